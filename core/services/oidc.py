"""Sign-in with an OpenID provider: discovery, the ID token checked (signature against the provider's JWKS, ``iss``,
``aud``, ``exp``, ``nonce``), the code exchanged at the token endpoint, and the user's groups turned into kiln's
teams, roles and admin flag (``KILN_OIDC_GROUP_MAP``).

A sign-in ends in a kiln API token of ``KILN_OIDC_SESSION_S`` (scopes read, write, and admin for an admin): the
dashboard keeps it for the tab as it keeps a pasted token, the CLI saves it as ``kiln login`` does. Roles are read
from the memberships on every request, so grants changed by a sign-in apply at once to every token the user holds;
a user removed at the provider keeps the tokens already issued until they expire or are revoked (sign-in is the
only moment kiln hears from the provider).

JWT and JWK handling is joserfc's (the Authlib project's JOSE library), never kiln's own; the HTTP requests to the
provider are plain httpx.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from joserfc import errors as jose_errors
from joserfc import jwt
from joserfc.jwk import KeySet
from joserfc.jwt import ClaimsOption

from core.services.errors import InvalidInput, ServiceError, Unauthenticated
from core.settings import OidcSettings

# Asymmetric algorithms only: an HMAC-signed ID token would be keyed by the client secret, and a public client has
# none (and "none" is never accepted).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# The provider's discovery document and keys change rarely; an unknown key id fetches the keys again at once.
METADATA_TTL_S = 3600.0
HTTP_TIMEOUT_S = 10.0


class ProviderUnavailable(ServiceError):
    """The provider could not be reached or answered nonsense (the API answers 502)."""


class NotConfigured(ServiceError):
    """Sign-in with a provider is off (``KILN_OIDC_ISSUER`` unset)."""


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    device_authorization_endpoint: str | None


_cache: dict[str, tuple[float, Any]] = {}
_lock = threading.Lock()


def _get_json(url: str, what: str) -> dict[str, Any]:
    try:
        response = httpx.get(url, timeout=HTTP_TIMEOUT_S, follow_redirects=False)
        response.raise_for_status()
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ProviderUnavailable(f"the OpenID provider's {what} ({url}) could not be read: {exc}") from exc
    if not isinstance(body, dict):
        raise ProviderUnavailable(f"the OpenID provider's {what} ({url}) is not a JSON object")
    return body


def _cached(key: str, load: Any, *, fresh: bool = False) -> Any:
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
    if hit is not None and not fresh and now - hit[0] < METADATA_TTL_S:
        return hit[1]
    value = load()
    with _lock:
        _cache[key] = (now, value)
    return value


def provider(settings: OidcSettings) -> Provider:
    """The provider's endpoints, from its discovery document (whose ``issuer`` must be the one configured)."""
    if not settings.oidc_enabled:
        raise NotConfigured("sign-in with an OpenID provider is not configured (KILN_OIDC_ISSUER, KILN_OIDC_CLIENT_ID)")
    issuer = settings.oidc_issuer.rstrip("/")

    def load() -> Provider:
        doc = _get_json(f"{issuer}/.well-known/openid-configuration", "discovery document")
        if str(doc.get("issuer", "")).rstrip("/") != issuer:
            raise ProviderUnavailable(f"the discovery document names issuer {doc.get('issuer')!r}, not {issuer!r}")
        try:
            return Provider(
                issuer=str(doc["issuer"]),
                authorization_endpoint=str(doc["authorization_endpoint"]),
                token_endpoint=str(doc["token_endpoint"]),
                jwks_uri=str(doc["jwks_uri"]),
                device_authorization_endpoint=doc.get("device_authorization_endpoint"),
            )
        except KeyError as exc:
            raise ProviderUnavailable(f"the discovery document lacks {exc.args[0]!r}") from exc

    result: Provider = _cached(f"discovery:{issuer}", load)
    return result


def _keys(jwks_uri: str, *, fresh: bool = False) -> KeySet:
    def load() -> KeySet:
        try:
            return KeySet.import_key_set(_get_json(jwks_uri, "keys (JWKS)"))  # type: ignore[arg-type]
        except (jose_errors.JoseError, ValueError, TypeError) as exc:
            raise ProviderUnavailable(f"the OpenID provider's keys ({jwks_uri}) could not be read: {exc}") from exc

    result: KeySet = _cached(f"jwks:{jwks_uri}", load, fresh=fresh)
    return result


