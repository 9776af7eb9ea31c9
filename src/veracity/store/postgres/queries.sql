-- PostgreSQL queries of the store. Parameters are psycopg's %(name)s; %(now)s is the
-- injected clock's time, NULL in production so that the database's now() rules.
--
-- Every statement that can end an execution also notifies channel veracity_ended for each
-- row it ended (its `ended_note` column; identical notifications of one transaction are
-- folded into one, sent at commit): what answers GET /v1/executions/{id}?wait= wakes on
-- it (veracity/waiting.py). The trigger veracity_child_finished may end a parent in the
-- same transaction as its child, whose end notifies.

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

-- name: session_check_notify
-- PostgresStore.check_session: a notification on a channel of the checking process's own.
SELECT pg_notify(%(channel)s, '') AS sent

-- name: execution_submit
-- One submission and its first event. Answers only what the database chose (the id tells
-- an insert from a conflict; the times; the lease of a hand-off); the store builds the
-- rest from what it sent, as for a batch (reading the whole row back cost some 50 µs of
-- the caller's CPU).
-- Hand-off (docs/workers.md, "Hand-off to an idle worker"): when an idle worker's offer
-- matches (its deployment, one of its pinned workflows, the submission due now, not
-- paused, not a child, its parameters small enough for a notification), the row is
-- written claimed by that worker as a claim would leave it (running, the worker's lease,
-- epoch 1, started now, the `running` event after the `pending` one) and the offer is
-- used up; the worker hears it on its own channel with the row. SKIP LOCKED: two
-- submissions never take one offer, and a submission never waits for one. A submission
-- whose key exists inserts nothing and leaves the offer.
WITH offer AS (
    SELECT owner, channel, lease_ttl FROM veracity_offers
    WHERE deployment_id = %(deployment_id)s
      AND %(ffqn)s = ANY (ffqns)
      AND expires_at > coalesce(%(now)s::timestamptz, now())
      AND NOT %(paused)s
      AND %(parent_id)s::uuid IS NULL
      AND coalesce(%(scheduled_at)s::timestamptz <= coalesce(%(now)s::timestamptz, now()),
                   true)
      -- a notification carries at most 8000 bytes: the row's variable texts within 5000
      AND octet_length(%(params)s::text) + octet_length(%(ffqn)s)
          + octet_length(%(deployment_id)s)
          + coalesce(octet_length(%(idempotency_key)s::text), 0)
          + coalesce(octet_length(%(request_digest)s::text), 0) <= 5000
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), ins AS (
    INSERT INTO veracity_executions (
        id, ffqn, params, status, paused_from, attempt, deployment_id, parent_id, join_set,
        idempotency_key, request_digest, scheduled_at, created_at, updated_at, history_seq,
        lease_owner, lease_epoch, lease_expires_at, started_at)
    SELECT
        %(id)s, %(ffqn)s, %(params)s,
        CASE WHEN offer.owner IS NOT NULL THEN 'running'
             WHEN %(paused)s THEN 'paused' ELSE 'pending' END,
        CASE WHEN %(paused)s THEN 'pending' END,
        1, %(deployment_id)s, %(parent_id)s::uuid, %(join_set)s::text,
        %(idempotency_key)s::text, %(request_digest)s::text,
        coalesce(%(scheduled_at)s::timestamptz, %(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()),
        CASE WHEN offer.owner IS NOT NULL THEN 2 ELSE 1 END,
        offer.owner,
        CASE WHEN offer.owner IS NOT NULL THEN 1 ELSE 0 END,
        coalesce(%(now)s::timestamptz, now()) + offer.lease_ttl,
        CASE WHEN offer.owner IS NOT NULL THEN coalesce(%(now)s::timestamptz, now()) END
    FROM (SELECT 1) AS one LEFT JOIN offer ON true
    ON CONFLICT DO NOTHING
    RETURNING *
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, 1, CASE WHEN lease_owner IS NULL THEN status ELSE 'pending' END, created_at,
        json_build_object(
            'ffqn', ffqn, 'params', params, 'deployment_id', deployment_id,
            'scheduled_at', scheduled_at, 'parent_id', parent_id, 'join_set', join_set,
            'idempotency_key', idempotency_key)
    FROM ins
    UNION ALL
    SELECT id, 2, 'running', updated_at, json_build_object(
        'owner', lease_owner, 'epoch', lease_epoch, 'attempt', attempt,
        'deployment_id', deployment_id, 'handoff', true)
    FROM ins WHERE lease_owner IS NOT NULL
), taken AS (
    DELETE FROM veracity_offers AS o USING ins WHERE o.owner = ins.lease_owner
)
SELECT id, scheduled_at, created_at, updated_at, lease_owner, lease_epoch, lease_expires_at,
       started_at, history_seq,
       (CASE WHEN lease_owner IS NOT NULL
             THEN pg_notify((SELECT channel FROM offer), row_to_json(ins)::text) END) IS NULL
           AS told
FROM ins

-- name: execution_submit_many
-- rows [{id, ffqn, params, paused, deployment_id, idempotency_key, request_digest,
-- scheduled_at}]: a batch of submissions and their first events (with the data
-- execution_submit gives its one), in one statement. A key that exists is skipped (ON
-- CONFLICT waits for its inserter to commit); rows in key order, so that batches sharing
-- keys wait for each other instead of deadlocking. Answers what the database chose for
-- each row inserted (the rest is what was sent); events_written: no history_of_submitted
-- needed.
WITH ins AS (
    INSERT INTO veracity_executions (
        id, ffqn, params, status, paused_from, attempt, deployment_id, idempotency_key,
        request_digest, scheduled_at, created_at, updated_at, history_seq)
    SELECT r.id, r.ffqn, r.params,
           CASE WHEN r.paused THEN 'paused' ELSE 'pending' END,
           CASE WHEN r.paused THEN 'pending' END,
           1, r.deployment_id, r.idempotency_key, r.request_digest,
           coalesce(r.scheduled_at, %(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), 1
    FROM json_to_recordset(%(rows)s::json) AS r (
        id uuid, ffqn text, params json, paused boolean, deployment_id text,
        idempotency_key text, request_digest text, scheduled_at timestamptz)
    ORDER BY r.idempotency_key
    ON CONFLICT DO NOTHING
    RETURNING id, ffqn, params, status, deployment_id, scheduled_at, parent_id, join_set,
              idempotency_key, created_at, updated_at
), events AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, 1, status, created_at, json_build_object(
        'ffqn', ffqn, 'params', params, 'deployment_id', deployment_id,
        'scheduled_at', scheduled_at, 'parent_id', parent_id, 'join_set', join_set,
        'idempotency_key', idempotency_key)
    FROM ins
)
SELECT id, scheduled_at, created_at, updated_at, true AS events_written FROM ins

-- name: history_of_submitted
-- (SQLite writes a batch's first events apart; here execution_submit_many writes them)
SELECT 1 WHERE false

-- name: execution_by_keys_or_ids
SELECT * FROM veracity_executions
WHERE idempotency_key = ANY (%(keys)s::text[]) OR id = ANY (%(ids)s::uuid[])

-- name: execution_by_key_or_id
SELECT * FROM veracity_executions
WHERE idempotency_key = %(idempotency_key)s OR id = %(id)s
ORDER BY (id = %(id)s) DESC
LIMIT 1

-- name: execution_get
SELECT * FROM veracity_executions WHERE id = %(id)s

-- name: list_planning
-- Run first, in the same transaction, by every list page (the store's execution_list): its
-- queries read an index newest first and stop at a page, which is never the plan to
-- avoid. Planned with a row count that is too low (rows newer than the table's statistics:
-- a burst of submissions before autovacuum analyzed it), PostgreSQL chose a bitmap scan of
-- every row of a status, or read the table, then sorted the rows: 9 ms for 20,000 rows,
-- and as much more as the burst was larger. With bitmap scans and sequential scans off
-- (made costly, not forbidden) it reads the index in order whatever it believes about the
-- rows (tests/store/test_list_plans.py, a table never analyzed).
SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off

-- name: execution_list_flagged
-- Newest first, the flagged executions (with any other filter): they are few, read newest
-- first from veracity_executions_flagged_created and the other filters checked on each.
-- Every other list page reads the status with its other filters (queries below; the
-- store's list_statement picks one). Here the other filters are expressions that no
-- index of all the rows can answer (the status in the database's default collation, the
-- deployment COLLATE "C" (migration 0020), the prefix as left() instead of starts_with(),
-- which the planner turns into a range of an index), so that the planner cannot read a
-- common status's or workflow's rows to check each for a flag, as it did on a table it
-- had no statistics of.
SELECT * FROM veracity_executions
WHERE flagged_at IS NOT NULL
  AND (cardinality(%(statuses)s::text[]) = 0 OR status = ANY (%(statuses)s::text[]))
  AND (%(ffqn_prefix)s::text IS NULL
       OR left(ffqn, char_length(%(ffqn_prefix)s::text)) = %(ffqn_prefix)s::text)
  AND (%(deployment_id)s::text IS NULL
       OR deployment_id COLLATE "C" = %(deployment_id)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(cursor_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: execution_list_by_status
-- Newest first, without an FFQN prefix, a deployment (each has a query below that reads
-- it with the status from one index) or `flagged`: each status asked for (or every status,
-- for a page of no filter, of dates or after a cursor) read newest first from the index
-- veracity_executions_status_created, then merged: a page costs the page times the number
-- of statuses, however rare each is and however long the history. (Migration 0020 dropped
-- the index of the whole list's order that an unfiltered page was read from before.)
SELECT e.* FROM unnest(%(statuses)s::text[]) AS s (status)
CROSS JOIN LATERAL (
    SELECT * FROM veracity_executions AS x
    WHERE x.status COLLATE "C" = s.status
      AND (%(created_after)s::timestamptz IS NULL
           OR x.created_at > %(created_after)s::timestamptz)
      AND (%(created_before)s::timestamptz IS NULL
           OR x.created_at < %(created_before)s::timestamptz)
      AND (%(flagged)s::boolean IS NULL OR (x.flagged_at IS NOT NULL) = %(flagged)s::boolean)
      AND (%(cursor_at)s::timestamptz IS NULL
           OR (x.created_at, x.id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid))
    ORDER BY x.created_at DESC, x.id DESC
    LIMIT %(limit)s
) AS e
ORDER BY e.created_at DESC, e.id DESC
LIMIT %(limit)s

-- name: execution_list_by_ffqn
-- The same, for an FFQN prefix (with or without statuses: without, every status): the
-- distinct workflow names with the prefix, found by skipping through the index
-- veracity_executions_ffqn_status_created (one probe per name), then each name's newest
-- rows of each status read in order from it, and merged: a page costs the page times the
-- number of (workflow, status) pairs, whatever the history, and a status none of the
-- names' rows has reads nothing. The status is compared COLLATE "POSIX", the index's key
-- (migration 0020): no other index can answer the pair. Each pair's newest keys are read
-- first (from the index alone when its pages are all visible) and only the page's rows
-- fetched: a prefix of 111 workflows read 5,550 rows for a page of 50 before. The store
-- also counts the names (up to 32) with this query's `names` alone (PostgresStore,
-- _prefix_names_query), to choose execution_list_by_ffqn_window first.
WITH RECURSIVE names (ffqn) AS (
    -- each probe the first name of the index after the last (ORDER BY ... LIMIT 1, not
    -- min(): planned for few rows, min() read every row of the range and kept the least)
    (SELECT ffqn COLLATE "C" FROM veracity_executions
     WHERE starts_with(ffqn COLLATE "C", %(ffqn_prefix)s::text)
     ORDER BY ffqn COLLATE "C" LIMIT 1)
    UNION ALL
    SELECT (SELECT x.ffqn COLLATE "C" FROM veracity_executions AS x
            WHERE x.ffqn COLLATE "C" > n.ffqn
              AND starts_with(x.ffqn COLLATE "C", %(ffqn_prefix)s::text)
            ORDER BY x.ffqn COLLATE "C" LIMIT 1)
    FROM names AS n WHERE n.ffqn IS NOT NULL
), page (created_at, id) AS (
    SELECT k.created_at, k.id FROM names
    CROSS JOIN unnest(%(statuses)s::text[]) AS s (status)
    CROSS JOIN LATERAL (
        SELECT x.created_at, x.id FROM veracity_executions AS x
        WHERE x.ffqn COLLATE "C" = names.ffqn
          AND x.status COLLATE "POSIX" = s.status
          AND (%(deployment_id)s::text IS NULL
               OR x.deployment_id COLLATE "C" = %(deployment_id)s::text)
          AND (%(created_after)s::timestamptz IS NULL
               OR x.created_at > %(created_after)s::timestamptz)
          AND (%(created_before)s::timestamptz IS NULL
               OR x.created_at < %(created_before)s::timestamptz)
          AND (%(flagged)s::boolean IS NULL
               OR (x.flagged_at IS NOT NULL) = %(flagged)s::boolean)
          AND (%(cursor_at)s::timestamptz IS NULL
               OR (x.created_at, x.id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid))
        ORDER BY x.created_at DESC, x.id DESC
        LIMIT %(limit)s
    ) AS k
    WHERE names.ffqn IS NOT NULL
    ORDER BY k.created_at DESC, k.id DESC
    LIMIT %(limit)s
)
SELECT e.* FROM page JOIN veracity_executions AS e ON e.id = page.id
ORDER BY page.created_at DESC, page.id DESC

-- name: execution_list_by_ffqn_window
-- A page of an FFQN prefix shared by many workflows, looked for among the newest rows
-- first (PostgresStore.execution_list): the window is the newest 200 keys of the statuses
-- asked for (or all) in the page's range, each status's read newest first from
-- veracity_executions_status_created, then each of their rows looked up by its id and
-- every filter checked. The page is answered when the window holds a page of rows with
-- them, or holds the whole range; otherwise nothing, and the store reads the page with
-- execution_list_by_ffqn (a statement per workflow and status: 1,584 of them for 200
-- workflows) instead.
WITH recent (created_at, id) AS (
    SELECT k.created_at, k.id FROM unnest(%(statuses)s::text[]) AS s (status)
    CROSS JOIN LATERAL (
        SELECT x.created_at, x.id FROM veracity_executions AS x
        WHERE x.status COLLATE "C" = s.status
          AND (%(created_after)s::timestamptz IS NULL
               OR x.created_at > %(created_after)s::timestamptz)
          AND (%(created_before)s::timestamptz IS NULL
               OR x.created_at < %(created_before)s::timestamptz)
          AND (%(cursor_at)s::timestamptz IS NULL
               OR (x.created_at, x.id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid))
        ORDER BY x.created_at DESC, x.id DESC
        LIMIT %(window)s
    ) AS k
    ORDER BY k.created_at DESC, k.id DESC
    LIMIT %(window)s
), found AS (
    -- each row looked up by its id (LIMIT 1: not joined otherwise, which PostgreSQL once
    -- planned as a hash of every row with the prefix)
    SELECT e.* FROM recent
    CROSS JOIN LATERAL (
        SELECT * FROM veracity_executions AS x
        WHERE x.id = recent.id
          AND starts_with(x.ffqn COLLATE "C", %(ffqn_prefix)s::text)
          AND (%(deployment_id)s::text IS NULL
               OR x.deployment_id COLLATE "C" = %(deployment_id)s::text)
          AND (%(flagged)s::boolean IS NULL
               OR (x.flagged_at IS NOT NULL) = %(flagged)s::boolean)
        LIMIT 1
    ) AS e
    ORDER BY e.created_at DESC, e.id DESC
    LIMIT %(limit)s
)
SELECT * FROM found
WHERE (SELECT count(*) FROM found) = %(limit)s
   OR (SELECT count(*) FROM recent) < %(window)s
ORDER BY created_at DESC, id DESC

-- name: execution_list_by_deployment
-- The same, for a deployment without an FFQN prefix (with or without statuses: without,
-- every status): the deployment's newest rows of each status read in order from the index
-- veracity_executions_deployment_status_created, and merged. Both are compared COLLATE
-- "POSIX", the index's keys (migration 0020): no other index can answer them.
SELECT e.* FROM unnest(%(statuses)s::text[]) AS s (status)
CROSS JOIN LATERAL (
    SELECT * FROM veracity_executions AS x
    WHERE x.deployment_id COLLATE "POSIX" = %(deployment_id)s::text
      AND x.status COLLATE "POSIX" = s.status
      AND (%(created_after)s::timestamptz IS NULL
           OR x.created_at > %(created_after)s::timestamptz)
      AND (%(created_before)s::timestamptz IS NULL
           OR x.created_at < %(created_before)s::timestamptz)
      AND (%(flagged)s::boolean IS NULL OR (x.flagged_at IS NOT NULL) = %(flagged)s::boolean)
      AND (%(cursor_at)s::timestamptz IS NULL
           OR (x.created_at, x.id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid))
    ORDER BY x.created_at DESC, x.id DESC
    LIMIT %(limit)s
) AS e
ORDER BY e.created_at DESC, e.id DESC
LIMIT %(limit)s

-- name: history_list
SELECT * FROM veracity_history
WHERE execution_id = %(id)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: execution_claim
-- Two scans, each in (scheduled_at, id) order and stopping at the LIMIT: the worker's own
-- deployment's due rows of its pinned workflows (veracity_executions_unfinished leads with
-- deployment_id: no other deployment's row is read), and, per workflow it claims from every
-- deployment (upgrade="auto"), that workflow's due rows (veracity_executions_due_ffqn). The
-- earliest LIMIT of both are claimed and belong to the worker's deployment from then on.
-- A row the second scan locked that the LIMIT leaves out is unlocked at the statement's
-- end, unclaimed. The CTEs pin the LIMITs: without them the planner may lock and update
-- more rows. deployment_id NULL: every workflow is in %(upgrading)s (tools and tests).
-- The UPDATE finds each chosen row by primary key and checks the status the CTE read under
-- its lock (no one else can change it since): a guard on e.status itself lets the planner
-- prove the partial indexes' predicates and, with statistics gathered when few rows were
-- pending (pending rows are few among many ended ones), join through one of them instead,
-- reading every pending row per claim (tests/store/test_list_plans.py).
WITH pinned AS (
    SELECT id, scheduled_at, status FROM veracity_executions
    WHERE deployment_id = %(deployment_id)s::text
      AND status = 'pending'
      AND scheduled_at <= coalesce(%(now)s::timestamptz, now())
      AND ffqn = ANY (%(pinned)s::text[])
      AND cardinality(%(pinned)s::text[]) > 0
    ORDER BY scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), upgrading AS (
    SELECT u.id, u.scheduled_at, u.status
    FROM unnest(%(upgrading)s::text[]) AS w(ffqn)
    CROSS JOIN LATERAL (
        SELECT x.id, x.scheduled_at, x.status FROM veracity_executions AS x
        WHERE x.ffqn = w.ffqn
          AND x.status = 'pending'
          AND x.scheduled_at <= coalesce(%(now)s::timestamptz, now())
        ORDER BY x.scheduled_at, x.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS u
), due AS (
    SELECT id, status FROM (SELECT * FROM pinned UNION ALL SELECT * FROM upgrading) AS found
    ORDER BY scheduled_at, id
    LIMIT %(limit)s
), claimed AS (
    UPDATE veracity_executions AS e SET
        status = 'running',
        started_at = coalesce(e.started_at, %(now)s::timestamptz, now()),
        deployment_id = coalesce(%(deployment_id)s::text, e.deployment_id),
        lease_owner = %(owner)s,
        lease_epoch = e.lease_epoch + 1,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl)s::interval,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = e.history_seq + 1
    FROM due
    WHERE e.id = due.id AND due.status = ANY (%(from_states)s::text[])
    RETURNING e.*
), ev AS (
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT id, history_seq, status, updated_at, json_build_object(
        'owner', lease_owner, 'epoch', lease_epoch, 'attempt', attempt,
        'deployment_id', deployment_id)
    FROM claimed
)
SELECT * FROM claimed ORDER BY scheduled_at, id

-- name: execution_leave_many_if_owned
-- Every exit a worker makes from running, one execution or a batch of one owner's: each row
-- guarded by the lease fence (veracity_holds_lease) with its own epoch, plus its event.
-- The batch comes as one JSON array of [id, epoch, to_status, retry_in, result, error,
-- event] rows: one parameter to encode, instead of a PostgreSQL array per column whose
-- elements the driver escapes one by one. Result, error and event come as JSON texts inside
-- JSON strings, so that PostgreSQL's JSON operators never unescape a NUL character of
-- theirs (which text cannot hold); a SQL NULL result or error is a JSON null there. The
-- array is read as jsonb: parsed once, where each ->> of a json value parses its row's
-- text again (seven times a row).
WITH input AS (
    SELECT (r->>0)::uuid AS id, (r->>1)::bigint AS epoch, r->>2 AS to_status,
           (r->>3)::float8 AS retry_in, (r->>4)::json AS result, (r->>5)::json AS error,
           (r->>6)::json AS event
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
), upd AS (
    UPDATE veracity_executions AS e SET
        status = input.to_status,
        result = input.result,
        error = input.error,
        -- a workflow retry is claimable again only after its delay
        scheduled_at = coalesce(coalesce(%(now)s::timestamptz, now())
                                + make_interval(secs => input.retry_in), e.scheduled_at),
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = e.history_seq + 1
    FROM input
    WHERE e.id = input.id
      -- the same ids as an array too: the planner then finds the rows through the primary
      -- key whatever it believes of the table's size (without statistics, as after a new
      -- deployment's first burst, it read the whole table for every batch and joined it
      -- by hash: tests/store/test_list_plans.py)
      AND e.id = ANY (ARRAY(SELECT id FROM input))
      -- The guards inside a CASE: a status the planner can read from the WHERE lets it
      -- prove the partial indexes' predicates and, with statistics gathered when few rows
      -- ran, join through one, reading every running row of every worker per batch; this
      -- way it finds each row by primary key (tests/store/test_list_plans.py). The guards
      -- are the same, and are checked again on the row's latest version as ever.
      AND CASE WHEN e.status = ANY (%(from_states)s::text[])
               THEN veracity_holds_lease(e.status, e.lease_owner, e.lease_epoch,
                                         e.lease_expires_at, %(owner)s, input.epoch,
                                         coalesce(%(now)s::timestamptz, now()))
               ELSE false END
    RETURNING e.*
), ev AS (
    -- the event joined here, not returned with the row: nobody reads it back
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT upd.id, upd.history_seq, upd.status, upd.updated_at, input.event
    FROM upd JOIN input ON input.id = upd.id
)
SELECT *, (CASE WHEN status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note
FROM upd

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
    RETURNING id, deployment_id
), seen AS (
    -- the worker's deployment is seen as long as the worker runs
    UPDATE veracity_deployments AS d
    SET last_seen = greatest(d.last_seen, coalesce(%(now)s::timestamptz, now()))
    FROM hb
    WHERE d.id = hb.deployment_id
), held AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(epochs)s::bigint[]) AS t(id, epoch)
), renewed AS (
    UPDATE veracity_executions AS e SET
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl)s::interval
    FROM held
    WHERE e.id = held.id
      -- the fence inside a CASE (on a condition that is not constant, or the planner
      -- folds it away), to find each row by primary key (see execution_leave_many_if_owned)
      AND CASE WHEN e.lease_owner = %(owner)s THEN veracity_holds_lease(
              e.status, e.lease_owner, e.lease_epoch, e.lease_expires_at, %(owner)s,
              held.epoch, coalesce(%(now)s::timestamptz, now())) ELSE false END
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
RETURNING e.*, (CASE WHEN e.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note

-- name: worker_register
-- the worker, and its deployment in the registry (first seen now, or seen again)
WITH seen AS (
    INSERT INTO veracity_deployments AS d (id, first_seen, last_seen)
    VALUES (%(deployment_id)s, coalesce(%(now)s::timestamptz, now()),
            coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE SET last_seen = greatest(d.last_seen, EXCLUDED.last_seen)
)
INSERT INTO veracity_workers (
    id, host, pid, deployment_id, ffqns, upgrade_ffqns, concurrency, heartbeat_interval,
    started_at, last_heartbeat, host_key)
VALUES (
    %(id)s, %(host)s, %(pid)s, %(deployment_id)s, %(ffqns)s, %(upgrade_ffqns)s,
    %(concurrency)s, %(heartbeat_interval)s, coalesce(%(now)s::timestamptz, now()),
    coalesce(%(now)s::timestamptz, now()), %(host_key)s)
ON CONFLICT (id) DO UPDATE SET
    host = EXCLUDED.host, pid = EXCLUDED.pid, deployment_id = EXCLUDED.deployment_id,
    ffqns = EXCLUDED.ffqns, upgrade_ffqns = EXCLUDED.upgrade_ffqns,
    concurrency = EXCLUDED.concurrency, heartbeat_interval = EXCLUDED.heartbeat_interval,
    last_heartbeat = EXCLUDED.last_heartbeat, stopped_at = NULL,
    host_key = EXCLUDED.host_key
RETURNING *

-- name: worker_stop
-- (and its offer withdrawn: a stopping worker takes no hand-off)
WITH withdrawn AS (
    DELETE FROM veracity_offers WHERE owner = %(id)s
)
UPDATE veracity_workers SET stopped_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *

-- name: worker_gone
-- Workers whose process is gone (docs/workers.md, "A worker whose process is gone"): each
-- registration is marked stopped and the leases it holds end now, so that the same
-- recovery tick takes its executions. Only while the registry still names the process
-- that was found gone (id, pid, host_key): a worker that registered again is not touched.
-- Rows [{id, pid}].
WITH gone AS (
    UPDATE veracity_workers AS w SET stopped_at = coalesce(%(now)s::timestamptz, now())
    FROM json_to_recordset(%(rows)s::json) AS r (id text, pid integer)
    WHERE w.id = r.id AND w.pid = r.pid AND w.host_key = %(host_key)s
      AND w.stopped_at IS NULL
    RETURNING w.id
), withdrawn AS (
    DELETE FROM veracity_offers AS o USING gone WHERE o.owner = gone.id
)
UPDATE veracity_executions AS e SET lease_expires_at = coalesce(%(now)s::timestamptz, now())
FROM gone
WHERE e.lease_owner = gone.id
  AND e.status = 'running'
  AND e.lease_expires_at > coalesce(%(now)s::timestamptz, now())
RETURNING e.id

-- name: worker_running_on
-- The registered workers of one host key not marked stopped (lease recovery asks which of
-- them are gone; docs/workers.md).
SELECT * FROM veracity_workers WHERE host_key = %(host_key)s AND stopped_at IS NULL

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
-- The lock's session first limits how long it may sit silent (idle_session_timeout, in
-- ms): a holder frozen mid-tick (SIGSTOP, a paused VM) stops pinging, the server ends its
-- session after that long, and the lock is free for the next tick elsewhere
-- (docs/workers.md, "Recovery"). Set for this session only; PostgreSQL 13 and older have no
-- such setting (set_config would fail), and there the lock lasts as long as its session.
SELECT CASE WHEN current_setting('server_version_num')::int >= 140000
            THEN set_config('idle_session_timeout', %(silence_ms)s, false) END AS silence,
       pg_try_advisory_lock(%(key)s) AS acquired

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

-- name: execution_insert_retry
-- an operator's retry of a failed execution: a new pending one linked to it
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, retry_of,
    scheduled_at, created_at, updated_at, history_seq)
VALUES (
    %(id)s, %(ffqn)s, %(params)s, 'pending', 1, %(deployment_id)s, %(retry_of)s::uuid,
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
    coalesce(%(now)s::timestamptz, now()), %(history_seq)s)
RETURNING *

-- name: execution_insert_children
-- rows [{id, ffqn, params, deployment_id, parent_id, join_set, scheduled_at}]: each one whose
-- id is new, pending (scheduled now unless given), in one statement; those created returned
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, parent_id, join_set,
    scheduled_at, created_at, updated_at, history_seq)
SELECT r.id, r.ffqn, r.params, 'pending', 1, r.deployment_id, r.parent_id, r.join_set,
       coalesce(r.scheduled_at, %(now)s::timestamptz, now()),
       coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), 1
FROM json_to_recordset(%(rows)s::json) AS r (id uuid, ffqn text, params json,
    deployment_id text, parent_id uuid, join_set text, scheduled_at timestamptz)
ORDER BY r.id
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
RETURNING *, (CASE WHEN status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note

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
-- oldest timer first, in the answer too (an UPDATE's RETURNING has no order of its own);
-- the status checked is the one read under the lock, as in execution_claim (a guard on
-- e.status let the UPDATE read every unfinished row, even when no timer was due)
WITH due AS (
    SELECT id, wake_at, status FROM veracity_executions
    WHERE status = 'blocked' AND cancel_requested_at IS NULL
      AND wake_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY wake_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), woken AS (
    UPDATE veracity_executions AS e SET
        status = 'pending', wake_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now()),
        history_seq = e.history_seq + 1
    FROM due
    WHERE e.id = due.id AND due.status = ANY (%(from_states)s::text[])
    RETURNING e.*, due.wake_at AS due_at
)
SELECT * FROM woken ORDER BY due_at, id

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
RETURNING e.*, (CASE WHEN e.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note

-- name: execution_with_open_children
-- which of these executions have an unfinished child
SELECT DISTINCT parent_id AS id FROM veracity_executions
WHERE parent_id = ANY (%(ids)s::uuid[]) AND status <> ALL (%(terminal)s::text[])

-- name: execution_cancel_mark_many
-- executions without unfinished children: cancel requested, each alone
UPDATE veracity_executions AS e SET
    cancel_requested_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = e.history_seq + 1
WHERE e.id = ANY (%(ids)s::uuid[])
  AND e.cancel_requested_at IS NULL AND e.status <> ALL (%(terminal)s::text[])
RETURNING e.*

-- name: execution_cancel_settle_many
-- of those, what is not running and still has no unfinished child ends cancelled now
UPDATE veracity_executions AS e SET
    status = 'cancelled', wake_at = NULL, paused_from = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    history_seq = e.history_seq + 1
WHERE e.id = ANY (%(ids)s::uuid[])
  AND e.cancel_requested_at IS NOT NULL
  AND e.status = ANY (%(from_states)s::text[])
  AND NOT EXISTS (SELECT 1 FROM veracity_executions AS c
                  WHERE c.parent_id = e.id AND c.status <> ALL (%(terminal)s::text[]))
RETURNING e.*, (CASE WHEN e.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note

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
-- The batch comes as one JSON array of [id, epoch, kind, data] rows, data as a JSON text
-- inside a JSON string, read as jsonb (see execution_leave_many_if_owned).
WITH input AS (
    SELECT (r->>0)::uuid AS id, (r->>1)::bigint AS epoch, r->>2 AS kind,
           (r->>3)::json AS data
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
), own AS (
    UPDATE veracity_executions AS e SET history_seq = e.history_seq + 1
    FROM input
    WHERE e.id = input.id
      AND e.id = ANY (ARRAY(SELECT id FROM input))  -- (see execution_leave_many_if_owned)
      -- the fence inside a CASE (on a condition that is not constant, or the planner
      -- folds it away), to find each row by primary key (see execution_leave_many_if_owned)
      AND CASE WHEN e.lease_owner = %(owner)s THEN veracity_holds_lease(
              e.status, e.lease_owner, e.lease_epoch, e.lease_expires_at, %(owner)s,
              input.epoch, coalesce(%(now)s::timestamptz, now())) ELSE false END
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
RETURNING *, (CASE WHEN status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note

-- name: execution_external_running
SELECT * FROM veracity_executions
WHERE status = 'running' AND engine IS NOT NULL
  AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
ORDER BY id
LIMIT %(limit)s

-- name: execution_leased_to
-- The running executions one worker holds the lease of (a worker that lost its listening
-- connection finds a hand-off it did not hear: docs/workers.md).
SELECT * FROM veracity_executions
WHERE status = 'running' AND lease_owner = %(owner)s
  AND lease_expires_at > coalesce(%(now)s::timestamptz, now())
ORDER BY id

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
RETURNING e.id, (CASE WHEN e.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note

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
RETURNING *, (CASE WHEN status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        THEN pg_notify('veracity_ended', '') END) IS NULL AS ended_note

-- name: execution_flag_note
-- more about why an execution is on the flagged list (a late report that concerns it)
UPDATE veracity_executions SET flag_reason = flag_reason || %(note)s WHERE id = %(id)s

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
SELECT r.execution_id, r.seq, r.kind, coalesce(%(now)s::timestamptz, now()), r.data
FROM json_to_recordset(%(rows)s::json) AS r (execution_id uuid, seq integer, kind text, data json)

-- ---------------------------------------------------------------------------------------
-- Cron (docs/cron.md; store/_ops.py drives these)

-- name: cron_entry_register_many
-- rows [{name, schedule, timezone}]: first seen now, unless already recorded with the same
-- schedule and time zone
INSERT INTO veracity_cron_entries (name, schedule, timezone, first_seen_at)
SELECT r.name, r.schedule, r.timezone, coalesce(%(now)s::timestamptz, now())
FROM json_to_recordset(%(rows)s::json) AS r (name text, schedule text, timezone text)
ORDER BY r.name
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
LEFT JOIN LATERAL (
    SELECT slot_at, execution_id FROM veracity_cron_slots
    WHERE name = e.name ORDER BY slot_at DESC LIMIT 1) AS s ON true
LEFT JOIN veracity_executions AS x ON x.id = s.execution_id
WHERE e.name = ANY (%(names)s::text[])
ORDER BY e.name

-- name: cron_slot_claim_many
-- rows [{name, slot_at, execution_id}]: the slots whose key was free (in key order, so
-- that servers claiming the same slots wait for each other instead of deadlocking)
INSERT INTO veracity_cron_slots (name, slot_at, execution_id, fired_at)
SELECT r.name, r.slot_at, r.execution_id, coalesce(%(now)s::timestamptz, now())
FROM json_to_recordset(%(rows)s::json) AS r (name text, slot_at timestamptz, execution_id uuid)
ORDER BY r.name, r.slot_at
ON CONFLICT DO NOTHING
RETURNING execution_id

-- name: execution_insert_many
-- rows [{id, ffqn, params, deployment_id, scheduled_at}]: new pending executions
INSERT INTO veracity_executions (
    id, ffqn, params, status, attempt, deployment_id, scheduled_at, created_at, updated_at,
    history_seq)
SELECT r.id, r.ffqn, r.params, 'pending', 1, r.deployment_id, r.scheduled_at,
       coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), 1
FROM json_to_recordset(%(rows)s::json)
    AS r (id uuid, ffqn text, params json, deployment_id text, scheduled_at timestamptz)


-- ---------------------------------------------------------------------------------------
-- Deployments (docs/deployments.md)

-- name: deployment_seen
INSERT INTO veracity_deployments AS d (id, first_seen, last_seen)
VALUES (%(id)s, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (id) DO UPDATE SET last_seen = greatest(d.last_seen, EXCLUDED.last_seen)
RETURNING id AS deployment_id, first_seen, last_seen

-- name: deployment_rows
SELECT id AS deployment_id, first_seen, last_seen FROM veracity_deployments
ORDER BY first_seen DESC, id

-- name: deployment_get
SELECT id AS deployment_id, first_seen, last_seen FROM veracity_deployments WHERE id = %(id)s

-- name: deployment_unfinished
-- unfinished executions by deployment, status and workflow (veracity_executions_unfinished)
SELECT deployment_id, status, ffqn, (status = 'running' AND engine IS NOT NULL) AS delegated,
       count(*) AS n
FROM veracity_executions
WHERE status IN ('pending', 'running', 'blocked', 'paused')
GROUP BY 1, 2, 3, 4

-- name: deployment_has_unfinished
SELECT 1 AS found FROM veracity_executions
WHERE deployment_id = %(id)s AND status IN ('pending', 'running', 'blocked', 'paused')
LIMIT 1

-- name: worker_live
-- the workers that may be live: not stopped, a heartbeat within live_within (the lease
-- TTL); core.deployments.is_live decides, from the heartbeat interval, which are
SELECT deployment_id, ffqns, upgrade_ffqns, stopped_at, last_heartbeat, heartbeat_interval,
       coalesce(%(now)s::timestamptz, now()) AS db_now
FROM veracity_workers
WHERE stopped_at IS NULL
  AND last_heartbeat >= coalesce(%(now)s::timestamptz, now()) - %(live_within)s::interval
  AND (%(deployment_id)s::text IS NULL OR deployment_id = %(deployment_id)s::text)

-- name: execution_adoptable
-- the unfinished executions an adopt moves, locked in id order (as execution_lock_many)
SELECT id, history_seq FROM veracity_executions
WHERE deployment_id = %(from_id)s
  AND status IN ('pending', 'running', 'blocked', 'paused')
  AND (%(ffqn_prefix)s::text IS NULL OR starts_with(ffqn, %(ffqn_prefix)s::text))
ORDER BY id
FOR UPDATE

-- name: execution_adopt_many
UPDATE veracity_executions SET
    deployment_id = %(to_id)s,
    history_seq = history_seq + 1
WHERE id = ANY (%(ids)s::uuid[])
  AND deployment_id = %(from_id)s
  AND status IN ('pending', 'running', 'blocked', 'paused')
RETURNING id, history_seq

-- name: notify_pending
-- adopted pending executions are due for the new deployment's workers: wake them
SELECT pg_notify('veracity_pending', '')


-- ---------------------------------------------------------------------------------------
-- Retention (docs/operations.md, Retention; store/_ops.py, prune, drives these)

-- name: prune_roots
-- Top-level executions that ended before the cutoff, oldest end first, after the cursor
-- (updated_at, id): read from the index veracity_executions_ended alone.
SELECT id, updated_at FROM veracity_executions
WHERE parent_id IS NULL
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')
  AND updated_at < %(cutoff)s::timestamptz
  AND (%(after_at)s::timestamptz IS NULL
       OR (updated_at, id) > (%(after_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY updated_at, id
LIMIT %(limit)s

-- name: prune_families
-- Every member of the families of these roots (the roots and everything below them),
-- with what the decision (veracity.core.retention) needs.
WITH RECURSIVE fam (root_id, id, depth) AS (
    SELECT r.id, r.id, 0 FROM unnest(%(roots)s::uuid[]) AS r (id)
    UNION ALL
    SELECT fam.root_id, c.id, fam.depth + 1
    FROM veracity_executions AS c JOIN fam ON c.parent_id = fam.id
)
SELECT fam.root_id, e.id, e.status, e.parent_id, fam.depth,
       e.flagged_at IS NOT NULL AS flagged,
       (e.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
        AND e.updated_at < %(cutoff)s::timestamptz) AS ended_before_cutoff,
       (SELECT coalesce(json_agg(r.id), '[]'::json) FROM veracity_executions AS r
        WHERE r.retry_of = e.id) AS retried_by,
       EXISTS (SELECT 1 FROM veracity_cron_slots AS s
               WHERE s.execution_id = e.id
                 AND s.slot_at = (SELECT max(l.slot_at) FROM veracity_cron_slots AS l
                                  WHERE l.name = s.name)) AS cron_latest
FROM fam JOIN veracity_executions AS e ON e.id = fam.id

-- name: prune_lock
-- The executions about to be deleted, locked, that are still terminal, ended before
-- the cutoff and not flagged (nobody waits on a terminal row: workers lock only
-- unfinished ones).
SELECT id FROM veracity_executions
WHERE id = ANY (%(ids)s::uuid[])
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')
  AND updated_at < %(cutoff)s::timestamptz
  AND flagged_at IS NULL
ORDER BY id
FOR UPDATE

-- name: prune_retried_by
-- Executions that retry one of these and are not among them (read again under the lock).
SELECT DISTINCT retry_of AS id FROM veracity_executions
WHERE retry_of = ANY (%(ids)s::uuid[]) AND NOT (id = ANY (%(ids)s::uuid[]))

-- name: prune_count_history
-- (a dry run: what deleting these would delete)
SELECT count(*) AS n FROM veracity_history WHERE execution_id = ANY (%(ids)s::uuid[])

-- name: prune_count_messages
SELECT count(*) AS n FROM veracity_messages WHERE execution_id = ANY (%(ids)s::uuid[])

-- name: prune_delete_messages
DELETE FROM veracity_messages WHERE execution_id = ANY (%(ids)s::uuid[]) RETURNING 1

-- name: prune_delete_history
DELETE FROM veracity_history WHERE execution_id = ANY (%(ids)s::uuid[]) RETURNING 1

-- name: prune_delete_cron_slots
DELETE FROM veracity_cron_slots WHERE execution_id = ANY (%(ids)s::uuid[]) RETURNING 1

-- name: prune_delete_executions
DELETE FROM veracity_executions WHERE id = ANY (%(ids)s::uuid[]) RETURNING 1

-- name: prune_counted
-- The batch's deletions added to the database's totals (veracity_pruned_total), in its
-- transaction.
UPDATE veracity_retention_totals SET deleted = deleted + CASE kind
    WHEN 'executions' THEN %(executions)s::bigint
    WHEN 'history' THEN %(history)s::bigint
    ELSE %(messages)s::bigint END

-- name: retention_totals
SELECT kind, deleted FROM veracity_retention_totals

-- name: prune_count
-- How many top-level executions ended before the cutoff (what a pass will read).
SELECT count(*) AS n FROM veracity_executions
WHERE parent_id IS NULL
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')
  AND updated_at < %(cutoff)s::timestamptz

-- name: history_newest_of_kinds
-- the newest event of each kind of each execution (what it waits for: core.waiting); one
-- index probe backwards per execution and kind
SELECT i.id AS execution_id, h.kind, h.data
FROM unnest(%(ids)s::uuid[]) AS i(id)
CROSS JOIN unnest(%(kinds)s::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT kind, data FROM veracity_history
    WHERE execution_id = i.id AND kind = k.kind
    ORDER BY seq DESC
    LIMIT 1
) h

-- name: execution_unfinished_children
-- the unfinished children of each execution by join set: how many, and the oldest few
SELECT parent_id, join_set, id, n FROM (
    SELECT parent_id, join_set, id, created_at,
           row_number() OVER (PARTITION BY parent_id, join_set ORDER BY created_at, id) AS rn,
           count(*) OVER (PARTITION BY parent_id, join_set) AS n
    FROM veracity_executions
    WHERE parent_id = ANY (%(ids)s::uuid[])
      AND status IN ('pending', 'running', 'blocked', 'paused')
) c
WHERE rn <= %(shown)s
ORDER BY parent_id, join_set, created_at, id

-- name: execution_ended_among
-- which of these executions have ended
SELECT id FROM veracity_executions
WHERE id = ANY (%(ids)s::uuid[])
  AND status IN ('completed', 'failed', 'failed_transient', 'cancelled')

-- ---------------------------------------------------------------------------------------
-- The dashboard's reads (docs/dashboard.md)

-- name: execution_counts_in
SELECT status, count(*) AS n FROM veracity_executions
WHERE status = ANY (%(statuses)s::text[])
GROUP BY status

-- name: execution_children_of
SELECT * FROM veracity_executions
WHERE parent_id = ANY (%(parent_ids)s::uuid[])
ORDER BY parent_id, created_at, id
LIMIT %(limit)s

-- name: history_list_kinds
SELECT * FROM veracity_history
WHERE execution_id = %(id)s AND seq > %(after_seq)s AND kind = ANY (%(kinds)s::text[])
ORDER BY seq
LIMIT %(limit)s

-- name: history_kind_counts
SELECT kind, count(*) AS n FROM veracity_history
WHERE execution_id = %(id)s
GROUP BY kind
ORDER BY kind

-- name: offer_post
-- An idle worker's offer to take the next matching submission (docs/workers.md, "Hand-off
-- to an idle worker"), posted again or refreshed; offers long expired (their workers gone
-- without withdrawing them) are removed on the way.
WITH stale AS (
    DELETE FROM veracity_offers
    WHERE expires_at < coalesce(%(now)s::timestamptz, now()) - interval '1 minute'
)
INSERT INTO veracity_offers AS o (owner, deployment_id, ffqns, channel, lease_ttl, expires_at)
VALUES (%(owner)s, %(deployment_id)s, %(ffqns)s::text[], %(channel)s, %(ttl)s::interval,
        coalesce(%(now)s::timestamptz, now()) + %(expires_in)s::interval)
ON CONFLICT (owner) DO UPDATE SET
    deployment_id = EXCLUDED.deployment_id, ffqns = EXCLUDED.ffqns,
    channel = EXCLUDED.channel, lease_ttl = EXCLUDED.lease_ttl,
    expires_at = EXCLUDED.expires_at
RETURNING owner

-- name: offer_refresh
-- The worker's offer made to last longer, if it is still there: no row answered means a
-- submission took it (its notification is on its way), and no new offer is made in its
-- place here (the worker would then be owed two hand-offs for one kept slot).
UPDATE veracity_offers
SET expires_at = coalesce(%(now)s::timestamptz, now()) + %(expires_in)s::interval
WHERE owner = %(owner)s
RETURNING owner

-- name: offer_withdraw
-- Answers a row if the offer was still there (no submission took it). Waits for a
-- submission that holds it to commit: if that one took it, it is gone by then.
DELETE FROM veracity_offers WHERE owner = %(owner)s RETURNING owner
