-- PostgreSQL queries of the store. Parameters are psycopg's %(name)s; %(now)s is the
-- injected clock's time, NULL in production so that the database's now() rules.

-- name: migrations_lock
SELECT pg_advisory_xact_lock(%(key)s)

-- name: migrations_ledger
CREATE TABLE IF NOT EXISTS veracity_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migrations_applied
SELECT version FROM veracity_migrations ORDER BY version

-- name: migrations_record
INSERT INTO veracity_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: ping
SELECT 1 AS ok

-- name: execution_submit
WITH ins AS (
    INSERT INTO veracity_executions (
        id, ffqn, params, status, paused_from, attempt, deployment_id, parent_id, join_set,
        idempotency_key, request_digest, scheduled_at, created_at, updated_at, history_seq)
    VALUES (
        %(id)s, %(ffqn)s, %(params)s,
        CASE WHEN %(paused)s THEN 'paused' ELSE 'pending' END,
        CASE WHEN %(paused)s THEN 'pending' END,
        1, %(deployment_id)s, %(parent_id)s::uuid, %(join_set)s::text,
        %(idempotency_key)s::text, %(request_digest)s::text,
        coalesce(%(scheduled_at)s::timestamptz, %(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()),
        1)
    ON CONFLICT DO NOTHING
    RETURNING *
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, 1, status, created_at, json_build_object(
        'ffqn', ffqn, 'params', params, 'deployment_id', deployment_id,
        'scheduled_at', scheduled_at, 'parent_id', parent_id, 'join_set', join_set,
        'idempotency_key', idempotency_key)
    FROM ins
)
SELECT * FROM ins

-- name: execution_by_key_or_id
SELECT * FROM veracity_executions
WHERE idempotency_key = %(idempotency_key)s OR id = %(id)s
ORDER BY (id = %(id)s) DESC
LIMIT 1

-- name: execution_get
SELECT * FROM veracity_executions WHERE id = %(id)s

-- name: execution_list
SELECT * FROM veracity_executions
WHERE (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
  AND (%(ffqn_prefix)s::text IS NULL OR starts_with(ffqn, %(ffqn_prefix)s::text))
  AND (%(deployment_id)s::text IS NULL OR deployment_id = %(deployment_id)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(flagged)s::boolean IS NULL OR (flagged_at IS NOT NULL) = %(flagged)s::boolean)
  AND (%(cursor_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: history_list
SELECT * FROM veracity_history
WHERE execution_id = %(id)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: execution_claim
-- The CTE pins the LIMIT: without it the planner may lock and update more rows.
WITH due AS (
    SELECT id FROM veracity_executions
    WHERE status = 'pending'
      AND scheduled_at <= coalesce(%(now)s::timestamptz, now())
      AND ffqn = ANY (%(ffqns)s::text[])
    ORDER BY scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE veracity_executions AS e SET
        status = 'running',
        lease_owner = %(owner)s,
        lease_epoch = e.lease_epoch + 1,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl)s::interval,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = e.history_seq + 1
    FROM due
    WHERE e.id = due.id AND e.status = ANY (%(from_states)s::text[])
    RETURNING e.*
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, status, updated_at, json_build_object(
        'owner', lease_owner, 'epoch', lease_epoch, 'attempt', attempt)
    FROM claimed
)
SELECT * FROM claimed ORDER BY scheduled_at, id

-- name: execution_leave_many_if_owned
-- Every exit a worker makes from running, one execution or a batch of one owner's: each row
-- guarded by the lease fence (veracity_holds_lease) with its own epoch, plus its event.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(epochs)s::bigint[], %(to_statuses)s::text[],
                         %(results)s::json[], %(errors)s::json[], %(events)s::json[])
        AS t(id, epoch, to_status, result, error, event)
), upd AS (
    UPDATE veracity_executions AS e SET
        status = input.to_status,
        result = input.result,
        error = input.error,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = e.history_seq + 1
    FROM input
    WHERE e.id = input.id
      AND e.status = ANY (%(from_states)s::text[])
      AND veracity_holds_lease(e.status, e.lease_owner, e.lease_epoch, e.lease_expires_at,
                               %(owner)s, input.epoch, coalesce(%(now)s::timestamptz, now()))
    RETURNING e.*, input.event
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, status, updated_at, event FROM upd
)
SELECT * FROM upd

-- name: execution_late_report
-- A write that lost the race is kept in history; the status is never touched.
WITH bump AS (
    UPDATE veracity_executions SET history_seq = history_seq + 1
    WHERE id = %(id)s
    RETURNING *
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, 'late_report', coalesce(%(now)s::timestamptz, now()), %(event)s
    FROM bump
)
SELECT * FROM bump

-- name: lease_renew
-- The heartbeat: one statement renews every lease the worker still holds (and its row).
WITH hb AS (
    UPDATE veracity_workers SET last_heartbeat = coalesce(%(now)s::timestamptz, now())
    WHERE id = %(owner)s
    RETURNING id
), held AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(epochs)s::bigint[]) AS t(id, epoch)
), renewed AS (
    UPDATE veracity_executions AS e SET
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl)s::interval
    FROM held
    WHERE e.id = held.id
      AND veracity_holds_lease(e.status, e.lease_owner, e.lease_epoch, e.lease_expires_at,
                               %(owner)s, held.epoch, coalesce(%(now)s::timestamptz, now()))
    RETURNING e.id, e.lease_epoch
)
SELECT id, lease_epoch FROM renewed

