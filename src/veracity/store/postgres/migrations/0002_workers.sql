-- 0002: worker registry, and wake-ups for workers when an execution becomes pending.

CREATE TABLE veracity_workers (
    id             text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 200),
    host           text NOT NULL,
    pid            integer NOT NULL,
    deployment_id  text NOT NULL,
    ffqns          json NOT NULL DEFAULT '[]'::json CHECK (json_typeof(ffqns) = 'array'),
    concurrency    integer NOT NULL CHECK (concurrency >= 1),
    started_at     timestamptz NOT NULL,
    last_heartbeat timestamptz NOT NULL,
    stopped_at     timestamptz
);

CREATE INDEX veracity_workers_heartbeat ON veracity_workers (last_heartbeat DESC);

-- Workers LISTEN on veracity_pending. A notification is only a hint (workers also poll),
-- so a lost one costs latency, never an execution. Identical notifications within one
-- transaction are folded into one by PostgreSQL.
CREATE FUNCTION veracity_notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('veracity_pending', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER veracity_executions_pending
    AFTER INSERT OR UPDATE OF status ON veracity_executions
    FOR EACH ROW WHEN (NEW.status = 'pending')
    EXECUTE FUNCTION veracity_notify_pending();
