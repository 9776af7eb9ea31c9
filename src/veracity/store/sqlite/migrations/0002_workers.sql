-- 0002: worker registry, and (SQLite's stand-in for advisory locks) single-runner locks.

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

-- A lock is held by `owner` until `expires_at`; a holder that dies loses it at expiry.
CREATE TABLE veracity_locks (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;