-- name: execution_expired_leases
-- Lease recovery, first half: worker-run executions whose lease expired, locked, with what
-- the decision (veracity.core.recovery) needs; rows other recoverers hold are skipped.
SELECT e.id, e.lease_owner, e.lease_epoch, e.attempt,
       e.cancel_requested_at IS NOT NULL AS cancel_requested,
       (SELECT count(*) FROM veracity_executions AS c
        WHERE c.parent_id = e.id AND c.status <> ALL (%(terminal)s::text[])) AS open_children
FROM veracity_executions AS e
WHERE e.status = 'running'
  AND e.lease_owner IS NOT NULL
  AND e.lease_expires_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY e.lease_expires_at
LIMIT %(limit)s
FOR UPDATE OF e SKIP LOCKED

-- name: execution_recover_many
-- Lease recovery, second half: each decision applied only while the lease it was decided
-- on (owner, epoch) is still the expired one; rows [{id, owner, epoch, to_status,
-- attempt, error}]. The owner is cleared.
UPDATE veracity_executions AS e SET
    status = r.to_status,
    attempt = r.attempt,
    error = coalesce(r.error, e.error),
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = e.history_seq + 1
FROM json_to_recordset(%(rows)s::json)
     AS r (id uuid, owner text, epoch bigint, to_status text, attempt integer, error json)
WHERE e.id = r.id
  AND e.status = ANY (%(from_states)s::text[])
  AND e.lease_owner = r.owner
  AND e.lease_epoch = r.epoch
  AND e.lease_expires_at <= coalesce(%(now)s::timestamptz, now())
RETURNING e.*

-- name: worker_register
INSERT INTO veracity_workers (
    id, host, pid, deployment_id, ffqns, concurrency, started_at, last_heartbeat)
