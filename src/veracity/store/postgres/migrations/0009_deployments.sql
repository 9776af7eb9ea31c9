-- 0009: deployments (docs/deployments.md). The registry of deployments servers and workers
-- ran (first and last seen); which workflows a worker claims from every deployment
-- (upgrade="auto"); and the indexes of a claim that reads only its own deployment's rows.

CREATE TABLE veracity_deployments (
    id         text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 128),
    first_seen timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL,
    CONSTRAINT seen_in_order CHECK (last_seen >= first_seen)
);

-- workflows a worker claims from every deployment (registered with upgrade="auto"); every
-- other workflow it claims only from its own deployment
ALTER TABLE veracity_workers
    ADD COLUMN upgrade_ffqns json NOT NULL DEFAULT '[]'::json
        CHECK (json_typeof(upgrade_ffqns) = 'array');

-- the deployments workers ran before this migration
INSERT INTO veracity_deployments (id, first_seen, last_seen)
SELECT deployment_id, min(started_at), greatest(min(started_at), max(last_heartbeat))
FROM veracity_workers
WHERE char_length(deployment_id) BETWEEN 1 AND 128
GROUP BY deployment_id;

-- The claim of a worker's own deployment scans (deployment_id, 'pending') in
-- (scheduled_at, id) order: rows of other deployments are never read. The same index
-- answers the deployments listing and adopt (every unfinished execution of a deployment).
-- It replaces the claim's index of 0001, which led with scheduled_at: a worker scanned
-- every deployment's due rows there.
DROP INDEX veracity_executions_due;
CREATE INDEX veracity_executions_unfinished
    ON veracity_executions (deployment_id, status, scheduled_at, id)
    WHERE status IN ('pending', 'running', 'blocked', 'paused');
-- The claim of a workflow registered with upgrade="auto": its pending rows of every
-- deployment, in (scheduled_at, id) order.
CREATE INDEX veracity_executions_due_ffqn ON veracity_executions (ffqn, scheduled_at, id)
    WHERE status = 'pending';
