"""``waiting_reason`` of every unfinished state on ``GET /v1/executions/{id}`` and the list
(docs/states.md#why-an-execution-waits), on both backends: executions put asleep, waiting
for messages and children and paused by a real worker (in-process), then read while a
registered live worker record stands for the deployment; one claimed through the store is
running under its lease. The list is read with a fixed number of statements."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests import workflows
from tests.durable._support import DEPLOYMENT, running, submit, wait_status
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.models import Claim, Execution, ExecutionFilter, NewExecution, WorkerInfo
from veracity.store import Store
from veracity.worker.runner import Worker

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def utc(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


AGO = re.compile(r"last heartbeat was (\d+) s ago")


def _apart(reason: str | None) -> tuple[str | None, int | None]:
    """A reason without its heartbeat's age, and the age (seconds, as of the request)."""
    if reason is None:
        return None, None
    age = AGO.search(reason)
    return AGO.sub("last heartbeat was N s ago", reason), int(age[1]) if age else None


async def reasons(client: httpx.AsyncClient, ids: dict[str, uuid.UUID]) -> dict[str, Any]:
    listed = (await client.get("/v1/executions", params={"limit": 1000})).json()["items"]
    by_id = {item["id"]: item["waiting_reason"] for item in listed}
    out = {}
    for name, ident in ids.items():
        one = (await client.get(f"/v1/executions/{ident}")).json()
        # the same reason on GET and in the list; a heartbeat's age is counted at each
        # request, so the later GET may say a second or two more on a busy machine
        (text, age), (listed_text, listed_age) = _apart(one["waiting_reason"]), _apart(
            by_id[str(ident)])
        assert text == listed_text, (name, one, by_id[str(ident)])
        if age is not None and listed_age is not None:
            assert 0 <= age - listed_age <= 2, (name, one, by_id[str(ident)])
        out[name] = one["waiting_reason"]
    return out


async def test_every_unfinished_state_says_why_it_waits(
    store: Store, worker: Worker, client: httpx.AsyncClient
) -> None:
    ids: dict[str, uuid.UUID] = {}
    async with running(worker):
        ids["asleep"] = (await submit(store, "test:sleep/run.fn", 3600)).id
        ids["message"] = (await submit(store, "test:recv/run.fn", 'say "yes"')).id
        ids["message_timeout"] = (await submit(store, "test:recv/run.fn", "ok", 600)).id
        ids["children"] = (await submit(store, "test:top/top.run-cancellable", "t")).id
        ids["paused_asleep"] = (await submit(store, "test:sleep/run.fn", 7200)).id
        for name in ids:
            await wait_status(store, ids[name], Status.BLOCKED)
        response = await client.put(f"/v1/executions/{ids['paused_asleep']}/pause")
        assert response.status_code == 200, response.text
        top = await wait_status(store, ids["children"], Status.BLOCKED)
    ids["submitted_paused"] = (await submit(store, "test:echo/run.fn", 1, paused=True)).id

    # the in-process worker stopped: a worker record stands for a live one of DEPLOYMENT
    await store.worker_register(WorkerInfo(
        id="w-live", host="h", pid=1, deployment_id=DEPLOYMENT,
        ffqns=sorted(workflows.app.workflows), concurrency=1, heartbeat_interval=60))
    held = await submit(store, "test:echo/run.fn", "held")
    (claimed,) = await store.execution_claim("w-live", ["test:echo/run.fn"], limit=1,
                                             lease_ttl=timedelta(seconds=600))
    assert claimed.id == held.id
    ids["running"] = held.id
    ids["ready"] = (await submit(store, "test:echo/run.fn", "ready")).id
    later = datetime.now(UTC) + timedelta(hours=2)
    new = NewExecution(ffqn="test:echo/run.fn", params=[1], deployment_id=DEPLOYMENT,
                       id=uuid.uuid4(), scheduled_at=later)
    ids["scheduled"] = (await store.execution_submit(new)).execution.id
    other = NewExecution(ffqn="test:echo/run.fn", params=[1], deployment_id="d-gone",
                         id=uuid.uuid4())
    ids["stranded"] = (await store.execution_submit(other)).execution.id

    got = await reasons(client, ids)
    assert re.fullmatch(f"asleep until ({TIME})", got["asleep"]), got
    wake = utc(got["asleep"].removeprefix("asleep until "))
    assert timedelta(minutes=59) < wake - datetime.now(UTC) <= timedelta(hours=1)
    assert got["message"] == 'waiting for message "say \\"yes\\""'
    assert re.fullmatch(f'waiting for message "ok" until {TIME}', got["message_timeout"])
    kids = await _children(store, top)
    assert got["children"] == (
        f"waiting for 2 children ({kids[0].id}, {kids[1].id}) of join set js0")
    assert re.fullmatch(f"paused by an operator while blocked; once unpaused, asleep until "
                        f"{TIME}", got["paused_asleep"]), got
    assert got["submitted_paused"] == "submitted paused"
    assert got["ready"] == "ready: waiting for a worker to claim it"
    assert got["scheduled"] == f"scheduled for {later.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    assert got["stranded"] == "no live worker for deployment d-gone"
    m = re.fullmatch(f"held by worker w-live whose last heartbeat was (\\d+) s ago, lease "
                     f"expires at ({TIME}) and recovery will retry it by ({TIME})",
                     got["running"])
    assert m is not None, got["running"]
    assert utc(m[3]) - utc(m[2]) == timedelta(seconds=30)  # recovery.interval's default

    # a terminal execution has none, on GET and in the list
    (mine,) = await store.execution_claim("w-live", ["test:echo/run.fn"], limit=1,
                                          lease_ttl=timedelta(seconds=60))
    assert mine.id == ids["ready"]
    ended = await store.execution_complete_if_owned(
        Claim(mine.id, "w-live", mine.lease_epoch), "done")
    assert ended.applied
    assert (await reasons(client, {"done": mine.id})) == {"done": None}


