"""Every error the API answers is ``{"error": {"code", "message"}}`` with a 4xx status:
never a stack trace, and a 500 only for a bug (logged with its trace). A database that does
not answer is ``503 database_unavailable`` (with ``Retry-After``), on every route.

A request body that is not JSON (bad syntax, not UTF-8) is ``422 malformed_json`` on every
endpoint that takes one, the status of every other body that cannot be used.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from veracity.errors import VeracityError

log = logging.getLogger("veracity.api")

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def error_response(
    http_status: int, code: str, message: str, headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    body.update(extra)
    return JSONResponse({"error": body}, status_code=http_status, headers=headers)


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
    msg = str(err.get("msg", "invalid"))
    return f"{loc}: {msg}" if loc else msg


def _allowed_methods(request: Request) -> set[str]:
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return methods


MALFORMED_JSON = "the request body is not valid JSON"


def _body_parse_error(exc: StarletteHTTPException) -> JSONResponse | None:
    """FastAPI answers a JSON body it could not decode, for any reason other than a syntax
    error, with a bare ``400 There was an error parsing the body`` raised from the cause.
    Bytes that are not UTF-8 are not JSON text (RFC 8259, section 8.1); nesting too deep
    for the parser is JSON this API does not take (the same as params nested too deeply)."""
    if exc.status_code != 400:
        return None
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return error_response(422, "malformed_json", f"{MALFORMED_JSON} (not UTF-8 text)")
    if isinstance(cause, RecursionError):
        return error_response(422, "invalid_json", "the request body is nested too deeply")
    return None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(VeracityError)
    async def veracity_error(_: Request, exc: VeracityError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, **exc.details)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(422, "malformed_json", MALFORMED_JSON)
        details = [
            {"field": ".".join(str(p) for p in e.get("loc", ())), "message": str(e.get("msg"))}
            for e in errors
        ]
        message = "; ".join(_describe(e) for e in errors[:3])
        return error_response(422, "invalid_input", message, details=details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if (parse_error := _body_parse_error(exc)) is not None:
            return parse_error
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # a 405 must say which methods are allowed; one path may have several routes
            headers["Allow"] = ", ".join(sorted(_allowed_methods(request)))
        return error_response(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(sqlite3.OperationalError)
    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # the database did not answer (down, restarting, unreachable, a pool with no
        # connection to give within its wait): say so at once, without a trace
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path,
                    first, extra={"domain": "api"})
        return error_response(503, "database_unavailable",
                              f"the database did not answer ({first}); try again shortly",
                              headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal", "internal error; see the server log")
