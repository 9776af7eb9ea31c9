-- SQLite queries of the store. Parameters are :name. Timestamps are integer
-- microseconds since the epoch (UTC). Each write runs inside BEGIN IMMEDIATE, which takes
-- the database's single write lock; :now is the transaction's time, read once from the
-- injected clock or, in production, from SQLite's own clock (see the `now` query).

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
    id, ffqn, params, status, paused_from, attempt, deployment_id, parent_id, join_set,
    idempotency_key, request_digest, scheduled_at, created_at, updated_at, history_seq)
VALUES (
    :id, :ffqn, :params, :status, :paused_from, 1, :deployment_id, :parent_id, :join_set,
    :idempotency_key, :request_digest, coalesce(:scheduled_at, :now), :now, :now, 1)
ON CONFLICT DO NOTHING
RETURNING *

-- name: history_insert
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
VALUES (:execution_id, :seq, :kind, :at, :data)

-- name: execution_submit_many
-- rows [{id, ffqn, params, paused, deployment_id, idempotency_key, request_digest,
-- scheduled_at}]: a batch of submissions (history_of_submitted writes their events);
-- a key that exists is skipped. Answers what the database chose for each row inserted
-- (the rest is what was sent).
INSERT INTO veracity_executions (
    id, ffqn, params, status, paused_from, attempt, deployment_id, idempotency_key,
    request_digest, scheduled_at, created_at, updated_at, history_seq)
SELECT json_extract(value, '$.id'), json_extract(value, '$.ffqn'),
       json_extract(value, '$.params'),
       CASE WHEN json_extract(value, '$.paused') THEN 'paused' ELSE 'pending' END,
       CASE WHEN json_extract(value, '$.paused') THEN 'pending' END,
       1, json_extract(value, '$.deployment_id'), json_extract(value, '$.idempotency_key'),
       json_extract(value, '$.request_digest'),
       coalesce(json_extract(value, '$.scheduled_at'), :now), :now, :now, 1
FROM json_each(:rows) WHERE true
ON CONFLICT DO NOTHING
RETURNING id, scheduled_at, created_at, updated_at, 0 AS events_written

-- name: history_of_submitted
-- the first events of executions a batch inserted, with the data execution_submit gives
-- its one (scheduled_at as Python's isoformat writes a UTC time: microseconds only when
-- there are any)
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
SELECT id, 1, status, created_at, json_object(
    'ffqn', ffqn, 'params', json(params), 'deployment_id', deployment_id,
    'scheduled_at', strftime('%Y-%m-%dT%H:%M:%S', scheduled_at / 1000000, 'unixepoch')
        || CASE WHEN scheduled_at % 1000000 = 0 THEN ''
                ELSE printf('.%06d', scheduled_at % 1000000) END || '+00:00',
    'parent_id', parent_id, 'join_set', join_set, 'idempotency_key', idempotency_key)
FROM veracity_executions
WHERE id IN (SELECT value FROM json_each(:ids))

-- name: execution_by_keys_or_ids
SELECT * FROM veracity_executions
WHERE idempotency_key IN (SELECT value FROM json_each(:keys))
   OR id IN (SELECT value FROM json_each(:ids))

-- name: execution_by_key_or_id
SELECT * FROM veracity_executions
WHERE idempotency_key = :idempotency_key OR id = :id
ORDER BY (id = :id) DESC
LIMIT 1

-- name: execution_get
SELECT * FROM veracity_executions WHERE id = :id

-- name: execution_list
-- Newest first; SqliteStore.execution_list runs it with its first term, `true`, replaced
-- by the term of the index its page is read from: a status leads (one page per status
-- asked for, merged), else a workflow name and a status (one page per pair with the FFQN
-- prefix, found by execution_list_pairs, or per name of execution_list_ffqns and status
-- asked for, merged), else a deployment, else flagged=true, as on PostgreSQL; with none
-- of them, `true` stays and the page is read from veracity_executions_created, as it is
-- for a prefix of many workflows first (SqliteStore._window_page). Each leading term
-- compares the expression its index (migrations 0017 and 0021) is keyed on, which no
-- other query names; the other filters are
-- skipped when their parameter is NULL, a form no index can answer, and checked on each
-- row read. The dates and the cursor are bounds of the index's range, always given (the
-- store puts the earlier of created_before and the cursor in :upper_at, :upper_id, and a
-- bound beyond every row for one not asked for): a page after the cursor reads about a
-- page, however far down the list.
SELECT * FROM veracity_executions
WHERE true
  AND (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:ffqn_prefix IS NULL OR substr(ffqn, 1, length(:ffqn_prefix)) = :ffqn_prefix)
  AND (:deployment_id IS NULL OR deployment_id = :deployment_id)
  AND created_at > :lower_at
  AND (:flagged IS NULL OR (flagged_at IS NOT NULL) = :flagged)
  AND (created_at, id) < (:upper_at, :upper_id)
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: execution_list_rows
-- The rows of a page whose keys were merged from several reads (SqliteStore._read_page).
SELECT * FROM veracity_executions WHERE id IN (SELECT value FROM json_each(:ids))