def audiences(settings: OidcSettings) -> list[str]:
    return sorted({settings.oidc_client_id, settings.oidc_cli_client_id or settings.oidc_client_id})


def validate_id_token(settings: OidcSettings, id_token: str, *, nonce: str | None = None) -> dict[str, Any]:
    """The ID token's claims once its signature (the provider's keys), issuer, audience, expiry and, when the
    sign-in sent one, nonce are right; Unauthenticated otherwise, saying which check failed."""
    prov = provider(settings)
    try:
        try:
            token = jwt.decode(id_token, _keys(prov.jwks_uri), algorithms=ALGORITHMS)
        except jose_errors.MissingKeyError:
            # The provider rotated its keys since they were fetched.
            token = jwt.decode(id_token, _keys(prov.jwks_uri, fresh=True), algorithms=ALGORITHMS)
    except jose_errors.BadSignatureError as exc:
        raise Unauthenticated("the ID token's signature does not verify against the provider's keys") from exc
    except (jose_errors.JoseError, ValueError, TypeError) as exc:
        raise Unauthenticated(f"not a valid ID token ({_why(exc)})") from exc
    options: dict[str, ClaimsOption] = {
        "iss": {"essential": True, "value": prov.issuer},
        "aud": {"essential": True, "values": audiences(settings)},
        "sub": {"essential": True},
        "exp": {"essential": True},
    }
    if nonce is not None:
        options["nonce"] = {"essential": True, "value": nonce}
    checks = jwt.JWTClaimsRegistry(None, settings.oidc_clock_skew_s, **options)
    try:
        checks.validate(token.claims)
    except jose_errors.ExpiredTokenError as exc:
        raise Unauthenticated("the ID token has expired; sign in again") from exc
    except jose_errors.JoseError as exc:
        raise Unauthenticated(f"the ID token was refused: {_why(exc)}") from exc
    return _checked_party(settings, dict(token.claims))


def _checked_party(settings: OidcSettings, claims: dict[str, Any]) -> dict[str, Any]:
    """OpenID Connect Core 3.1.3.7: a token for several audiences names the party it was issued to (``azp``),
    which must be kiln's; and the identity must fit where kiln keeps it (255 characters each, as the spec's
    ``sub`` limit)."""
    aud = claims.get("aud")
    if isinstance(aud, list) and len(aud) > 1 and claims.get("azp") not in audiences(settings):
        raise Unauthenticated("the ID token was issued to another client (azp)")
    if len(str(claims["iss"])) > 255 or len(str(claims["sub"])) > 255:
        raise Unauthenticated("the ID token's issuer or subject is longer than 255 characters")
    return claims


def _why(exc: Exception) -> str:
    return str(getattr(exc, "description", "") or exc) or type(exc).__name__


def exchange_code(settings: OidcSettings, *, code: str, code_verifier: str, redirect_uri: str) -> str:
    """The ID token the provider's token endpoint gives for an authorization code and its PKCE verifier."""
    prov = provider(settings)
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "code_verifier": code_verifier,
        "redirect_uri": redirect_uri,
        "client_id": settings.oidc_client_id,
    }
    auth = (settings.oidc_client_id, settings.oidc_client_secret) if settings.oidc_client_secret else None
    try:
        response = httpx.post(prov.token_endpoint, data=form, auth=auth, timeout=HTTP_TIMEOUT_S)
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ProviderUnavailable(f"the OpenID provider's token endpoint could not be reached: {exc}") from exc
    if response.status_code != 200 or not isinstance(body, dict):
        error = body.get("error_description") or body.get("error") if isinstance(body, dict) else None
        raise Unauthenticated(f"the provider refused the sign-in code: {error or response.status_code}")
    id_token = body.get("id_token")
    if not isinstance(id_token, str):
        raise Unauthenticated("the provider's answer has no ID token (is 'openid' among KILN_OIDC_SCOPES?)")
    return id_token


def session_lifetime(settings: OidcSettings) -> timedelta:
    return timedelta(seconds=settings.oidc_session_s)


def check_redirect_uri(redirect_uri: str) -> None:
    if not redirect_uri.startswith(("http://", "https://")) or len(redirect_uri) > 2000:
        raise InvalidInput.at("redirect_uri", "an http(s) URL")
