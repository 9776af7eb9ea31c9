"""Submissions per second through the HTTP API, on SQLite and on PostgreSQL.

One ``veracity server`` process; the load comes from ``wrk`` (Debian package ``wrk``) with
``--connections`` keep-alive connections for ``--seconds``. Every request is a full durable
submission: the row and its history event are committed before the 201. Without wrk, a
Python client is used instead, which on 2 cores measures mostly itself (it says so).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench._util import process_cpu, scratch_pg_database, server

BODY = '{"ffqn": "shop:orders/process.run", "params": ["order", 100]}'
LUA = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""


def _with_wrk(url: str, seconds: int, connections: int) -> tuple[float, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(LUA)
        script.flush()
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s",
             script.name, f"{url}/v1/executions"],
            check=True, capture_output=True, text=True,
        ).stdout
    if "Non-2xx" in out:
        raise SystemExit(f"some submissions failed:\n{out}")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    # the latency distribution's lines ("     50%    5.43ms"), not a percentage that ends
    # in 50% or 99% on the thread statistics' lines ("+/- Stdev" 71.50%)
    p50 = re.search(r"^\s*50%\s+(\S+)", out, re.MULTILINE)
    p99 = re.search(r"^\s*99%\s+(\S+)", out, re.MULTILINE)
    if not rate:
        raise SystemExit(f"cannot read wrk's output:\n{out}")
    detail = f"latency p50 {p50[1] if p50 else '?'}, p99 {p99[1] if p99 else '?'} (wrk)"
    return float(rate[1]), detail


async def _with_httpx(url: str, seconds: int, connections: int) -> tuple[float, str]:
    limits = httpx.Limits(max_connections=connections)
    done = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        deadline = time.perf_counter() + seconds

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                r = await client.post("/v1/executions", content=BODY,
                                      headers={"content-type": "application/json"})
                if r.status_code != 201:
                    raise SystemExit(f"unexpected {r.status_code}: {r.text}")
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(connections)))
        return done / (time.perf_counter() - start), "python client (install wrk for a fair figure)"


def measure(database_url: str, seconds: int, connections: int) -> tuple[float, str]:
    """(submissions/s, what else was seen): with the server process's CPU a submission
    (what bounds the rate when the server's one process is busy all the time)."""
    pids: list[int] = []
    with server(database_url, pids=pids) as url:
        before, started = process_cpu(pids[0]), time.perf_counter()
        if shutil.which("wrk"):
            rate, detail = _with_wrk(url, seconds, connections)
        else:
            rate, detail = asyncio.run(_with_httpx(url, seconds, connections))
        cpu, elapsed = process_cpu(pids[0]) - before, time.perf_counter() - started
    return rate, (f"{detail}; the server's CPU {cpu / (rate * seconds) * 1e6:.0f} µs a "
                  f"submission, {cpu / elapsed:.0%} of a core")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rate, detail = measure(f"sqlite:///{Path(tmp) / 'bench.db'}", args.seconds,
                               args.connections)
        print(f"submit  sqlite      {args.connections} connections, {args.seconds}s: "
              f"{rate:,.0f} submissions/s; {detail}")
    with scratch_pg_database() as url:
        rate, detail = measure(url, args.seconds, args.connections)
        print(f"submit  postgresql  {args.connections} connections, {args.seconds}s: "
              f"{rate:,.0f} submissions/s; {detail}")


if __name__ == "__main__":
    main()