-- name: execution_list_ffqns
-- The workflow names with the prefix :ffqn_prefix, each found by one probe of
-- veracity_executions_ffqn_status_created: the names with a prefix are the range
-- [:ffqn_prefix, :ffqn_end) of its BINARY order (:ffqn_end from the store). The first
-- :cap of them (-1: all): the names are found one probe at a time, as they are read.
WITH RECURSIVE names (ffqn) AS (
    SELECT min(CAST(ffqn AS TEXT)) FROM veracity_executions
    WHERE CAST(ffqn AS TEXT) >= :ffqn_prefix AND CAST(ffqn AS TEXT) < :ffqn_end
    UNION ALL
    SELECT (SELECT min(CAST(x.ffqn AS TEXT)) FROM veracity_executions AS x
            WHERE CAST(x.ffqn AS TEXT) > n.ffqn AND CAST(x.ffqn AS TEXT) < :ffqn_end)
    FROM names AS n WHERE n.ffqn IS NOT NULL
)
SELECT ffqn FROM names WHERE ffqn IS NOT NULL
LIMIT :cap

-- name: execution_list_pairs
-- The (workflow name, status) pairs with the prefix :ffqn_prefix that have rows, in the
-- order of veracity_executions_ffqn_status_created, each step found by a few probes of it:
-- the next status of the same name, else the first status of the next name with the
-- prefix (the range [:ffqn_prefix, :ffqn_end) of its BINARY order). A prefix without a
-- status filter is read pair by pair: a workflow's statuses it has none of cost nothing.
-- The first :cap of them (-1: all), found as they are read.
WITH RECURSIVE pairs (ffqn, status) AS (
    VALUES (:ffqn_prefix, '')
    UNION ALL
    SELECT CASE WHEN EXISTS (SELECT 1 FROM veracity_executions AS x
                             WHERE CAST(x.ffqn AS TEXT) = p.ffqn
                               AND CAST(x.status AS TEXT) > p.status)
                THEN p.ffqn
                ELSE (SELECT CAST(x.ffqn AS TEXT) FROM veracity_executions AS x
                      WHERE CAST(x.ffqn AS TEXT) > p.ffqn
                        AND CAST(x.ffqn AS TEXT) < :ffqn_end
                      ORDER BY CAST(x.ffqn AS TEXT) LIMIT 1) END,
           coalesce((SELECT CAST(x.status AS TEXT) FROM veracity_executions AS x
                     WHERE CAST(x.ffqn AS TEXT) = p.ffqn
                       AND CAST(x.status AS TEXT) > p.status
                     ORDER BY CAST(x.status AS TEXT) LIMIT 1),
                    (SELECT CAST(x.status AS TEXT) FROM veracity_executions AS x
                     WHERE CAST(x.ffqn AS TEXT) = (
                         SELECT CAST(y.ffqn AS TEXT) FROM veracity_executions AS y
                         WHERE CAST(y.ffqn AS TEXT) > p.ffqn
                           AND CAST(y.ffqn AS TEXT) < :ffqn_end
                         ORDER BY CAST(y.ffqn AS TEXT) LIMIT 1)
                     ORDER BY CAST(x.status AS TEXT) LIMIT 1))
    FROM pairs AS p WHERE p.ffqn IS NOT NULL
)
SELECT ffqn, status FROM pairs WHERE ffqn IS NOT NULL AND status <> ''
LIMIT :cap

-- name: execution_list_floor
-- The creation time of the (:window + 1)th newest row in a page's range (none when the
-- range holds :window rows or fewer), read from veracity_executions_created's entries
-- alone, or, with its first term, `true`, replaced by a status's (as execution_list's),
-- from the status index's: the rows newer than it are the window a page of many values
-- is first looked for in (SqliteStore._window_page).
SELECT created_at FROM veracity_executions
WHERE true
  AND created_at > :lower_at AND (created_at, id) < (:upper_at, :upper_id)
ORDER BY created_at DESC, id DESC
LIMIT 1 OFFSET :window

-- name: history_list
SELECT * FROM veracity_history
WHERE execution_id = :id AND seq > :after_seq
ORDER BY seq
LIMIT :limit

-- name: execution_claim
-- As PostgreSQL's: the worker's own deployment's due rows of its pinned workflows (the
-- index veracity_executions_unfinished, usable because the query repeats its WHERE term;
-- no other deployment's row is read), and the due rows of every deployment of the
-- workflows it claims from every deployment (upgrade="auto", the index
-- veracity_executions_due_ffqn); the earliest :limit of both are claimed and belong to the
-- worker's deployment from then on. INDEXED BY keeps both scans on their index whatever
-- the statistics say (and fails loudly if one were missing). The write lock held by
-- BEGIN IMMEDIATE is the lock. :deployment_id NULL: every workflow is in :upgrading.
UPDATE veracity_executions SET
    status = 'running',
    started_at = coalesce(started_at, :now),
    deployment_id = coalesce(:deployment_id, deployment_id),
    lease_owner = :owner,
    lease_epoch = lease_epoch + 1,
    lease_expires_at = :now + :ttl_us,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id IN (
        SELECT id FROM (
            SELECT id, scheduled_at FROM (
                SELECT id, scheduled_at FROM veracity_executions
                    INDEXED BY veracity_executions_unfinished
                WHERE deployment_id = :deployment_id
                  AND status = 'pending'
                  AND status IN ('pending', 'running', 'blocked', 'paused')
                  AND scheduled_at <= :now
                  AND ffqn IN (SELECT value FROM json_each(:pinned))
                ORDER BY scheduled_at, id
                LIMIT :limit)
            UNION ALL
            SELECT id, scheduled_at FROM (
                SELECT id, scheduled_at FROM veracity_executions
                    INDEXED BY veracity_executions_due_ffqn
                WHERE status = 'pending'
                  AND scheduled_at <= :now
                  AND ffqn IN (SELECT value FROM json_each(:upgrading))
                ORDER BY scheduled_at, id
                LIMIT :limit)
            ORDER BY scheduled_at, id
            LIMIT :limit))
  AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_leave
