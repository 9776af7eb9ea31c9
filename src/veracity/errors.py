"""Errors that carry a stable code and the HTTP status the API answers with.

The service layer raises these; the API turns them into ``{"error": {code, message}}``
and the CLI prints the message and exits 1.
"""

from __future__ import annotations

from typing import Any, ClassVar


class VeracityError(Exception):
    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]
        self.details = details


class BadRequest(VeracityError):
    status = 400
    code = "bad_request"


class Unauthorized(VeracityError):
    status = 401
    code = "unauthorized"


class Forbidden(VeracityError):
    status = 403
    code = "forbidden"


class NotFound(VeracityError):
    status = 404
    code = "not_found"


class Conflict(VeracityError):
    status = 409
    code = "conflict"


class PayloadTooLarge(VeracityError):
    status = 413
    code = "payload_too_large"


class InvalidInput(VeracityError):
    status = 422
    code = "invalid_input"


class ConfigError(Exception):
    """An invalid configuration: the message names the source, line and reason."""
