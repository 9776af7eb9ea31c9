"""The generation reconciler (veracity.generations, docs/generations.md) against a real API
served on loopback with API tokens required, and a real worker, on each backend: two
reconcilers racing start a key twice and the next run keeps one per key; a legacy managed
execution is paused, not cancelled; managed params without the key fail the run with a
clear error and change nothing; a run cut short is repaired by the next; retiring an ended
execution is a success; the deployment is the one the run's own record names; every page of
the listing is read; the example's scopes list, cancel and pause, and nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._helpers import history, wait_status
from tests.generations._api import CURRENT, SCOPES, Running
from tests.generations._api import served as api_served
from veracity import App, Context
from veracity.api import create_api
from veracity.control import ExecutionService, TokenService
from veracity.core.states import Status
from veracity.generations import Generations, _cancel_page, _pause
from veracity.models import Execution, ExecutionFilter
from veracity.store import Store

pytestmark = pytest.mark.timeout(60)

RECONCILER = "test:gen/reconciler.run"
WORKER = "test:gen/worker.run-cancellable"
LEGACY = "test:gen/worker.run"


class Desired:
    """The desired keys."""

    def __init__(self) -> None:
        self.keys: list[Any] = []

    async def __call__(self) -> list[Any]:
        return list(self.keys)


DESIRED = Desired()
app = App("generation-tests")
Generations(reconciler=RECONCILER, managed=WORKER, binding="control_plane",
            desired_keys=DESIRED).register(app)


async def serve(ctx: Context, key: str) -> str:
    await ctx.recv("work")
    return key


PAGED = "test:gen/paged-reconciler.run"
Generations(reconciler=PAGED, managed=WORKER, binding="control_plane",
            desired_keys=DESIRED, page_size=2).register(app)

app.workflow(WORKER)(serve)
app.workflow(LEGACY)(serve)

@asynccontextmanager
async def served(store: Store, tmp_path: Path, scopes: list[str] = SCOPES
                 ) -> AsyncIterator[Running]:
    DESIRED.keys = []
    async with api_served(store, tmp_path, app, reconciler=RECONCILER, prefix=LEGACY,
                          scopes=scopes) as r:
        yield r


def keyed(executions: list[Execution]) -> dict[str, list[Execution]]:
    out: dict[str, list[Execution]] = {}
    for e in executions:
        out.setdefault(e.params[0], []).append(e)
    return out


async def test_two_racing_reconcilers_start_duplicates_the_next_run_resolves(
    store: Store, tmp_path: Path
) -> None:
    async with served(store, tmp_path) as r:
        DESIRED.keys = ["A", "B"]
        # each run's listing waits at the API until the other's has arrived too: both read
        # the executions before either has scheduled any (a race, made certain; a barrier
        # any earlier, as at the desired keys, let a slow run list after the other's
        # children were written, under load)
        both = asyncio.Barrier(2)

        async def both_list(scope: dict[str, Any]) -> None:
            if scope["method"] == "GET" and scope["path"] == "/v1/executions":
                await both.wait()

        r.gate.append(both_list)
        one, _ = await r.current.submit(RECONCILER, [])
        two, _ = await r.current.submit(RECONCILER, [])
        ended = [await wait_status(store, i, Status.COMPLETED, Status.FAILED, timeout=20)
                 for i in (one.id, two.id)]
        assert [e.result for e in ended] == ["kept 0; started 2"] * 2
        raced = keyed(await r.managed(Status.PENDING, Status.RUNNING, Status.BLOCKED))
        assert {k: len(v) for k, v in raced.items()} == {"A": 2, "B": 2}

        r.gate.remove(both_list)
        assert (await r.reconcile()).result == "kept 2; started 0"
        left = keyed(await r.managed(Status.PENDING, Status.RUNNING, Status.BLOCKED))
        for key, pair in raced.items():
            newest = max(pair, key=lambda e: (e.created_at, str(e.id)))
            [kept] = left[key]
            assert kept.id == newest.id
            [other] = [e for e in pair if e.id != newest.id]
            assert (await wait_status(store, other.id, Status.CANCELLED)).deployment_id \
                == CURRENT
        assert (await r.reconcile()).result == "kept 2; started 0"


async def test_a_legacy_execution_is_paused_not_cancelled(store: Store, tmp_path: Path
                                                         ) -> None:
    async with served(store, tmp_path) as r:
        DESIRED.keys = ["A"]
        legacy, _ = await r.old.submit(LEGACY, ["A"])
        old, _ = await r.old.submit(WORKER, ["A"])
        assert (await r.reconcile()).result == "kept 0; started 1"
        assert (await wait_status(store, legacy.id, Status.PAUSED)).status == Status.PAUSED
        assert "cancel_requested" not in [e.kind for e in await history(store, legacy.id)]
        # the older managed one is retired through the bulk cancel, the legacy one never
        assert ("PUT", "/v1/executions/cancel") in r.seen
        assert ("PUT", f"/v1/executions/{legacy.id}/cancel") not in r.seen
        assert (await wait_status(store, old.id, Status.CANCELLED)).status == Status.CANCELLED
        # still visible, and left as it is by the next run
        assert [e.id for e in await r.managed(Status.PAUSED)] == [legacy.id]
        assert (await r.reconcile()).result == "kept 1; started 0"
        assert r.seen.count(("PUT", f"/v1/executions/{legacy.id}/pause")) == 1
        assert (await r.current.get(legacy.id)).status == Status.PAUSED


@pytest.mark.parametrize("params", [[], [7], [""], [{"key": "A"}]],
                         ids=["none", "number", "empty", "object"])
async def test_managed_params_without_the_key_fail_the_run_and_change_nothing(
    store: Store, tmp_path: Path, params: list[Any]
) -> None:
    async with served(store, tmp_path) as r:
        DESIRED.keys = ["A", "B"]
        old, _ = await r.old.submit(WORKER, ["A"])
        legacy, _ = await r.old.submit(LEGACY, ["B"])
        bad, _ = await r.old.submit(WORKER, params)
        before = {e.id: e.status for e in await r.managed()}
        run = await r.reconcile()
        assert run.status == Status.FAILED
        assert run.error is not None
        message = str(run.error["message"])
        assert f"execution {bad.id} of {WORKER} has no key" in message, message
        assert {e.id: e.status for e in await r.managed()} == before  # nothing changed
        assert not [m for m, _ in r.seen if m == "PUT"]
        failed = [e for e in await history(store, run.id) if e.kind == "step_failed"]
        assert [e.data["attempts"] for e in failed] == [1]  # not retried
        assert {old.id, legacy.id, bad.id} <= set(before)


async def test_a_run_cut_short_is_repaired_by_the_next(store: Store, tmp_path: Path) -> None:
    """Two pages of cancels (2 executions a page): the first request is refused, the other
    goes through; the run fails, and the next one retires what is left."""
    async with served(store, tmp_path) as r:
        DESIRED.keys = ["A", "B", "C"]
        olds = [(await r.old.submit(WORKER, [k]))[0] for k in DESIRED.keys]
        refused: list[str] = []

        async def refuse_once(scope: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
            if scope["method"] == "PUT" and scope["path"] == "/v1/executions/cancel" \
                    and not refused:
                refused.append(scope["path"])
                return 403, {"error": {"code": "forbidden", "message": "not now",
                                       "scope": "executions:cancel"}}
            return None

        r.gate.append(refuse_once)
        run, _ = await r.current.submit(PAGED, [])
        first = await wait_status(store, run.id, Status.COMPLETED, Status.FAILED, timeout=20)
        assert first.status == Status.FAILED and first.error is not None
        assert "executions (the first " in str(first.error["message"])
        assert "403 forbidden" in str(first.error["message"])
        statuses = [(await r.current.get(e.id)).status for e in olds]
        # the page refused is left pending, the other one cancelled: partial progress
        assert sorted(statuses).count(Status.PENDING) in (1, 2), statuses
        assert Status.CANCELLED in statuses, statuses
        assert (await r.reconcile()).result == "kept 0; started 3"
        for e in olds:
            assert (await wait_status(store, e.id, Status.CANCELLED)).status \
                == Status.CANCELLED


async def test_retiring_an_ended_or_retired_execution_is_a_success(
    store: Store, tmp_path: Path
) -> None:
    async with served(store, tmp_path) as r:
        done, _ = await r.current.submit(WORKER, ["A"])
        await r.current.cancel(done.id)
        ended, _ = await r.current.submit(LEGACY, ["A"])
        await r.current.send(ended.id, "work", None)
        await wait_status(store, ended.id, Status.COMPLETED)
        paused, _ = await r.current.submit(LEGACY, ["B"], paused=True)
        reconciler = (await TokenService(store).create("retire", SCOPES)).token
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {reconciler}"}) as http:
            for _ in range(2):  # and again: a repeated request is fine
                await _cancel_page(http, r.url, [str(done.id)])
                await _pause(http, r.url, str(ended.id))
                await _pause(http, r.url, str(paused.id))
        assert (await r.current.get(done.id)).status == Status.CANCELLED
        assert (await r.current.get(ended.id)).status == Status.COMPLETED
        assert (await r.current.get(paused.id)).status == Status.PAUSED


async def test_the_examples_token_lists_cancels_and_pauses_and_nothing_else(
    store: Store,
) -> None:
    """The scopes examples/generations/README.md gives the reconciler's token."""
    service = ExecutionService(store, workflows=set(app.workflows), deployment_id=CURRENT)
    target, _ = await service.submit(WORKER, ["A"])
    legacy, _ = await service.submit(LEGACY, ["A"])
    second, _ = await service.submit(WORKER, ["B"])
    reconciler = (await TokenService(store).create("reconciler", SCOPES)).token
    transport = httpx.ASGITransport(app=create_api(service, auth_required=True),
                                    raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers={
            "Authorization": f"Bearer {reconciler}"}) as api:
        assert (await api.get("/v1/executions", params={"ffqn_prefix": LEGACY})
                ).status_code == 200
        assert (await api.get(f"/v1/executions/{target.id}")).status_code == 200
        assert (await api.put(f"/v1/executions/{legacy.id}/pause")).status_code == 200
        assert (await api.put(f"/v1/executions/{target.id}/cancel")).status_code == 200
        many = await api.put("/v1/executions/cancel", json={"ids": [str(second.id)]})
        assert many.status_code == 200, many.text
        assert many.json()["items"][0]["execution"]["status"] == "cancelled"
        refused = {
            "executions:submit": await api.post(
                "/v1/executions", json={"ffqn": WORKER, "params": ["B"]}),
            "executions:send": await api.post(
                f"/v1/executions/{legacy.id}/messages", json={"topic": "work", "payload": 1}),
            "executions:resolve": await api.put(
                f"/v1/executions/{legacy.id}/resolve",
                json={"action": "cancel", "reason": "test"}),
        }
        for scope, answer in refused.items():
            assert answer.status_code == 403, (scope, answer.text)
            error = answer.json()["error"]
            assert (error["code"], error["scope"]) == ("forbidden", scope)
    assert (await service.get(target.id)).status == Status.CANCELLED
    assert (await service.get(legacy.id)).status == Status.PAUSED
    assert (await service.get(second.id)).status == Status.CANCELLED
    assert len(await store.execution_list(ExecutionFilter(), limit=100)) == 3  # none submitted


