"""What the OpenAPI document says of each route: its summary and the errors it can answer,
with their codes (README's error table, docs/security.md for 401 and 403).

:data:`ROUTE_ERRORS` is the one table of the errors each route answers by itself (its
input, its state checks). Added to them: ``401`` and ``403`` on every route that needs an
API token (``veracity.api.auth``), ``401`` on the engine callbacks, ``413`` on every route
and ``415`` on every write under ``/v1`` (the middleware answers them before any route),
and ``503 database_unavailable`` on every route but ``/metrics``. :func:`finish_document` removes
any other error response FastAPI would list on its own (a ``422`` for a route whose input
cannot be invalid, say), so that each route lists only what it can answer.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from pydantic.json_schema import models_json_schema

from veracity.api import bodies
from veracity.api.auth import ROUTE_ACCESS, Unscoped
from veracity.api.limits import JsonBodies
from veracity.api.schemas import ErrorOut

EXECUTION = "/v1/executions/{execution_id}"

BODY = {413: ("payload_too_large",), 415: ("unsupported_media_type",)}
"""Every route that reads a body: larger than max_payload_bytes, or declared not JSON."""

ROUTE_SUMMARIES: Mapping[tuple[str, str], str] = {
    ("GET", "/healthz"): "Check that the server and its database answer",
    ("GET", "/metrics"): "Prometheus metrics",
    ("POST", "/v1/executions"): "Submit an execution",
    ("POST", "/v1/executions/batch"): "Submit up to 1,000 executions in one transaction",
    ("GET", "/v1/executions"): "List executions, newest first",
    ("GET", EXECUTION): "Get one execution",
    ("GET", f"{EXECUTION}/history"): "Read an execution's history",
    ("PUT", f"{EXECUTION}/cancel"): "Cancel an execution",
    ("PUT", "/v1/executions/cancel"): "Cancel up to 1,000 executions in one transaction",
    ("PUT", f"{EXECUTION}/retry"): "Retry a failed execution",
    ("PUT", f"{EXECUTION}/pause"): "Pause an execution",
    ("PUT", f"{EXECUTION}/unpause"): "Unpause an execution",
    ("POST", f"{EXECUTION}/messages"): "Send a message to an execution",
    ("POST", f"{EXECUTION}/complete"): "Engine callback: the delegated run completed",
    ("POST", f"{EXECUTION}/fail"): "Engine callback: the delegated run failed",
    ("PUT", f"{EXECUTION}/resolve"): "Resolve a flagged delegated run",
    ("GET", "/v1/workers"): "List registered workers",
    ("GET", "/v1/crons"): "List the server's cron entries",
    ("GET", "/v1/deployments"): "List deployments",
    ("POST", "/v1/deployments/{deployment_id}/adopt"):
        "Adopt a deployment's unfinished executions",
}

_ID = {400: ("invalid_id",), 404: ("not_found",)}

MAX_EXAMPLES = 20
"""Workflow names given as examples of a submission's ffqn."""

ROUTE_ERRORS: Mapping[tuple[str, str], Mapping[int, tuple[str, ...]]] = {
    ("GET", "/healthz"): {},
    ("GET", "/metrics"): {},
    ("POST", "/v1/executions"): {
        **BODY, 409: ("idempotency_conflict",),
        422: ("malformed_json", "invalid_input", "invalid_ffqn", "unknown_workflow",
              "invalid_params", "invalid_time", "invalid_json", "invalid_idempotency_key")},
    ("POST", "/v1/executions/batch"): {
        **BODY, 409: ("idempotency_conflict",),
        422: ("malformed_json", "invalid_input", "invalid_json", "invalid_batch")},
    ("GET", "/v1/executions"): {
        400: ("invalid_cursor",), 422: ("invalid_input", "invalid_status", "invalid_time")},
    ("GET", EXECUTION): {**_ID, 422: ("invalid_wait",)},
    ("GET", f"{EXECUTION}/history"): {
        400: ("invalid_id", "invalid_cursor"), 404: ("not_found",), 422: ("invalid_input",)},
    ("PUT", f"{EXECUTION}/cancel"): {**_ID, 409: ("not_cancellable",)},
    ("PUT", "/v1/executions/cancel"): {
        **BODY, 422: ("malformed_json", "invalid_input", "invalid_json", "invalid_id")},
    ("PUT", f"{EXECUTION}/retry"): {**_ID, 409: ("wrong_state",)},
    ("PUT", f"{EXECUTION}/pause"): {
        **_ID, **BODY, 409: ("wrong_state", "not_pausable"),
        422: ("malformed_json", "invalid_input", "invalid_json", "invalid_reason")},
    ("PUT", f"{EXECUTION}/unpause"): {**_ID, 409: ("wrong_state",)},
    ("POST", f"{EXECUTION}/messages"): {
        **_ID, **BODY, 409: ("wrong_state",),
        422: ("malformed_json", "invalid_input", "invalid_topic", "invalid_json")},
    ("POST", f"{EXECUTION}/complete"): {
        **_ID, **BODY, 409: ("already_ended",),
        422: ("malformed_json", "invalid_input", "invalid_json")},
    ("POST", f"{EXECUTION}/fail"): {
        **_ID, **BODY, 409: ("already_ended",),
        422: ("malformed_json", "invalid_input", "invalid_json")},
    ("PUT", f"{EXECUTION}/resolve"): {
        **_ID, **BODY, 409: ("wrong_state", "engine_not_confirmed"),
        422: ("malformed_json", "invalid_input", "invalid_json", "invalid_action",
              "invalid_force", "invalid_reason")},
    ("GET", "/v1/workers"): {422: ("invalid_input",)},
    ("GET", "/v1/crons"): {},
    ("GET", "/v1/deployments"): {},
    ("POST", "/v1/deployments/{deployment_id}/adopt"): {
        **BODY, 404: ("not_found",), 409: ("deployment_live", "unknown_target"),
        422: ("malformed_json", "invalid_input", "invalid_json", "same_deployment",
              "invalid_ffqn_prefix", "invalid_deployment_id")},
}
"""(method, path) -> the errors the route answers by itself: status -> codes."""

