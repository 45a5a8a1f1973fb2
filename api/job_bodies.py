"""Job submissions as the API reads them: the spec from a JSON or YAML body (the submit, estimate and sweep routes),
the ``Idempotency-Key`` header, and the small bodies of cancel and hold."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from fastapi import HTTPException, Request
from pydantic import ValidationError

from api.bodies import yaml_body
from api.schemas.common import InModel, Text
from core.services import jobs as svc
from core.services.errors import InvalidInput
from core.spec import JobSpec, SpecError, parse_spec_data, validation_errors

JSON_TYPES = frozenset({"application/json"})
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml"})
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,128}$")
SUBMIT_BODY: dict[str, Any] = {
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "A key of yours for this submission (e.g. a UUID): a retry with the same key and body "
            "answers the job the first one made (header Idempotent-Replayed: true) instead of starting another; the "
            "same key with another body is a 422. Keys are kept per team.",
            "schema": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[!-~]+$"},
        }
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
            **{t: {"schema": {"type": "string", "description": "The job spec as YAML"}} for t in sorted(YAML_TYPES)},
        },
    },
}


def spec_from_json(body: bytes) -> JobSpec:
    """Validated straight from the bytes by pydantic-core (no ``json.loads`` and second walk over a dict); the
    same errors as ``parse_spec_data`` on the parsed document."""
    try:
        return JobSpec.model_validate_json(body)
    except ValidationError as exc:
        errors = validation_errors(exc)
        bad_json = [e for e in errors if e["type"] == "json_invalid"]
        if bad_json:
            detail = [{"loc": "$", "msg": bad_json[0]["msg"], "type": "json_invalid"}]
            raise SpecError("malformed JSON", detail) from exc
        if len(errors) == 1 and errors[0]["loc"] == "$" and errors[0]["type"] == "model_type":
            detail = [{"loc": "$", "msg": "expected a mapping", "type": "type"}]
            raise SpecError("a job spec is a mapping", detail) from exc
        first = errors[0]
        raise SpecError(f"invalid job spec: {first['loc']}: {first['msg']}", errors) from exc


async def spec_from_body(request: Request) -> JobSpec:
    """The spec of a submission, read within bounds (``api.bodies``: depth, and a YAML document's size)."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    body = await request.body()
    if ctype in JSON_TYPES:
        return spec_from_json(body)
    if ctype in YAML_TYPES:
        return parse_spec_data(yaml_body(body))
    raise HTTPException(415, f"submit the spec as application/json or YAML ({', '.join(sorted(YAML_TYPES))})")


async def idempotency_of(request: Request) -> svc.Idempotency | None:
    """The ``Idempotency-Key`` header and the hash of the body it names (the bytes as sent)."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not IDEMPOTENCY_KEY.match(key):
        raise InvalidInput.at("header.Idempotency-Key", "1 to 128 printable ASCII characters, no spaces")
    return svc.Idempotency(key=key, request_sha256=hashlib.sha256(await request.body()).hexdigest())


class CancelIn(InModel):
    reason: Text | None = None


class HoldIn(InModel):
    """Why the job is held: shown as its pending message and recorded in its events."""

    reason: Text | None = None