VALUES (
    %(id)s, %(host)s, %(pid)s, %(deployment_id)s, %(ffqns)s, %(concurrency)s,
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (id) DO UPDATE SET
    host = EXCLUDED.host, pid = EXCLUDED.pid, deployment_id = EXCLUDED.deployment_id,
    ffqns = EXCLUDED.ffqns, concurrency = EXCLUDED.concurrency,
    last_heartbeat = EXCLUDED.last_heartbeat, stopped_at = NULL
RETURNING *

-- name: worker_stop
UPDATE veracity_workers SET stopped_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *

-- name: worker_list
SELECT *, coalesce(%(now)s::timestamptz, now()) AS db_now FROM veracity_workers
ORDER BY started_at DESC, id
LIMIT %(limit)s

-- API tokens (docs/security.md)

-- name: token_create
INSERT INTO veracity_api_tokens (name, key_id, token_hash, scopes, created_at, expires_at)
VALUES (%(name)s, %(key_id)s, %(token_hash)s, %(scopes)s,
        coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + %(expires_in)s::interval)
ON CONFLICT (name) DO NOTHING
RETURNING *

-- name: token_get
SELECT * FROM veracity_api_tokens WHERE name = %(name)s

-- name: token_find
SELECT *, coalesce(%(now)s::timestamptz, now()) AS db_now FROM veracity_api_tokens
WHERE key_id = %(key_id)s

-- name: token_list
SELECT * FROM veracity_api_tokens ORDER BY created_at, name

-- name: token_revoke
UPDATE veracity_api_tokens SET revoked_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s AND revoked_at IS NULL
RETURNING *

-- name: token_touch
UPDATE veracity_api_tokens SET last_used_at = coalesce(%(now)s::timestamptz, now())
WHERE key_id = %(key_id)s
  AND (last_used_at IS NULL OR last_used_at < coalesce(%(now)s::timestamptz, now()))
RETURNING key_id

-- name: lock_try
SELECT pg_try_advisory_lock(%(key)s) AS acquired

-- name: lock_release
SELECT pg_advisory_unlock(%(key)s) AS released

-- name: db_now
SELECT coalesce(%(now)s::timestamptz, now()) AS now

-- ---------------------------------------------------------------------------------------
-- The durable engine (store/_ops.py drives these inside one transaction)

-- name: history_append
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
VALUES (%(execution_id)s, %(seq)s, %(kind)s, coalesce(%(now)s::timestamptz, now()), %(data)s)

-- name: execution_lock
SELECT * FROM veracity_executions WHERE id = %(id)s FOR UPDATE

-- name: execution_lock_owned
SELECT * FROM veracity_executions AS e
WHERE id = %(id)s
  AND veracity_holds_lease(e.status, e.lease_owner, e.lease_epoch, e.lease_expires_at,
                           %(owner)s, %(epoch)s, coalesce(%(now)s::timestamptz, now()))
FOR UPDATE

-- name: execution_bump_history
UPDATE veracity_executions SET history_seq = history_seq + %(by)s WHERE id = %(id)s
RETURNING *

-- name: execution_block
UPDATE veracity_executions SET
    status = CASE
        WHEN signal_seq <> %(seen)s THEN 'pending'
        WHEN %(wake_at)s::timestamptz <= coalesce(%(now)s::timestamptz, now()) THEN 'pending'
        ELSE 'blocked' END,
    wake_at = CASE
        WHEN signal_seq <> %(seen)s THEN NULL
        WHEN %(wake_at)s::timestamptz <= coalesce(%(now)s::timestamptz, now()) THEN NULL
        ELSE %(wake_at)s::timestamptz END,
    blocked_seq = %(seen)s,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + %(events)s + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_insert_child
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, parent_id, join_set,
    scheduled_at, created_at, updated_at, history_seq)
VALUES (
    %(id)s, %(ffqn)s, %(params)s, 'pending', 1, %(deployment_id)s, %(parent_id)s::uuid,
    %(join_set)s::text,
    coalesce(%(scheduled_at)s::timestamptz, %(now)s::timestamptz, now()),
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), 1)
ON CONFLICT (id) DO NOTHING
RETURNING *

-- name: message_oldest_open
SELECT id AS message_id, execution_id, topic, payload, created_at, consumed_at, consumed_pos
FROM veracity_messages
WHERE execution_id = %(execution_id)s AND topic = %(topic)s AND consumed_at IS NULL
ORDER BY id
LIMIT 1
FOR UPDATE

-- name: message_consume
UPDATE veracity_messages SET
    consumed_at = coalesce(%(now)s::timestamptz, now()), consumed_pos = %(pos)s
WHERE id = %(message_id)s

-- name: message_insert
INSERT INTO veracity_messages (execution_id, topic, payload, created_at)
VALUES (%(execution_id)s, %(topic)s, %(payload)s, coalesce(%(now)s::timestamptz, now()))
RETURNING id AS message_id, execution_id, topic, payload, created_at, consumed_at, consumed_pos

-- name: execution_signal_bump
UPDATE veracity_executions SET
    signal_seq = signal_seq + 1,
    status = CASE WHEN %(wake)s AND status = ANY (%(from_states)s::text[])
                  THEN 'pending' ELSE status END,
    wake_at = CASE WHEN %(wake)s THEN NULL ELSE wake_at END,
    updated_at = CASE WHEN %(wake)s THEN coalesce(%(now)s::timestamptz, now())
                      ELSE updated_at END,
    history_seq = history_seq + %(events)s
WHERE id = %(id)s
RETURNING *

-- name: execution_park
UPDATE veracity_executions SET
    status = 'paused', paused_from = 'pending', pause_requested_at = NULL,
    lease_owner = NULL, lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_open_children
SELECT count(*) AS n FROM veracity_executions
WHERE parent_id = %(id)s
  AND status NOT IN ('completed', 'failed', 'failed_transient', 'cancelled')

-- name: execution_stop_cancelled
UPDATE veracity_executions SET
    status = %(to_status)s,
    wake_at = NULL,
    blocked_seq = signal_seq,
    lease_owner = NULL, lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_signal
SELECT signal_seq FROM veracity_executions WHERE id = %(id)s

