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
        id, ffqn, params, status, attempt, deployment_id, parent_id, idempotency_key,
        request_digest, scheduled_at, created_at, updated_at, history_seq)
    VALUES (
        %(id)s, %(ffqn)s, %(params)s, 'pending', 1, %(deployment_id)s, %(parent_id)s::uuid,
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
        'scheduled_at', scheduled_at, 'parent_id', parent_id,
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

-- name: execution_leave_if_owned
-- Every exit a worker makes from running: one guarded statement plus its event.
WITH upd AS (
    UPDATE veracity_executions SET
        status = %(to_status)s,
        result = %(result)s,
        error = %(error)s,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = history_seq + 1
    WHERE id = %(id)s
      AND status = ANY (%(from_states)s::text[])
      AND lease_owner = %(owner)s
      AND lease_epoch = %(epoch)s
      AND lease_expires_at > coalesce(%(now)s::timestamptz, now())
    RETURNING *
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, status, updated_at, %(event)s FROM upd
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

-- name: execution_checkpoint_if_owned
-- A journal entry (a step's result, ...) written only while the lease is ours: one round trip.
WITH own AS (
    UPDATE veracity_executions SET history_seq = history_seq + 1
    WHERE id = %(id)s
      AND status = 'running'
      AND lease_owner = %(owner)s
      AND lease_epoch = %(epoch)s
      AND lease_expires_at > coalesce(%(now)s::timestamptz, now())
    RETURNING id, history_seq
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, %(kind)s, coalesce(%(now)s::timestamptz, now()), %(data)s FROM own
)
SELECT history_seq FROM own

-- name: execution_complete_many_if_owned
-- Batched completions of one owner: each row is still guarded by its own epoch and lease.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(epochs)s::bigint[], %(results)s::json[])
        AS t(id, epoch, result)
), upd AS (
    UPDATE veracity_executions AS e SET
        status = 'completed',
        result = input.result,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = e.history_seq + 1
    FROM input
    WHERE e.id = input.id
      AND e.status = ANY (%(from_states)s::text[])
      AND e.lease_owner = %(owner)s
      AND e.lease_epoch = input.epoch
      AND e.lease_expires_at > coalesce(%(now)s::timestamptz, now())
    RETURNING e.*
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, 'completed', updated_at,
           json_build_object('owner', %(owner)s::text, 'epoch', lease_epoch)
    FROM upd
)
SELECT * FROM upd

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
      AND e.lease_epoch = held.epoch
      AND e.status = 'running'
      AND e.lease_owner = %(owner)s
      AND e.lease_expires_at > coalesce(%(now)s::timestamptz, now())
    RETURNING e.id, e.lease_epoch
)
SELECT id, lease_epoch FROM renewed

-- name: execution_recover_expired
-- Lease recovery: expired leases of worker-run executions go back to pending (attempt + 1)
-- or, after max_attempts, to failed_transient; the owner is cleared, the reason recorded.
WITH expired AS (
    SELECT id, lease_owner AS old_owner, lease_epoch AS old_epoch, attempt AS old_attempt
    FROM veracity_executions
    WHERE status = 'running'
      AND lease_owner IS NOT NULL
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE veracity_executions AS e SET
        status = CASE WHEN e.attempt >= %(max_attempts)s
                      THEN 'failed_transient' ELSE 'pending' END,
        attempt = CASE WHEN e.attempt >= %(max_attempts)s THEN e.attempt ELSE e.attempt + 1 END,
        error = CASE WHEN e.attempt >= %(max_attempts)s
                     THEN json_build_object(
                        'code', 'lease_expired',
                        'message', format('lease of %%s expired on attempt %%s of %%s',
                                          expired.old_owner, e.attempt, %(max_attempts)s::int))
                     ELSE e.error END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = e.history_seq + 1
    FROM expired
    WHERE e.id = expired.id
      AND e.status = ANY (%(from_states)s::text[])
      AND e.lease_expires_at <= coalesce(%(now)s::timestamptz, now())
    RETURNING e.*, expired.old_owner, expired.old_epoch, expired.old_attempt
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, status, updated_at, json_build_object(
        'reason', 'lease expired', 'owner', old_owner, 'epoch', old_epoch,
        'attempt', old_attempt, 'max_attempts', %(max_attempts)s::int)
    FROM upd
)
SELECT * FROM upd

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

-- name: lock_try
SELECT pg_try_advisory_lock(%(key)s) AS acquired

-- name: lock_release
SELECT pg_advisory_unlock(%(key)s) AS released

-- name: db_now
SELECT coalesce(%(now)s::timestamptz, now()) AS now
