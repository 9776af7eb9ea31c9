-- 0004: executions delegated to an external engine (docs/external.md), and operator flags.

ALTER TABLE veracity_executions ADD COLUMN engine TEXT
    CHECK (engine IS NULL OR length(engine) BETWEEN 1 AND 100);
ALTER TABLE veracity_executions ADD COLUMN external_execution_id TEXT
    CHECK (external_execution_id IS NULL OR length(external_execution_id) BETWEEN 1 AND 200);
ALTER TABLE veracity_executions ADD COLUMN triggered_at INTEGER;
ALTER TABLE veracity_executions ADD COLUMN callback_token_hash TEXT;
ALTER TABLE veracity_executions ADD COLUMN flagged_at INTEGER;
ALTER TABLE veracity_executions ADD COLUMN flag_reason TEXT;

CREATE INDEX veracity_executions_external ON veracity_executions (id)
    WHERE status = 'running' AND engine IS NOT NULL;
CREATE INDEX veracity_executions_flagged ON veracity_executions (flagged_at)
    WHERE flagged_at IS NOT NULL;
