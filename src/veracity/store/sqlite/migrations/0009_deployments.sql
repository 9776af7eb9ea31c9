-- 0009: deployments (docs/deployments.md). See the PostgreSQL migration of the same number;
-- SQLite uses a partial index only when the query repeats the index's WHERE term, so the
-- queries that need veracity_executions_unfinished repeat its status list word for word.

CREATE TABLE veracity_deployments (
    id         TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    first_seen INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL,
    CONSTRAINT seen_in_order CHECK (last_seen >= first_seen)
) STRICT;

ALTER TABLE veracity_workers ADD COLUMN upgrade_ffqns TEXT NOT NULL DEFAULT '[]'
    CHECK (json_type(upgrade_ffqns) = 'array');

INSERT INTO veracity_deployments (id, first_seen, last_seen)
SELECT deployment_id, min(started_at), max(min(started_at), max(last_heartbeat))
FROM veracity_workers
WHERE length(deployment_id) BETWEEN 1 AND 128
GROUP BY deployment_id;

DROP INDEX veracity_executions_due;
CREATE INDEX veracity_executions_unfinished
    ON veracity_executions (deployment_id, status, scheduled_at, id)
    WHERE status IN ('pending', 'running', 'blocked', 'paused');
CREATE INDEX veracity_executions_due_ffqn ON veracity_executions (ffqn, scheduled_at, id)
    WHERE status = 'pending';