-- A worker's exit from running (complete, fail, release) of a row execution_lock_owned
-- returned in this transaction: the fence held, the transition table guards the status.
UPDATE veracity_executions SET
    status = :to_status,
    result = :result,
    error = :error,
    -- a workflow retry is claimable again only after its delay
    scheduled_at = coalesce(:now + :retry_in_us, scheduled_at),
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id
  AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: lease_extend
-- The heartbeat's renewal of a lease execution_lock_owned returned in this transaction.
UPDATE veracity_executions SET lease_expires_at = :now + :ttl_us
WHERE id = :id
RETURNING id, lease_epoch

-- name: worker_heartbeat
UPDATE veracity_workers SET last_heartbeat = :now WHERE id = :owner

-- name: deployment_touch
-- the heartbeat's worker's deployment is seen as long as the worker runs
UPDATE veracity_deployments SET last_seen = max(last_seen, :now)
WHERE id = (SELECT deployment_id FROM veracity_workers WHERE id = :owner)

-- name: execution_expired_leases
-- Lease recovery, first half: worker-run executions whose lease expired, with what the
-- decision (veracity.core.recovery) needs (the transaction's write lock is the lock).
SELECT e.id, e.lease_owner, e.lease_epoch, e.attempt,
       e.cancel_requested_at IS NOT NULL AS cancel_requested,
       (SELECT count(*) FROM veracity_executions AS c
        WHERE c.parent_id = e.id
          AND c.status NOT IN (SELECT value FROM json_each(:terminal))) AS open_children
FROM veracity_executions AS e
WHERE e.status = 'running' AND e.lease_owner IS NOT NULL AND e.lease_expires_at <= :now
ORDER BY e.lease_expires_at
LIMIT :limit

-- name: execution_recover_many
-- Lease recovery, second half: each decision applied only while the lease it was decided
-- on (owner, epoch) is still the expired one; rows [{id, owner, epoch, to_status,
-- attempt, error}]. The owner is cleared.
UPDATE veracity_executions SET
    status = r.r_to,
    attempt = r.r_attempt,
    error = coalesce(r.r_error, error),
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
FROM (SELECT json_extract(value, '$.id') AS r_id, json_extract(value, '$.owner') AS r_owner,
             json_extract(value, '$.epoch') AS r_epoch,
             json_extract(value, '$.to_status') AS r_to,
             json_extract(value, '$.attempt') AS r_attempt,
             json_extract(value, '$.error') AS r_error
      FROM json_each(:rows)) AS r
WHERE veracity_executions.id = r.r_id
  AND veracity_executions.status IN (SELECT value FROM json_each(:from_states))
  AND veracity_executions.lease_owner = r.r_owner
  AND veracity_executions.lease_epoch = r.r_epoch
  AND veracity_executions.lease_expires_at <= :now
RETURNING *

-- name: worker_register
INSERT INTO veracity_workers (
    id, host, pid, deployment_id, ffqns, upgrade_ffqns, concurrency, heartbeat_interval,
    started_at, last_heartbeat, host_key)
VALUES (:id, :host, :pid, :deployment_id, :ffqns, :upgrade_ffqns, :concurrency,
        :heartbeat_interval, :now, :now, :host_key)
ON CONFLICT (id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, deployment_id = excluded.deployment_id,
    ffqns = excluded.ffqns, upgrade_ffqns = excluded.upgrade_ffqns,
    concurrency = excluded.concurrency, heartbeat_interval = excluded.heartbeat_interval,
    last_heartbeat = excluded.last_heartbeat, stopped_at = NULL,
    host_key = excluded.host_key
RETURNING *

-- name: worker_stop
UPDATE veracity_workers SET stopped_at = :now WHERE id = :id RETURNING *

-- name: worker_gone_mark
-- A worker whose process is gone (docs/workers.md): marked stopped while the registry
-- still names that process; then worker_gone_leases_end, in the same transaction.
UPDATE veracity_workers SET stopped_at = :now
WHERE id = :id AND pid = :pid AND host_key = :host_key AND stopped_at IS NULL
RETURNING id

-- name: worker_gone_leases_end
UPDATE veracity_executions SET lease_expires_at = :now
WHERE lease_owner = :id AND status = 'running' AND lease_expires_at > :now
RETURNING id

-- name: worker_running_on
SELECT * FROM veracity_workers WHERE host_key = :host_key AND stopped_at IS NULL

-- name: worker_list
SELECT * FROM veracity_workers ORDER BY started_at DESC, id LIMIT :limit

-- ---------------------------------------------------------------------------------------
-- The durable engine (store/_ops.py drives these inside one IMMEDIATE transaction, which
-- already holds the write lock: "lock" queries are plain reads here)

-- name: history_append
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
VALUES (:execution_id, :seq, :kind, :now, :data)

-- name: execution_lock
SELECT * FROM veracity_executions WHERE id = :id

-- name: execution_lock_owned
-- The lease fence, written once: the row, only while it runs under this owner's lease (its
-- epoch, not expired by the transaction's clock). Every fenced write reads through it.
SELECT * FROM veracity_executions
WHERE id = :id
  AND status = 'running'
  AND lease_owner = :owner
  AND lease_epoch = :epoch
  AND lease_expires_at > :now

-- name: execution_bump_history
UPDATE veracity_executions SET history_seq = history_seq + :by WHERE id = :id
RETURNING *

-- name: execution_block
UPDATE veracity_executions SET
    status = CASE
        WHEN signal_seq <> :seen THEN 'pending'
        WHEN :wake_at <= :now THEN 'pending'
        ELSE 'blocked' END,
    wake_at = CASE
        WHEN signal_seq <> :seen THEN NULL
        WHEN :wake_at <= :now THEN NULL
        ELSE :wake_at END,
    blocked_seq = :seen,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + :events + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_insert_retry
-- an operator's retry of a failed execution: a new pending one linked to it
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, retry_of,
    scheduled_at, created_at, updated_at, history_seq)
VALUES (
    :id, :ffqn, :params, 'pending', 1, :deployment_id, :retry_of, :now, :now, :now,
    :history_seq)
RETURNING *

-- name: execution_insert_children
-- rows [{id, ffqn, params, deployment_id, parent_id, join_set, scheduled_at}]: each one whose
-- id is new, pending (scheduled now unless given), in one statement; those created returned
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, parent_id, join_set,
    scheduled_at, created_at, updated_at, history_seq)
