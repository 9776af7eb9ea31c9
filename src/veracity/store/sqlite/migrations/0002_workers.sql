-- 0002: worker registry.

CREATE TABLE veracity_workers (
    id             TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
    host           TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    deployment_id  TEXT NOT NULL,
    ffqns          TEXT NOT NULL DEFAULT '[]' CHECK (json_type(ffqns) = 'array'),
    concurrency    INTEGER NOT NULL CHECK (concurrency >= 1),
    started_at     INTEGER NOT NULL,
    last_heartbeat INTEGER NOT NULL,
    stopped_at     INTEGER
) STRICT;

CREATE INDEX veracity_workers_heartbeat ON veracity_workers (last_heartbeat DESC);
