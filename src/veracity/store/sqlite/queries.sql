-- SQLite queries of the store. Parameters are :name. Timestamps are integer
-- microseconds since the epoch (UTC). Each write runs inside BEGIN IMMEDIATE, which takes
-- the database's single write lock; :now is the transaction's time, read once from the
-- injected clock or, in production, from SQLite's own clock (see the `now` query).

-- name: now
SELECT coalesce(:now, CAST(round((julianday('now') - 2440587.5) * 86400000000.0) AS INTEGER))
    AS now

-- name: migrations_ledger
CREATE TABLE IF NOT EXISTS veracity_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT

-- name: migrations_applied
SELECT version FROM veracity_migrations ORDER BY version

-- name: migrations_record
INSERT INTO veracity_migrations (version, name) VALUES (:version, :name)

-- name: ping
SELECT 1 AS ok

-- name: execution_insert
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, parent_id, idempotency_key,
    request_digest, scheduled_at, created_at, updated_at, history_seq)
VALUES (
    :id, :ffqn, :params, 'pending', 1, :deployment_id, :parent_id, :idempotency_key,
    :request_digest, coalesce(:scheduled_at, :now), :now, :now, 1)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *

-- name: history_insert
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
VALUES (:execution_id, :seq, :kind, :at, :data)

-- name: execution_by_idempotency_key
SELECT * FROM veracity_executions WHERE idempotency_key = :idempotency_key

-- name: execution_get
SELECT * FROM veracity_executions WHERE id = :id

-- name: execution_list
SELECT * FROM veracity_executions
WHERE (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:ffqn_prefix IS NULL OR substr(ffqn, 1, length(:ffqn_prefix)) = :ffqn_prefix)
  AND (:deployment_id IS NULL OR deployment_id = :deployment_id)
  AND (:created_after IS NULL OR created_at > :created_after)
  AND (:created_before IS NULL OR created_at < :created_before)
  AND (:cursor_at IS NULL OR (created_at, id) < (:cursor_at, :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: history_list
SELECT * FROM veracity_history
WHERE execution_id = :id AND seq > :after_seq
ORDER BY seq
LIMIT :limit

-- name: execution_claim
UPDATE veracity_executions SET
    status = 'running',
    lease_owner = :owner,
    lease_epoch = lease_epoch + 1,
    lease_expires_at = :now + :ttl_us,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id IN (
        SELECT id FROM veracity_executions
        WHERE status = 'pending'
          AND scheduled_at <= :now
          AND ffqn IN (SELECT value FROM json_each(:ffqns))
        ORDER BY scheduled_at, id
        LIMIT :limit)
  AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_leave_if_owned
UPDATE veracity_executions SET
    status = :to_status,
    result = :result,
    error = :error,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id
  AND status IN (SELECT value FROM json_each(:from_states))
  AND lease_owner = :owner
  AND lease_epoch = :epoch
  AND lease_expires_at > :now
RETURNING *

-- name: execution_bump_history
UPDATE veracity_executions SET history_seq = history_seq + 1
WHERE id = :id
RETURNING *