SELECT json_extract(value, '$.id'), json_extract(value, '$.ffqn'),
       json_extract(value, '$.params'), 'pending', 1, json_extract(value, '$.deployment_id'),
       json_extract(value, '$.parent_id'), json_extract(value, '$.join_set'),
       coalesce(json_extract(value, '$.scheduled_at'), :now), :now, :now, 1
FROM json_each(:rows) WHERE true
ON CONFLICT (id) DO NOTHING
RETURNING *

-- name: message_oldest_open
SELECT id AS message_id, execution_id, topic, payload, created_at, consumed_at, consumed_pos
FROM veracity_messages
WHERE execution_id = :execution_id AND topic = :topic AND consumed_at IS NULL
ORDER BY id
LIMIT 1

-- name: message_consume
UPDATE veracity_messages SET consumed_at = :now, consumed_pos = :pos WHERE id = :message_id

-- name: message_insert
INSERT INTO veracity_messages (execution_id, topic, payload, created_at)
VALUES (:execution_id, :topic, :payload, :now)
RETURNING id AS message_id, execution_id, topic, payload, created_at, consumed_at, consumed_pos

-- name: execution_signal_bump
UPDATE veracity_executions SET
    signal_seq = signal_seq + 1,
    status = CASE WHEN :wake AND status IN (SELECT value FROM json_each(:from_states))
                  THEN 'pending' ELSE status END,
    wake_at = CASE WHEN :wake THEN NULL ELSE wake_at END,
    updated_at = CASE WHEN :wake THEN :now ELSE updated_at END,
    history_seq = history_seq + :events
WHERE id = :id
RETURNING *

-- name: execution_park
UPDATE veracity_executions SET
    status = 'paused', paused_from = 'pending', pause_requested_at = NULL,
    lease_owner = NULL, lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_open_children
SELECT count(*) AS n FROM veracity_executions
WHERE parent_id = :id
  AND status NOT IN ('completed', 'failed', 'failed_transient', 'cancelled')

-- name: execution_stop_cancelled
UPDATE veracity_executions SET
    status = :to_status,
    wake_at = NULL,
    blocked_seq = signal_seq,
    lease_owner = NULL, lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_signal
SELECT signal_seq FROM veracity_executions WHERE id = :id

-- name: execution_children
SELECT * FROM veracity_executions
WHERE parent_id = :parent_id AND (:join_set IS NULL OR join_set = :join_set)
ORDER BY (status IN ('completed', 'failed', 'failed_transient', 'cancelled')) DESC,
         updated_at, id

-- name: execution_interrupts
SELECT id, lease_epoch, cancel_requested_at, pause_requested_at FROM veracity_executions
WHERE lease_owner = :owner
  AND status = 'running'
  AND (cancel_requested_at IS NOT NULL OR pause_requested_at IS NOT NULL)

-- name: execution_wake_due
UPDATE veracity_executions SET
    status = 'pending', wake_at = NULL, updated_at = :now, history_seq = history_seq + 1
WHERE id IN (SELECT id FROM veracity_executions
             WHERE status = 'blocked' AND cancel_requested_at IS NULL AND wake_at <= :now
             ORDER BY wake_at LIMIT :limit)
  AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_cancel_mark