-- name: execution_children
-- in the order they ended (ended ones first), then the unfinished ones
SELECT * FROM veracity_executions
WHERE parent_id = %(parent_id)s
  AND (%(join_set)s::text IS NULL OR join_set = %(join_set)s::text)
ORDER BY (status IN ('completed', 'failed', 'failed_transient', 'cancelled')) DESC,
         updated_at, id

-- name: execution_interrupts
SELECT id, lease_epoch, cancel_requested_at, pause_requested_at FROM veracity_executions
WHERE lease_owner = %(owner)s
  AND status = 'running'
  AND (cancel_requested_at IS NOT NULL OR pause_requested_at IS NOT NULL)

-- name: execution_wake_due
WITH due AS (
    SELECT id FROM veracity_executions
    WHERE status = 'blocked' AND cancel_requested_at IS NULL
      AND wake_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY wake_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE veracity_executions AS e SET
    status = 'pending', wake_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = e.history_seq + 1
FROM due
WHERE e.id = due.id AND e.status = ANY (%(from_states)s::text[])
RETURNING e.*

-- name: execution_cancel_mark
-- the execution and, recursively, its unfinished children whose names end in -cancellable
-- (a child that cannot be cancelled is left to finish, and so is everything below it)
WITH RECURSIVE tree AS (
    SELECT id FROM veracity_executions WHERE id = %(id)s
    UNION
    SELECT c.id FROM veracity_executions AS c JOIN tree AS t ON c.parent_id = t.id
    WHERE c.status <> ALL (%(terminal)s::text[]) AND right(c.ffqn, 12) = '-cancellable'
)
UPDATE veracity_executions AS e SET
    cancel_requested_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = e.history_seq + 1
FROM tree
WHERE e.id = tree.id AND e.cancel_requested_at IS NULL AND e.status <> ALL (%(terminal)s::text[])
RETURNING e.*

-- name: execution_cancel_settle
WITH RECURSIVE tree AS (
    SELECT id FROM veracity_executions WHERE id = %(root)s
    UNION
    SELECT c.id FROM veracity_executions AS c JOIN tree AS t ON c.parent_id = t.id
    WHERE c.cancel_requested_at IS NOT NULL
)
UPDATE veracity_executions AS e SET
    status = 'cancelled', wake_at = NULL, paused_from = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = e.history_seq + 1
FROM tree
WHERE e.id = tree.id
  AND e.cancel_requested_at IS NOT NULL
  AND e.status = ANY (%(from_states)s::text[])
  AND NOT EXISTS (SELECT 1 FROM veracity_executions AS c
                  WHERE c.parent_id = e.id AND c.status <> ALL (%(terminal)s::text[]))
RETURNING e.*

-- name: execution_request_pause
UPDATE veracity_executions SET
    pause_requested_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s
RETURNING *

-- name: execution_withdraw_pause
UPDATE veracity_executions SET pause_requested_at = NULL, history_seq = history_seq + 1
WHERE id = %(id)s
RETURNING *

-- name: execution_pause
UPDATE veracity_executions SET
    paused_from = status, status = 'paused',
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_unpause
-- back to blocked only if still waiting: blocked before, no signal since, timer not due
UPDATE veracity_executions SET
    status = CASE
        WHEN cancel_requested_at IS NOT NULL THEN 'blocked'
        WHEN paused_from = 'blocked' AND blocked_seq = signal_seq
             AND (wake_at IS NULL OR wake_at > coalesce(%(now)s::timestamptz, now()))
        THEN 'blocked' ELSE 'pending' END,
    wake_at = CASE
        WHEN paused_from = 'blocked' AND blocked_seq = signal_seq
             AND (wake_at IS NULL OR wake_at > coalesce(%(now)s::timestamptz, now()))
        THEN wake_at ELSE NULL END,
    paused_from = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = 'paused'
RETURNING *

-- name: execution_checkpoint_many_if_owned
-- Journal events of several executions of one owner in one statement (one commit): each
-- row still guarded by its own epoch and lease. Each execution appears at most once.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(epochs)s::bigint[], %(kinds)s::text[],
                         %(datas)s::json[]) AS t(id, epoch, kind, data)
), own AS (
    UPDATE veracity_executions AS e SET history_seq = e.history_seq + 1
    FROM input
    WHERE e.id = input.id
      AND veracity_holds_lease(e.status, e.lease_owner, e.lease_epoch, e.lease_expires_at,
                               %(owner)s, input.epoch, coalesce(%(now)s::timestamptz, now()))
    RETURNING e.id, e.history_seq, input.kind, input.data
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, kind, coalesce(%(now)s::timestamptz, now()), data FROM own
)
SELECT id FROM own

