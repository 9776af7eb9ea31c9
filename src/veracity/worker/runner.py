"""The worker: claims executions, runs them under a lease, and writes only while it owns them.

- Claims due pending executions in batches (one statement), up to its free slots: those of
  its own deployment, and those of every deployment for workflows registered with
  ``upgrade="auto"`` (docs/deployments.md).
- Wakes on LISTEN/NOTIFY where the store has it, and polls anyway, so a lost notification
  costs latency, never an execution. The database is the queue: nothing is queued in memory.
- Renews all its leases in one statement every heartbeat interval. An execution missing
  from the renewal has lost its lease: it is interrupted at its next step boundary, and
  every write it still attempts is fenced out by the store (and kept as a late report).
- Completions are batched: those that finish while one batch is being written go out
  together in the next statement, each still guarded by its own lease.
- On shutdown it stops claiming, lets in-flight steps finish within the grace period, and
  releases what is left back to pending at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from veracity.adapters.base import Engine
from veracity.adapters.config import ExternalConfig
from veracity.app import App, WorkflowDef
from veracity.bindings import Bindings, redact_text
from veracity.config import WorkerSettings
from veracity.core.params import shapes_of_functions
from veracity.core.requests import InterruptKind
from veracity.core.states import Status
from veracity.host import host_key
from veracity.models import JSON, Claim, Execution, TransitionResult, WorkerInfo
from veracity.store._common import claim_split
from veracity.store.protocol import WorkerStore
from veracity.worker.context import (
    Context,
    ExecutionInterrupted,
    ExecutionSuspended,
    Journal,
    NondeterminismError,
    NotJSONError,
    to_json_value,
)
from veracity.worker.journal import retries_made
from veracity.worker.trigger import trigger

if TYPE_CHECKING:
    from veracity.telemetry import Telemetry
    from veracity.worker._http_client import HttpClient

log = logging.getLogger("veracity.worker")
RETRY_CAP = 1.0
"""The longest wait between a worker's tries of a database that does not answer: once it
answers again the worker registers, claims and listens again within about a second."""
EXTRA = {"domain": "worker"}
SHUTDOWN_REASON = "worker shutting down"
HANDOFF_GRACE = 1.0
"""Seconds a worker keeps a slot for a hand-off it learnt was taken and has not heard yet
(its notification was sent when the submission committed, before the worker learnt it)."""


MAX_CLAIM = 128
"""The most one claim takes however many slots a worker has: a burst of work is spread
over the workers asking for it, 128 at a time, not taken whole by the first one."""


def claim_limit(concurrency: int) -> int:
    """The most one claim takes: half the worker's slots, rounded up, and at most
    :data:`MAX_CLAIM` (docs/workers.md, "Concurrency"). Its next claim is then on its way
    to the database while the executions of the last one run, instead of after them;
    claims of all the slots at once left the worker idle for each claim's round trip."""
    return min(MAX_CLAIM, (concurrency + 1) // 2)


class RateLimitedLog:
    """Says a recurring problem once per interval (with how often it happened), not once
    per attempt."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: Any) -> bool:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        again = self._suppressed.pop(key, 0)
        self._last[key] = now
        suffix = f" ({again} more since the last report)" if again else ""
        log.warning(message + suffix, *args, extra=EXTRA)
        return True


async def cancel_all(tasks: list[asyncio.Task[None]], again_after: float = 0.5) -> None:
    """Cancel ``tasks`` and wait for their end, cancelling again any still going after
    ``again_after`` seconds. A cancel can be lost inside a library (on Python 3.11, for
    one, ``asyncio.wait_for`` returns its result when it completes as the cancel arrives),
    and a helper loop then goes on: a worker's stop once waited forever on its heartbeat
    loop, still running after its cancel (tests/worker/test_processes.py under load, seen
    with ``kill -USR1``: docs/workers.md)."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_after)
    for task in tasks:  # their outcomes retrieved: nothing logged as never retrieved
        if not task.cancelled():
            task.exception()


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def workflow_error(code: str, exc: BaseException | None = None, message: str = "") -> JSON:
    # secret values (docs/http.md) are redacted from whatever is stored
    error: dict[str, JSON] = {"code": code, "message": redact_text(message or str(exc))}
    if exc is not None:
        error["type"] = type(exc).__name__
        error["traceback"] = redact_text("".join(traceback.format_exception(exc)))[-4000:]
    return error


@dataclass
class Run:
    """One execution this worker is running."""

    execution: Execution
    claim: Claim
    ctx: Context | None = None
    task: asyncio.Task[None] | None = None
    interrupt: str | None = None
    """A cancel or pause that arrived before the context existed."""
    delegated: bool = False
    """Handed to an external engine: it holds no lease any more, so it is not renewed."""
    retries: int = 0
    """How many times the workflow was retried already after its own error."""


@dataclass
class _Pending:
    claim: Claim
    item: Any
    future: asyncio.Future[TransitionResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Batcher:
    """Batches fenced writes of one owner into one statement per flush, without delay: the
    writes that arrive while a flush is in flight form the next batch. Each execution
    appears at most once per batch (two concurrent steps of one workflow go out in turn).
    Every write still answers only once its own statement has committed."""

    def __init__(
        self,
        write_many: Callable[[list[tuple[Claim, Any]]], Awaitable[list[TransitionResult]]],
        max_batch: int = 500,
    ) -> None:
        self._write_many = write_many
        self._max_batch = max_batch
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self.flushes = 0

    async def submit(self, claim: Claim, item: Any) -> TransitionResult:
        pending = _Pending(claim, item)
        self._queue.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await pending.future

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        rest: list[_Pending] = []
        ids: set[uuid.UUID] = set()
        for p in self._queue:
            if len(batch) < self._max_batch and p.claim.execution_id not in ids:
                ids.add(p.claim.execution_id)
                batch.append(p)
            else:
                rest.append(p)
        self._queue = rest
        return batch

    async def _flush(self) -> None:
        while self._queue:
            batch = self._take_batch()
            self.flushes += 1
            try:
                outcomes = await self._write_many([(p.claim, p.item) for p in batch])
            except Exception as exc:
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, outcome in zip(batch, outcomes, strict=True):
                if not p.future.done():
                    p.future.set_result(outcome)


class Completer(Batcher):
    """Batched completions (see :class:`Batcher`)."""

    def __init__(self, store: WorkerStore, owner: str, max_batch: int = 500) -> None:
        async def write(items: list[tuple[Claim, Any]]) -> list[TransitionResult]:
            return await store.execution_complete_many_if_owned(owner, items)

        super().__init__(write, max_batch)

    async def complete(self, claim: Claim, result: JSON) -> TransitionResult:
        return await self.submit(claim, result)


class Checkpointer(Batcher):
    """Batched journal writes (step results...) of concurrent runs (see :class:`Batcher`):
    still one round trip per step, and one commit for many."""

    def __init__(self, store: WorkerStore, owner: str, max_batch: int = 500) -> None:
        async def write(items: list[tuple[Claim, Any]]) -> list[TransitionResult]:
            return await store.execution_checkpoint_many_if_owned(
                owner, [(claim, kind, data) for claim, (kind, data) in items])

        super().__init__(write, max_batch)

    async def checkpoint(self, claim: Claim, kind: str, data: JSON) -> TransitionResult:
        return await self.submit(claim, (kind, data))


class _WakingStore:
    """The worker's store on a database without notifications (SQLite): the writes that
    can make work claimable at once — children spawned, an execution ended whose parent
    waits for it, a wait that turned out due — wake the worker's claim loop directly,
    instead of leaving the work to the next poll (docs/workers.md)."""

    WAKING = frozenset({
        "execution_spawn_if_owned", "execution_complete_if_owned", "execution_fail_if_owned",
        "execution_release_if_owned", "execution_complete_many_if_owned",
        "execution_block_if_owned", "execution_stop_if_owned",
    })

    def __init__(self, store: WorkerStore, wake: Callable[[], None]) -> None:
        self._store = store
        self._wake = wake

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in self.WAKING:
            return attr

        async def waking(*args: Any, **kwargs: Any) -> Any:
            try:
                return await attr(*args, **kwargs)
            finally:
                self._wake()

        return waking


class Worker:
    def __init__(
        self,
        store: WorkerStore,
        app: App,
        *,
        settings: WorkerSettings | None = None,
        deployment_id: str | None = None,
        worker_id: str | None = None,
        ffqns: Sequence[str] | None = None,
        external: ExternalConfig | None = None,
        engines: Mapping[str, Engine] | None = None,
        http: Bindings | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.telemetry = telemetry
        """Where this worker counts what it does (docs/operations.md, Metrics)."""
        self.store: WorkerStore = (
            store if store.supports_notifications
            else cast(WorkerStore, _WakingStore(store, self.wake)))
        self.app = app
        self.external = external
        self.engines = dict(engines or {})
        self.settings = settings or WorkerSettings()
        self.deployment_id = deployment_id or app.code_digest()
        self.id = worker_id or new_worker_id()
        if ffqns is None:
            ffqns = [*app.workflows, *(external.workflows if external else ())]
        self.ffqns = sorted(set(ffqns))
        # claimed from every deployment (docs/deployments.md); the others only from ours
        self.upgrade_ffqns = [f for f in app.upgrading if f in self.ffqns]
        self.shapes = shapes_of_functions({f: wf.fn for f, wf in app.workflows.items()})
        """The parameters each of the app's workflows takes: a workflow's new children and
        schedules of them are checked against it (docs/workflows.md)."""
        self.ttl = timedelta(seconds=self.settings.lease_ttl)
        self.runs: dict[uuid.UUID, Run] = {}
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._ending: set[uuid.UUID] = set()
        """Executions whose workflow code has ended and whose completion or failure is being
        written: they keep their lease (renewed, fenced) but not their slot, up to
        ``concurrency`` of them (docs/workers.md, "Concurrency")."""
        self._stopping = asyncio.Event()
        self._completer = Completer(self.store, self.id)
        self._checkpointer = Checkpointer(self.store, self.id)
        self._trouble = RateLimitedLog(interval=max(self.settings.poll_interval, 5.0))
        self._lease_deadline: dict[uuid.UUID, float] = {}
        self._next_timer_check = 0.0
        self._stale: set[asyncio.Task[None]] = set()
        self._hints: set[asyncio.Task[None]] = set()
        self.claimed_total = 0
        self.finished_total = 0
        self.bindings = http or Bindings()
        """The ``[[http]]`` bindings ``ctx.http`` is held to (docs/http.md)."""
        self._http: HttpClient | None = None
        # Hand-offs (docs/workers.md, "Hand-off to an idle worker"): the workflows an offer
        # names (those claimed from our deployment only), whether an offer of ours may be
        # out, until when a slot is kept for a taken one not heard yet, how many were heard.
        self._offer_ffqns = claim_split(self.ffqns, self.deployment_id, self.upgrade_ffqns)[0]
        self._offered = False
        self._awaiting_handoff = 0.0
        self._handed = 0
        self._listening = False
        self.handed_total = 0
        self._hinted = False
        """A hint of work (a pending notification, :meth:`wake`) came since the last claim
        was sent."""
        self._last_claim = 0.0
        """When the last claim answered (``time.monotonic()``): the next poll is due
        ``poll_interval`` after it."""
        self._drained = False
        """The last claim came back with room to spare: nothing more was due then."""
        self._parked = False
        """The claim loop waits for a hint (its offer out, or a slot kept for a taken one):
        a hand-off heard then wakes it to offer again. Heard at any other time, the loop
        offers again on its own; a wake then would come after the new offer, and with its
        only free slot kept for that offer the loop would withdraw it to claim, leaving no
        offer out for a moment (a submission then goes pending and is claimed)."""

    @property
    def http(self) -> HttpClient:
        """``ctx.http`` of every execution this worker runs (docs/http.md): made when a
        workflow first uses it (so that a worker whose workflows never do never loads
        httpx)."""
        if self._http is None:
            from veracity.worker._http_client import HttpClient

            self._http = HttpClient(self.bindings)
        return self._http

    # -- lifecycle ------------------------------------------------------------------------

    def wake(self) -> None:
        """A hint that work may be waiting (an in-process submission, a notification)."""
        self._hinted = True
        self._wake.set()

    def interrupted(self, execution_id: uuid.UUID) -> None:
        """A hint that a cancel or pause was requested (in-process, where no notification
        carries it): runs of this worker learn it now, not at the next heartbeat."""
        if self.runs:
            task = asyncio.get_running_loop().create_task(self._check_interrupts_quietly())
            self._hints.add(task)  # kept referenced until done
            task.add_done_callback(self._hints.discard)

    async def _check_interrupts_quietly(self) -> None:
        try:
            await self.check_interrupts()
        except Exception as exc:  # the heartbeat checks again anyway
            self._trouble.warning("db", "checking interrupts failed: %s", exc)

    def stop(self) -> None:
        """Stop claiming; :meth:`run` then drains and returns."""
        self._stopping.set()
        self._wake.set()
        self._slot_freed.set()

    async def run(self) -> None:
        """Register, work until :meth:`stop`, then drain and release."""
        if self._http is not None and self._http.is_closed:  # run again after a stop
            self._http = None
        await self._register()
        helpers = [asyncio.create_task(self._heartbeat_loop(), name="veracity-heartbeat")]
        if self.settings.notifications and self.store.supports_notifications:
            helpers.append(asyncio.create_task(self._listen_loop(), name="veracity-listen"))
            helpers.append(asyncio.create_task(self._interrupt_loop(),
                                               name="veracity-interrupts"))
        try:
            await self._claim_loop()
        finally:
            # a hand-off taken before the offer was withdrawn is released by the drain
            while time.monotonic() < self._awaiting_handoff:
                await asyncio.sleep(0.01)
            await self._drain()
            await cancel_all(helpers)
            if self._http is not None:
                await self._http.close_for_worker()
            try:
                await self.store.worker_stop(self.id)
            except Exception as exc:
                log.warning("could not record the worker's stop: %s", exc, extra=EXTRA)
            log.info("worker stopped", extra={**EXTRA, "worker_id": self.id})

    async def _register(self) -> None:
        info = WorkerInfo(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            deployment_id=self.deployment_id,
            ffqns=self.ffqns,
            concurrency=self.settings.concurrency,
            upgrade_ffqns=self.upgrade_ffqns,
            heartbeat_interval=self.settings.effective_heartbeat_interval,
            host_key=host_key(),
        )
        delay = 0.1
        while not self._stopping.is_set():
            try:
                await self.store.worker_register(info)
                log.info("worker started", extra={**EXTRA, "worker_id": self.id,
                                                   "workflows": self.ffqns,
                                                   "deployment_id": self.deployment_id,
                                                   "http": self.bindings.describe()})
                return
            except Exception as exc:
                self._trouble.warning("db", "database unavailable, retrying: %s", exc)
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_CAP)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake early when stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except TimeoutError:
            pass

    # -- claiming ---------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        delay = 0.1
        try:
            while not self._stopping.is_set():
                free = self.settings.concurrency - self._busy() - self._kept_for_handoff()
                if free <= 0 and self._offered and self._busy() < self.settings.concurrency:
                    # the only free slot is kept for our offer: withdraw it to claim
                    try:
                        await self._withdraw_offer()
                    except Exception as exc:
                        self._trouble.warning("db", "withdrawing the offer failed: %s", exc)
                        await self._sleep(delay)
                        delay = min(delay * 2, RETRY_CAP)
                    continue
                if free <= 0:
                    if self._busy() < self.settings.concurrency:  # kept for a taken offer
                        self._wake.clear()
                        self._parked = True
                        try:
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(
                                    self._wake.wait(),
                                    timeout=max(0.0, self._awaiting_handoff - time.monotonic()))
                        finally:
                            self._parked = False
                        continue
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                    continue
                if (self._drained and not self._hinted and not self._offered
                        and self._handoff_enabled()
                        and time.monotonic() < self._last_claim + self.settings.poll_interval):
                    # woken by a hand-off alone: the last claim left nothing due, no hint
                    # came since and no poll is due, so offer the free slot again at once
                    self._wake.clear()
                    await self._offer_and_park()
                    continue
                self._wake.clear()  # before the claim: a hint arriving during it is kept
                self._hinted = False
                self._drained = False
                free = min(free, claim_limit(self.settings.concurrency))
                try:
                    batch = await self.store.execution_claim(
                        self.id, self.ffqns, limit=free, lease_ttl=self.ttl,
                        deployment_id=self.deployment_id, upgrade_ffqns=self.upgrade_ffqns,
                    )
                except Exception as exc:
                    self._trouble.warning("db", "claim failed, retrying with backoff: %s", exc)
                    await self._sleep(delay)
                    delay = min(delay * 2, RETRY_CAP)
                    continue
                delay = 0.1
                now = self._last_claim = time.monotonic()
                if self.telemetry is not None:
                    self.telemetry.claimed(len(batch))
                for execution in batch:
                    self._start(execution, now)
                # due durable timers (sleeps, receive timeouts) become pending, once per
                # poll interval; after the claim, so that a woken claim never waits behind it
                woken = await self._wake_due_timers(now)
                if len(batch) == free or woken:
                    continue  # there may be more; claim again as soon as slots allow
                self._drained = True
                await self._offer_and_park()
        finally:
            if self._offered:  # stopping: take no more hand-offs
                # bounded: a stop never waits long on the database (the offer ends on its
                # own within poll_interval + 1 s; one taken meanwhile is recovered)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(HANDOFF_GRACE * 2):
                        await self._withdraw_offer()

    async def _offer_and_park(self) -> None:
        """Offer a free slot (hand-offs), then wait for a hint until the next poll is due
        (``poll_interval`` after the last claim answered). An offer taken as it was written is
        not waited on: the loop goes round at once to offer again."""
        heard = self._handed
        await self._offer()
        if self._handed != heard and not self._offered:
            return
        self._parked = True
        try:
            await asyncio.wait_for(
                self._wake.wait(),
                timeout=max(0.0, self._last_claim + self.settings.poll_interval
                            - time.monotonic()))
        except TimeoutError:
            pass
        finally:
            self._parked = False

    # -- hand-offs (docs/workers.md, "Hand-off to an idle worker") -------------------------

    def _kept_for_handoff(self) -> int:
        """Slots kept for hand-offs: one while an offer of ours may be out or a taken one
        has not been heard yet."""
        return 1 if self._offered or time.monotonic() < self._awaiting_handoff else 0

    def _handoff_enabled(self) -> bool:
        return (self.settings.handoff and self.settings.notifications
                and self.store.supports_handoff and bool(self._offer_ffqns))

    async def _offer(self) -> None:
        """Found nothing more to claim: offer to take the next submission directly, while
        a slot is free and we hear hand-offs; an offer out already is made to last longer
        (so that it outlives the poll interval only by a second), never replaced: one
        taken meanwhile is owed its slot, and a new one would be owed another."""
        if (not self._handoff_enabled() or not self._listening or self._stopping.is_set()
                or time.monotonic() < self._awaiting_handoff
                or self._busy() >= self.settings.concurrency):
            return
        expires_in = timedelta(seconds=self.settings.poll_interval + 1.0)
        if self._offered:
            heard = self._handed
            try:
                still = await self.store.offer_refresh(self.id, expires_in=expires_in)
            except Exception as exc:
                self._trouble.warning("db", "refreshing the offer failed: %s", exc)
                return
            if not still:
                self._offer_gone(heard)
            return
        self._offered = True  # before the write: a hand-off heard meanwhile clears it
        try:
            await self.store.offer_post(
                self.id, deployment_id=self.deployment_id, ffqns=self._offer_ffqns,
                lease_ttl=self.ttl, expires_in=expires_in)
        except Exception as exc:
            # not known to be posted: one expires on its own, and withdrawing it first
            # keeps the slot count right
            self._trouble.warning("db", "posting an offer failed: %s", exc)

    async def _withdraw_offer(self) -> None:
        heard = self._handed
        self._offered = False
        try:
            kept = await self.store.offer_withdraw(self.id)
        except BaseException:
            self._offered = True  # still possibly out
            raise
        if not kept:
            self._offer_gone(heard)

    def _offer_gone(self, heard: int) -> None:
        """Our offer was not there any more: unless a hand-off was heard since ``heard``
        (the count then), a submission took it and its notification is on its way; a slot
        is kept for it (HANDOFF_GRACE)."""
        self._offered = False
        if self._handed == heard:
            self._awaiting_handoff = time.monotonic() + HANDOFF_GRACE

    async def _adopt_unheard(self) -> None:
        """Listening again after the connection was lost: a hand-off taken meanwhile was
        never heard. Withdraw the offer, and run what is leased to us and not running."""
        try:
            async with asyncio.timeout(5.0):  # the listener never waits long on it
                if self._offered:
                    await self._withdraw_offer()
                held = await self.store.execution_leased_to(self.id)
        except Exception as exc:
            self._trouble.warning("db", "looking for unheard hand-offs failed: %s", exc)
            return
        for execution in held:
            if execution.id not in self.runs and not self._stopping.is_set():
                log.info("running a hand-off whose notification was lost",
                         extra={**EXTRA, "execution_id": str(execution.id)})
                self._handed_off(execution)

    def _handed_off(self, execution: Execution) -> None:
        """A submission was written claimed by us (our offer): run it as a claimed one."""
        self._handed += 1
        self._offered = False
        self._awaiting_handoff = 0.0
        if execution.lease_owner != self.id or execution.status is not Status.RUNNING:
            return  # not ours (cannot happen: our own channel)
        self.handed_total += 1
        if self._stopping.is_set():  # taken before we withdrew the offer: back to pending
            task = asyncio.get_running_loop().create_task(self._release(
                Claim(execution.id, self.id, execution.lease_epoch), SHUTDOWN_REASON))
            self._stale.add(task)  # the drain waits for it
            task.add_done_callback(self._stale.discard)
            return
        if self.telemetry is not None:
            self.telemetry.handed_off()
        self._start(execution, time.monotonic())
        if self._parked:
            self._wake.set()  # offer again while slots are free

    def _busy(self) -> int:
        """Slots taken: every execution held, but those whose code has ended and whose last
        write is under way, up to ``concurrency`` of them (so that at most twice
        ``concurrency`` are held)."""
        return len(self.runs) - min(len(self._ending), self.settings.concurrency)

    def _ended(self, claim: Claim) -> None:
        """The workflow's code has ended: its slot is free while its last write goes out.
        Not for a run that a newer claim of the same execution replaced (the slot is the
        newer run's)."""
        current = self.runs.get(claim.execution_id)
        if current is not None and current.claim == claim:
            self._ending.add(claim.execution_id)
            self._slot_freed.set()

    async def _wake_due_timers(self, now: float) -> int:
        """Every ``poll_interval``: due timers' executions made pending (how many)."""
        if now < self._next_timer_check:
            return 0
        self._next_timer_check = now + self.settings.poll_interval
        try:
            return len(await self.store.execution_wake_due(limit=1000))
        except Exception as exc:
            self._trouble.warning("db", "waking due timers failed, retrying: %s", exc)
            return 0

    def _start(self, execution: Execution, claimed_at: float) -> None:
        claim = Claim(execution.id, self.id, execution.lease_epoch)
        run = Run(execution, claim)
        # a cancel or pause requested before the claim is acted on at the first await
        if execution.cancel_requested_at is not None:
            run.interrupt = "cancel"
        elif execution.pause_requested_at is not None:
            run.interrupt = "pause"
        previous = self.runs.get(execution.id)
        if previous is not None and previous.claim == claim:
            return  # this very claim, started already (a hand-off found two ways)
        if previous is not None:
            # we claimed it again (a newer epoch) while an old run of ours was still going:
            # that one has lost its lease; stop it, and keep it tracked for the drain
            self._lose(previous, "claimed again with a newer epoch")
            previous.interrupt = "lease_lost"
            if previous.task is not None:
                self._stale.add(previous.task)
                previous.task.add_done_callback(self._stale.discard)
        self.runs[execution.id] = run
        self._ending.discard(execution.id)  # a new run of it: its code has not ended
        # a conservative local estimate of the lease's end, by the monotonic clock
        self._lease_deadline[execution.id] = claimed_at + self.settings.lease_ttl
        self.claimed_total += 1
        if self.telemetry is not None:
            self.telemetry.started(execution)
        run.task = asyncio.create_task(self._execute(run), name=f"veracity-{execution.id}")

    # -- running ------------------------------------------------------------------------------

    async def _execute(self, run: Run) -> None:
        execution, claim = run.execution, run.claim
        try:
            if self.external is not None and execution.ffqn in self.external.workflows:
                await self._trigger(run)
                return
            wf = self.app.get(execution.ffqn)
            if wf is None:  # cannot happen: we claim only registered names
                await self._release(claim, "workflow not registered in this worker")
                return
            journal = await self._journal(run)
            ctx = Context(
                store=self.store,
                claim=claim,
                execution_id=execution.id,
                deployment_id=execution.deployment_id,
                attempt=execution.attempt,
                journal=journal,
                lease_valid=lambda: time.monotonic() < self._lease_deadline.get(
                    execution.id, 0.0),
                clock_base=execution.updated_at,  # the claim's time, by the database
                signal_seq=execution.signal_seq,
                checkpoint=self._checkpointer.checkpoint,
                retry=run.retries,
                claimed_seq=execution.history_seq,
                http_source=lambda: self.http,
                telemetry=self.telemetry,
                ffqn=execution.ffqn,
                shapes=self.shapes,
            )
            run.ctx = ctx
            if run.interrupt is not None:
                ctx.interrupt(run.interrupt)
            await self._run_workflow(wf, run, ctx)
        except ExecutionSuspended:
            pass  # blocked in the database: nothing held, nothing more to write
        except ExecutionInterrupted as stop:
            await self._interrupted(claim, stop.reason)
        except asyncio.CancelledError:
            # forced at the end of the shutdown grace period: give the execution back
            await asyncio.shield(self._release(claim, SHUTDOWN_REASON))
            raise
        except Exception as exc:  # infrastructure trouble: leave it to lease recovery
            self._trouble.warning(
                "run", "execution %s stopped by an infrastructure error: %s", execution.id, exc
            )
        finally:
            if self.runs.get(execution.id) is run:  # not a newer run of the same execution
                self._ending.discard(execution.id)
                self.runs.pop(execution.id, None)
                self._lease_deadline.pop(execution.id, None)
            self.finished_total += 1
            self._slot_freed.set()

    async def _trigger(self, run: Run) -> None:
        assert self.external is not None
        workflow = self.external.workflows[run.execution.ffqn]
        engine = self.engines.get(workflow.engine)
        if engine is None or self.external.public_url is None:
            await self._release(run.claim, f"engine {workflow.engine} is not available here")
            return
        # from the delegation on it holds no lease: a slow engine call is not a lost lease
        run.delegated = True
        what = await trigger(self.store, engine, workflow, run.execution, run.claim,
                             self.external.public_url, telemetry=self.telemetry)
        log.info("trigger: %s", what, extra={**EXTRA, "execution_id": str(run.execution.id),
                                             "engine": workflow.engine})

    async def _journal(self, run: Run) -> Journal:
        # a first run has only its `pending` and `running` events: nothing to replay (but an
        # operator's retry, whose history holds the failed run's calls)
        if run.execution.history_seq <= 2 and run.execution.retry_of is None:
            return Journal()
        events = await self.store.history_list(run.execution.id, limit=100_000)
        run.retries = retries_made(events)
        return Journal.from_history(events)

    async def _run_workflow(self, wf: WorkflowDef, run: Run, ctx: Context) -> None:
        claim = run.claim
        # no timeout: no asyncio.timeout either (a few µs of every no-op's run)
        limit = asyncio.timeout(wf.timeout.total_seconds()) if wf.timeout else None
        bound: contextlib.AbstractAsyncContextManager[Any] = (
            limit if limit is not None else contextlib.nullcontext())
        try:
            async with bound:
                value = await wf.fn(ctx, *run.execution.params)
        except (ExecutionInterrupted, ExecutionSuspended):
            if ctx.nondeterminism is not None:
                await self._fail(claim, workflow_error("nondeterminism", ctx.nondeterminism))
                return
            raise
        except Exception as exc:
            timed_out = isinstance(exc, TimeoutError) and limit is not None \
                and limit.expired()
            # its own error ends the run: recorded calls it never reached are a divergence
            # too (not after its timeout, which may stop it before the end of its history)
            if not timed_out:
                ctx.finish()
            if ctx.nondeterminism is not None:  # whatever the workflow made of it
                await self._fail(claim, workflow_error("nondeterminism", ctx.nondeterminism))
                return
            await ctx.settle()  # what it scheduled before failing is kept
            await self._fail_with(run, wf, limit, exc)
            return
        # swallowed by the workflow, or calls left in its history: still a failure
        if ctx.finish() is not None:
            await self._fail(claim, workflow_error("nondeterminism", ctx.nondeterminism))
            return
        await ctx.settle()
        await self._complete(claim, value)

    async def _fail_with(self, run: Run, wf: WorkflowDef, limit: asyncio.Timeout | None,
                         exc: Exception) -> None:
        """The workflow raised: retry it if its policy says so (its own error or its
        timeout), else record why, with the code that names the cause."""
        claim = run.claim
        retryable = True
        if (isinstance(exc, TimeoutError) and wf.timeout is not None and limit is not None
                and limit.expired()):
            error = workflow_error("timeout", exc, "workflow ran longer than its timeout of "
                                   f"{wf.timeout.total_seconds():g}s")
        elif isinstance(exc, NondeterminismError):
            error, retryable = workflow_error("nondeterminism", exc), False
        elif isinstance(exc, NotJSONError):
            error, retryable = workflow_error("step_result_not_json", exc), False
        else:  # its own error (its own TimeoutError included)
            error = workflow_error("workflow_error", exc)
        tries = run.retries + 1
        if retryable and wf.retry.should_retry(tries, exc):
            delay = wf.retry.delay(tries, random.random())
            log.info("workflow failed; retry %d of %d in %.3g s", tries,
                     wf.retry.max_attempts - 1, delay,
                     extra={**EXTRA, "execution_id": str(claim.execution_id)})
            await self._write(lambda: self.store.execution_retry_if_owned(
                claim, error, retry=tries, of=wf.retry.max_attempts - 1, delay=delay), claim)
            return
        await self._fail(claim, error)

    async def _complete(self, claim: Claim, value: Any) -> None:
        # The workflow returned: its completion is written even if a cancel or pause arrived
        # meanwhile (the cancel is then kept as a late report); a lost lease fences it out.
        try:
            result = to_json_value(value, "the workflow's result")
        except NotJSONError as exc:
            await self._fail(claim, workflow_error("result_not_json", exc))
            return
        self._ended(claim)
        outcome = await self._write(lambda: self._completer.complete(claim, result), claim)
        if outcome is not None and not outcome.applied:
            log.warning("completion refused (%s)", outcome.reason,
                        extra={**EXTRA, "execution_id": str(claim.execution_id)})

    async def _interrupted(self, claim: Claim, reason: str) -> None:
        if reason == "lease_lost":
            log.warning("lease lost; stopped at a step boundary",
                        extra={**EXTRA, "execution_id": str(claim.execution_id)})
            return
        if reason in set(InterruptKind):
            kind = InterruptKind(reason)
            outcome = await self._write(
                lambda: self.store.execution_stop_if_owned(claim, kind), claim)
            log.info("%s at a step boundary", reason,
                     extra={**EXTRA, "execution_id": str(claim.execution_id),
                            "status": str(outcome.execution.status)
                            if outcome and outcome.execution else None})
            return
        await self._release(claim, reason)

    async def _fail(self, claim: Claim, error: JSON) -> None:
        self._ended(claim)
        await self._write(lambda: self.store.execution_fail_if_owned(claim, error), claim)

    async def _release(self, claim: Claim, reason: str) -> None:
        try:
            await self.store.execution_release_if_owned(claim, reason)
        except Exception as exc:
            self._trouble.warning("db", "release failed (recovery will take it): %s", exc)

    async def _write(
        self, attempt: Callable[[], Any], claim: Claim
    ) -> TransitionResult | None:
        """A final write (complete/fail), retried through database trouble for as long as
        our lease can still be valid; after that, lease recovery owns the execution."""
        delay = 0.05
        in_doubt = False
        while True:
            try:
                if in_doubt and await self._ended_by(claim):
                    # the write whose answer was lost had landed: writing it again would
                    # be refused and kept as a late report of our own exit
                    return TransitionResult(True, None, "written before its answer was lost")
                result: TransitionResult = await attempt()
                if self.telemetry is not None:
                    if result.applied:
                        self.telemetry.end(result.exit or result.execution)
                    elif result.execution is not None:  # refused: kept as a late report
                        self.telemetry.late("worker")
                return result
            except Exception as exc:
                in_doubt = True
                deadline = self._lease_deadline.get(claim.execution_id, 0.0)
                if time.monotonic() + delay >= deadline:
                    self._trouble.warning(
                        "db", "giving up a write for %s (its lease has run out): %s",
                        claim.execution_id, exc)
                    return None
                self._trouble.warning("db", "write failed, retrying: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _ended_by(self, claim: Claim) -> bool:
        """Whether the history holds a state event written by this claim since it was
        claimed: every exit from running names the owner and epoch that wrote it."""
        state_kinds = {str(status) for status in Status}
        run = self.runs.get(claim.execution_id)
        since = run.execution.history_seq if run is not None else 0
        for ev in await self.store.history_list(claim.execution_id, after_seq=since,
                                                limit=100_000):
            if ev.kind in state_kinds and isinstance(ev.data, Mapping) \
                    and ev.data.get("owner") == claim.owner \
                    and ev.data.get("epoch") == claim.epoch:
                return True
        return False

    # -- leases ---------------------------------------------------------------------------------

    async def heartbeat(self) -> list[Claim]:
        """Renew every lease once; interrupt the runs whose lease is gone. Returns the lost."""
        runs = [r for r in self.runs.values() if not r.delegated]
        sent = time.monotonic()
        renewed = await self.store.lease_renew(self.id, [r.claim for r in runs], self.ttl)
        kept = {(c.execution_id, c.epoch) for c in renewed}
        lost: list[Claim] = []
        for run in runs:
            key = (run.claim.execution_id, run.claim.epoch)
            if key in kept:
                self._lease_deadline[run.claim.execution_id] = sent + self.settings.lease_ttl
            else:
                lost.append(run.claim)
                self._lose(run, "renewal refused")
        await self.check_interrupts()
        return lost

    async def check_interrupts(self) -> None:
        """Tell runs whose cancel or pause was requested to stop at their next await."""
        if not self.runs:
            return
        for item in await self.store.execution_interrupts(self.id):
            run = self.runs.get(item.claim.execution_id)
            if run is None or run.claim.epoch != item.claim.epoch:
                continue
            run.interrupt = item.kind
            if run.ctx is not None:
                run.ctx.interrupt(item.kind)

    def _lose(self, run: Run, why: str) -> None:
        if run.ctx is not None:
            run.ctx.interrupt("lease_lost")
        log.warning("lease lost (%s)", why,
                    extra={**EXTRA, "execution_id": str(run.claim.execution_id)})

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.effective_heartbeat_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except Exception as exc:
                self._trouble.warning("db", "heartbeat failed: %s", exc)
                # without a renewal, a lease surely ends by our own monotonic estimate
                now = time.monotonic()
                for run in list(self.runs.values()):
                    if self._lease_deadline.get(run.claim.execution_id, 0.0) <= now:
                        self._lose(run, "not renewed before its end")

    async def _listen_loop(self) -> None:
        delay = 0.1
        handoff_to = self.id if self._handoff_enabled() else None
        listened = False
        while True:
            try:
                async for note in self.store.pending_notifications(handoff_to=handoff_to):
                    if not self._listening and listened and handoff_to is not None:
                        await self._adopt_unheard()
                    self._listening = listened = True
                    if note is None:
                        self.wake()
                    else:
                        self._handed_off(note)
                    delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._trouble.warning("listen", "notifications lost, reconnecting: %s", exc)
            finally:
                self._listening = False
            self.wake()  # something may have arrived while we were not listening
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP)

    async def _interrupt_loop(self) -> None:
        delay = 0.1
        while True:
            try:
                async for execution_id in self.store.interrupt_notifications():
                    if execution_id in self.runs:
                        await self.check_interrupts()
                    delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._trouble.warning("listen", "interrupts lost, reconnecting: %s", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP)

    # -- shutdown -------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Stop at step boundaries within the grace period; then cancel and release."""
        runs = list(self.runs.values())
        if not runs and not self._stale:
            return
        log.info("draining %d executions", len(runs), extra=EXTRA)
        for run in runs:
            run.interrupt = run.interrupt or SHUTDOWN_REASON  # also for one still loading
            if run.ctx is not None:
                run.ctx.interrupt(SHUTDOWN_REASON)
        tasks = [r.task for r in runs if r.task is not None] + list(self._stale)
        _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10)
