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
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, 1, status, created_at, jsonb_build_object(
        'ffqn', ffqn, 'params', params, 'deployment_id', deployment_id,
        'scheduled_at', scheduled_at, 'parent_id', parent_id,
        'idempotency_key', idempotency_key)
    FROM ins
)
SELECT * FROM ins

-- name: execution_by_idempotency_key
SELECT * FROM veracity_executions WHERE idempotency_key = %(idempotency_key)s

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
    SELECT id, history_seq, status, updated_at, jsonb_build_object(
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
