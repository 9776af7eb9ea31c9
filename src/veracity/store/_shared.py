"""The durable-engine methods of the Store protocol, shared by both backends: each one
hands an operation of :mod:`veracity.store._ops` to the backend's ``_op`` driver."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from veracity.core.requests import CallbackReport, InterruptKind, ResolveAction
from veracity.core.retry import WORKFLOW_RETRY
from veracity.core.states import Status
from veracity.models import (
    JSON,
    Adopted,
    CallbackResult,
    Claim,
    ControlResult,
    CronDefinition,
    CronFire,
    CronRecord,
    DeploymentSummary,
    Execution,
    HistoryEvent,
    Interrupt,
    NewExecution,
    PruneBatch,
    ReconcileAction,
    Recovered,
    Submitted,
    Taken,
    TransitionResult,
)
from veracity.store import _ops
from veracity.store._common import Leave, recover_sources, require_aware

E = TypeVar("E", bound=StrEnum)


def _member(kind: type[E], value: str, what: str) -> E:
    """``value`` as a member of ``kind``; a value that is none is a ValueError naming it."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"unknown {what} {value!r}") from None


def _completion(claim: Claim, result: JSON) -> Leave:
    return Leave(claim, Status.COMPLETED, "complete",
                 event={"owner": claim.owner, "epoch": claim.epoch},
                 payload={"result": result}, result=result)


