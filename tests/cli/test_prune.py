"""``veracity prune`` as a real process against real databases (docs/operations.md,
Retention): a dry run counts and deletes nothing, a run deletes what ended before the
cutoff with its history, and every bad input is refused with nothing deleted."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from tests.cli.test_cli import (
    assert_failure,
    assert_usage_error,
    base_env,
    ok,
    ok_json,
    run,
    run_all,
)
from tests.conftest import run_async
from tests.reconciler._support import metric_value
from tests.test_server import free_port, server_env, server_process
from veracity.clock import ManualClock
from veracity.models import Claim, NewExecution
from veracity.store import open_store

MAIL = "shop:mail/send.run"


async def setup(database_url: str) -> dict[str, list[uuid.UUID]]:
    """Two executions that ended ten days ago, one pending since then, one ended now."""
    ids: dict[str, list[uuid.UUID]] = {"old": [], "keep": []}
    for when, kind, n in [(timedelta(days=10), "old", 2), (timedelta(0), "keep", 1)]:
        store = await open_store(database_url, clock=ManualClock(datetime.now(UTC) - when))
        try:
            for _ in range(n):
                new = NewExecution(ffqn=MAIL, params=["x"], deployment_id="d1",
                                   id=uuid.uuid4())
                await store.execution_submit(new)
                (c,) = await store.execution_claim("w", [MAIL], limit=1,
                                                   lease_ttl=timedelta(minutes=1))
                assert (await store.execution_complete_if_owned(
                    Claim(c.id, "w", c.lease_epoch), "sent")).applied
                ids[kind].append(c.id)
            if kind == "old":
                new = NewExecution(ffqn="shop:orders/process.run", params=["o", 1],
                                   deployment_id="d1", id=uuid.uuid4())
                ids["keep"].append((await store.execution_submit(new)).execution.id)
        finally:
            await store.close()
    return ids


async def present(database_url: str, ids: list[uuid.UUID]) -> list[bool]:
    store = await open_store(database_url)
    try:
        return [await store.execution_get(i) is not None for i in ids]
    finally:
        await store.close()


def test_prune_counts_deletes_and_refuses_bad_input(database_url: str, tmp_path: Path
                                                    ) -> None:
    ids = run_async(setup(database_url))
    everything = ids["old"] + ids["keep"]
    env = base_env(database_url)
    bad = run_all({
        "not-a-duration": (["prune", "--older-than", "soon"], env, tmp_path),
        "negative": (["prune", "--older-than", "-7d"], env, tmp_path),
        "negative-seconds": (["prune", "--older-than", "-5"], env, tmp_path),
        "zero": (["prune", "--older-than", "0"], env, tmp_path),
        "bad-config": (["prune"], {**env, "VERACITY_RETENTION_TERMINAL": "-1d"}, tmp_path),
        "bad-config-text": (["prune"], {**env, "VERACITY_RETENTION_TERMINAL": "a month"},
                            tmp_path),
        "retention-off": (["prune"], {**env, "VERACITY_RETENTION_TERMINAL": "0"}, tmp_path),
        # a cutoff further back than any date
        "huge": (["prune", "--older-than", "99999999d"], env, tmp_path),
        "huge-config": (["prune"], {**env, "VERACITY_RETENTION_TERMINAL": "1000000d"},
                        tmp_path),
        "dry-run": (["prune", "--older-than", "7d", "--dry-run", "--json"], env, tmp_path),
    })
    # a dry run takes retention's lock too (one pass at a time): the second one after it
    bad["dry-run-text"] = run(["prune", "--older-than", "7d", "--dry-run"], env, tmp_path)
    assert_usage_error(bad["not-a-duration"], "--older-than", "invalid duration 'soon'")
    assert_usage_error(bad["negative"], "--older-than", "cannot be negative")
    assert_usage_error(bad["negative-seconds"], "--older-than", "cannot be negative")
    assert_usage_error(bad["zero"], "--older-than", "must be above 0")
    assert_failure(bad["bad-config"], "VERACITY_RETENTION_TERMINAL", "cannot be negative")
    assert_failure(bad["bad-config-text"], "VERACITY_RETENTION_TERMINAL", "invalid duration")
    assert_failure(bad["retention-off"], "retention is off", "--older-than")
    assert_usage_error(bad["huge"], "--older-than", "at most 36500d")
    assert_failure(bad["huge-config"], "VERACITY_RETENTION_TERMINAL", "at most 36500d")
    # what deleting would delete: the two executions and their six events
    counted = ok_json(bad["dry-run"])
    assert (counted["dry_run"], counted["executions"], counted["history"],
            counted["messages"]) == (True, 2, 6, 0)
    dry_text = ok(bad["dry-run-text"])
    assert dry_text.startswith("would delete 2 executions that ended before "), dry_text
    assert "(6 history events, 0 messages)" in dry_text
    # nothing of all that deleted anything
    assert run_async(present(database_url, everything)) == [True] * 4

    # the default is retention.terminal (30 days): nothing ended that long ago
    assert ok(run(["prune"], env, tmp_path)).startswith("deleted 0 executions")
    out = ok(run(["prune", "--older-than", "7d"], env, tmp_path))
    assert out.startswith("deleted 2 executions that ended before "), out
    assert "(6 history events, 0 messages)" in out
    assert run_async(present(database_url, everything)) == [False, False, True, True]
    assert ok_json(run(["prune", "--older-than", "7d", "--json"], env, tmp_path))[
        "executions"] == 0


def test_prune_never_creates_a_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/absent.db"
    assert_failure(run(["prune", "--older-than", "7d"], base_env(url), tmp_path))
    assert not (tmp_path / "absent.db").exists()


def test_prune_on_a_terminal_shows_a_progress_bar(sqlite_url: str, tmp_path: Path) -> None:
    """On a TTY the pass shows click's progress bar on stderr (here a pseudo-terminal);
    the summary line still goes to stdout."""
    import os
    import pty
    import subprocess

    from tests.cli.test_cli import VERACITY

    ids = run_async(setup(sqlite_url))
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([VERACITY, "prune", "--older-than", "7d"],
                              env=base_env(sqlite_url), cwd=tmp_path, stderr=follower,
                              stdout=subprocess.PIPE, text=True, timeout=60, check=False)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the follower is closed: everything was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0, (done.stdout, shown)
    assert done.stdout.startswith("deleted 2 executions"), done.stdout
    assert b"pruning" in shown and b"100%" in shown, shown
    assert run_async(present(sqlite_url, ids["old"])) == [False, False]


def pruned_total(url: str) -> dict[str, float | None]:
    """veracity_pruned_total by kind, as a server serves it."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {kind: metric_value(text, "veracity_pruned_total", kind=kind)
            for kind in ("executions", "history", "messages")}


def test_what_prune_deletes_is_counted_in_every_servers_metrics(
    database_url: str, tmp_path: Path
) -> None:
    """`veracity prune` serves no metrics of its own: each batch adds its deletions to the
    totals in the database, which a running server serves as veracity_pruned_total (the
    default retention of 30 days deletes nothing of these meanwhile)."""
    run_async(setup(database_url))
    port = free_port()
    with server_process(tmp_path, server_env(database_url, port), port) as server:
        server.wait_healthy()
        assert pruned_total(server.url) == {"executions": 0, "history": 0, "messages": 0}
        out = ok(run(["prune", "--older-than", "7d"], base_env(database_url), tmp_path))
        assert out.startswith("deleted 2 executions"), out
        assert pruned_total(server.url) == {"executions": 2, "history": 6, "messages": 0}
