"""Apps for the replayer's tests, importable by CLI subprocesses as
``tests.testing.replay_apps:<name>``.

``app`` is the code that really runs an order (every kind of call: steps, now, a durable
sleep, a child, a schedule, a receive); the others register the same workflow name with a
code change each, to replay the recorded histories against:

- ``renamed``: the first step calls another function;
- ``other_args``: the first step gets other arguments;
- ``removed``: the last step is gone (the history holds a call the code never makes);
- ``added``: a step more at the end (consistent so far: the history ends first).

Every step appends its name to the marks file named by the workflow's parameters, so a
test can tell that a replay ran none.
"""

from __future__ import annotations

from typing import Any

from veracity import App, Context

PROCESS = "rep:orders/process.run"
SEND = "rep:mail/send.run"
AUDIT = "rep:audit/log.run"


def _mark(marks: str, what: str) -> None:
    with open(marks, "a", encoding="utf-8") as f:
        f.write(what + "\n")


def charge(marks: str, order_id: str, cents: int) -> dict[str, Any]:
    _mark(marks, "charge")
    return {"order_id": order_id, "charged": cents}


def bill(marks: str, order_id: str, cents: int) -> dict[str, Any]:
    _mark(marks, "bill")
    return {"order_id": order_id, "billed": cents}


def ship(marks: str, order_id: str) -> str:
    _mark(marks, "ship")
    return f"shipped {order_id}"


def notify(marks: str, order_id: str) -> str:
    _mark(marks, "notify")
    return f"notified {order_id}"


def build(change: str | None = None) -> App:
    app = App(f"replay-{change or 'original'}")

    @app.workflow(PROCESS)
    async def process(ctx: Context, marks: str, order_id: str) -> dict[str, Any]:
        if change == "renamed":
            receipt = await ctx.step(bill, marks, order_id, 2500)
        else:
            cents = 3000 if change == "other_args" else 2500
            receipt = await ctx.step(charge, marks, order_id, cents)
        at = ctx.now()
        await ctx.sleep(1)  # long enough that its "blocked" is written before its end
        mail = await ctx.call(SEND, order_id)
        audit = await ctx.schedule(AUDIT, order_id)
        decision = await ctx.recv("approval", timeout=30)
        shipped = None
        if change != "removed":
            shipped = await ctx.step(ship, marks, order_id)
        if change == "added":
            await ctx.step(notify, marks, order_id)
        return {"receipt": receipt, "at": at.isoformat(), "mail": mail,
                "audit": str(audit), "decision": decision, "shipped": shipped}

    if change is None:  # the changed apps register only the workflow they change

        @app.workflow(SEND)
        async def send(ctx: Context, to: str) -> str:
            return f"mailed {to}"

        @app.workflow(AUDIT)
        async def audit(ctx: Context, what: str) -> str:
            return f"logged {what}"

    return app


app = build()
renamed = build("renamed")
other_args = build("other_args")
removed = build("removed")
added = build("added")
