"""One run of the generation reconciler over 10,000 keys against a running server, on
PostgreSQL (docs/generations.md).

Set-up (not measured): a scratch database; ``--keys`` keys (default 10,000) in a keys
file; managed executions bulk-inserted with SQL, pending: one for each key of the first
half on the current deployment, one for each key of the third quarter on an older
deployment, none for the last quarter. A ``veracity server`` of the current deployment
(PostgreSQL: no worker in it) with API tokens required, and one ``veracity worker`` of the
current deployment whose ``[[http]]`` binding carries a token with ``executions:read``,
``executions:cancel`` and ``executions:pause``. The worker registers only the reconciler
(``bench.generations:reconciler_app``), so the managed executions stay as they are while it
runs and only the reconciler's own work is measured.

Measured: one reconciler execution, submitted through the API once the worker is
registered (and, just before it, the same listing the activity makes, every page, timed by
the benchmark itself through the API: the rest of the activity is the cancels). Its
**run** is its end (``updated_at``: the completing transaction's ``now()``) minus its
``running`` event (the claim), both the database's clock; the phases are read from its
history: the desired-keys step, the control-plane activity (reading its own execution,
listing every page, the cancels, ``--concurrency`` requests at once), and the end (5,000
executions scheduled with the completion, in one transaction). Checked
afterwards from the database: the result is ``kept 5000; started 5000``, the older
deployment's 2,500 are cancelled, and each key has exactly one unfinished execution, of
the current deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench._util import scratch_pg_database, server, veracity_bin
from veracity import App, Context
from veracity.control import TokenService
from veracity.generations import Generations
from veracity.store import open_store

ROOT = Path(__file__).resolve().parent.parent
RECONCILER = "bench:gen/reconciler.run"
MANAGED = "bench:gen/worker.run-cancellable"
CURRENT, OLD = "gen-current", "gen-old"
KEYS_ENV = "VERACITY_BENCH_KEYS_FILE"
CONCURRENCY_ENV = "VERACITY_BENCH_GEN_CONCURRENCY"


def desired() -> list[str]:
    return Path(os.environ[KEYS_ENV]).read_text().split()


def _generations() -> Generations:
    return Generations(reconciler=RECONCILER, managed=MANAGED, binding="control_plane",
                       desired_keys=desired,
                       concurrency=int(os.environ.get(CONCURRENCY_ENV, "16")))


async def _managed(ctx: Context, key: str) -> None:
    await ctx.recv("work")


reconciler_app = App("bench-generations-reconciler")
"""What the worker runs: the reconciler only."""
_generations().register(reconciler_app)

app = App("bench-generations")
"""What the server accepts: the reconciler and the managed workflow."""
_generations().register(app)
app.workflow(MANAGED)(_managed)


def insert_managed(url: str, deployment: str, first: int, last: int) -> None:
    """Pending executions of the managed workflow for keys first..last-1, each created a
    millisecond apart, with their creation events, in one statement."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            WITH ins AS (
                INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id,
                    scheduled_at, created_at, updated_at, history_seq)
                SELECT gen_random_uuid(), %s,
                       json_build_array('k' || lpad(i::text, 5, '0')), 'pending', %s,
                       now(), now() - make_interval(secs => i / 1000.0), now(), 1
                FROM generate_series(%s, %s - 1) AS i
                RETURNING id, created_at
            )
            INSERT INTO veracity_history (execution_id, seq, kind, at, data)
            SELECT id, 1, 'pending', created_at, '{}' FROM ins
            """,
            [MANAGED, deployment, first, last],
        )


async def tokens(url: str) -> tuple[str, str]:
    store = await open_store(url)
    try:
        await store.migrate()
        service = TokenService(store)
        reconciler = await service.create(
            "reconciler", ["executions:read", "executions:cancel", "executions:pause"])
        admin = await service.create("bench", ["admin"])
        return reconciler.token, admin.token
    finally:
        await store.close()


def _wait(check: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def measure(keys: int, concurrency: int) -> dict[str, Any]:
    half, quarter = keys // 2, keys // 4
    with scratch_pg_database() as url, tempfile.TemporaryDirectory() as folder:
        reconciler_token, admin = asyncio.run(tokens(url))
        insert_managed(url, CURRENT, 0, half)
        insert_managed(url, OLD, half, half + quarter)
        keys_file = Path(folder) / "keys.txt"
        keys_file.write_text("".join(f"k{i:05d}\n" for i in range(keys)))
        env = {"VERACITY_DEPLOYMENT_ID": CURRENT, "VERACITY_AUTH_REQUIRED": "true",
               "PYTHONPATH": str(ROOT)}
        with server(url, app="bench.generations:app", extra_env=env) as base:
            config = Path(folder) / "veracity.toml"
            config.write_text(f'''
[[http]]
name = "control_plane"
origin = "{base}"
methods = ["GET", "PUT"]
headers = {{ Authorization = "Bearer ${{secret:control_token}}" }}
''')
            worker_env = dict(os.environ, VERACITY_DATABASE_URL=url, VERACITY_CONFIG=str(config),
                              VERACITY_APP="bench.generations:reconciler_app",
                              VERACITY_LOG_LEVEL="warning",
                              VERACITY_SECRET_CONTROL_TOKEN=reconciler_token,
                              **{KEYS_ENV: str(keys_file), CONCURRENCY_ENV: str(concurrency)},
                              **env)
            worker = subprocess.Popen([veracity_bin(), "worker"], env=worker_env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                with httpx.Client(headers={"Authorization": f"Bearer {admin}"},
                                  timeout=30) as client:
                    def registered() -> bool:
                        if worker.poll() is not None:
                            err = worker.stderr.read().decode() if worker.stderr else ""
                            raise SystemExit(f"the worker exited: {err[-2000:]}")
                        items = client.get(f"{base}/v1/workers").json()["items"]
                        return any(w["live"] and RECONCILER in w["workflows"] for w in items)

                    _wait(registered, "the worker to register", 30)
                    listing = time_listing(client, base)
                    submitted = client.post(f"{base}/v1/executions",
                                            json={"ffqn": RECONCILER, "params": []})
                    if submitted.status_code != 201:
                        raise SystemExit(f"submit: {submitted.status_code} {submitted.text}")
                    ident = submitted.json()["id"]

                    def ended() -> dict[str, Any] | None:
                        e: dict[str, Any] = client.get(f"{base}/v1/executions/{ident}").json()
                        return e if e["status"] in ("completed", "failed") else None

                    done = _wait(ended, "the reconciler to end", 120)
            finally:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
        if done["status"] != "completed":
            raise SystemExit(f"the reconciler failed: {done['error']}")
        return {**read_back(url, ident), "result": done["result"], "keys": keys,
                "concurrency": concurrency, "listing": listing}


def time_listing(client: httpx.Client, base: str) -> tuple[float, int, int]:
    """The listing the activity makes (every page of the unfinished managed executions),
    made once by the benchmark itself before the run: seconds, pages, items."""
    start = time.perf_counter()
    cursor: str | None = None
    pages = items = 0
    while True:
        query: dict[str, Any] = {"ffqn_prefix": "bench:gen/worker.run", "limit": 1000,
                                 "status": "pending,running,blocked,paused"}
        if cursor:
            query["cursor"] = cursor
        page = client.get(f"{base}/v1/executions", params=query).json()
        pages, items = pages + 1, items + len(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return time.perf_counter() - start, pages, items


def read_back(url: str, ident: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT created_at, updated_at FROM veracity_executions "
                           "WHERE id = %s", [ident]).fetchone()
        assert row is not None
        created, ended = row
        events: list[tuple[str, datetime, Any]] = conn.execute(
            "SELECT kind, at, data FROM veracity_history WHERE execution_id = %s "
            "ORDER BY seq", [ident]).fetchall()
        counts: dict[str, int] = dict(conn.execute(
            "SELECT status || ':' || deployment_id, count(*) FROM veracity_executions "
            "WHERE ffqn = %s GROUP BY 1", [MANAGED]).fetchall())
        [(per_key_max, keys_with)] = conn.execute(
            "SELECT max(n), count(*) FROM (SELECT params->>0 AS key, count(*) AS n "
            "FROM veracity_executions WHERE ffqn = %s "
            "AND status IN ('pending', 'running', 'blocked', 'paused') "
            "AND deployment_id = %s GROUP BY 1) AS k", [MANAGED, CURRENT]).fetchall()
    running = next(at for kind, at, _ in events if kind == "running")
    steps = [at for kind, at, _ in events if kind == "step_completed"]
    return {
        "run": (ended - running).total_seconds(),
        "from_submit": (ended - created).total_seconds(),
        "keys_step": (steps[0] - running).total_seconds(),
        "activity": (steps[1] - steps[0]).total_seconds(),
        "end": (ended - steps[1]).total_seconds(),
        "counts": counts, "per_key_max": per_key_max, "keys_with_one": keys_with,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.generations",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16,
                        help="cancel requests in flight at once (Generations(concurrency=))")
    args = parser.parse_args(argv)
    got = measure(args.keys, args.concurrency)
    half, quarter = args.keys // 2, args.keys // 4
    listing = got["listing"]
    expected = f"kept {half}; started {args.keys - half}"
    ok = (got["result"] == expected and got["per_key_max"] == 1
          and got["keys_with_one"] == args.keys
          and got["counts"].get(f"cancelled:{OLD}") == quarter)
    print(f"generations: one reconcile over {args.keys:,} keys ({half:,} current, {quarter:,} "
          f"of an older deployment, {args.keys - half - quarter:,} missing), "
          f"concurrency {args.concurrency}: run {got['run']:.2f} s (from submission "
          f"{got['from_submit']:.2f} s; keys step {got['keys_step']:.2f} s, activity "
          f"{got['activity']:.2f} s, end with {args.keys - half:,} scheduled "
          f"{got['end']:.2f} s; the listing alone, made before the run: {listing[2]:,} "
          f"executions in {listing[1]} pages, {listing[0]:.2f} s); result {got['result']!r}; "
          f"{'checked' if ok else 'CHECK FAILED'}: {got['counts']}, one unfinished "
          f"execution for {got['keys_with_one']:,} keys (at most {got['per_key_max']} each)")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
