"""The app the dashboard's browser tests serve: a workflow with a step, a sleep, a message
and two children, a child, and a cancellable one that waits for a message."""

from __future__ import annotations

from typing import Any

from veracity import App, Context

app = App("ui-tests")

TOUR = "ui:demo/tour.run"
CHILD = "ui:demo/child.run"
WAITER = "ui:demo/waiter.run-cancellable"


def charge(order: str) -> dict[str, Any]:
    return {"receipt": f"r-{order}"}


@app.workflow(TOUR)
async def tour(ctx: Context, order: str) -> dict[str, Any]:
    receipt = await ctx.step(charge, order)
    await ctx.sleep(0.2)
    approval = await ctx.recv("approval")
    first = await ctx.call(CHILD, "a")
    second = await ctx.call(CHILD, "b")
    return {"receipt": receipt, "approval": approval, "children": [first, second]}


@app.workflow(CHILD)
async def child(ctx: Context, name: str) -> str:
    return f"hello {name}"


@app.workflow(WAITER)
async def waiter(ctx: Context, label: str) -> Any:
    return await ctx.recv("go")
