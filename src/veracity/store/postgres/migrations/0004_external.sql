-- 0004: executions delegated to an external engine (docs/external.md), and operator flags.

ALTER TABLE veracity_executions
    ADD COLUMN engine text CHECK (char_length(engine) BETWEEN 1 AND 100),
    ADD COLUMN external_execution_id text CHECK (char_length(external_execution_id) BETWEEN 1 AND 200),
    -- Veracity's own record of when it sent the trigger: limits are measured from here
    ADD COLUMN triggered_at timestamptz,
    ADD COLUMN callback_token_hash text,
    ADD COLUMN flagged_at timestamptz,
    ADD COLUMN flag_reason text,
    ADD CONSTRAINT delegated_has_no_lease CHECK (engine IS NULL OR lease_owner IS NULL);

CREATE INDEX veracity_executions_external ON veracity_executions (id)
    WHERE status = 'running' AND engine IS NOT NULL;
CREATE INDEX veracity_executions_flagged ON veracity_executions (flagged_at)
    WHERE flagged_at IS NOT NULL;
