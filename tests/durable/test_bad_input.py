"""Bad input to cancel, pause, unpause and messages, on both backends: unknown ids (404),
malformed ids (400), wrong states (409 with the current state), oversize payloads (413),
bad topics and bodies (422), malformed JSON (400). Each request leaves the database as it
was (the execution row and its history)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.durable._support import (
    MAX_PAYLOAD,
    error_of,
    get,
    history,
    running,
    submit,
    wait_status,
)
from veracity.core.states import Status
from veracity.models import Execution
from veracity.store import Store
from veracity.worker.runner import Worker

ACTIONS = ("cancel", "pause", "unpause")


async def snapshot(store: Store, execution_id: uuid.UUID) -> tuple[Execution, list[Any]]:
    return await get(store, execution_id), await history(store, execution_id)


@pytest.fixture
async def blocked(store: Store, worker: Worker) -> AsyncIterator[Execution]:
    """An execution blocked on recv("t") (not cancellable), with a worker running."""
    async with running(worker):
        ex = await submit(store, "test:recv/run.fn", "t")
        yield await wait_status(store, ex.id, Status.BLOCKED)


async def post_message(client: httpx.AsyncClient, execution_id: uuid.UUID | str,
                       **kwargs: Any) -> httpx.Response:
    return await client.post(f"/v1/executions/{execution_id}/messages", **kwargs)


# -- ids -------------------------------------------------------------------------------------


async def test_unknown_ids_answer_404(client: httpx.AsyncClient, store: Store) -> None:
    unknown = uuid.uuid4()
    for action in ACTIONS:
        response = await client.put(f"/v1/executions/{unknown}/{action}")
        assert response.status_code == 404, (action, response.text)
        error = error_of(response)
        assert error["code"] == "not_found" and str(unknown) in error["message"]
    response = await post_message(client, unknown, json={"topic": "t", "payload": 1})
    assert response.status_code == 404, response.text
    assert error_of(response)["code"] == "not_found"
    assert await store.execution_get(unknown) is None
    assert await store.history_list(unknown) == []


@pytest.mark.parametrize("bad_id", [
    "not-a-uuid", "123", "0" * 65, "01234567-89ab-cdef-0123-456789abcdeg", "%20", "null",
])
async def test_malformed_ids_answer_400(client: httpx.AsyncClient, bad_id: str) -> None:
    for action in ACTIONS:
        response = await client.put(f"/v1/executions/{bad_id}/{action}")
        assert response.status_code == 400, (action, response.text)
        assert error_of(response)["code"] == "invalid_id"
    response = await post_message(client, bad_id, json={"topic": "t", "payload": 1})
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "invalid_id"


# -- wrong states ----------------------------------------------------------------------------


async def test_wrong_states_answer_409_with_the_current_state(
    client: httpx.AsyncClient, store: Store, worker: Worker
) -> None:
    async with running(worker):
        done = await submit(store, "test:echo/run.fn", 1)
        await wait_status(store, done.id, Status.COMPLETED)
        failed = await submit(store, "test:raise/run.fn")
        await wait_status(store, failed.id, Status.FAILED)
    cancelled = await submit(store, "test:waiter/wait.run-cancellable", "t", paused=True)
    assert (await store.execution_cancel(cancelled.id)).execution is not None
    pending = await submit(store, "test:echo/run.fn", 2)  # no worker runs any more

    cases: list[tuple[Execution, str, str]] = [
        (done, "pause", "completed"),
        (failed, "pause", "failed"),
        (cancelled, "pause", "cancelled"),
        (done, "unpause", "completed"),
        (pending, "unpause", "pending"),
        (done, "message", "completed"),
        (failed, "message", "failed"),
        (cancelled, "message", "cancelled"),
        (pending, "cancel", "pending"),  # not cancellable: 409 with its state too
    ]
    for ex, action, state in cases:
        before = await snapshot(store, ex.id)
        if action == "message":
            response = await post_message(client, ex.id, json={"topic": "t", "payload": 1})
        else:
            response = await client.put(f"/v1/executions/{ex.id}/{action}")
        assert response.status_code == 409, (action, state, response.text)
        error = error_of(response)
        assert error["state"] == state, (action, error)
        assert error["code"] in {"wrong_state", "not_cancellable"}, error
        if error["code"] == "wrong_state":
            assert state in error["message"]
        assert await snapshot(store, ex.id) == before, (action, state)


# -- message bodies --------------------------------------------------------------------------


async def test_oversize_message_payloads_answer_413(
    client: httpx.AsyncClient, store: Store, blocked: Execution
) -> None:
    before = await snapshot(store, blocked.id)
    big = {"topic": "t", "payload": "x" * MAX_PAYLOAD}
    response = await post_message(client, blocked.id, json=big)
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "payload_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: streamed, chunked
        body = json.dumps(big).encode()
        for i in range(0, len(body), 256):
            yield body[i:i + 256]

    response = await post_message(client, blocked.id, content=chunks(),
                                  headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "payload_too_large"
    # a body that claims to be small but is not
    response = await post_message(
        client, blocked.id, content=json.dumps(big).encode(),
        headers={"content-type": "application/json", "content-length": "10"})
    assert response.status_code in (400, 413), response.text
    assert await snapshot(store, blocked.id) == before
    # just under the limit is fine
    fits = {"topic": "t", "payload": "y" * (MAX_PAYLOAD - 100)}
    response = await post_message(client, blocked.id, json=fits)
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(("topic", "why"), [
    ("", "empty"),
    ("t" * 257, "longer than 256"),
    ("é" * 257, "257 two-byte characters"),
    ("a\x00b", "NUL"),
    (7, "a number"),
    (None, "null"),
    (["t"], "a list"),
])
async def test_bad_topics_answer_422(
    client: httpx.AsyncClient, store: Store, blocked: Execution, topic: Any, why: str
) -> None:
    before = await snapshot(store, blocked.id)
    response = await post_message(client, blocked.id, json={"topic": topic, "payload": 1})
    assert response.status_code == 422, (why, response.text)
    error = error_of(response)
    assert error["code"] in {"invalid_input", "invalid_topic"}, error
    assert "topic" in error["message"], error
    assert await snapshot(store, blocked.id) == before


@pytest.mark.parametrize("topic", ["t" * 256, "é" * 256, "\U0001f600" * 256, "a b/c:d"])
async def test_topics_up_to_256_characters_are_accepted(
    client: httpx.AsyncClient, store: Store, blocked: Execution, topic: str
) -> None:
    response = await post_message(client, blocked.id, json={"topic": topic, "payload": [1]})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["topic"] == topic and body["execution_id"] == str(blocked.id)
    arrived = [e for e in await history(store, blocked.id) if e.kind == "message_arrived"]
    assert [e.data["topic"] for e in arrived] == [topic]


@pytest.mark.parametrize(("body", "why"), [
    ([], "a list"),
    (["t", 1], "a list"),
    ("t", "a string"),
    (5, "a number"),
    (None, "null"),
    ({"payload": 1}, "no topic"),
    ({"topic": "t", "payload": 1, "extra": True}, "an unknown field"),
    ({"topic": "t", "payload": 1, "execution_id": "x"}, "an unknown field"),
])
async def test_message_bodies_that_are_not_the_schema_answer_422(
    client: httpx.AsyncClient, store: Store, blocked: Execution, body: Any, why: str
) -> None:
    before = await snapshot(store, blocked.id)
    response = await post_message(client, blocked.id, json=body)
    assert response.status_code == 422, (why, response.text)
    assert error_of(response)["code"] == "invalid_input"
    assert await snapshot(store, blocked.id) == before


@pytest.mark.parametrize("raw", [
    b"{", b"{'topic': 't'}", b'{"topic": "t",}', b"", b"\xff\xfe", b'{"topic": "t"} x',
])
async def test_malformed_json_answers_422(
    client: httpx.AsyncClient, store: Store, blocked: Execution, raw: bytes
) -> None:
    before = await snapshot(store, blocked.id)
    response = await post_message(client, blocked.id, content=raw,
                                  headers={"content-type": "application/json"})
    assert response.status_code == 422, (raw, response.text)
    if raw:  # an empty body is a missing body for FastAPI (invalid_input)
        assert error_of(response)["code"] == "malformed_json"
    assert await snapshot(store, blocked.id) == before


async def test_a_payload_may_be_any_json_value_or_left_out(
    client: httpx.AsyncClient, store: Store, blocked: Execution
) -> None:
    for payload in (None, 0, "s", [1, [2]], {"a": {"b": None}}):
        response = await post_message(client, blocked.id,
                                      json={"topic": "other", "payload": payload})
        assert response.status_code == 201, response.text
    response = await post_message(client, blocked.id, json={"topic": "other"})
    assert response.status_code == 201, response.text
    ids = [e.data["message_id"] for e in await history(store, blocked.id)
           if e.kind == "message_arrived"]
    assert len(ids) == 6 and ids == sorted(ids)
