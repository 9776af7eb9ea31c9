"""``veracity.AsyncDatabaseClient`` (docs/client.md, "Straight to the database") beside a
live ``veracity server`` and its worker on the same database, on both backends: what it
submits runs and reads the same as through the API, with the API's checks and typed
errors, idempotency keys inside and across batches, bad batches refused whole, waits that
end and waits that time out; and a database that does not answer."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from tests.client.conftest import APP, ECHO, FAIL, HOLD
from tests.test_server import Server, free_port
from veracity import AsyncClient, AsyncDatabaseClient, ExecutionFailed, Submission, WaitTimeout
from veracity.client import (
    ApiError,
    ConflictError,
    DatabaseUnavailable,
    InvalidRequest,
    NotFoundError,
    PayloadTooLarge,
)
from veracity.config import ENV_VARS
from veracity.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)


async def test_what_it_submits_runs_and_reads_as_through_the_api(
        live: Server, database_url: str) -> None:
    async with AsyncDatabaseClient(database_url, app=APP) as direct, \
            AsyncClient(live.url, timeout=10) as api:
        echoed = await direct.submit(ECHO, "hi", "!")
        # running when the server's idle worker took it as a hand-off (PostgreSQL:
        # docs/workers.md; tests/worker/test_handoff.py)
        assert echoed.status in ("pending", "running") and echoed.params == ["hi", "!"]
        if echoed.status == "running":
            assert echoed.raw["lease_owner"] and echoed.raw["lease_epoch"] == 1
            assert echoed.raw["started_at"] == echoed.raw["created_at"]
        assert await direct.result(echoed.id, timeout=20) == "hi!"
        # the same execution, field for field, as the API answers it (the server's
        # deployment: the same App gives the same deployment id)
        assert await direct.get(echoed.id) == await api.get(echoed.id)
        assert (await direct.get(echoed.id)).raw == (await api.get(echoed.id)).raw
        # idempotency keys: the same request again answers the same execution
        first = await direct.submit(ECHO, 1, idempotency_key="k")
        assert (await direct.submit(ECHO, 1, idempotency_key="k")).id == first.id
        assert (await api.submit(ECHO, 1, idempotency_key="k")).id == first.id
        with pytest.raises(ConflictError) as conflict:
            await direct.submit(ECHO, 2, idempotency_key="k")
        assert conflict.value.status == 409 and conflict.value.code == "idempotency_conflict"
        # a failure, a wait that times out with the state then, a wait woken by the end
        failing = await direct.submit(FAIL, "boom")
        with pytest.raises(ExecutionFailed) as failed:
            await direct.result(failing.id, timeout=20)
        assert failed.value.execution.status == "failed"
        assert "boom" in str(failed.value.execution.error)
        held = await direct.submit(HOLD)
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as timed_out:
            await direct.wait(held.id, timeout=0.5)
        assert 0.45 <= time.monotonic() - started < 5
        assert timed_out.value.execution.status in ("pending", "running", "blocked")
        assert timed_out.value.execution.waiting_reason
        waiting = asyncio.create_task(direct.result(held.id, timeout=20))
        await asyncio.sleep(0.2)
        await api.send(held.id, "go", {"ok": 1})
        assert await waiting == {"ok": 1}
        # scheduled, paused
        later = await direct.submit(ECHO, "x", scheduled_at=datetime(2099, 1, 1, tzinfo=UTC),
                                    paused=True)
        assert later.status == "paused"
        assert later.scheduled_at == datetime(2099, 1, 1, tzinfo=UTC)
        # what submit answers is what the API reads back, field for field and in its JSON
        # (but the waiting reason, which only a read gives)
        read = await api.get(later.id)
        assert read.waiting_reason and later.waiting_reason is None
        assert dataclasses.replace(later, waiting_reason=read.waiting_reason) == read
        assert later.raw == {**read.raw, "waiting_reason": None}
        assert (await api.unpause(later.id)).status == "pending"


async def test_batches_and_typed_errors_change_nothing(live: Server, database_url: str
                                                      ) -> None:
    async with AsyncDatabaseClient(database_url, app=APP) as direct, \
            AsyncClient(live.url, timeout=10) as api:
        first = await direct.submit_many([
            Submission(ECHO, [1], idempotency_key="a"),
            Submission(ECHO, [2]),
            {"ffqn": ECHO, "params": [1], "idempotency_key": "a"},
        ])
        assert [e.params for e in first] == [[1], [2], [1]]
        assert first[0].id == first[2].id != first[1].id
        again = await direct.submit_many([
            Submission(ECHO, [1], idempotency_key="a"),
            {"ffqn": ECHO, "params": [3], "idempotency_key": "b",
             "scheduled_at": "2099-01-01T00:00:00Z"}])
        assert again[0].id == first[0].id and again[1].params == [3]
        assert again[1].scheduled_at == datetime(2099, 1, 1, tzinfo=UTC)
        assert [await direct.result(e.id, timeout=20) for e in first] == [1, 2, 1]
        before = [e.id async for e in api.list()]

        # each bad input is refused with the API's status and code, and writes nothing
        with pytest.raises(InvalidRequest) as bad:
            await direct.submit_many([Submission(ECHO, [4]), Submission("t:client/none.run"),
                                      Submission(ECHO, [])])
        assert bad.value.status == 422 and bad.value.code == "invalid_batch"
        assert [(i["index"], i["code"]) for i in bad.value.details["items"]] == [
            (1, "unknown_workflow"), (2, "invalid_params")]
        with pytest.raises(ConflictError) as conflict:
            await direct.submit_many([Submission(ECHO, ["other"], idempotency_key="a")])
        assert conflict.value.code == "idempotency_conflict"
        with pytest.raises(PayloadTooLarge) as large:
            await direct.submit_many([Submission(ECHO, [i]) for i in range(1001)])
        assert large.value.status == 413
        # a batch's items are checked as the API checks them: the same error, naming the
        # same items with the same codes, for each of these
        for items in ([{"params": [1]}],
                      [{"ffqn": ECHO, "params": [1], "scheduled_at": "soon"}],
                      [{"ffqn": ECHO, "params": [1]}, {"ffqn": ECHO, "paused": "false"}],
                      [{"ffqn": ECHO, "params": [1], "bogus": 1}],
                      [{"ffqn": ECHO, "params": "1"}, "not an object", 7],
                      [{"ffqn": ECHO, "params": [1], "scheduled_at": "2099-01-01T00:00:00"}],
                      [{"ffqn": ECHO, "params": [1], "idempotency_key": "z"},
                       {"ffqn": ECHO, "params": [2], "idempotency_key": "z"}]):
            with pytest.raises(ApiError) as by_api:
                await api.submit_many(items)  # type: ignore[arg-type]
            with pytest.raises(ApiError) as by_db:
                await direct.submit_many(items)  # type: ignore[arg-type]
            assert (type(by_db.value), by_db.value.status, by_db.value.code) == (
                type(by_api.value), by_api.value.status, by_api.value.code), items
            assert by_db.value.details.get("items") == by_api.value.details.get("items")
            assert by_db.value.code in ("invalid_batch", "idempotency_conflict"), items
        with pytest.raises(InvalidRequest) as naive:
            await direct.submit(ECHO, 1, scheduled_at=datetime(2099, 1, 1))
        assert naive.value.code == "invalid_time"
        with pytest.raises(InvalidRequest) as params:
            await direct.submit(ECHO)
        assert params.value.code == "invalid_params" and "missing value" in params.value.message
        with pytest.raises(InvalidRequest) as unknown:
            await direct.submit("t:client/none.run")
        assert unknown.value.code == "unknown_workflow"
        with pytest.raises(PayloadTooLarge) as huge:
            await direct.submit(ECHO, "x" * 2_000_000)
        assert huge.value.status == 413 and huge.value.code == "payload_too_large"
        assert [e.id async for e in api.list()] == before

        with pytest.raises(NotFoundError) as missing:
            await direct.get(str(uuid.uuid4()))
        assert missing.value.code == "not_found" and missing.value.status == 404
        with pytest.raises(InvalidRequest) as bad_id:
            await direct.get("not-an-id")
        assert bad_id.value.code == "invalid_id"
        for no_wait in (-1.0, float("nan")):  # as AsyncClient refuses them, before any wait
            with pytest.raises(InvalidRequest) as negative:
                await direct.wait(first[0].id, timeout=no_wait)
            assert negative.value.code == "invalid_wait"
            with pytest.raises(InvalidRequest) as negative:
                await api.wait(first[0].id, timeout=no_wait)
            assert negative.value.code == "invalid_wait"


async def test_submissions_at_once_share_transactions(live: Server, database_url: str
                                                      ) -> None:
    """Its calls that arrive together are written together, as the server's are
    (docs/scaling.md, "Many submissions at once"), each answered as if alone."""
    async with AsyncDatabaseClient(database_url, app=APP) as direct:
        fresh, same = await asyncio.gather(
            asyncio.gather(*(direct.submit(ECHO, i) for i in range(40))),
            asyncio.gather(*(direct.submit(ECHO, "same", idempotency_key="same")
                             for _ in range(5))))
        assert [e.params for e in fresh] == [[i] for i in range(40)]
        assert len({e.id for e in fresh}) == 40 and len({e.id for e in same}) == 1
        assert [await direct.result(e.id, timeout=20) for e in fresh[:3]] == [0, 1, 2]
    if database_url.startswith("postgresql"):
        with psycopg.connect(database_url) as conn:
            rows = conn.execute("SELECT count(DISTINCT xmin::text) FROM veracity_executions "
                                "WHERE params->>0 <> 'same'").fetchone()
        assert rows is not None and rows[0] < 40


async def test_it_is_opened_before_use_and_a_database_that_does_not_answer_is_clear(
        ) -> None:
    client = AsyncDatabaseClient("sqlite:///unused.db", app=APP)
    with pytest.raises(RuntimeError, match="not open"):
        await client.submit(ECHO, 1)
    # nothing listens there: refused at once, as the API's 503
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=2"
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as unavailable:
        async with AsyncDatabaseClient(down, app=APP):
            pass
    assert unavailable.value.status == 503
    assert unavailable.value.code == "database_unavailable"
    assert time.monotonic() - started < 5


async def test_a_database_without_veracitys_tables_is_said_so_at_open(
        tmp_path: Path, pg_server_url: str) -> None:
    from tests._pg import create_database, drop_database, with_database

    name = f"veracity_empty_{uuid.uuid4().hex[:12]}"
    create_database(pg_server_url, name)
    try:
        # a missing SQLite file is said so and not created; an empty one is no database
        with pytest.raises(ConfigError, match=r"^no Veracity database at .*none\.db; run "
                                              r"`veracity migrate`"):
            await AsyncDatabaseClient(f"sqlite:///{tmp_path}/none.db", app=APP).open()
        assert not (tmp_path / "none.db").exists()
        (tmp_path / "empty.db").write_bytes(b"")
        for url in (f"sqlite:///{tmp_path}/empty.db", with_database(pg_server_url, name)):
            with pytest.raises(ConfigError, match=r"holds no Veracity database[:;] run "
                                                  r"`veracity migrate`"):
                await AsyncDatabaseClient(url, app=APP).open()
        assert (tmp_path / "empty.db").read_bytes() == b""
    finally:
        drop_database(pg_server_url, name)
