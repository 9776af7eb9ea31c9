"""The App the client tests serve (tests/client/test_client.py)."""

from __future__ import annotations

from typing import Any

from veracity import App, Context

app = App("client-tests")


@app.workflow("t:client/echo.run")
async def echo(ctx: Context, value: Any, suffix: str = "") -> Any:
    return f"{value}{suffix}" if suffix else value


@app.workflow("t:client/fail.run")
async def fail(ctx: Context, why: str) -> None:
    raise ValueError(why)


@app.workflow("t:client/hold.run-cancellable")
async def hold(ctx: Context) -> Any:
    """Waits for a message on topic "go" and returns its payload."""
    return await ctx.recv("go")
