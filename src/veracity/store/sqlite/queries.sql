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
ON CONFLICT DO NOTHING
RETURNING *

-- name: history_insert
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
VALUES (:execution_id, :seq, :kind, :at, :data)

-- name: execution_by_key_or_id
SELECT * FROM veracity_executions
WHERE idempotency_key = :idempotency_key OR id = :id
ORDER BY (id = :id) DESC
LIMIT 1

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

-- name: execution_checkpoint_if_owned
UPDATE veracity_executions SET history_seq = history_seq + 1
WHERE id = :id
  AND status = 'running'
  AND lease_owner = :owner
  AND lease_epoch = :epoch
  AND lease_expires_at > :now
RETURNING id, history_seq

-- name: lease_renew
UPDATE veracity_executions SET lease_expires_at = :now + :ttl_us
WHERE id = :id
  AND lease_epoch = :epoch
  AND status = 'running'
  AND lease_owner = :owner
  AND lease_expires_at > :now
RETURNING id, lease_epoch

-- name: worker_heartbeat
UPDATE veracity_workers SET last_heartbeat = :now WHERE id = :owner

-- name: execution_expired
SELECT id, lease_owner, lease_epoch, attempt FROM veracity_executions
WHERE status = 'running' AND lease_owner IS NOT NULL AND lease_expires_at <= :now
ORDER BY lease_expires_at
LIMIT :limit

-- name: execution_recover_one
UPDATE veracity_executions SET
    status = CASE WHEN attempt >= :max_attempts THEN 'failed_transient' ELSE 'pending' END,
    attempt = CASE WHEN attempt >= :max_attempts THEN attempt ELSE attempt + 1 END,
    error = CASE WHEN attempt >= :max_attempts
                 THEN json_object('code', 'lease_expired', 'message',
                      printf('lease of %s expired on attempt %d of %d',
                             lease_owner, attempt, :max_attempts))
                 ELSE error END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id
  AND status IN (SELECT value FROM json_each(:from_states))
  AND lease_expires_at <= :now
RETURNING *

-- name: worker_register
INSERT INTO veracity_workers (
    id, host, pid, deployment_id, ffqns, concurrency, started_at, last_heartbeat)
VALUES (:id, :host, :pid, :deployment_id, :ffqns, :concurrency, :now, :now)
ON CONFLICT (id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, deployment_id = excluded.deployment_id,
    ffqns = excluded.ffqns, concurrency = excluded.concurrency,
    last_heartbeat = excluded.last_heartbeat, stopped_at = NULL
RETURNING *

-- name: worker_stop
UPDATE veracity_workers SET stopped_at = :now WHERE id = :id RETURNING *

-- name: worker_list
SELECT * FROM veracity_workers ORDER BY started_at DESC, id LIMIT :limit
