"""Who may call which route: the one table of every route's access, the middleware that
enforces it before anything else reads the request, and the security the OpenAPI document
declares (docs/security.md).

A route is open (health, metrics, the API's own documents), an engine callback (checked by
its handler against the execution's callback token, which is not an API token), or needs
an API token with one scope. A route missing from :data:`ROUTE_ACCESS` stops
:func:`veracity.api.create_api` from building the app at all.
"""

from __future__ import annotations

import logging
import sqlite3
import weakref
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

import psycopg
from fastapi import FastAPI
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from veracity.api.errors import error_response
from veracity.control import TokenService
from veracity.core.tokens import Scope as TokenScope
from veracity.errors import Forbidden, Unauthorized

log = logging.getLogger("veracity.api")


class Unscoped(StrEnum):
    OPEN = "open"
    """No token: /healthz, /metrics, and the OpenAPI document with its viewers."""
    CALLBACK = "callback"
    """An engine's callback: its execution's callback token, checked by the handler."""


Access = TokenScope | Unscoped

DASHBOARD_TOKEN_COOKIE = "veracity_token"
"""The cookie the dashboard keeps its API token in (HttpOnly; docs/dashboard.md)."""

DashboardRefusal = Callable[[Scope, int, str, str | None], Response]
"""Renders the dashboard's answer to a refused token: (scope, 401 or 403, why, the scope
needed)."""

EXECUTION = "/v1/executions/{execution_id}"
UI_EXECUTION = "/ui/executions/{execution_id}"
DOCUMENT_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
                  "/docs/static/{name}")

ROUTE_ACCESS: Mapping[tuple[str, str], Access] = {
    ("GET", "/healthz"): Unscoped.OPEN,
    ("GET", "/metrics"): Unscoped.OPEN,
    **{(method, path): Unscoped.OPEN for path in DOCUMENT_PATHS for method in ("GET", "HEAD")},
    ("POST", "/v1/executions"): TokenScope.EXECUTIONS_SUBMIT,
    ("POST", "/v1/executions/batch"): TokenScope.EXECUTIONS_SUBMIT,
    ("GET", "/v1/executions"): TokenScope.EXECUTIONS_READ,
    ("GET", EXECUTION): TokenScope.EXECUTIONS_READ,
    ("GET", f"{EXECUTION}/history"): TokenScope.EXECUTIONS_READ,
    ("GET", "/v1/workers"): TokenScope.EXECUTIONS_READ,
    ("GET", "/v1/crons"): TokenScope.EXECUTIONS_READ,
    ("GET", "/v1/deployments"): TokenScope.EXECUTIONS_READ,
    ("POST", "/v1/deployments/{deployment_id}/adopt"): TokenScope.ADMIN,
    # a retry submits a new execution (the failed one is left as it is)
    ("PUT", f"{EXECUTION}/retry"): TokenScope.EXECUTIONS_SUBMIT,
    ("PUT", f"{EXECUTION}/cancel"): TokenScope.EXECUTIONS_CANCEL,
    ("PUT", "/v1/executions/cancel"): TokenScope.EXECUTIONS_CANCEL,
    ("PUT", f"{EXECUTION}/pause"): TokenScope.EXECUTIONS_PAUSE,
    ("PUT", f"{EXECUTION}/unpause"): TokenScope.EXECUTIONS_PAUSE,
    ("POST", f"{EXECUTION}/messages"): TokenScope.EXECUTIONS_SEND,
    ("PUT", f"{EXECUTION}/resolve"): TokenScope.EXECUTIONS_RESOLVE,
    ("POST", f"{EXECUTION}/complete"): Unscoped.CALLBACK,
    ("POST", f"{EXECUTION}/fail"): Unscoped.CALLBACK,
    # the dashboard (docs/dashboard.md): each page and action needs the scope of the API
    # route it stands for; its token comes from its cookie (or the Authorization header)
    ("GET", "/"): Unscoped.OPEN,
    ("GET", "/ui"): Unscoped.OPEN,
    ("GET", "/ui/static/{name}"): Unscoped.OPEN,
    ("GET", "/ui/login"): Unscoped.OPEN,
    ("POST", "/ui/login"): Unscoped.OPEN,  # checks the token it is given itself
    ("POST", "/ui/logout"): Unscoped.OPEN,
    ("GET", "/ui/executions"): TokenScope.EXECUTIONS_READ,
    ("GET", UI_EXECUTION): TokenScope.EXECUTIONS_READ,
    ("POST", f"{UI_EXECUTION}/cancel"): TokenScope.EXECUTIONS_CANCEL,
    ("POST", f"{UI_EXECUTION}/pause"): TokenScope.EXECUTIONS_PAUSE,
    ("POST", f"{UI_EXECUTION}/unpause"): TokenScope.EXECUTIONS_PAUSE,
    ("POST", f"{UI_EXECUTION}/messages"): TokenScope.EXECUTIONS_SEND,
    ("POST", f"{UI_EXECUTION}/resolve"): TokenScope.EXECUTIONS_RESOLVE,
    ("POST", f"{UI_EXECUTION}/retry"): TokenScope.EXECUTIONS_SUBMIT,
    ("GET", "/ui/bulk"): TokenScope.EXECUTIONS_READ,
    ("POST", "/ui/bulk/cancel"): TokenScope.EXECUTIONS_CANCEL,
    ("POST", "/ui/bulk/pause"): TokenScope.EXECUTIONS_PAUSE,
    ("GET", "/ui/flagged"): TokenScope.EXECUTIONS_READ,
    ("GET", "/ui/workers"): TokenScope.EXECUTIONS_READ,
    ("GET", "/ui/deployments"): TokenScope.EXECUTIONS_READ,
    ("GET", "/ui/crons"): TokenScope.EXECUTIONS_READ,
    ("GET", "/ui/{rest:path}"): Unscoped.OPEN,  # the dashboard's 404 page
}
"""(method, path template) -> what a request needs. Every route of the app is here: every
route under /v1 needs a scope (GET ones ``executions:read``) or is an engine callback."""

