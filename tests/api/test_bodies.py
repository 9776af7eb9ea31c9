"""A body read by the route itself (veracity/api/bodies.py) is answered exactly as FastAPI
answers the same body declared as a model parameter: two routes of one app, one of each
kind (the hand-read one a ``PlainRoute``, as ``POST /v1/executions``), with the API's error
handlers, get the same bodies and must give the same answers; and the OpenAPI document
lists the hand-read body as FastAPI lists the declared one."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from veracity.api.bodies import PlainRoute, declared, read_body, schemas
from veracity.api.errors import install_error_handlers
from veracity.api.schemas import SubmitRequest


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/declared")
    async def by_fastapi(body: SubmitRequest) -> dict[str, Any]:
        return body.model_dump(mode="json")

    async def by_hand(request: Request) -> Response:
        body = await read_body(request, SubmitRequest)
        return JSONResponse(body.model_dump(mode="json"))

    # run as POST /v1/executions is: by Starlette's request handling, not FastAPI's
    app.router.add_api_route("/read", by_hand, methods=["POST"], route_class_override=PlainRoute,
                      openapi_extra=declared(SubmitRequest))
    return app


JSON = "application/json"

BODIES: dict[str, tuple[bytes, str | None]] = {
    "valid": (b'{"ffqn": "a:b/c.d", "params": [1, "x"]}', JSON),
    "valid, every field": (b'{"ffqn": "a:b/c.d", "params": [], "idempotency_key": "k", '
                           b'"scheduled_at": "2030-01-01T00:00:00Z", "paused": true}', JSON),
    "valid, a charset": (b'{"ffqn": "a:b/c.d"}', "application/json; charset=utf-8"),
    "valid, a +json type": (b'{"ffqn": "a:b/c.d"}', "application/vnd.veracity+json"),
    "valid, utf-16": ('{"ffqn": "a:b/c.d"}'.encode("utf-16"), JSON),
    "empty": (b"", JSON),
    "null": (b"null", JSON),
    "a list": (b"[1, 2]", JSON),
    "a string": (b'"x"', JSON),
    "a number": (b"3", JSON),
    "truncated": (b'{"ffqn": "a:b/c.d", "params": [', JSON),
    "trailing garbage": (b'{"ffqn": "a:b/c.d"} x', JSON),
    "single quotes": (b"{'ffqn': 'a:b/c.d'}", JSON),
    "not utf-8": (b'{"ffqn": "\xff\xfe"}', JSON),
    "a bom alone": (b"\xff\xfe", JSON),
    "nested too deeply": (b'{"ffqn": "a:b/c.d", "params": ' + b"[" * 100_000 + b"]" * 100_000
                          + b"}", JSON),
    # Python's json takes NaN, and so the model; the service refuses it (invalid_json)
    "valid to the model, NaN": (b'{"ffqn": "a:b/c.d", "params": [NaN]}', JSON),
    "missing ffqn": (b'{"params": []}', JSON),
    "an unknown field": (b'{"ffqn": "a:b/c.d", "priority": 1}', JSON),
    "wrong types": (b'{"ffqn": 1, "params": {}, "paused": "yes", "idempotency_key": ""}',
                    JSON),
    "a time without offset": (b'{"ffqn": "a:b/c.d", "scheduled_at": "2030-01-01T00:00"}',
                              JSON),
    "a text type": (b'{"ffqn": "a:b/c.d"}', "text/plain"),
    "a text +json type": (b'{"ffqn": "a:b/c.d"}', "text/x+json"),
    "no type": (b'{"ffqn": "a:b/c.d"}', None),
}


@pytest.fixture
async def client() -> Any:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


@pytest.mark.parametrize("name", list(BODIES))
async def test_a_body_read_by_hand_is_answered_as_fastapi_answers_it(
        client: httpx.AsyncClient, name: str) -> None:
    content, content_type = BODIES[name]
    headers = {"content-type": content_type} if content_type else {}
    by_fastapi = await client.post("/declared", content=content, headers=headers)
    by_hand = await client.post("/read", content=content, headers=headers)
    assert (by_hand.status_code, by_hand.json()) == (by_fastapi.status_code, by_fastapi.json())
    if name.startswith("valid"):
        assert by_hand.status_code == 200 and by_hand.json()["ffqn"] == "a:b/c.d"
    else:
        assert by_hand.status_code in (400, 422), by_hand.text


def test_the_document_lists_a_hand_read_body_as_fastapi_lists_a_declared_one() -> None:
    document = _app().openapi()
    by_fastapi = document["paths"]["/declared"]["post"]["requestBody"]
    by_hand = document["paths"]["/read"]["post"]["requestBody"]
    assert by_hand == by_fastapi
    # FastAPI wrote SubmitRequest's schema (the declared route uses it); ours is the same
    assert schemas()["SubmitRequest"] == json.loads(
        json.dumps(document["components"]["schemas"]["SubmitRequest"]))


def test_a_plain_route_takes_the_request_alone() -> None:
    app = FastAPI()

    async def two(request: Request, other: int) -> Response:
        return Response()

    with pytest.raises(TypeError, match="takes the request alone"):
        app.router.add_api_route("/two", two, methods=["POST"], route_class_override=PlainRoute)
