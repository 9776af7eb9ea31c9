-- 0011: when an execution was first claimed (started), kept across later claims: the
-- telemetry's start-to-end time (docs/operations.md, Metrics) and the API's started_at.
-- NULL for executions that never ran (cancelled while pending, and those from before).

ALTER TABLE veracity_executions ADD COLUMN started_at INTEGER;
