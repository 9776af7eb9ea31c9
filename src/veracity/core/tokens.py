"""API tokens and their scopes, the pure part (docs/security.md).

A token reads ``vrc_<key id>_<secret>``: the key id (16 hex digits, public) finds the
token's row; the secret (32 random bytes, base64url) is what authenticates. The database
keeps the SHA-256 of the whole token, never the token; a presented token's digest is
compared with the stored one in constant time. A secret of 256 random bits needs no salt
nor a slow hash: nobody can guess it back from its digest.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

PREFIX = "vrc_"
KEY_ID_HEX = 16
SECRET_BYTES = 32
MAX_NAME_LENGTH = 64
MAX_LIFETIME = timedelta(days=3650)
"""The longest ``--expires``: ten years (a token meant to live forever has none)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_KEY_ID = re.compile(rf"[0-9a-f]{{{KEY_ID_HEX}}}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")  # 32 bytes in unpadded base64url
_EXPIRES = re.compile(r"(\d{1,12})([smhdw])")
_EXPIRES_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Scope(StrEnum):
    """What a token may do. ``admin`` grants every other scope."""

    EXECUTIONS_READ = "executions:read"
    EXECUTIONS_SUBMIT = "executions:submit"
    EXECUTIONS_CANCEL = "executions:cancel"
    EXECUTIONS_PAUSE = "executions:pause"
    EXECUTIONS_SEND = "executions:send"
    EXECUTIONS_RESOLVE = "executions:resolve"
    ADMIN = "admin"


class InvalidTokenRequest(ValueError):
    """A bad name, scope or lifetime for a new token."""


def allows(granted: Iterable[str], needed: Scope) -> bool:
    """Whether scopes as stored (their values) grant ``needed``."""
    held = set(granted)
    return needed.value in held or Scope.ADMIN.value in held


def parse_scopes(values: Iterable[str]) -> tuple[Scope, ...]:
    """The scopes named, in the order of :class:`Scope`, each once. At least one; an
    unknown one is refused naming every scope there is."""
    found: set[Scope] = set()
    for value in values:
        try:
            found.add(Scope(value.strip()))
        except ValueError:
            known = ", ".join(s.value for s in Scope)
            raise InvalidTokenRequest(f"unknown scope {value!r} (one of: {known})") from None
    if not found:
        raise InvalidTokenRequest(
            "a token needs at least one scope (one of: "
            + ", ".join(s.value for s in Scope) + ")")
    return tuple(s for s in Scope if s in found)


def check_name(name: str) -> str:
    if not 1 <= len(name) <= MAX_NAME_LENGTH or not _NAME.fullmatch(name):
        raise InvalidTokenRequest(
            f"token name {name[:80]!r} must be 1 to {MAX_NAME_LENGTH} letters, digits, "
            "'.', '_' or '-', starting with a letter or digit")
    return name


def parse_expires(text: str) -> timedelta:
    """A lifetime such as ``30d``, ``12h``, ``90m``, ``2w`` or ``3600s``: one whole number
    and one unit (s, m, h, d, w), more than zero, at most ten years."""
    match = _EXPIRES.fullmatch(text.strip().lower())
    hint = "give a whole number and a unit: 30d, 12h, 90m, 2w or 3600s"
    if match is None:
        raise InvalidTokenRequest(f"invalid --expires {text!r}: {hint}")
    amount, unit = int(match.group(1)), match.group(2)
    if amount == 0:
        raise InvalidTokenRequest(f"invalid --expires {text!r}: a token cannot expire at once")
    seconds = amount * _EXPIRES_UNITS[unit]
    if seconds > MAX_LIFETIME.total_seconds():
        raise InvalidTokenRequest(
            f"invalid --expires {text!r}: at most 3650d (ten years); for a token that "
            "never expires, leave --expires out")
    return timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class NewSecret:
    """A freshly made token: ``token`` is shown once, ``key_id`` and ``digest`` are kept."""

    token: str
    key_id: str
    digest: str


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_secret() -> NewSecret:
    key_id = secrets.token_hex(KEY_ID_HEX // 2)
    token = f"{PREFIX}{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"
    return NewSecret(token, key_id, digest(token))


def key_id_of(token: str) -> str | None:
    """The key id of something shaped like a token; None for anything else."""
    if not token.startswith(PREFIX):
        return None
    key_id, sep, secret = token[len(PREFIX):].partition("_")
    if not sep or not _KEY_ID.fullmatch(key_id) or not _SECRET.fullmatch(secret):
        return None
    return key_id


def matches(token: str, stored_digest: str) -> bool:
    """The presented token against the stored digest, in constant time."""
    return hmac.compare_digest(digest(token).encode(), stored_digest.encode())


class TokenState(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    REVOKED = "revoked"


def state(expires_at: datetime | None, revoked_at: datetime | None, now: datetime
          ) -> TokenState:
    """Revoked wins over expired: revocation is what an operator did on purpose."""
    if revoked_at is not None:
        return TokenState.REVOKED
    if expires_at is not None and expires_at <= now:
        return TokenState.EXPIRED
    return TokenState.ACTIVE
