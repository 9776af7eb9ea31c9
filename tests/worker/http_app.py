"""Workflows of the secret tests run by real processes (tests/worker/test_http_processes.py),
importable by a server or worker process as ``tests.worker.http_app:app``.

Their steps call a loopback server that echoes the request's headers back (tests/_echo.py),
and do with the answer what a careless step might: log it, put it in an exception, return
it, schedule an execution with it. None of it may leave a secret's value anywhere.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from veracity import App, Context, RetryPolicy, StepFailed

app = App("tests-http-processes")
log = logging.getLogger("tests.http_app")
TRIES = RetryPolicy(max_attempts=3, initial_delay=0.05)


async def answer_then_fail(http: httpx.AsyncClient, url: str) -> None:
    response = await http.post(url, json={"try": True})
    log.info("upstream answered %s with headers %s", response.text, dict(response.headers))
    raise RuntimeError(f"upstream answered: {response.text}")


async def echoed(http: httpx.AsyncClient, url: str) -> Any:
    response = await http.get(url)
    log.debug("echoed %s", response.json())
    return response.json()


@app.workflow("test:leak/echo.run")
async def echo(ctx: Context, url: str) -> None:
    try:
        await ctx.step_with(answer_then_fail, ctx.http, url, retry=TRIES)
    except StepFailed as exc:
        log.warning("step failed: %s", exc)
    answer = await ctx.step(echoed, ctx.http, url)
    await ctx.schedule("test:leak/keep.run", answer["headers"])
    raise RuntimeError(f"giving up after {answer}")


@app.workflow("test:leak/keep.run")
async def keep(ctx: Context, value: Any) -> Any:
    return value


async def status(http: httpx.AsyncClient, method: str, url: str) -> int:
    try:
        return (await http.request(method, url)).status_code
    except httpx.HTTPError:
        log.exception("%s %s failed", method, url)
        raise


@app.workflow("test:leak/call.run")
async def call(ctx: Context, method: str, url: str) -> int:
    """One request in a step that retries (refusals excepted): completes, or fails with
    the request's error, or with the refusal."""
    result: int = await ctx.step_with(status, ctx.http, method, url, retry=TRIES)
    return result