class SharedMethods:
    """Methods both backends share: the durable-engine operations (driven by ``_op``) and
    the worker's fenced exits from running, single ones as batches of one (each backend's
    ``_leave_many_if_owned`` and ``execution_checkpoint_many_if_owned``)."""

    async def _op(self, factory: Callable[[], _ops.Op], *, transaction: bool = True) -> Any:
        """Drive ``factory()``'s statements in one transaction; ``transaction=False`` lets a
        backend commit each statement by itself instead (PostgreSQL does, for a group of
        single submissions: its one write is one statement, safe to run again)."""
        raise NotImplementedError

    async def _leave_many_if_owned(self, owner: str, items: Sequence[Leave], *,
                                   brief: bool = False) -> list[TransitionResult]:
        """Each item guarded by the lease fence; refusals (a repeat in the batch included)
        kept as late reports; results in the order of ``items``. ``brief``: an applied
        item's result carries its :class:`Exit`, not its row."""
        raise NotImplementedError

    async def _leave(self, item: Leave) -> TransitionResult:
        # a single exit is a batch of one: one path for every fenced exit
        return (await self._leave_many_if_owned(item.claim.owner, [item]))[0]

    async def execution_complete_if_owned(self, claim: Claim, result: JSON) -> TransitionResult:
        return await self._leave(_completion(claim, result))

    async def execution_complete_many_if_owned(
        self, owner: str, items: Sequence[tuple[Claim, JSON]]
    ) -> list[TransitionResult]:
        if not items:
            return []
        return await self._leave_many_if_owned(
            owner, [_completion(claim, result) for claim, result in items], brief=True)

    async def execution_fail_if_owned(
        self, claim: Claim, error: JSON, *, transient: bool = False
    ) -> TransitionResult:
        return await self._leave(Leave(
            claim, Status.FAILED_TRANSIENT if transient else Status.FAILED, "fail",
            event={"owner": claim.owner, "epoch": claim.epoch, "error": error},
            payload={"error": error, "transient": transient}, error=error))

    async def execution_retry_if_owned(self, claim: Claim, error: JSON, *, retry: int,
                                       of: int, delay: float) -> TransitionResult:
        if delay < 0 or retry < 1:
            raise ValueError("a workflow retry needs a delay of 0 or more and a number from 1")
        return await self._leave(Leave(
            claim, Status.PENDING, "retry",
            event={"owner": claim.owner, "epoch": claim.epoch, "reason": WORKFLOW_RETRY,
                   "retry": retry, "of": of, "delay": delay, "error": error},
            payload={"error": error, "retry": retry}, retry_in=delay))

    async def execution_release_if_owned(self, claim: Claim, reason: str) -> TransitionResult:
        return await self._leave(Leave(
            claim, Status.PENDING, "release",
            event={"owner": claim.owner, "epoch": claim.epoch, "reason": reason},
            payload={"reason": reason}))

    async def execution_checkpoint_if_owned(
        self, claim: Claim, kind: str, data: JSON
    ) -> TransitionResult:
        # a single checkpoint is a batch of one: one path for every journal write
        return (await self.execution_checkpoint_many_if_owned(
            claim.owner, [(claim, kind, data)]))[0]

    async def execution_checkpoint_many_if_owned(
        self, owner: str, items: Sequence[tuple[Claim, str, JSON]]
    ) -> list[TransitionResult]:
        raise NotImplementedError

    def _now(self) -> datetime | None:
        raise NotImplementedError

    async def execution_block_if_owned(
        self,
        claim: Claim,
        *,
        wake_at: datetime | None,
        seen_signal: int,
        events: Sequence[tuple[str, JSON]],
        reason: str,
    ) -> TransitionResult:
        require_aware(wake_at)
        result: TransitionResult = await self._op(lambda: _ops.block_if_owned(
            claim, wake_at=wake_at, seen_signal=seen_signal, events=events, reason=reason,
            now=self._now()))
        return result

    async def execution_spawn_if_owned(
        self, claim: Claim, children: Sequence[NewExecution], events: Sequence[tuple[str, JSON]]
    ) -> TransitionResult:
        for child in children:
            require_aware(child.scheduled_at)
        result: TransitionResult = await self._op(
            lambda: _ops.spawn_if_owned(claim, children, events, self._now()))
        return result

    async def execution_children(
        self, parent_id: uuid.UUID, join_set: str | None = None
    ) -> tuple[list[Execution], int]:
        result: tuple[list[Execution], int] = await self._op(
            lambda: _ops.children(parent_id, join_set))
        return result

    async def execution_take_message_if_owned(
        self, claim: Claim, topic: str, pos: int
    ) -> Taken:
        result: Taken = await self._op(
            lambda: _ops.take_message_if_owned(claim, topic, pos, self._now()))
        return result

    async def execution_stop_if_owned(self, claim: Claim, kind: InterruptKind
                                      ) -> TransitionResult:
        interrupt = _member(InterruptKind, kind, "interrupt")
        result: TransitionResult = await self._op(
            lambda: _ops.stop_if_owned(claim, interrupt, self._now()))
        return result

    async def execution_submit_many(self, items: Sequence[NewExecution], *,
                                    all_or_nothing: bool = True) -> list[Submitted]:
        for new in items:
            require_aware(new.scheduled_at)
        if not items:
            return []
        # a group of single submissions (not all or nothing) raises nothing to roll back:
        # its one write is one statement (PostgreSQL writes the first events in it)
        result: list[Submitted] = await self._op(lambda: _ops.submit_many(
            items, self._now(), all_or_nothing=all_or_nothing),
            transaction=all_or_nothing)
        return result

    async def execution_interrupts(self, owner: str) -> list[Interrupt]:
        result: list[Interrupt] = await self._op(lambda: _ops.interrupts(owner))
        return result

    async def execution_wake_due(self, *, limit: int = 1000) -> list[Execution]:
        result: list[Execution] = await self._op(lambda: _ops.wake_due(limit, self._now()))
        return result

    async def message_send(
        self, execution_id: uuid.UUID, topic: str, payload: JSON, *,
        actor: str | None = None, reason: str | None = None,
    ) -> ControlResult:
        result: ControlResult = await self._op(
            lambda: _ops.send_message(execution_id, topic, payload, self._now(),
                                      actor=actor, reason=reason))
        return result

    async def execution_cancel(
        self, execution_id: uuid.UUID, *, actor: str | None = None, reason: str | None = None
    ) -> ControlResult:
        result: ControlResult = await self._op(
            lambda: _ops.cancel(execution_id, actor, self._now(), reason=reason))
        return result

    async def execution_cancel_many(
        self, ids: Sequence[uuid.UUID], *, actor: str | None = None, reason: str | None = None
    ) -> list[ControlResult]:
        if not ids:
            return []
        result: list[ControlResult] = await self._op(
            lambda: _ops.cancel_many(ids, actor, self._now(), reason=reason))
        return result

    async def execution_pause(
        self, execution_id: uuid.UUID, *, actor: str | None = None, reason: str | None = None
    ) -> ControlResult:
        result: ControlResult = await self._op(
            lambda: _ops.pause(execution_id, actor, self._now(), reason=reason))
        return result

    async def execution_unpause(
        self, execution_id: uuid.UUID, *, actor: str | None = None, reason: str | None = None
    ) -> ControlResult:
        result: ControlResult = await self._op(
            lambda: _ops.unpause(execution_id, actor, self._now(), reason=reason))
        return result

    # -- external engines -----------------------------------------------------------------

    async def execution_delegate_if_owned(
        self, claim: Claim, engine: str, callback_token_hash: str
    ) -> TransitionResult:
        result: TransitionResult = await self._op(lambda: _ops.delegate_if_owned(
            claim, engine, callback_token_hash, self._now()))
        return result

    async def execution_record_external_id(
        self, execution_id: uuid.UUID, external_id: str, *, actor: str = "worker",
        reason: str | None = None,
    ) -> ControlResult:
        result: ControlResult = await self._op(lambda: _ops.record_external_id(
            execution_id, external_id, actor, reason, self._now()))
        return result

    async def execution_end_external(
        self, execution_id: uuid.UUID, *, to: Status, expected_external_id: str | None,
        any_external_id: bool = False, result: JSON = None, error: JSON = None,
        event: dict[str, JSON] | None = None,
    ) -> ControlResult:
        out: ControlResult = await self._op(lambda: _ops.end_external(
            execution_id, to=to, expected_external_id=expected_external_id,
            any_external_id=any_external_id, result=result, error=error,
            event=event or {}, now=self._now()))
        return out

    async def execution_callback(
        self, execution_id: uuid.UUID, token: str, report: CallbackReport, payload: JSON, *,
        transient: bool = False,
    ) -> CallbackResult:
        kind = _member(CallbackReport, report, "callback")
        result: CallbackResult = await self._op(lambda: _ops.callback(
            execution_id, token, kind, payload, transient, self._now()))
        return result

    async def execution_external_running(
        self, *, limit: int = 1000, after: uuid.UUID | None = None
    ) -> list[Execution]:
        result: list[Execution] = await self._op(lambda: _ops.external_running(limit, after))
        return result

    async def execution_leased_to(self, owner: str) -> list[Execution]:
        result: list[Execution] = await self._op(lambda: _ops.leased_to(owner, self._now()))
        return result

    async def execution_reconcile_apply(
        self, actions: Sequence[ReconcileAction]
    ) -> list[ReconcileAction]:
        if not actions:
            return []
        result: list[ReconcileAction] = await self._op(
            lambda: _ops.reconcile_apply(actions, self._now()))
        return result

    async def execution_recover_expired(
        self, *, max_attempts: int, limit: int = 1000
    ) -> list[Recovered]:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        recovered: list[Recovered] = await self._op(lambda: _ops.recover_expired(
            max_attempts, limit, recover_sources(), self._now()))
        return recovered

    async def execution_prune(
        self, *, cutoff: datetime, limit: int = 500,
        after: tuple[datetime, uuid.UUID] | None = None, dry_run: bool = False,
        rest: Sequence[uuid.UUID] = (),
    ) -> PruneBatch:
        require_aware(cutoff)
        if after is not None:
            require_aware(after[0])
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if rest and dry_run:
            raise ValueError("a dry run deletes no part of a family: it has no rest")
        batch: PruneBatch = await self._op(
            (lambda: _ops.prune_rest(cutoff, limit, rest)) if rest
            else (lambda: _ops.prune(cutoff, limit, after, dry_run)))
        return batch

    async def retention_totals(self) -> dict[str, int]:
        totals: dict[str, int] = await self._op(_ops.retention_totals, transaction=False)
        return totals

    async def execution_prune_count(self, *, cutoff: datetime) -> int:
        require_aware(cutoff)
        count: int = await self._op(lambda: _ops.prune_count(cutoff))
        return count

    async def execution_resolve(
        self, execution_id: uuid.UUID, *, action: ResolveAction, external_id: str | None,
        reason: str, actor: str, expected_external_id: str | None = None,
        unconfirmed: str | None = None,
    ) -> ControlResult:
        resolution = _member(ResolveAction, action, "resolution")
        if resolution is ResolveAction.ATTACH and not external_id:
            raise ValueError("attach needs an external id")
        if resolution is ResolveAction.ATTACH and unconfirmed is not None:
            raise ValueError("attaching an id ends nothing: it cannot be unconfirmed")
        result: ControlResult = await self._op(lambda: _ops.resolve(
            execution_id, resolution, external_id, reason, actor, unconfirmed,
            expected_external_id, self._now()))
        return result

    async def execution_retry(
        self, old_id: uuid.UUID, new: NewExecution, replayed: Sequence[tuple[str, JSON]],
        *, actor: str | None = None, reason: str | None = None,
    ) -> ControlResult:
        result: ControlResult = await self._op(
            lambda: _ops.retry(old_id, new, replayed, actor, self._now(), reason=reason))
        return result

    async def execution_flag_counts(self) -> dict[str, int]:
        counts: dict[str, int] = await self._op(_ops.flag_counts)
        return counts

    # -- the dashboard's reads (docs/dashboard.md) -----------------------------------------

    async def execution_status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = await self._op(_ops.status_counts)
        return counts

    async def execution_counts_in(self, statuses: Sequence[str]) -> dict[str, int]:
        if not statuses:
            return {}
        counts: dict[str, int] = await self._op(lambda: _ops.counts_in(list(statuses)))
        return counts

    async def execution_children_of(
        self, parent_ids: Sequence[uuid.UUID], *, limit: int
    ) -> list[Execution]:
        if not parent_ids:
            return []
        found: list[Execution] = await self._op(
            lambda: _ops.children_of(list(parent_ids), limit))
        return found

    async def history_list_kinds(
        self, execution_id: uuid.UUID, kinds: Sequence[str], *, after_seq: int = 0,
        limit: int = 1000,
    ) -> list[HistoryEvent]:
        events: list[HistoryEvent] = await self._op(
            lambda: _ops.history_of_kinds(execution_id, list(kinds), after_seq, limit))
        return events

    async def history_kind_counts(self, execution_id: uuid.UUID) -> dict[str, int]:
        counts: dict[str, int] = await self._op(lambda: _ops.history_kinds(execution_id))
        return counts

    # -- cron (docs/cron.md) ------------------------------------------------------------

    async def cron_records(self, names: Sequence[str]) -> dict[str, CronRecord]:
        if not names:
            return {}
        records: dict[str, CronRecord] = await self._op(lambda: _ops.cron_records(names))
        return records

    async def cron_register(
        self, definitions: Sequence[CronDefinition]
    ) -> dict[str, CronRecord]:
        if len({d.name for d in definitions}) != len(definitions):
            raise ValueError("cron entries are registered once each")
        records: dict[str, CronRecord] = await self._op(
            lambda: _ops.cron_register(definitions, self._now()))
        return records

    async def cron_fire(self, fires: Sequence[CronFire]) -> list[CronFire]:
        if not fires:
            return []
        keys = {(f.name, f.slot_at) for f in fires}
        if len(keys) != len(fires) or len({f.execution.id for f in fires}) != len(fires):
            raise ValueError("each slot, and each execution, is started once per call")
        for f in fires:
            require_aware(f.slot_at)
            if f.execution.parent_id is not None or f.execution.paused \
                    or f.execution.idempotency_key is not None:
                raise ValueError("a slot starts a plain top-level pending execution")
        started: list[CronFire] = await self._op(lambda: _ops.cron_fire(fires, self._now()))
        return started

    # -- deployments (docs/deployments.md) -------------------------------------------------

    async def deployment_list(self, *, live_within: timedelta) -> list[DeploymentSummary]:
        if live_within <= timedelta(0):
            raise ValueError("live_within must be positive")
        result: list[DeploymentSummary] = await self._op(
            lambda: _ops.deployments(live_within, self._now()))
        return result

    async def deployment_adopt(
        self, from_id: str, to_id: str, *, ffqn_prefix: str | None, actor: str,
        live_within: timedelta,
    ) -> Adopted:
        if from_id == to_id:
            raise ValueError("a deployment cannot adopt its own executions")
        if live_within <= timedelta(0):
            raise ValueError("live_within must be positive")
        if ffqn_prefix is not None and not ffqn_prefix:
            raise ValueError("an empty ffqn_prefix: give None for every workflow")
        result: Adopted = await self._op(lambda: _ops.adopt(
            from_id, to_id, ffqn_prefix, actor, live_within, self._now()))
        return result
