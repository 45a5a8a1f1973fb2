"""API token secrets: shown once, stored only as a SHA-256 hash (they are random, so no slow KDF is needed)."""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "kiln_"


def new_token() -> tuple[str, str, str]:
    """Return (secret, display prefix, hash)."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return secret, secret[: len(TOKEN_PREFIX) + 6], hash_token(secret)


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
