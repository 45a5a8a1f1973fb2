"""Sign-in with the company's OpenID provider: where to send the browser or the CLI, and a kiln token for a sign-in
that the provider vouched for (core.services.oidc, core.services.oidc_signin). These routes take no token: they are
how one is had. A refused sign-in counts as a failed authentication of the client's address, as a bad token does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import Field

from api.auth import client_address
from api.deps import SessionDep, SettingsDep
from api.ratelimit import FailedAuthentications
from api.routers.tokens import token_out
from api.schemas.common import InModel, OutModel, problem_responses
from api.schemas.users import TeamRole, TokenCreated
from core.services import oidc, oidc_signin
from core.services.errors import NotFound, Unauthenticated
from core.settings import Settings

router = APIRouter(prefix="/v1/auth/oidc", tags=["sign-in"], responses=problem_responses(400, 401, 404, 409, 429, 502))


class OidcConfigOut(OutModel):
    enabled: bool = Field(description="Whether kiln signs people in with a provider; the rest is null when not.")
    issuer: str | None = None
    client_id: str | None = Field(default=None, description="The dashboard's client (authorization code, PKCE).")
    cli_client_id: str | None = Field(default=None, description="The CLI's client (device grant, RFC 8628).")
    scopes: str | None = None
    authorization_endpoint: str | None = None
    token_endpoint: str | None = None
    device_authorization_endpoint: str | None = None


class CodeIn(InModel):
    code: str = Field(min_length=1, max_length=4096)
    code_verifier: str = Field(min_length=43, max_length=128, description="PKCE (RFC 7636), S256.")
    redirect_uri: str = Field(min_length=1, max_length=2000)
    nonce: str = Field(min_length=16, max_length=256, description="The nonce sent with the authorization request.")


class IdTokenIn(InModel):
    id_token: str = Field(min_length=1, max_length=16384, description="From the provider's device grant.")


class SignedIn(TokenCreated):
    admin: bool
    teams: list[TeamRole] = Field(
        description="The user's teams and roles now (those from groups: KILN_OIDC_GROUP_MAP)."
    )


@router.get("", response_model=OidcConfigOut, summary="Where to sign in, when kiln signs people in with a provider")
def config(settings: SettingsDep) -> OidcConfigOut:
    if not settings.oidc_enabled:
        return OidcConfigOut(enabled=False)
    prov = _provider(settings)
    return OidcConfigOut(
        enabled=True,
        issuer=prov.issuer,
        client_id=settings.oidc_client_id,
        cli_client_id=settings.oidc_cli_client_id or settings.oidc_client_id,
        scopes=settings.oidc_scopes,
        authorization_endpoint=prov.authorization_endpoint,
        token_endpoint=prov.token_endpoint,
        device_authorization_endpoint=prov.device_authorization_endpoint,
    )


@router.post(
    "/code",
    response_model=SignedIn,
    status_code=status.HTTP_201_CREATED,
    summary="The dashboard's sign-in: an authorization code and its PKCE verifier for a kiln token",
)
def sign_in_code(body: CodeIn, request: Request, db: SessionDep, settings: SettingsDep) -> SignedIn:
    oidc.check_redirect_uri(body.redirect_uri)
    _provider(settings)

    def claims() -> dict[str, Any]:
        id_token = oidc.exchange_code(
            settings, code=body.code, code_verifier=body.code_verifier, redirect_uri=body.redirect_uri
        )
        return oidc.validate_id_token(settings, id_token, nonce=body.nonce)

    return _signed_in(request, db, settings, claims, client="dashboard")


@router.post(
    "/id-token",
    response_model=SignedIn,
    status_code=status.HTTP_201_CREATED,
    summary="The CLI's sign-in: the ID token of a device grant for a kiln token",
)
def sign_in_id_token(body: IdTokenIn, request: Request, db: SessionDep, settings: SettingsDep) -> SignedIn:
    _provider(settings)
    return _signed_in(request, db, settings, lambda: oidc.validate_id_token(settings, body.id_token), client="cli")


def _provider(settings: Settings) -> oidc.Provider:
    try:
        return oidc.provider(settings)
    except oidc.NotConfigured as exc:
        raise NotFound(exc.detail) from exc
    except oidc.ProviderUnavailable as exc:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, exc.detail) from exc


def _signed_in(
    request: Request, db: SessionDep, settings: Settings, claims: Callable[[], dict[str, Any]], client: str
) -> SignedIn:
    failures: FailedAuthentications = request.app.state.auth_failures
    address = client_address(request)
    wait = failures.blocked_for(address)
    if wait > 0:
        raise HTTPException(429, "too many failed sign-ins from this address", {"Retry-After": str(int(wait) + 1)})
    try:
        checked = claims()
    except Unauthenticated:
        failures.failed(address)
        raise
    except oidc.ProviderUnavailable as exc:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, exc.detail) from exc
    token, secret, user, grants = oidc_signin.sign_in(
        db=db, settings=settings, claims=checked, max_active=settings.max_tokens_per_user, client=client
    )
    db.refresh(token)
    out = token_out(token).model_dump()
    teams = [TeamRole(team=m.team.name, role=m.role) for m in user.memberships]
    return SignedIn(**out, secret=secret, admin=user.is_admin, teams=sorted(teams, key=lambda g: g.team))