async def test_the_deployment_is_the_one_its_own_execution_record_names(
    store: Store, tmp_path: Path
) -> None:
    """Told by the API that it belongs to another deployment, the run treats every execution
    of its own as older: the deployment comes from the record, not from anywhere else."""
    async with served(store, tmp_path) as r:
        DESIRED.keys = ["A"]
        first = await r.reconcile()
        assert first.result == "kept 0; started 1"
        assert ("GET", f"/v1/executions/{first.id}") in r.seen
        [mine] = await r.managed()  # created with the run's end (its status moves on)

        async def elsewhere(scope: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
            if scope["method"] == "GET" and scope["path"].count("/") == 3 \
                    and scope["path"] != f"/v1/executions/{mine.id}":
                return 200, {"id": scope["path"].rsplit("/", 1)[1], "deployment_id": "d9"}
            return None

        r.gate.append(elsewhere)
        assert (await r.reconcile()).result == "kept 0; started 1"
        assert (await wait_status(store, mine.id, Status.CANCELLED)).deployment_id == CURRENT


async def test_every_page_of_the_listing_is_read(store: Store, tmp_path: Path) -> None:
    async with served(store, tmp_path) as r:
        keys = ["A", "B", "C", "D", "E"]
        DESIRED.keys = keys
        old = [(await r.old.submit(WORKER, [k]))[0] for k in keys]
        run, _ = await r.current.submit(PAGED, [])
        done = await wait_status(store, run.id, Status.COMPLETED, Status.FAILED, timeout=20)
        assert done.result == "kept 0; started 5", done.error
        for e in old:
            assert (await wait_status(store, e.id, Status.CANCELLED)).status == Status.CANCELLED
        listings = [p for m, p in r.seen if m == "GET" and p == "/v1/executions"]
        assert len(listings) == 3  # 5 executions, 2 a page
        # and cancelled 2 a request
        assert r.seen.count(("PUT", "/v1/executions/cancel")) == 3
