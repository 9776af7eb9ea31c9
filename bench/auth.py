"""What an API token costs a request, on SQLite and on PostgreSQL (docs/security.md).

Two figures per backend, in one process, over a real store:

* **check**: ``TokenService.authenticate`` alone, ``--checks`` times in a row with one valid
  token (the key-id lookup, the constant-time digest comparison, expiry, revocation and
  scope; the last-use write happens at most once a minute, so once here): median and p99.
* **request**: ``--requests`` sequential ``GET /v1/executions/{id}`` through the ASGI app
  in-process (httpx's ASGI transport, no sockets), alternating between an app that
  requires tokens (sent an ``executions:read`` token) and one that does not; the difference
  of the medians is what the middleware adds to a request (route matching included).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench._util import scratch_pg_database
from veracity.api import create_api
from veracity.control import ExecutionService, TokenService
from veracity.core.tokens import Scope
from veracity.examples import shop
from veracity.store import open_store


def _ms(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


async def _requests(secured: object, open_: object, path: str, headers: dict[str, str],
                    n: int) -> tuple[list[float], list[float]]:
    """Alternate one request to each app, after a warm-up, so that both see the same
    machine (the load of other processes moves in between)."""
    out: tuple[list[float], list[float]] = ([], [])
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                 base_url="http://bench") for app in (secured, open_)]
    try:
        for i in range(n + 50):
            for samples, client, sent in zip(out, clients, (headers, {}), strict=True):
                start = time.perf_counter()
                response = await client.get(path, headers=sent)
                elapsed = time.perf_counter() - start
                if response.status_code != 200:
                    raise SystemExit(f"unexpected {response.status_code}: {response.text}")
                if i >= 50:
                    samples.append(elapsed)
    finally:
        for client in clients:
            await client.aclose()
    return out


async def measure(database_url: str, checks: int, requests: int) -> str:
    store = await open_store(database_url)
    try:
        await store.migrate()
        tokens = TokenService(store)
        created = await tokens.create("bench", [Scope.EXECUTIONS_READ.value])
        check: list[float] = []
        for _ in range(checks):
            start = time.perf_counter()
            await tokens.authenticate(created.token, Scope.EXECUTIONS_READ, route="bench")
            check.append(time.perf_counter() - start)
        service = ExecutionService(store, workflows=set(shop.app.workflows),
                                   deployment_id="bench")
        execution, _ = await service.submit("shop:orders/process.run", ["o", 1])
        path = f"/v1/executions/{execution.id}"
        secured, open_ = await _requests(
            create_api(service, auth_required=True), create_api(service, auth_required=False),
            path, {"Authorization": f"Bearer {created.token}"}, requests)
    finally:
        await store.close()
    c50, c99 = _ms(check)
    s50, s99 = _ms(secured)
    o50, o99 = _ms(open_)
    return (f"token check median {c50:.3f} ms, p99 {c99:.3f} ms ({checks} checks); "
            f"GET one execution median {s50:.3f} ms with a token (p99 {s99:.3f}), "
            f"{o50:.3f} ms without (p99 {o99:.3f}): +{s50 - o50:.3f} ms ({requests} "
            "sequential requests each, in-process)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        line = asyncio.run(measure(f"sqlite:///{Path(tmp) / 'bench.db'}", args.checks,
                                   args.requests))
        print(f"auth    sqlite      {line}")
    with scratch_pg_database() as url:
        line = asyncio.run(measure(url, args.checks, args.requests))
        print(f"auth    postgresql  {line}")


if __name__ == "__main__":
    main()