UPDATE veracity_executions SET
    cancel_requested_at = :now,
    history_seq = history_seq + 1
WHERE id IN (
        WITH RECURSIVE tree(id) AS (
            SELECT :id
            UNION
            SELECT c.id FROM veracity_executions AS c JOIN tree AS t ON c.parent_id = t.id
            WHERE c.status NOT IN (SELECT value FROM json_each(:terminal))
              AND substr(c.ffqn, -12) = '-cancellable')
        SELECT id FROM tree)
  AND cancel_requested_at IS NULL
  AND status NOT IN (SELECT value FROM json_each(:terminal))
RETURNING *

-- name: execution_cancel_settle
UPDATE veracity_executions SET
    status = 'cancelled', wake_at = NULL, paused_from = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id IN (
        WITH RECURSIVE tree(id) AS (
            SELECT :root
            UNION
            SELECT c.id FROM veracity_executions AS c JOIN tree AS t ON c.parent_id = t.id
            WHERE c.cancel_requested_at IS NOT NULL)
        SELECT id FROM tree)
  AND cancel_requested_at IS NOT NULL
  AND status IN (SELECT value FROM json_each(:from_states))
  AND NOT EXISTS (SELECT 1 FROM veracity_executions AS c
                  WHERE c.parent_id = veracity_executions.id
                    AND c.status NOT IN (SELECT value FROM json_each(:terminal)))
RETURNING *

-- name: execution_with_open_children
-- which of these executions have an unfinished child
SELECT DISTINCT parent_id AS id FROM veracity_executions
WHERE parent_id IN (SELECT value FROM json_each(:ids))
  AND status NOT IN (SELECT value FROM json_each(:terminal))

-- name: execution_cancel_mark_many
-- executions without unfinished children: cancel requested, each alone
UPDATE veracity_executions SET
    cancel_requested_at = :now,
    history_seq = history_seq + 1
WHERE id IN (SELECT value FROM json_each(:ids))
  AND cancel_requested_at IS NULL
  AND status NOT IN (SELECT value FROM json_each(:terminal))
RETURNING *

-- name: execution_cancel_settle_many
-- of those, what is not running and still has no unfinished child ends cancelled now
UPDATE veracity_executions SET
    status = 'cancelled', wake_at = NULL, paused_from = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id IN (SELECT value FROM json_each(:ids))
  AND cancel_requested_at IS NOT NULL
  AND status IN (SELECT value FROM json_each(:from_states))
  AND NOT EXISTS (SELECT 1 FROM veracity_executions AS c
                  WHERE c.parent_id = veracity_executions.id
                    AND c.status NOT IN (SELECT value FROM json_each(:terminal)))
RETURNING *

-- name: execution_request_pause
UPDATE veracity_executions SET pause_requested_at = :now, history_seq = history_seq + 1
WHERE id = :id
RETURNING *

-- name: execution_withdraw_pause
UPDATE veracity_executions SET pause_requested_at = NULL, history_seq = history_seq + 1
WHERE id = :id
RETURNING *

-- name: execution_pause
UPDATE veracity_executions SET
    paused_from = status, status = 'paused', updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_unpause
UPDATE veracity_executions SET
    status = CASE
        WHEN cancel_requested_at IS NOT NULL THEN 'blocked'
        WHEN paused_from = 'blocked' AND blocked_seq = signal_seq
             AND (wake_at IS NULL OR wake_at > :now)
        THEN 'blocked' ELSE 'pending' END,
    wake_at = CASE
        WHEN paused_from = 'blocked' AND blocked_seq = signal_seq
             AND (wake_at IS NULL OR wake_at > :now)
        THEN wake_at ELSE NULL END,
    paused_from = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id AND status = 'paused'
RETURNING *

-- ---------------------------------------------------------------------------------------
-- External engines (docs/external.md)

-- name: execution_delegate
UPDATE veracity_executions SET
    engine = :engine,
    callback_token_hash = :token_hash,
    triggered_at = :now,
    lease_owner = NULL,
    lease_expires_at = NULL,
    history_seq = history_seq + 1
WHERE id = :id AND status = 'running'
RETURNING *

-- name: execution_set_external_id
UPDATE veracity_executions SET
    external_execution_id = :external_id,
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    history_seq = history_seq + 1
WHERE id = :id
RETURNING *

-- name: execution_end_external
-- an ended run needs no operator any more: its flag is cleared (history keeps it)
UPDATE veracity_executions SET
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    end_request = NULL, end_requested_at = NULL,
    status = :to_status,
    result = :result,
    error = :error,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_external_running
SELECT * FROM veracity_executions
WHERE status = 'running' AND engine IS NOT NULL AND (:after IS NULL OR id > :after)
ORDER BY id
LIMIT :limit

-- name: execution_leased_to
SELECT * FROM veracity_executions
WHERE status = 'running' AND lease_owner = :owner AND lease_expires_at > :now
ORDER BY id

-- name: execution_park_waiting
UPDATE veracity_executions SET
    status = 'paused', paused_from = 'blocked', pause_requested_at = NULL,
    wake_at = :wake_at, blocked_seq = :seen,
    lease_owner = NULL, lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + :events + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_release_locked
