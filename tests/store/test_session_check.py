"""PostgresStore.check_session counts only its own notification (docs/scaling.md,
"Connection poolers").

Through a pooler in transaction mode a server connection keeps the LISTENs of the clients
it served before, so a notification on another process's check channel can reach this
process's listening connection while it is linked to that server connection: the likely
way `submit`, one of five `veracity` commands started at once through pgbouncer, once ran
through transaction mode (tests/pooler/test_pgbouncer.py). Here that delivery is made on a
direct connection: the listening connection also listens on a foreign channel, and the
notification the check sends goes there instead of to the check's own channel."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from veracity.errors import ConfigError
from veracity.store import Store
from veracity.store.postgres import store as pg

POSTGRESQL = pytest.mark.parametrize("backend", ["postgresql"])
"""The check is PostgreSQL's (SQLite has no sessions to lose)."""

FOREIGN = "veracity_session_check_someone_else"


@POSTGRESQL
async def test_a_notification_on_another_channel_does_not_pass_the_check(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(store, pg.PostgresStore)
    connect = psycopg.AsyncConnection.connect

    async def listening_elsewhere_too(*args: Any, **kwargs: Any) -> Any:
        conn = await connect(*args, **kwargs)
        await conn.execute(f"LISTEN {FOREIGN}")
        return conn

    fetchall = store._fetchall

    async def misdelivered(name: str, params: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "session_check_notify":  # another process's check, not ours
            params = {"channel": FOREIGN}
        return await fetchall(name, params, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", listening_elsewhere_too)
    monkeypatch.setattr(store, "_fetchall", misdelivered)
    with pytest.raises(ConfigError, match=r"did not arrive within 0\.5 s"):
        await store.check_session(wait=0.5)


@POSTGRESQL
async def test_its_own_notification_passes_after_a_foreign_one(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A foreign notification first, then the check's own: the check passes on the second."""
    assert isinstance(store, pg.PostgresStore)
    fetchall = store._fetchall
    connect = psycopg.AsyncConnection.connect

    async def listening_elsewhere_too(*args: Any, **kwargs: Any) -> Any:
        conn = await connect(*args, **kwargs)
        await conn.execute(f"LISTEN {FOREIGN}")
        return conn

    async def foreign_first(name: str, params: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "session_check_notify":
            await fetchall(name, {"channel": FOREIGN}, *args, **kwargs)
        return await fetchall(name, params, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", listening_elsewhere_too)
    monkeypatch.setattr(store, "_fetchall", foreign_first)
    await store.check_session(wait=5)