_ERROR_SCHEMA = {"content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/ErrorOut"}}}}


def listed_errors(method: str, path: str) -> dict[int, tuple[str, ...]]:
    """Every error status the route can answer, with its codes."""
    errors = dict(ROUTE_ERRORS[(method, path)])
    access = ROUTE_ACCESS[(method, path)]
    if access is Unscoped.CALLBACK:
        errors[401] = ("unauthorized",)
    elif access is not Unscoped.OPEN:
        errors[401] = ("unauthorized",)
        errors[403] = ("forbidden",)
    # the middleware's, before any route: a body over max_payload_bytes on any request
    # (BodySizeLimit), a body declared not JSON on a write under /v1 (JsonBodies), whether
    # or not the route reads a body
    errors.setdefault(413, BODY[413])
    if method in JsonBodies.METHODS and path.startswith("/v1/"):
        errors.setdefault(415, BODY[415])
    if path != "/metrics":
        errors[503] = ("database_unavailable",)
    return dict(sorted(errors.items()))


def _describe(status: int, codes: tuple[str, ...]) -> str:
    return ", ".join(f"`{c}`" for c in codes) + {
        401: " (no API token, or an unknown, expired or revoked one; a callback without "
             "its execution's token)",
        403: " (the token lacks the route's scope)",
        503: " (the database does not answer; with Retry-After)",
    }.get(status, "")


def _links(schema: dict[str, Any]) -> None:
    """A submission's answer links to every operation on that execution (its id), so that
    clients and API fuzzers can follow it."""
    targets = {}
    for path, operations in schema.get("paths", {}).items():
        if path.startswith(EXECUTION):
            for operation in operations.values():
                targets[operation["operationId"].split("_v1_")[0]] = {
                    "operationId": operation["operationId"],
                    "parameters": {"execution_id": "$response.body#/id"}}
    submit = schema["paths"]["/v1/executions"]["post"]["responses"]
    for status in ("200", "201"):
        submit[status]["links"] = dict(sorted(targets.items()))


def finish_document(schema: dict[str, Any], workflows: Collection[str] = ()
                    ) -> dict[str, Any]:
    """Each operation gets its summary and exactly its listed errors (README, errors); the
    workflows the server runs are examples of a submission's ``ffqn``; a submission links
    to the operations on the execution it made."""
    # the bodies routes read themselves (veracity/api/bodies.py), as FastAPI lists others
    schema.setdefault("components", {}).setdefault("schemas", {}).update(bodies.schemas())
    if workflows:
        submit = schema["components"]["schemas"]["SubmitRequest"]["properties"]["ffqn"]
        submit["examples"] = sorted(workflows)[:MAX_EXAMPLES]
    _links(schema)
    _, defs = models_json_schema([(ErrorOut, "serialization")],
                                 ref_template="#/components/schemas/{model}")
    schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            key = (method.upper(), path)
            if key not in ROUTE_ERRORS:
                continue
            operation["summary"] = ROUTE_SUMMARIES[key]
            errors = listed_errors(*key)
            responses = operation.setdefault("responses", {})
            for status in list(responses):
                if int(status) >= 400 and int(status) not in errors:
                    del responses[status]
            for status, codes in errors.items():
                responses[str(status)] = {"description": _describe(status, codes),
                                          **_ERROR_SCHEMA}
            operation["responses"] = dict(sorted(responses.items()))
    schemas = schema["components"]["schemas"]
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422, not used
        if name in schemas and f"#/components/schemas/{name}" not in json.dumps(
                {k: v for k, v in schema.items()} | {"components": {
                    "schemas": {n: d for n, d in schemas.items() if n != name}}}):
            del schemas[name]
    return schema
