"""A JSON body read by the route itself, answered exactly as FastAPI answers a body
declared as a model parameter.

FastAPI reads a declared body, then solves the route's dependencies and validates the
body as one of them: on ``POST /v1/executions``, the API's busiest route, that machinery
was about a tenth of the server's CPU a submission (bench/journal.md, "Single and batch
submissions through the API"). :func:`read_body` does the same steps without it: the same parser
(``json.loads`` of the bytes, as Starlette's ``Request.json``), the same validation
(``from_attributes``, as FastAPI's), and the same errors, raised as FastAPI raises them so
that the app's handlers answer them as before (veracity/api/errors.py): a body that is
not JSON, ``422 malformed_json``; one that does not fit the model, ``422 invalid_input``
naming each field under ``body``; an empty one, ``body: Field required``. A route that
reads its body this way declares it with :func:`declared` so that the OpenAPI document
shows the same request body, and :func:`schemas` adds the models to its components; as a
:class:`PlainRoute`, it also runs without FastAPI's request handler.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.routing import request_response

M = TypeVar("M", bound=BaseModel)

_DECLARED: dict[str, type[BaseModel]] = {}
"""Models of the bodies routes read themselves, by name (their OpenAPI components)."""


def _is_json(content_type: str) -> bool:
    """As FastAPI decides it (``email.message``'s reading of the header): an
    ``application`` type whose subtype is ``json`` or ends in ``+json``."""
    media = content_type.split(";", 1)[0].strip().lower()
    main, slash, sub = media.partition("/")
    return bool(slash) and main == "application" and (sub == "json" or sub.endswith("+json"))


def _missing() -> dict[str, Any]:
    error = ValidationError.from_exception_data(
        "Field required", [{"type": "missing", "loc": ("body",), "input": {}}]
    ).errors(include_url=False)[0]
    return {**error, "input": None}


async def read_body(request: Request, model: type[M]) -> M:
    """The request's JSON body as ``model``. The body must be declared JSON (the API's
    ``JsonBodies`` middleware gives one sent without a Content-Type that type and refuses
    any other); one of another ``+json`` type the middleware lets through is, as FastAPI
    takes it, not parsed, and so not the model."""
    raw = await request.body()
    if not raw:
        raise RequestValidationError([_missing()])
    body: Any = raw
    if _is_json(request.headers.get("content-type", "")):
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestValidationError(
                [{"type": "json_invalid", "loc": ("body", exc.pos),
                  "msg": "JSON decode error", "input": {}, "ctx": {"error": exc.msg}}],
                body=exc.doc) from exc
        except Exception as exc:  # not UTF-8, nested too deep: errors.py says which
            raise HTTPException(400, "There was an error parsing the body") from exc
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)],
            body=body) from None


class PlainRoute(APIRoute):
    """A route FastAPI lists in the OpenAPI document (its response model, its declared
    body) but does not run: its endpoint takes the ``Request`` and answers a ``Response``,
    called as Starlette calls a route's endpoint (``starlette.routing.request_response``:
    the app's exception handlers still answer what it raises), without FastAPI's request
    handler around it (its exit stacks, its solving of the endpoint's parameters, its
    response model). For an endpoint that reads its body with :func:`read_body` and writes
    its own answer: ``POST /v1/executions`` (bench/journal.md, "Single and batch
    submissions through the API")."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        params = list(inspect.signature(endpoint).parameters)
        if len(params) != 1:
            raise TypeError(f"{path}: a PlainRoute's endpoint takes the request alone")
        self.app = request_response(endpoint)


def declared(model: type[BaseModel]) -> dict[str, Any]:
    """The route's ``openapi_extra``: its request body is ``model``, required, as FastAPI
    would list a body parameter of that type."""
    _DECLARED[model.__name__] = model
    return {"requestBody": {
        "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        "required": True}}


def schemas() -> dict[str, Any]:
    """The JSON schemas of the declared bodies (and of what they refer to), as FastAPI
    lists request bodies: in validation mode, without null values."""
    if not _DECLARED:
        return {}
    _, defs = models_json_schema([(m, "validation") for m in _DECLARED.values()],
                                 ref_template="#/components/schemas/{model}")
    found: dict[str, Any] = _without_none(defs.get("$defs", {}))
    return found


def _without_none(value: Any) -> Any:
    """As FastAPI writes its document (``exclude_none``): ``"default": null`` and the
    like left out."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value
