"""Types shared by every schema: safe names and strings, UTC datetimes, bounded numbers, the problem document."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from core.spec import NAME_PATTERN

INT32 = 2**31 - 1
INT64 = 2**63 - 1

TeamName = Annotated[str, Field(pattern=NAME_PATTERN, max_length=64, examples=["vision"])]
UserName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$", examples=["alice"])]
GpuType = Annotated[
    str,
    Field(
        pattern=r"^(\*|cpu|[A-Za-z0-9][A-Za-z0-9 ._-]{0,63})$",
        examples=["H200"],
        description="A GPU type as kiln writes it ('H200', 'H100-80GB') or as NVML names it ('NVIDIA H200'), "
        "'*' for any type, 'cpu' for CPU slots.",
    ),
]
Text = Annotated[str, Field(max_length=256, pattern=r"^[^\x00]*$")]
Int32 = Annotated[int, Field(ge=0, le=INT32)]
Int64 = Annotated[int, Field(ge=0, le=INT64)]
Seconds = Annotated[float, Field(gt=0, le=10 * 365 * 86400, allow_inf_nan=False)]


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise ValueError("timestamp out of range") from exc


UTCDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]


class InModel(BaseModel):
    """Requests: unknown fields are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class OutModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)


NEXT_CURSOR_DOC = "Pass as ?cursor= for the next page; null on the last page."


class ProblemError(BaseModel):
    loc: str = Field(description="Dotted field path, e.g. 'resources.gpus' or 'query.limit'; '$' = the document.")
    msg: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    type: str = Field(examples=["https://kiln.dev/problems/validation-error"])
    title: str = Field(examples=["Request validation failed"])
    status: int = Field(examples=[422])
    detail: str = Field(default="", examples=["resources.gpus: Input should be greater than or equal to 0"])
    instance: str | None = Field(default=None, examples=["/v1/jobs"])
    errors: list[ProblemError] | None = None

    model_config = ConfigDict(extra="allow")


PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error statuses, all problem+json pointing at the one ``Problem`` component (which
    ``api.openapi`` adds to the document)."""
    return {code: {"content": {"application/problem+json": {"schema": PROBLEM_REF}}} for code in codes}