UPDATE veracity_executions SET
    status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_lock_many
-- (the transaction's write lock is the lock; the rows are read in id order)
SELECT * FROM veracity_executions WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id

-- name: execution_end_external_many
-- the terminations of one page of looks, rows [{id, to_status, error}]
UPDATE veracity_executions SET
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    end_request = NULL, end_requested_at = NULL,
    status = r.r_to,
    result = NULL,
    error = r.r_error,
    updated_at = :now,
    history_seq = history_seq + 1
FROM (SELECT json_extract(value, '$.id') AS r_id, json_extract(value, '$.to_status') AS r_to,
             json_extract(value, '$.error') AS r_error
      FROM json_each(:rows)) AS r
WHERE veracity_executions.id = r.r_id
  AND veracity_executions.status IN (SELECT value FROM json_each(:from_states))
RETURNING id

-- name: execution_flag_many
-- flags of one page of looks, rows [{id, reason, kind}]
UPDATE veracity_executions SET
    flagged_at = :now,
    flag_reason = r.r_reason,
    flag_kind = r.r_kind,
    history_seq = history_seq + 1
FROM (SELECT json_extract(value, '$.id') AS r_id, json_extract(value, '$.reason') AS r_reason,
             json_extract(value, '$.kind') AS r_kind
      FROM json_each(:rows)) AS r
WHERE veracity_executions.id = r.r_id
RETURNING id

-- name: execution_unflag_many
-- flags that no longer hold (the engine found the run), rows [{id}]
UPDATE veracity_executions SET
    flagged_at = NULL, flag_reason = NULL, flag_kind = NULL,
    history_seq = history_seq + 1
FROM (SELECT json_extract(value, '$.id') AS r_id FROM json_each(:rows)) AS r
WHERE veracity_executions.id = r.r_id
RETURNING id

-- name: execution_request_end
-- an operator's request to end a delegated run, kept until the engine confirms the stop
UPDATE veracity_executions SET
    end_request = :request,
    end_requested_at = :now,
    history_seq = history_seq + 1
WHERE id = :id
RETURNING *

-- name: execution_end_forced
-- an operator ends a delegated run without the engine's confirmation: it stays flagged
UPDATE veracity_executions SET
    status = :to_status,
    result = NULL,
    error = :error,
    end_request = NULL, end_requested_at = NULL,
    flagged_at = :now,
    flag_reason = :reason,
    flag_kind = 'forced',
    updated_at = :now,
    history_seq = history_seq + 1
WHERE id = :id AND status IN (SELECT value FROM json_each(:from_states))
RETURNING *

-- name: execution_flag_note
-- more about why an execution is on the flagged list (a late report that concerns it)
UPDATE veracity_executions SET flag_reason = flag_reason || :note WHERE id = :id

-- name: execution_flag_counts
SELECT flag_kind, count(*) AS n FROM veracity_executions
WHERE flagged_at IS NOT NULL
GROUP BY flag_kind

-- name: execution_status_counts
-- Unfinished executions by status (the telemetry's gauge, read at each scrape): the
-- partial index veracity_executions_unfinished holds exactly these rows, so the count
-- costs what is unfinished, not the whole table (its status list repeated word for word).
SELECT status, count(*) AS n FROM veracity_executions
WHERE status IN ('pending', 'running', 'blocked', 'paused')
GROUP BY status

-- name: history_append_many
-- rows [{execution_id, seq, kind, data}]: many executions' events in one statement
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
SELECT json_extract(value, '$.execution_id'), json_extract(value, '$.seq'),
       json_extract(value, '$.kind'), :now, json_extract(value, '$.data')
FROM json_each(:rows)

-- ---------------------------------------------------------------------------------------
-- Cron (docs/cron.md; store/_ops.py drives these)

-- name: cron_entry_register_many
-- rows [{name, schedule, timezone}]: first seen now, unless already recorded with the same
-- schedule and time zone
INSERT INTO veracity_cron_entries (name, schedule, timezone, first_seen_at)
SELECT json_extract(value, '$.name'), json_extract(value, '$.schedule'),
       json_extract(value, '$.timezone'), :now
FROM json_each(:rows) WHERE true
ORDER BY 1
ON CONFLICT (name) DO UPDATE SET
    schedule = excluded.schedule,
    timezone = excluded.timezone,
    first_seen_at = excluded.first_seen_at
WHERE veracity_cron_entries.schedule <> excluded.schedule
   OR veracity_cron_entries.timezone <> excluded.timezone

-- name: cron_entry_records
-- each entry with its newest slot, the execution that slot started and its status
SELECT e.name, e.schedule, e.timezone, e.first_seen_at,
       s.slot_at AS last_slot_at, s.execution_id AS last_execution_id,
       x.status AS last_status
FROM veracity_cron_entries AS e
LEFT JOIN veracity_cron_slots AS s
    ON s.name = e.name
   AND s.slot_at = (SELECT max(slot_at) FROM veracity_cron_slots WHERE name = e.name)
LEFT JOIN veracity_executions AS x ON x.id = s.execution_id
WHERE e.name IN (SELECT value FROM json_each(:names))
ORDER BY e.name

-- name: cron_slot_claim_many
-- rows [{name, slot_at, execution_id}]: the slots whose key was free
INSERT INTO veracity_cron_slots (name, slot_at, execution_id, fired_at)
SELECT json_extract(value, '$.name'), json_extract(value, '$.slot_at'),
       json_extract(value, '$.execution_id'), :now
FROM json_each(:rows) WHERE true
ORDER BY 1, 2
ON CONFLICT DO NOTHING
RETURNING execution_id

-- name: execution_insert_many
-- rows [{id, ffqn, params, deployment_id, scheduled_at}]: new pending executions
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, scheduled_at, created_at, updated_at,
    history_seq)
SELECT json_extract(value, '$.id'), json_extract(value, '$.ffqn'),
       json_extract(value, '$.params'), 'pending', 1, json_extract(value, '$.deployment_id'),
       json_extract(value, '$.scheduled_at'), :now, :now, 1
FROM json_each(:rows)


-- ---------------------------------------------------------------------------------------
-- Deployments (docs/deployments.md)

-- name: deployment_seen
INSERT INTO veracity_deployments (id, first_seen, last_seen) VALUES (:id, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen = max(last_seen, excluded.last_seen)
RETURNING id AS deployment_id, first_seen, last_seen

-- name: deployment_rows
SELECT id AS deployment_id, first_seen, last_seen FROM veracity_deployments
ORDER BY first_seen DESC, id

-- name: deployment_get
SELECT id AS deployment_id, first_seen, last_seen FROM veracity_deployments WHERE id = :id

-- name: deployment_unfinished
SELECT deployment_id, status, ffqn, (status = 'running' AND engine IS NOT NULL) AS delegated,
       count(*) AS n
FROM veracity_executions INDEXED BY veracity_executions_unfinished
WHERE status IN ('pending', 'running', 'blocked', 'paused')
GROUP BY 1, 2, 3, 4

-- name: deployment_has_unfinished
SELECT 1 AS found FROM veracity_executions INDEXED BY veracity_executions_unfinished
WHERE deployment_id = :id AND status IN ('pending', 'running', 'blocked', 'paused')
LIMIT 1

-- name: worker_live
-- the workers that may be live (core.deployments.is_live decides which are)
SELECT deployment_id, ffqns, upgrade_ffqns, stopped_at, last_heartbeat, heartbeat_interval,
       :now AS db_now
FROM veracity_workers
WHERE stopped_at IS NULL
  AND last_heartbeat >= :now - :live_within
  AND (:deployment_id IS NULL OR deployment_id = :deployment_id)

-- name: execution_adoptable
SELECT id, history_seq FROM veracity_executions INDEXED BY veracity_executions_unfinished
WHERE deployment_id = :from_id
  AND status IN ('pending', 'running', 'blocked', 'paused')
  AND (:ffqn_prefix IS NULL OR substr(ffqn, 1, length(:ffqn_prefix)) = :ffqn_prefix)
ORDER BY id

-- name: execution_adopt_many
UPDATE veracity_executions SET
    deployment_id = :to_id,
    history_seq = history_seq + 1
WHERE id IN (SELECT value FROM json_each(:ids))
  AND deployment_id = :from_id
  AND status IN ('pending', 'running', 'blocked', 'paused')
RETURNING id, history_seq

-- name: notify_pending
-- SQLite has no notifications: workers find adopted executions when they poll
SELECT 1 AS ok


-- ---------------------------------------------------------------------------------------
-- API tokens (docs/security.md)

-- name: token_create
INSERT INTO veracity_api_tokens (name, key_id, token_hash, scopes, created_at, expires_at)
VALUES (:name, :key_id, :token_hash, :scopes, :now, :now + :expires_in_us)
ON CONFLICT (name) DO NOTHING
RETURNING *

-- name: token_get
SELECT * FROM veracity_api_tokens WHERE name = :name

-- name: token_find
SELECT * FROM veracity_api_tokens WHERE key_id = :key_id

-- name: token_list
SELECT * FROM veracity_api_tokens ORDER BY created_at, name

-- name: token_revoke
UPDATE veracity_api_tokens SET revoked_at = :now
WHERE name = :name AND revoked_at IS NULL
RETURNING *

-- name: token_touch
UPDATE veracity_api_tokens SET last_used_at = :now
WHERE key_id = :key_id AND (last_used_at IS NULL OR last_used_at < :now)


-- ---------------------------------------------------------------------------------------
-- Retention (docs/operations.md, Retention; store/_ops.py, prune, drives these). The
-- transaction's write lock is the lock.

-- name: prune_roots
-- Top-level executions that ended before the cutoff, oldest end first, after the cursor
-- (updated_at, id): read from the index veracity_executions_ended.
SELECT id, updated_at FROM veracity_executions
WHERE parent_id IS NULL
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')
  AND updated_at < :cutoff
  AND (:after_at IS NULL OR (updated_at, id) > (:after_at, :after_id))
ORDER BY updated_at, id
LIMIT :limit

-- name: prune_families
-- Every member of the families of these roots (the roots and everything below them),
-- with what the decision (veracity.core.retention) needs.
WITH RECURSIVE fam (root_id, id, depth) AS (
    SELECT value, value, 0 FROM json_each(:roots)
    UNION ALL
    SELECT fam.root_id, c.id, fam.depth + 1
    FROM veracity_executions AS c JOIN fam ON c.parent_id = fam.id
)
SELECT fam.root_id, e.id, e.status, e.parent_id, fam.depth,
       e.flagged_at IS NOT NULL AS flagged,
       (e.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        AND e.updated_at < :cutoff) AS ended_before_cutoff,
       (SELECT json_group_array(r.id) FROM veracity_executions AS r
        WHERE r.retry_of = e.id) AS retried_by,
       EXISTS (SELECT 1 FROM veracity_cron_slots AS s
               WHERE s.execution_id = e.id
                 AND s.slot_at = (SELECT max(l.slot_at) FROM veracity_cron_slots AS l
                                  WHERE l.name = s.name)) AS cron_latest
FROM fam JOIN veracity_executions AS e ON e.id = fam.id

-- name: prune_lock
-- The executions about to be deleted that are still terminal, ended before the cutoff and
-- not flagged.
SELECT id FROM veracity_executions
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')
  AND updated_at < :cutoff
  AND flagged_at IS NULL

-- name: prune_retried_by
-- Executions that retry one of these and are not among them.
SELECT DISTINCT retry_of AS id FROM veracity_executions
WHERE retry_of IN (SELECT value FROM json_each(:ids))
  AND id NOT IN (SELECT value FROM json_each(:ids))

-- name: prune_count_history
-- (a dry run: what deleting these would delete)
SELECT count(*) AS n FROM veracity_history
WHERE execution_id IN (SELECT value FROM json_each(:ids))

-- name: prune_count_messages
SELECT count(*) AS n FROM veracity_messages
WHERE execution_id IN (SELECT value FROM json_each(:ids))

-- name: prune_delete_messages
DELETE FROM veracity_messages WHERE execution_id IN (SELECT value FROM json_each(:ids))
RETURNING 1

-- name: prune_delete_history
DELETE FROM veracity_history WHERE execution_id IN (SELECT value FROM json_each(:ids))
RETURNING 1

-- name: prune_delete_cron_slots
DELETE FROM veracity_cron_slots WHERE execution_id IN (SELECT value FROM json_each(:ids))
RETURNING 1

-- name: prune_delete_executions
DELETE FROM veracity_executions WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING 1

-- name: prune_counted
-- The batch's deletions added to the database's totals (veracity_pruned_total), in its
-- transaction.
UPDATE veracity_retention_totals SET deleted = deleted + CASE kind
    WHEN 'executions' THEN :executions
    WHEN 'history' THEN :history
    ELSE :messages END

-- name: retention_totals
SELECT kind, deleted FROM veracity_retention_totals

-- name: prune_count
-- How many top-level executions ended before the cutoff (what a pass will read).
SELECT count(*) AS n FROM veracity_executions
WHERE parent_id IS NULL
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')
  AND updated_at < :cutoff

-- name: history_newest_of_kinds
-- the newest event of each kind of each execution (what it waits for: core.waiting)
SELECT h.execution_id, h.kind, h.data
FROM (SELECT i.value AS id, k.value AS kind,
             (SELECT x.seq FROM veracity_history x
              WHERE x.execution_id = i.value AND x.kind = k.value
              ORDER BY x.seq DESC LIMIT 1) AS seq
      FROM json_each(:ids) i, json_each(:kinds) k) m
JOIN veracity_history h ON h.execution_id = m.id AND h.seq = m.seq

-- name: execution_unfinished_children
-- the unfinished children of each execution by join set: how many, and the oldest few
SELECT parent_id, join_set, id, n FROM (
    SELECT parent_id, join_set, id, created_at,
           row_number() OVER (PARTITION BY parent_id, join_set ORDER BY created_at, id) AS rn,
           count(*) OVER (PARTITION BY parent_id, join_set) AS n
    FROM veracity_executions
    WHERE parent_id IN (SELECT value FROM json_each(:ids))
      AND status IN ('pending', 'running', 'blocked', 'paused')
) c
WHERE rn <= :shown
ORDER BY parent_id, join_set, created_at, id

-- name: execution_ended_among
-- which of these executions have ended
SELECT id FROM veracity_executions
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')

-- ---------------------------------------------------------------------------------------
-- The dashboard's reads (docs/dashboard.md)

-- name: execution_counts_in
SELECT status, count(*) AS n FROM veracity_executions
WHERE status IN (SELECT value FROM json_each(:statuses))
GROUP BY status

-- name: execution_children_of
SELECT * FROM veracity_executions
WHERE parent_id IN (SELECT value FROM json_each(:parent_ids))
ORDER BY parent_id, created_at, id
LIMIT :limit

-- name: history_list_kinds
SELECT * FROM veracity_history
WHERE execution_id = :id AND seq > :after_seq
  AND kind IN (SELECT value FROM json_each(:kinds))
ORDER BY seq
LIMIT :limit

-- name: history_kind_counts
SELECT kind, count(*) AS n FROM veracity_history
WHERE execution_id = :id
GROUP BY kind
ORDER BY kind