async def _children(store: Store, parent: Execution) -> list[Execution]:
    listed = await store.execution_list(ExecutionFilter(), limit=1000)
    return sorted([e for e in listed if e.parent_id == parent.id],
                  key=lambda e: (e.created_at, e.id))


class Counting:
    """A store that counts the calls made to it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.store, name)


async def test_a_page_of_reasons_takes_the_same_reads_for_one_item_or_many(
    store: Store
) -> None:
    made = [await submit(store, "test:sleep/run.fn", i, paused=i % 3 == 0)
            for i in range(30)]
    counting = Counting(store)
    service = ExecutionService(counting, workflows=set(workflows.app.workflows),
                               deployment_id=DEPLOYMENT)
    one = await service.waiting_reasons(made[:1])
    calls_for_one = list(counting.calls)
    counting.calls.clear()
    many = await service.waiting_reasons(made)
    assert counting.calls == calls_for_one == ["worker_list", "db_now", "execution_waits"]
    assert len(one) == 1 and len(many) == 30


async def test_who_paused_and_why_are_recorded_and_said(
    store: Store, client: httpx.AsyncClient
) -> None:
    e = await submit(store, "test:echo/run.fn", 1)
    url = f"/v1/executions/{e.id}/pause"
    bad: list[tuple[Any, str]] = [
        ({"reason": "   "}, "invalid_reason"),
        ({"reason": "a\x00b"}, "invalid_reason"),
        ({"reason": ""}, "invalid_input"),
        ({"reason": "x" * 2001}, "invalid_input"),
        ({"by": ""}, "invalid_input"),
        ({"by": " "}, "invalid_input"),
        ({"by": "x" * 201}, "invalid_input"),
        ({"why": "typo"}, "invalid_input"),
        ({"reason": 7}, "invalid_input"),
        (b"{nope", "malformed_json"),
    ]
    for body, code in bad:
        kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        response = await client.put(url, **kw)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["code"] == code, (body, response.text)
    still = await store.execution_get(e.id)
    assert still is not None and still.status == Status.PENDING
    assert [ev.kind for ev in await store.history_list(e.id)] == ["pending"]

    response = await client.put(url, json={"by": "ada", "reason": "deploy freeze"})
    assert response.status_code == 200, response.text
    assert response.json()["waiting_reason"] is None  # the answer of a change: GET says why
    got = (await client.get(f"/v1/executions/{e.id}")).json()
    nobody = f"; no live worker for deployment {DEPLOYMENT}"  # none runs here
    assert (got["status"], got["waiting_reason"]) == (
        "paused", f"paused by ada while pending: deploy freeze{nobody}")
    (event,) = [ev for ev in await store.history_list(e.id) if ev.kind == "paused"]
    assert event.data == {"by": "ada", "from": "pending", "reason": "deploy freeze"}
    # no body at all, as before: paused by an operator
    other = await submit(store, "test:echo/run.fn", 2)
    assert (await client.put(f"/v1/executions/{other.id}/pause")).status_code == 200
    got = (await client.get(f"/v1/executions/{other.id}")).json()
    assert got["waiting_reason"] == f"paused by an operator while pending{nobody}"
