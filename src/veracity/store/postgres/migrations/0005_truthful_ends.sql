-- 0005: ending a delegated run only once its engine confirms (docs/external.md): an
-- operator's request to end it waits here for the engine's confirmation, and a flag says
-- why it was raised (a flag raised because the engine did not find the run clears itself
-- when a later look finds it; a forced end stays flagged).

ALTER TABLE veracity_executions
    ADD COLUMN end_request jsonb,
    ADD COLUMN end_requested_at timestamptz,
    ADD COLUMN flag_kind text CHECK (flag_kind IN (
        'no_external_id', 'trigger_unknown', 'engine_unconfigured', 'unknown_id',
        'stop_unconfirmed', 'forced')),
    ADD CONSTRAINT flag_kind_with_flag CHECK ((flag_kind IS NULL) = (flagged_at IS NULL));

-- flags raised before this migration: no id, or the engine did not know the id
UPDATE veracity_executions
SET flag_kind = CASE WHEN external_execution_id IS NULL THEN 'no_external_id'
                     ELSE 'unknown_id' END
WHERE flagged_at IS NOT NULL;
