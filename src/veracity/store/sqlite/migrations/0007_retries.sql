-- 0007: an execution retried by an operator (veracity retry, PUT .../retry) is a new one
-- linked to the failed one; and each worker records its heartbeat interval, so that one
-- that stopped beating shows as not live after two missed beats (docs/workers.md).

ALTER TABLE veracity_executions ADD COLUMN retry_of TEXT REFERENCES veracity_executions (id);
CREATE INDEX veracity_executions_retry_of ON veracity_executions (retry_of)
    WHERE retry_of IS NOT NULL;

ALTER TABLE veracity_workers ADD COLUMN heartbeat_interval REAL
    CHECK (heartbeat_interval IS NULL OR heartbeat_interval > 0);
