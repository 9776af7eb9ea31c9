-- 0001: executions and their history.
-- User payloads (params, result, error, history data) are `json`, not `jsonb`: json keeps
-- the text exactly as given, so numbers such as 1e100 or 0.1000 round-trip unchanged.

CREATE TABLE veracity_executions (
    id               uuid PRIMARY KEY,
    ffqn             text NOT NULL CHECK (char_length(ffqn) BETWEEN 1 AND 512),
    params           json NOT NULL CHECK (json_typeof(params) = 'array'),
    status           text NOT NULL CHECK (status IN (
                         'pending', 'running', 'blocked', 'paused',
                         'completed', 'failed', 'failed_transient', 'cancelled')),
    result           json,
    error            json,
    attempt          integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    deployment_id    text NOT NULL CHECK (char_length(deployment_id) BETWEEN 1 AND 128),
    parent_id        uuid REFERENCES veracity_executions (id),
    idempotency_key  text UNIQUE CHECK (char_length(idempotency_key) BETWEEN 1 AND 256),
    request_digest   text,
    scheduled_at     timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    lease_owner      text,
    lease_epoch      bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    history_seq      integer NOT NULL DEFAULT 0,
    -- docs/states.md, guarantee 3: completed is recorded only together with its result
    CONSTRAINT completed_has_result CHECK (status <> 'completed' OR result IS NOT NULL),
    -- a lease exists only while running
    CONSTRAINT lease_only_when_running CHECK (status = 'running' OR lease_owner IS NULL)
);

-- the claim: due pending rows in order
CREATE INDEX veracity_executions_due ON veracity_executions (scheduled_at, id)
    WHERE status = 'pending';
-- listing, newest first, keyset-paginated
CREATE INDEX veracity_executions_created ON veracity_executions (created_at DESC, id DESC);
-- lease recovery
CREATE INDEX veracity_executions_lease ON veracity_executions (lease_expires_at)
    WHERE status = 'running';
CREATE INDEX veracity_executions_parent ON veracity_executions (parent_id)
    WHERE parent_id IS NOT NULL;

CREATE TABLE veracity_history (
    execution_id uuid NOT NULL REFERENCES veracity_executions (id),
    seq          integer NOT NULL CHECK (seq >= 1),
    kind         text NOT NULL CHECK (char_length(kind) BETWEEN 1 AND 64),
    at           timestamptz NOT NULL,
    data         json NOT NULL DEFAULT '{}'::json,
    PRIMARY KEY (execution_id, seq)
);
