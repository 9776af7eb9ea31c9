"""A generation change end to end (docs/generations.md), with real ``veracity server``
processes running examples/generations/ on each backend, driven and checked through the
HTTP API with API tokens required: d1 with keys A and B starts two workers; a restart
within d1 replaces nothing (same ids, a message sent after it is handled); d2 cancels the
d1 workers (still listed) and starts two of its own; removing B retires its worker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import run_async
from tests.generations._support import (
    RECONCILER,
    Served,
    base_env,
    by_key,
    copy_example,
    managed,
    server,
    stop,
)
from veracity.control import TokenService
from veracity.store import open_store

pytestmark = pytest.mark.timeout(120)

RECONCILER_SCOPES = ["executions:read", "executions:cancel", "executions:pause"]


async def make_tokens(url: str) -> tuple[str, str]:
    """The reconciler's token (the example's scopes), and an admin one for the test."""
    store = await open_store(url, pool_size=1)
    try:
        tokens = TokenService(store)
        reconciler = await tokens.create("reconciler", RECONCILER_SCOPES)
        admin = await tokens.create("test", ["admin"])
        return reconciler.token, admin.token
    finally:
        await store.close()


def wait_for(check: Any, what: str, served: Served, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{served.describe()}")


def reconcile(client: httpx.Client, served: Served) -> str:
    """Start a run of the reconciler (as the cron entry would) and return its result."""
    submitted = client.post(f"{served.url}/v1/executions",
                            json={"ffqn": RECONCILER, "params": []})
    assert submitted.status_code == 201, submitted.text
    ident = submitted.json()["id"]

    def ended() -> dict[str, Any] | None:
        e: dict[str, Any] = client.get(f"{served.url}/v1/executions/{ident}").json()
        return e if e["status"] in ("completed", "failed") else None

    done = wait_for(ended, f"reconciler {ident} to end", served)
    assert done["status"] == "completed", done["error"]
    result: str = done["result"]
    return result


def blocked_workers(client: httpx.Client, served: Served, n: int) -> dict[str, list[Any]]:
    """Once ``n`` managed workers are blocked (waiting for a message): key -> them."""
    def ready() -> dict[str, list[Any]] | None:
        found = by_key(managed(client, served.url), "blocked")
        return found if sum(map(len, found.values())) == n else None

    got: dict[str, list[Any]] = wait_for(ready, f"{n} blocked workers", served)
    return got


def test_a_generation_change(tmp_path: Path, database_url: str) -> None:
    folder = tmp_path / "generations"
    port = copy_example(folder)
    token, admin = run_async(make_tokens(database_url))
    env = base_env(database_url, port, VERACITY_SECRET_CONTROL_TOKEN=token)
    headers = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(timeout=10, headers=headers) as client:
        with server(folder, env, "d1", "--worker") as d1:
            assert reconcile(client, d1) == "kept 0; started 2"
            first = blocked_workers(client, d1, 2)
            assert {k: [d for d, _ in v] for k, v in first.items()} == {"A": ["d1"],
                                                                       "B": ["d1"]}
            stop(d1)

        with server(folder, env, "d1", "--worker") as d1:
            assert reconcile(client, d1) == "kept 2; started 0"
            assert by_key(managed(client, d1.url), "blocked") == first  # the same ids
            # its wait carried on: a message sent now is received and handled
            [(_, worker_a)] = first["A"]
            sent = client.post(f"{d1.url}/v1/executions/{worker_a}/messages",
                               json={"topic": "work", "payload": "hello"})
            assert sent.status_code == 201, sent.text

            def handled() -> bool:
                events = client.get(f"{d1.url}/v1/executions/{worker_a}/history",
                                    params={"limit": 1000}).json()["items"]
                return any(e["kind"] == "step_completed"
                           and e["data"]["result"] == "A handled 'hello'" for e in events)

            wait_for(handled, "worker A to handle the message", d1)
            assert by_key(managed(client, d1.url), "blocked") == first
            stop(d1)

        with server(folder, env, "d2", "--worker") as d2:
            assert reconcile(client, d2) == "kept 0; started 2"
            second = blocked_workers(client, d2, 2)
            assert {k: [d for d, _ in v] for k, v in second.items()} == {"A": ["d2"],
                                                                        "B": ["d2"]}
            # the d1 workers are cancelled, and still listed
            assert by_key(managed(client, d2.url), "cancelled") == first

            (folder / "keys.txt").write_text("A\n")
            assert reconcile(client, d2) == "kept 1; started 0"
            items = managed(client, d2.url)
            assert by_key(items, "blocked") == {"A": second["A"]}
            cancelled = by_key(items, "cancelled")
            assert sorted(cancelled["B"]) == sorted(first["B"] + second["B"])
            assert cancelled["A"] == first["A"]
            stop(d2)