API_TOKEN_SCHEME = "apiToken"
CALLBACK_TOKEN_SCHEME = "callbackToken"


def route_methods(routes: list[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path template) of every route, as the router matches them."""
    out: list[tuple[str, str]] = []
    for route in routes:
        path = getattr(route, "path", None)
        methods = getattr(route, "methods", None)
        if path is None or not methods:
            raise RuntimeError(f"a route this module cannot place: {route!r}")
        out.extend((method, path) for method in sorted(methods))
    return out


def check_routes(routes: list[BaseRoute], table: Mapping[tuple[str, str], Access]) -> None:
    """Raise unless ``table`` gives every route its access, and nothing else; every route
    under /v1 needs a scope or is a callback, and every GET under /v1 needs
    executions:read."""
    present = route_methods(routes)
    missing = [f"{m} {p}" for m, p in present if (m, p) not in table]
    if missing:
        raise RuntimeError("routes without an entry in veracity.api.auth.ROUTE_ACCESS: "
                           + ", ".join(missing))
    stale = [f"{m} {p}" for m, p in table if (m, p) not in set(present)]
    if stale:
        raise RuntimeError("ROUTE_ACCESS names routes the app does not have: "
                           + ", ".join(stale))
    for (method, path), access in table.items():
        if not path.startswith("/v1/"):
            continue
        if access is Unscoped.OPEN:
            raise RuntimeError(f"{method} {path} is under /v1 and open: give it a scope")
        if method == "GET" and access is not TokenScope.EXECUTIONS_READ:
            raise RuntimeError(f"GET {path} must need executions:read, not {access}")


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of the first Authorization header if it is ``Bearer <token>``."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


def cookie(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """The value of the cookie ``name`` (the dashboard keeps its API token in one)."""
    for header, value in headers:
        if header != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, _, found = part.strip().partition("=")
            if key == name and found:
                return found
    return None


def is_dashboard(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


_FIXED: weakref.WeakKeyDictionary[FastAPI, dict[tuple[str, str, str], tuple[Access, str]]] = (
    weakref.WeakKeyDictionary())
"""By application: what :func:`access_of` found for paths a route without parameters took
(``POST /v1/executions``), so that the busiest requests are not matched against every
route twice (here and in the router)."""


def access_of(app: FastAPI, scope: Scope) -> tuple[Access, str] | None:
    """The access the route this request goes to needs, and ``METHOD path``; None when no
    route takes it (the router answers 404 or 405)."""
    known = _FIXED.get(app)
    if known is None:
        known = _FIXED[app] = {}
    key = (scope["method"], scope.get("root_path", ""), scope["path"])
    found = known.get(key)
    if found is not None:
        return found
    for route in app.router.routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            path: str = getattr(route, "path")  # noqa: B009 - BaseRoute does not declare it
            found = ROUTE_ACCESS[(scope["method"], path)], f"{scope['method']} {path}"
            # routes are only ever added after the others: the first route to take a
            # path without parameters stays the first
            if not child.get("path_params"):
                known[key] = found
            return found
    return None


class TokenAuth:
    """Checks the API token of every request to a scoped route, before the body is read.

    ``required`` (auth.required): without it, a request without a token is served; one
    with a bearer token is still checked, so that a wrong, expired or revoked token is
    never taken silently. Other Authorization schemes (a proxy's Basic) are not ours."""

    def __init__(self, app: ASGIApp, required: bool) -> None:
        self.app = app
        self.required = required

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api: FastAPI = scope["app"]
        found = access_of(api, scope)
        needed = found[0] if found is not None else None
        if found is None or not isinstance(needed, TokenScope):
            await self.app(scope, receive, send)
            return
        route = found[1]
        headers = scope.get("headers", [])
        token = bearer(headers)
        dashboard = is_dashboard(scope["path"])
        if token is None and dashboard:
            # the dashboard keeps the token it was given in an HttpOnly cookie
            token = cookie(headers, DASHBOARD_TOKEN_COOKIE)
        if token is None and not self.required:
            await self.app(scope, receive, send)
            return
        refusal = await self._refusal(api, token, needed, route, scope, dashboard)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    async def _refusal(self, api: FastAPI, token: str | None, needed: TokenScope,
                       route: str, scope: Scope, dashboard: bool) -> Response | None:
        tokens = TokenService(api.state.service.store)
        try:
            record = await tokens.authenticate(token, needed, route=route)
        except Unauthorized as exc:
            log.info("refused %s: %s", route, exc.message, extra={"domain": "api"})
            if dashboard:
                refuse: DashboardRefusal = api.state.dashboard_refusal
                return refuse(scope, 401, exc.message, None)
            challenge = 'Bearer realm="veracity"'
            if token is not None:
                challenge += ', error="invalid_token"'
            return error_response(401, exc.code, exc.message,
                                  headers={"WWW-Authenticate": challenge})
        except Forbidden as exc:
            log.info("refused %s: %s", route, exc.message, extra={"domain": "api"})
            if dashboard:
                refuse = api.state.dashboard_refusal
                return refuse(scope, 403, exc.message, needed.value)
            return error_response(
                403, exc.code, exc.message, headers={
                    "WWW-Authenticate":
                        f'Bearer realm="veracity", error="insufficient_scope", '
                        f'scope="{needed.value}"'},
                **exc.details)
        except (psycopg.OperationalError, sqlite3.OperationalError) as exc:
            # as every route answers in an outage (api/errors.py): 503 with Retry-After
            log.warning("cannot check the API token for %s: %s", route, exc,
                        extra={"domain": "api"})
            return error_response(503, "database_unavailable",
                                  "cannot check the API token: the database did not answer",
                                  headers={"Retry-After": "1"})
        # the dashboard and the API name whoever acted in the history events they record
        scope.setdefault("state", {})["api_token"] = record
        return None


def declare_security(app: FastAPI, required: bool) -> None:
    """Make the OpenAPI document say which token each operation takes: the bearer scheme
    ``apiToken`` with the scope needed (optional when auth is not required), or the
    callback's own ``callbackToken``; open operations take none."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {})
        components["securitySchemes"] = {
            API_TOKEN_SCHEME: {
                "type": "http", "scheme": "bearer", "bearerFormat": "vrc_<key id>_<secret>",
                "description": "An API token (`veracity token create`); each operation "
                               "names the one scope it needs; `admin` grants every scope.",
            },
            CALLBACK_TOKEN_SCHEME: {
                "type": "http", "scheme": "bearer",
                "description": "The execution's callback token, given to its engine with "
                               "the trigger (not an API token).",
            },
        }
        error = {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
        for (method, path), access in ROUTE_ACCESS.items():
            operation = schema["paths"].get(path, {}).get(method.lower())
            if operation is None:
                continue  # the documents themselves are not in the document
            if access is Unscoped.OPEN:
                operation["security"] = []
            elif access is Unscoped.CALLBACK:
                operation["security"] = [{CALLBACK_TOKEN_SCHEME: []}]
            else:
                operation["security"] = [{API_TOKEN_SCHEME: [access.value]}]
                if not required:
                    operation["security"].append({})
                note = f"Needs an API token with the scope `{access.value}` (or `admin`)."
                text = operation.get("description", "")
                operation["description"] = f"{text}\n\n{note}" if text else note
                responses = operation.setdefault("responses", {})
                responses["401"] = {"description": "No API token, or an unknown, "
                                                   "expired or revoked one", **error}
                responses["403"] = {"description": f"The token lacks {access.value}",
                                    **error}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
