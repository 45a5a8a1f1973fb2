"""Users and tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from api.schemas.common import NEXT_CURSOR_DOC, InModel, OutModel, UserName, UTCDatetime

Scope = Literal["read", "write", "admin", "metrics"]
TokenName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\x00]*$")]


class TeamRole(OutModel):
    team: str
    role: str


class UserCreate(InModel):
    name: UserName
    email: Annotated[str, Field(max_length=254)] | None = None
    is_admin: bool = False

    model_config = InModel.model_config | {
        "json_schema_extra": {"examples": [{"name": "alice", "email": "alice@example.com", "is_admin": False}]}
    }


class UserOut(OutModel):
    id: int
    name: str
    email: str | None
    is_admin: bool
    created_at: datetime
    teams: list[TeamRole]


class TokenCreate(InModel):
    name: TokenName = Field(examples=["laptop"])
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=4)] | None = Field(
        default=None, description="Within the calling token's own scopes; default: its read and write."
    )
    expires_at: UTCDatetime | None = Field(
        default=None, description="No later than the calling token's own expiry; default: that expiry (none: never)."
    )
    expires_in_s: Annotated[int, Field(ge=60, le=10 * 365 * 86400)] | None = Field(
        default=None, description="Alternative to expires_at: lifetime in seconds."
    )
    user: UserName | None = Field(default=None, description="Admins only: issue the token for this user.")

    model_config = InModel.model_config | {
        "json_schema_extra": {"examples": [{"name": "laptop", "scopes": ["read", "write"], "expires_in_s": 2592000}]}
    }


class TokenOut(OutModel):
    id: int
    name: str
    prefix: str = Field(description="The first characters of the secret, to recognise it.")
    user: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenOut):
    secret: str = Field(description="Shown once; only its SHA-256 is stored.", examples=["kiln_3q2...Zx"])


class UserPageOut(OutModel):
    items: list[UserOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


class TokenPageOut(OutModel):
    items: list[TokenOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)
