-- 0001: executions and their history.
-- Timestamps are integers: microseconds since the Unix epoch, UTC.

CREATE TABLE veracity_executions (
    id               TEXT PRIMARY KEY,
    ffqn             TEXT NOT NULL CHECK (length(ffqn) BETWEEN 1 AND 512),
    params           TEXT NOT NULL CHECK (json_type(params) = 'array'),
    status           TEXT NOT NULL CHECK (status IN (
                         'pending', 'running', 'blocked', 'paused',
                         'completed', 'failed', 'failed_transient', 'cancelled')),
    result           TEXT CHECK (result IS NULL OR json_valid(result)),
    error            TEXT CHECK (error IS NULL OR json_valid(error)),
    attempt          INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    deployment_id    TEXT NOT NULL CHECK (length(deployment_id) BETWEEN 1 AND 128),
    parent_id        TEXT REFERENCES veracity_executions (id),
    idempotency_key  TEXT UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 256),
    request_digest   TEXT,
    scheduled_at     INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    history_seq      INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT completed_has_result CHECK (status <> 'completed' OR result IS NOT NULL),
    CONSTRAINT lease_only_when_running CHECK (status = 'running' OR lease_owner IS NULL)
) STRICT;

CREATE INDEX veracity_executions_due ON veracity_executions (scheduled_at, id)
    WHERE status = 'pending';
CREATE INDEX veracity_executions_created ON veracity_executions (created_at DESC, id DESC);
CREATE INDEX veracity_executions_lease ON veracity_executions (lease_expires_at)
    WHERE status = 'running';
CREATE INDEX veracity_executions_parent ON veracity_executions (parent_id)
    WHERE parent_id IS NOT NULL;

CREATE TABLE veracity_history (
    execution_id TEXT NOT NULL REFERENCES veracity_executions (id),
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    kind         TEXT NOT NULL CHECK (length(kind) BETWEEN 1 AND 64),
    at           INTEGER NOT NULL,
    data         TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    PRIMARY KEY (execution_id, seq)
) STRICT;
