"""Bad input, on both backends: every refusal is a 4xx JSON ``{"error": {code, message}}``,
never a 500 nor a stack trace, and nothing is written to the database.

The big tables run every case in one test per backend (a fresh database per case would
cost more than the cases) and report every failing case at once.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from tests.api.conftest import MAX_PAYLOAD, count_executions, stable
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.models import ExecutionFilter
from veracity.store import Store

ORDERS = "shop:orders/process.run"
JSON_HEADERS = {"content-type": "application/json"}
A_UUID = "01890a5d-ac96-774b-bcce-b302099a8057"
LEAKS = ("Traceback", 'File "', "site-packages", '.py", line')

Case = tuple[dict[str, Any], int, str | None]


def error_problems(response: httpx.Response, status: int, code: str | None = None) -> list[str]:
    """What is wrong with ``response`` as the documented JSON error (empty if nothing)."""
    problems: list[str] = []
    if response.status_code != status:
        problems.append(f"status {response.status_code}, expected {status}")
    if not response.headers.get("content-type", "").startswith("application/json"):
        problems.append(f"content-type {response.headers.get('content-type')!r}")
    try:
        body = response.json()
    except ValueError:
        return [*problems, "body is not JSON"]
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(error, dict):
        return [*problems, "body is not {'error': {...}}"]
    for key in ("code", "message"):
        if not isinstance(error.get(key), str) or not error[key]:
            problems.append(f"error.{key} missing or empty")
    if code is not None and error.get("code") != code:
        problems.append(f"code {error.get('code')!r}, expected {code!r}")
    problems += [f"body leaks {leak!r}" for leak in LEAKS if leak in response.text]
    return problems


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    problems = error_problems(response, status, code)
    assert not problems, f"{problems}: {response.text[:300]}"


async def check_cases(
    client: httpx.AsyncClient, store: Store, method: str, url: str,
    cases: dict[str, Case],
) -> None:
    """Send each case; collect every problem (wrong answer, a write, a poisoned list)."""
    failures: list[str] = []
    for name, (kwargs, status, code) in cases.items():
        before = await count_executions(store)
        response = await client.request(method, url, **kwargs)
        problems = error_problems(response, status, code)
        after = await count_executions(store)
        if after != before:
            problems.append(f"{after - before} execution(s) written")
        listed = await client.get("/v1/executions", params={"limit": 1000})
        if listed.status_code != 200:
            problems.append(f"listing afterwards answers {listed.status_code}")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)} -- {response.text[:200]}")
    assert not failures, "\n" + "\n".join(failures)


@pytest.fixture
async def seeded(client: httpx.AsyncClient, store: Store) -> dict[str, Any]:
    """One execution that exists (so bad input has something to collide with)."""
    response = await client.post(
        "/v1/executions", json={"ffqn": ORDERS, "params": ["o-0"], "idempotency_key": "seed"}
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def raw(body: bytes) -> dict[str, Any]:
    return {"content": body, "headers": JSON_HEADERS}


def body_with(**fields: Any) -> dict[str, Any]:
    return {"json": {"ffqn": ORDERS, "params": ["o-1"], **fields}}


# -- submissions -------------------------------------------------------------------------

POST_CASES: dict[str, Case] = {
    # malformed JSON
    "truncated-json": (raw(b'{"ffqn": "shop:orders/process.run", "params": ['), 422,
                       "malformed_json"),
    "trailing-garbage": (raw(b'{"ffqn": "shop:orders/process.run"} x'), 422, "malformed_json"),
    "single-quotes": (raw(b"{'ffqn': 'shop:orders/process.run'}"), 422, "malformed_json"),
    "not-utf8": (raw(b'{"ffqn": "\xff\xfe"}'), 422, "malformed_json"),
    # not an object
    "array-body": ({"json": [ORDERS, ["o-1"]]}, 422, None),
    "string-body": ({"json": "shop:orders/process.run"}, 422, None),
    "number-body": ({"json": 42}, 422, None),
    "null-body": (raw(b"null"), 422, None),
    "empty-body": (raw(b""), 422, None),
    # wrong types
    "ffqn-int": ({"json": {"ffqn": 42, "params": []}}, 422, "invalid_input"),
    "ffqn-null": ({"json": {"ffqn": None, "params": []}}, 422, "invalid_input"),
    "ffqn-list": ({"json": {"ffqn": [ORDERS], "params": []}}, 422, "invalid_input"),
    "ffqn-missing": ({"json": {"params": []}}, 422, "invalid_input"),
    "params-object": (body_with(params={"order_id": "o-1"}), 422, "invalid_params"),
    "params-string": (body_with(params="o-1"), 422, "invalid_params"),
    "params-number": (body_with(params=1), 422, "invalid_params"),
    "params-null": (body_with(params=None), 422, "invalid_params"),
    "key-int": (body_with(idempotency_key=7), 422, "invalid_input"),
    "key-empty": (body_with(idempotency_key=""), 422, "invalid_input"),
    "key-too-long": (body_with(idempotency_key="k" * 257), 422, "invalid_input"),
    "key-list": (body_with(idempotency_key=["k"]), 422, "invalid_input"),
    "scheduled-at-bool": (body_with(scheduled_at=True), 422, "invalid_input"),
    # paused is a JSON boolean: 0, 1 and "true" are not (found by schemathesis)
    "paused-zero": (body_with(paused=0), 422, "invalid_input"),
    "paused-one": (body_with(paused=1), 422, "invalid_input"),
    "paused-string": (body_with(paused="true"), 422, "invalid_input"),
    "scheduled-at-list": (body_with(scheduled_at=["2030-01-01T00:00:00Z"]), 422,
                          "invalid_input"),
    "scheduled-at-object": (body_with(scheduled_at={"at": "2030-01-01T00:00:00Z"}), 422,
                            "invalid_input"),
    # unknown extra field
    "extra-field": (body_with(priority=5), 422, "invalid_input"),
    "misspelt-field": ({"json": {"ffqn": ORDERS, "param": ["o-1"]}}, 422, "invalid_input"),
    # invalid workflow names
    "ffqn-empty": (body_with(ffqn=""), 422, "invalid_ffqn"),
    "ffqn-no-namespace": (body_with(ffqn="orders/process.run"), 422, "invalid_ffqn"),
    "ffqn-no-function": (body_with(ffqn="shop:orders/process"), 422, "invalid_ffqn"),
    "ffqn-upper-case": (body_with(ffqn="Shop:orders/process.run"), 422, "invalid_ffqn"),
    "ffqn-spaces": (body_with(ffqn=" shop:orders/process.run"), 422, "invalid_ffqn"),
    "ffqn-too-long": (body_with(ffqn="shop:orders/process." + "r" * 600), 422, "invalid_ffqn"),
    "ffqn-nul": (body_with(ffqn="shop:orders/process.run\u0000"), 422, "invalid_ffqn"),
    # unknown workflows
    "unknown-workflow": (body_with(ffqn="shop:orders/process.nope"), 422, "unknown_workflow"),
    "unknown-namespace": (body_with(ffqn="other:orders/process.run"), 422, "unknown_workflow"),
    "not-quite-cancellable": (body_with(ffqn="shop:monitor/stock.run"), 422,
                              "unknown_workflow"),
    # invalid scheduled_at
    "scheduled-at-not-a-date": (body_with(scheduled_at="tomorrow"), 422, None),
    "scheduled-at-empty": (body_with(scheduled_at=""), 422, None),
    "scheduled-at-no-timezone": (body_with(scheduled_at="2030-01-01T00:00:00"), 422, None),
    "scheduled-at-date-only": (body_with(scheduled_at="2030-01-01"), 422, None),
    "scheduled-at-feb-30": (body_with(scheduled_at="2030-02-30T00:00:00Z"), 422, None),
    "scheduled-at-year-10000": (body_with(scheduled_at="10000-01-01T00:00:00Z"), 422, None),
    "scheduled-at-end-of-9999": (body_with(scheduled_at="9999-12-31T23:59:59Z"), 422,
                                 "invalid_time"),
    "scheduled-at-year-1900": (body_with(scheduled_at="1900-01-01T00:00:00Z"), 422,
                               "invalid_time"),
    "scheduled-at-year-1": (body_with(scheduled_at="0001-01-01T00:00:00+00:00"), 422,
                            "invalid_time"),
    # values JSON cannot carry: Python's json module reads them, the API must not store them
    "params-nan": (raw(b'{"ffqn": "shop:orders/process.run", "params": [NaN]}'), 422, None),
    "params-infinity": (raw(b'{"ffqn": "shop:orders/process.run", "params": [-Infinity]}'),
                        422, None),
    "params-nested-nan": (raw(b'{"ffqn": "shop:orders/process.run", "params": [{"a": NaN}]}'),
                          422, None),
    "params-lone-surrogate": (raw(b'{"ffqn": "shop:orders/process.run", "params": ["\\ud800"]}'),
                              422, None),
    "key-lone-surrogate": (
        raw(b'{"ffqn": "shop:orders/process.run", "params": [], "idempotency_key": "\\udfff"}'),
        422, None),
    # the seeded key with a different body
    "seeded-key-other-params": (body_with(idempotency_key="seed"), 409, "idempotency_conflict"),
    "seeded-key-bad-time": (body_with(params=["o-0"], idempotency_key="seed",
                                      scheduled_at="soon"), 422, None),
}


async def test_bad_submissions_are_refused_and_write_nothing(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    await check_cases(client, store, "POST", "/v1/executions", POST_CASES)
    got = await client.get(f"/v1/executions/{seeded['id']}")
    assert stable(got.json()) == stable(seeded)


# every endpoint that takes a body: (method, path with {id} for the seeded execution)
BODY_ENDPOINTS = [
    ("POST", "/v1/executions"),
    ("POST", "/v1/executions/batch"),
    ("PUT", "/v1/executions/cancel"),
    ("POST", "/v1/executions/{id}/messages"),
    ("POST", "/v1/executions/{id}/complete"),
    ("POST", "/v1/executions/{id}/fail"),
    ("PUT", "/v1/executions/{id}/resolve"),
    ("PUT", "/v1/executions/{id}/pause"),
    ("POST", "/v1/deployments/{id}/adopt"),
]

NOT_JSON: dict[str, bytes] = {
    "truncated": b'{"topic": "t", "payload": [',
    "unclosed-object": b"{",
    "trailing-garbage": b'{"topic": "t"} x',
    "two-documents": b'{"topic": "t"}{"topic": "t"}',
    "single-quotes": b"{'topic': 't'}",
    "trailing-comma": b'{"topic": "t",}',
    "unquoted-key": b"{topic: 1}",
    "bare-word": b"nope",
    "not-utf8": b'{"topic": "\xff\xfe"}',
    "latin-1": '{"topic": "caf\u00e9"}'.encode("latin-1"),
    "utf16-bom-only": b"\xff\xfe",
    "nul-byte": b'{"topic": "t"}\x00',
}


def test_the_body_endpoint_list_is_complete(api: FastAPI) -> None:
    """Every route that reads a body is in BODY_ENDPOINTS (a new one must be added): those
    FastAPI reads, and those that read theirs themselves (veracity/api/bodies.py)."""
    with_body = {
        (method, route.path.replace("{execution_id}", "{id}").replace("{deployment_id}", "{id}"))
        for route in api.routes
        if isinstance(route, APIRoute) and (route.body_field is not None
                                            or "requestBody" in (route.openapi_extra or {}))
        for method in route.methods or ()
    }
    assert with_body == set(BODY_ENDPOINTS)


async def test_a_body_that_is_not_json_is_422_on_every_endpoint(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    seeded_id = uuid.UUID(seeded["id"])
    history = await store.history_list(seeded_id)
    failures: list[str] = []
    for method, path in BODY_ENDPOINTS:
        url = path.format(id=seeded["id"])
        cases: dict[str, Case] = {
            f"{method} {path} {name}": (raw(body), 422, "malformed_json")
            for name, body in NOT_JSON.items()
        }
        # a charset parameter or a +json type is still JSON
        cases[f"{method} {path} charset"] = (
            {"content": b"{", "headers": {"content-type": "application/json; charset=utf-8"}},
            422, "malformed_json")
        cases[f"{method} {path} problem+json"] = (
            {"content": b"{", "headers": {"content-type": "application/problem+json"}},
            422, "malformed_json")
        try:
            await check_cases(client, store, method, url, cases)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)
    assert await store.history_list(seeded_id) == history
    assert await count_executions(store) == 1


async def test_a_body_nested_too_deeply_to_parse_is_422(
    service: ExecutionService, store: Store
) -> None:
    # past the JSON parser's recursion limit (about 1000 levels), under the size limit
    api = create_api(service, max_payload_bytes=200_000)
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for depth in (5_000, 50_000):
            body = b'{"ffqn": "shop:orders/process.run", "params": ' + b"[" * depth
            body += b"]" * depth + b"}"
            response = await client.post("/v1/executions", content=body, headers=JSON_HEADERS)
            assert_error(response, 422, "invalid_json")
    assert await count_executions(store) == 0


async def test_payload_over_the_limit_with_content_length(
    client: httpx.AsyncClient, store: Store
) -> None:
    body = json.dumps({"ffqn": ORDERS, "params": ["x" * MAX_PAYLOAD]}).encode()
    response = await client.post("/v1/executions", content=body, headers=JSON_HEADERS)
    assert_error(response, 413, "payload_too_large")
    assert await count_executions(store) == 0


async def test_invalid_content_length_is_400(client: httpx.AsyncClient, store: Store) -> None:
    body = json.dumps({"ffqn": ORDERS, "params": []}).encode()
    response = await client.post("/v1/executions", content=body,
                                 headers={**JSON_HEADERS, "content-length": "not-a-number"})
    assert_error(response, 400)
    assert await count_executions(store) == 0


async def test_payload_over_the_limit_in_a_chunked_body(
    client: httpx.AsyncClient, store: Store
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"ffqn": "shop:orders/process.run", "params": ["'
        for _ in range(10):
            yield b"x" * 500
        yield b'"]}'

    response = await client.post("/v1/executions", content=chunks(), headers=JSON_HEADERS)
    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert_error(response, 413, "payload_too_large")
    assert await count_executions(store) == 0


async def test_chunked_body_under_the_limit_is_accepted(
    client: httpx.AsyncClient, store: Store
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"ffqn": "shop:orders/process.run", '
        yield b'"params": ["o-1", 5]}'

    response = await client.post("/v1/executions", content=chunks(), headers=JSON_HEADERS)
    assert response.status_code == 201, response.text
    assert await count_executions(store) == 1


async def refused_or_kept(client: httpx.AsyncClient, store: Store,
                          request: dict[str, Any]) -> httpx.Response:
    """Either a 422 that wrote nothing, or a 201 whose execution reads back intact: a
    value one backend cannot store must be refused up front, never a 500."""
    response = await client.post("/v1/executions", json=request)
    if response.status_code == 201:
        got = await client.get(f"/v1/executions/{response.json()['id']}")
        assert got.status_code == 200, got.text
        assert stable(got.json()) == stable(response.json())
        for key in ("params", "idempotency_key"):
            if key in request:
                assert got.json()[key] == request[key]
        assert await count_executions(store) == 1
    else:
        assert_error(response, 422)
        assert await count_executions(store) == 0
    listed = await client.get("/v1/executions")
    assert listed.status_code == 200, listed.text
    return response


async def test_nul_character_in_params(client: httpx.AsyncClient, store: Store) -> None:
    # PostgreSQL's jsonb cannot hold U+0000 inside a string
    await refused_or_kept(client, store, {"ffqn": ORDERS, "params": ["a\u0000b"]})


@pytest.mark.parametrize("key", ["\u0000", "k\u0000ey"])
async def test_nul_character_in_idempotency_key(
    client: httpx.AsyncClient, store: Store, key: str
) -> None:
    # PostgreSQL's text cannot hold NUL; SQLite's length() stops at it
    await refused_or_kept(client, store, {"ffqn": ORDERS, "params": [], "idempotency_key": key})


async def test_deeply_nested_params_do_not_break_the_api(
    client: httpx.AsyncClient, store: Store
) -> None:
    # 900 levels fit well under the 2048-byte limit
    body = b'{"ffqn": "shop:orders/process.run", "params": ' + b"[" * 900 + b"]" * 900 + b"}"
    assert len(body) < MAX_PAYLOAD
    response = await client.post("/v1/executions", content=body, headers=JSON_HEADERS)
    if response.status_code == 201:
        got = await client.get(f"/v1/executions/{response.json()['id']}")
        assert got.status_code == 200, got.text
    else:
        assert_error(response, 422)
        assert await count_executions(store) == 0
    listed = await client.get("/v1/executions")
    assert listed.status_code == 200, listed.text


# -- ids ----------------------------------------------------------------------------------

BAD_IDS = ["nope", "123", "x" * 100, A_UUID[:-1], A_UUID + "0", "%00", "%20", "-1"]


async def test_malformed_ids_are_400(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    failures: list[str] = []
    for bad in BAD_IDS:
        for url in (f"/v1/executions/{bad}", f"/v1/executions/{bad}/history"):
            problems = error_problems(await client.get(url), 400, "invalid_id")
            if problems:
                failures.append(f"{url[:60]}: {problems}")
    assert not failures, failures
    assert await count_executions(store) == 1


async def test_unknown_id_is_404(client: httpx.AsyncClient, seeded: dict[str, Any]) -> None:
    other = str(uuid.uuid4())
    assert_error(await client.get(f"/v1/executions/{other}"), 404, "not_found")
    assert_error(await client.get(f"/v1/executions/{other}/history"), 404, "not_found")


# -- list queries ---------------------------------------------------------------------------


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def cursor_case(cursor: str) -> Case:
    return {"params": {"cursor": cursor}}, 400, "invalid_cursor"


BAD_CURSORS: dict[str, Case] = {
    "garbage": cursor_case("!!!not a cursor!!!"),
    "tilde": cursor_case("abc~def"),
    "one-char": cursor_case("A"),
    "non-ascii": cursor_case("\u00e9\u00e9\u00e9\u00e9"),
    "base64-of-text": cursor_case(b64("hello, world")),
    "base64-of-binary": cursor_case(base64.urlsafe_b64encode(bytes(range(200, 256))).decode()),
    "json-object": cursor_case(b64('{"created_at": "2030-01-01T00:00:00+00:00", "id": "x"}')),
    "json-number": cursor_case(b64("5")),
    "json-null": cursor_case(b64("null")),
    "json-empty-list": cursor_case(b64("[]")),
    "json-three-items": cursor_case(b64(f'["2030-01-01T00:00:00+00:00", "{A_UUID}", 1]')),
    "naive-time": cursor_case(b64(f'["2030-01-01T00:00:00", "{A_UUID}"]')),
    "not-a-time": cursor_case(b64(f'["yesterday", "{A_UUID}"]')),
    "time-a-number": cursor_case(b64(f'[1, "{A_UUID}"]')),
    "not-a-uuid": cursor_case(b64('["2030-01-01T00:00:00+00:00", "not-a-uuid"]')),
    "uuid-null": cursor_case(b64('["2030-01-01T00:00:00+00:00", null]')),
    "uuid-a-number": cursor_case(b64('["2030-01-01T00:00:00+00:00", 5]')),
    "uuid-a-list": cursor_case(b64('["2030-01-01T00:00:00+00:00", [1]]')),
    "uuid-an-object": cursor_case(b64('["2030-01-01T00:00:00+00:00", {"a": 1}]')),
}


async def test_invalid_list_cursors_are_400(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    await check_cases(client, store, "GET", "/v1/executions", BAD_CURSORS)


def query_case(code: str | None = None, **query: Any) -> Case:
    return {"params": query}, 422, code


BAD_LIST_QUERIES: dict[str, Case] = {
    "limit-0": query_case(limit=0),
    "limit-1001": query_case(limit=1001),
    "limit-negative": query_case(limit=-1),
    "limit-abc": query_case(limit="abc"),
    "limit-empty": query_case(limit=""),
    "limit-huge": query_case(limit="9" * 30),
    "limit-fraction": query_case(limit="2.5"),
    "status-unknown": query_case("invalid_status", status="bogus"),
    "status-one-unknown": query_case("invalid_status", status="pending,bogus"),
    "status-wrong-case": query_case("invalid_status", status=["pending", "Pending"]),
    "flagged-one": query_case(flagged="1"),
    "flagged-yes": query_case(flagged="yes"),
    "flagged-upper": query_case(flagged="True"),
    "flagged-empty": query_case(flagged=""),
    "created-after-not-a-time": query_case(created_after="yesterday"),
    "created-after-no-timezone": query_case(created_after="2030-01-01T00:00:00"),
    "created-before-year-1900": query_case(created_before="1900-01-01T00:00:00Z"),
    "created-before-year-10000": query_case(created_before="10000-01-01T00:00:00Z"),
}


async def test_invalid_list_queries_are_422(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    await check_cases(client, store, "GET", "/v1/executions", BAD_LIST_QUERIES)


@pytest.mark.parametrize("field", ["ffqn_prefix", "deployment_id"])
async def test_odd_filter_text_never_fails(
    client: httpx.AsyncClient, seeded: dict[str, Any], field: str
) -> None:
    failures: list[str] = []
    for value in ["\u00e9\u2713", "x" * 100, "'; drop table x; --", "a\u0000b"]:
        response = await client.get("/v1/executions", params={field: value})
        if response.status_code == 200:
            if response.json() != {"items": [], "next_cursor": None}:
                failures.append(f"{value!r}: matched {response.text[:100]}")
        elif problems := error_problems(response, 422):
            failures.append(f"{value!r}: {problems}")
    assert not failures, failures


# -- history queries --------------------------------------------------------------------------


async def test_invalid_history_cursors_are_400(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    # the same code as the list endpoint's invalid cursor, so the same status (400)
    cases = {repr(c): cursor_case(c) for c in ["abc", "-1", "1.5", " 1", "0x10", "1e3"]}
    await check_cases(client, store, "GET", f"/v1/executions/{seeded['id']}/history", cases)


@pytest.mark.parametrize("cursor", ["\u00b2", "\u0661", "\uff11"])
async def test_non_ascii_digits_are_not_a_history_cursor(
    client: httpx.AsyncClient, seeded: dict[str, Any], cursor: str
) -> None:
    # str.isdigit() says yes to these; int() then fails
    response = await client.get(f"/v1/executions/{seeded['id']}/history",
                                params={"cursor": cursor})
    assert response.status_code in (400, 422), response.text
    assert_error(response, response.status_code, "invalid_cursor")


async def test_empty_history_cursor(client: httpx.AsyncClient, seeded: dict[str, Any]) -> None:
    response = await client.get(f"/v1/executions/{seeded['id']}/history", params={"cursor": ""})
    if response.status_code == 200:  # no cursor, as the list endpoint reads it
        assert [e["kind"] for e in response.json()["items"]] == ["pending"]
    else:
        assert response.status_code in (400, 422), response.text
        assert_error(response, response.status_code, "invalid_cursor")


async def test_history_cursor_beyond_64_bits(
    client: httpx.AsyncClient, seeded: dict[str, Any]
) -> None:
    response = await client.get(f"/v1/executions/{seeded['id']}/history",
                                params={"cursor": "9" * 20})
    if response.status_code == 200:  # past the last event: an empty page
        assert response.json() == {"items": [], "next_cursor": None}
    else:
        assert response.status_code in (400, 422), response.text
        assert_error(response, response.status_code, "invalid_cursor")


async def test_invalid_history_limits_are_422(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    cases = {str(limit): query_case(limit=limit) for limit in [0, -1, 10_001, "abc", "1.5"]}
    await check_cases(client, store, "GET", f"/v1/executions/{seeded['id']}/history", cases)


# -- routes and methods -----------------------------------------------------------------------


async def test_unknown_routes_are_404_json(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    cases: dict[str, Case] = {}
    for path in ["/nope", "/v1", "/v1/nope", f"/v1/executions/{A_UUID}/nope", "/v2/executions",
                 "/v1/executions/a/b/c"]:
        cases[path] = ({"url": path}, 404, "not_found")
    failures: list[str] = []
    for name, (kwargs, status, code) in cases.items():
        for method in ("GET", "POST"):
            response = await client.request(method, kwargs["url"], json={})
            if problems := error_problems(response, status, code):
                failures.append(f"{method} {name}: {problems}")
    assert not failures, failures
    assert await count_executions(store) == 1


async def test_wrong_methods_are_405_json(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    failures: list[str] = []
    for method, path in [
        ("DELETE", "/v1/executions"),
        ("PUT", "/v1/executions"),
        ("PATCH", "/v1/executions"),
        ("DELETE", f"/v1/executions/{seeded['id']}"),
        ("POST", f"/v1/executions/{seeded['id']}"),
        ("POST", f"/v1/executions/{seeded['id']}/history"),
        ("POST", "/healthz"),
    ]:
        response = await client.request(method, path, json={"ffqn": ORDERS})
        if problems := error_problems(response, 405, "method_not_allowed"):
            failures.append(f"{method} {path}: {problems}")
    assert not failures, failures
    assert await count_executions(store) == 1


async def test_405_says_which_methods_are_allowed(client: httpx.AsyncClient) -> None:
    # RFC 9110 section 15.5.6: a 405 response MUST carry an Allow header
    response = await client.delete("/v1/executions")
    assert_error(response, 405, "method_not_allowed")
    allowed = {m.strip() for m in response.headers.get("allow", "").split(",")}
    assert {"GET", "POST"} <= allowed, dict(response.headers)


async def test_a_json_body_without_a_content_type_is_taken_as_json(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/executions", content=json.dumps(
        {"ffqn": "shop:mail/send.run", "params": ["a", "b"]}).encode())
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("content_type", [
    "application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"])
async def test_a_body_declared_as_not_json_is_415_with_a_hint(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any], content_type: str
) -> None:
    """``curl -d`` sends form encoding; a browser's cross-site form or text/plain post is not
    taken either. Nothing is written."""
    before = await store.execution_list(ExecutionFilter(), limit=100)
    for path in ("/v1/executions", f"/v1/executions/{seeded['id']}/messages"):
        response = await client.post(path, content=b'{"ffqn": "shop:mail/send.run"}',
                                     headers={"content-type": content_type})
        assert response.status_code == 415, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_media_type"
        assert "-H 'content-type: application/json'" in error["message"]
    # a write that takes no body is refused the same, before it runs (the document lists
    # 415 on every write under /v1: tests/api/test_openapi.py)
    response = await client.put(f"/v1/executions/{seeded['id']}/unpause", content=b"hello",
                                headers={"content-type": content_type})
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert await store.execution_list(ExecutionFilter(), limit=100) == before


async def test_a_body_over_the_limit_is_413_on_any_route(
    client: httpx.AsyncClient, store: Store, seeded: dict[str, Any]
) -> None:
    """The limit is the middleware's, before any route: a route that reads no body refuses
    one over it too (the document lists 413 on every route), and nothing changes."""
    before = await store.execution_list(ExecutionFilter(), limit=100)
    big = json.dumps({"pad": "x" * (MAX_PAYLOAD + 10)}).encode()
    for method, path in [("GET", "/healthz"), ("GET", "/v1/executions"),
                         ("PUT", f"/v1/executions/{seeded['id']}/cancel"),
                         ("PUT", f"/v1/executions/{seeded['id']}/retry")]:
        response = await client.request(method, path, content=big,
                                        headers={"content-type": "application/json"})
        assert response.status_code == 413, (method, path, response.text)
        assert response.json()["error"]["code"] == "payload_too_large"
    assert await store.execution_list(ExecutionFilter(), limit=100) == before
