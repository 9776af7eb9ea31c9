"""The example app that ``make run`` serves: a tiny shop.

Run it with ``VERACITY_APP=veracity.examples.shop:app veracity server``.
"""

from __future__ import annotations

from typing import Any

from veracity import App, Context

app = App("shop")


def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
    """A payment call; inside a workflow it runs as a checkpointed step."""
    return {"order_id": order_id, "charged_cents": amount_cents, "receipt": f"r-{order_id}"}


@app.workflow("shop:orders/process.run")
async def process_order(ctx: Context, order_id: str, amount_cents: int = 1000) -> dict[str, Any]:
    receipt = await ctx.step(charge, order_id, amount_cents)
    return {"order_id": order_id, "receipt": receipt}


@app.workflow("shop:mail/send.run")
async def send_mail(ctx: Context, to: str, subject: str) -> str:
    return f"queued mail to {to}: {subject}"


@app.workflow("shop:monitor/stock.run-cancellable")
async def watch_stock(ctx: Context, sku: str) -> None:
    """A long-running, cancellable monitor (see the generations guide)."""
    return None