-- ---------------------------------------------------------------------------------------
-- External engines (docs/external.md)

-- name: execution_delegate
UPDATE veracity_executions SET
    engine = %(engine)s,
    callback_token_hash = %(token_hash)s,
    triggered_at = coalesce(%(now)s::timestamptz, now()),
    lease_owner = NULL,
    lease_expires_at = NULL,
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = 'running'
RETURNING *

-- name: execution_set_external_id
UPDATE veracity_executions SET
    external_execution_id = %(external_id)s,
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    history_seq = history_seq + 1
WHERE id = %(id)s
RETURNING *

-- name: execution_end_external
-- an ended run needs no operator any more: its flag is cleared (history keeps it)
UPDATE veracity_executions SET
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    end_request = NULL, end_requested_at = NULL,
    status = %(to_status)s,
    result = %(result)s,
    error = %(error)s,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_external_running
SELECT * FROM veracity_executions
WHERE status = 'running' AND engine IS NOT NULL
  AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
ORDER BY id
LIMIT %(limit)s

-- name: execution_park_waiting
-- a pause requested while running, acted on at a durable wait: the wait is kept
UPDATE veracity_executions SET
    status = 'paused', paused_from = 'blocked', pause_requested_at = NULL,
    wake_at = %(wake_at)s::timestamptz, blocked_seq = %(seen)s,
    lease_owner = NULL, lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + %(events)s + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_release_locked
UPDATE veracity_executions SET
    status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_lock_many
-- in id order, so that two writers locking overlapping sets cannot deadlock
SELECT * FROM veracity_executions WHERE id = ANY (%(ids)s::uuid[]) ORDER BY id FOR UPDATE

-- name: execution_end_external_many
-- the terminations of one page of looks, rows [{id, to_status, error}]; the caller holds
-- the row locks (execution_lock_many) and checked each row's state
UPDATE veracity_executions AS e SET
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    end_request = NULL, end_requested_at = NULL,
    status = r.to_status,
    result = NULL,
    error = r.error,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = e.history_seq + 1
FROM json_to_recordset(%(rows)s::json) AS r (id uuid, to_status text, error json)
WHERE e.id = r.id AND e.status = ANY (%(from_states)s::text[])
RETURNING e.id

-- name: execution_flag_many
-- flags of one page of looks, rows [{id, reason, kind}]
UPDATE veracity_executions AS e SET
    flagged_at = coalesce(%(now)s::timestamptz, now()),
    flag_reason = r.reason,
    flag_kind = r.kind,
    history_seq = e.history_seq + 1
FROM json_to_recordset(%(rows)s::json) AS r (id uuid, reason text, kind text)
WHERE e.id = r.id
RETURNING e.id

-- name: execution_unflag_many
-- flags that no longer hold (the engine found the run), rows [{id}]
UPDATE veracity_executions AS e SET
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    history_seq = e.history_seq + 1
FROM json_to_recordset(%(rows)s::json) AS r (id uuid)
WHERE e.id = r.id
RETURNING e.id

-- name: execution_request_end
-- an operator's request to end a delegated run, kept until the engine confirms the stop
UPDATE veracity_executions SET
    end_request = %(request)s,
    end_requested_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s
RETURNING *

-- name: execution_end_forced
-- an operator ends a delegated run without the engine's confirmation: it stays flagged
UPDATE veracity_executions SET
    status = %(to_status)s,
    result = NULL,
    error = %(error)s,
    end_request = NULL, end_requested_at = NULL,
    flagged_at = coalesce(%(now)s::timestamptz, now()),
    flag_reason = %(reason)s,
    flag_kind = 'forced',
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = history_seq + 1
WHERE id = %(id)s AND status = ANY (%(from_states)s::text[])
RETURNING *

-- name: execution_flag_counts
SELECT flag_kind, count(*) AS n FROM veracity_executions
WHERE flagged_at IS NOT NULL
GROUP BY flag_kind

-- name: history_append_many
-- rows [{execution_id, seq, kind, data}]: many executions' events in one statement
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
SELECT r.execution_id, r.seq, r.kind, coalesce(%(now)s::timestamptz, now()), r.data
FROM json_to_recordset(%(rows)s::json) AS r (execution_id uuid, seq integer, kind text, data json)
