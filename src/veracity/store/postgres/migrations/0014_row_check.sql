-- 0014: the sixteen CHECK constraints of veracity_executions become one, the same rules in
-- one function (docs/states.md, "Where the rules live").
--
-- Why: PostgreSQL reads a table's CHECK expressions from their stored text and prepares
-- them again for every statement that writes the table. Sixteen of them were 14.5 kB of
-- text to parse per statement: 23.6 % of a profile of the database process during
-- submissions (docs/scaling.md), and every claim and completion parses them too. One
-- constraint calling a PL/pgSQL function is a short expression, and the function's own
-- expressions are parsed and planned once per session.
--
-- Nothing else changes: every rule is checked on every insert and update as before, a
-- rule that holds or cannot be decided (a NULL) passes as a CHECK's does, and a row that
-- breaks one is refused with SQLSTATE 23514 (check_violation) naming the rule's old
-- constraint (the diagnostics' constraint name and the message), the first broken one in
-- this order. Adding the constraint checks every row already written, under the lock that
-- the dropped constraints take: 2.23 s for 1,000,000 executions (docs/operations.md,
-- Upgrading).
CREATE FUNCTION veracity_execution_valid(
    status text, paused_from text, attempt integer, deployment_id text, engine text,
    external_execution_id text, ffqn text, flag_kind text, flagged_at timestamptz,
    idempotency_key text, join_set text, params json, result json, lease_owner text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN NOT coalesce(status IN ('pending', 'running', 'blocked', 'paused', 'completed',
                                     'failed', 'failed_transient', 'cancelled'), true)
            THEN 'veracity_executions_status_check'
        WHEN NOT coalesce(paused_from IN ('pending', 'blocked'), true)
            THEN 'veracity_executions_paused_from_check'
        WHEN NOT coalesce(attempt >= 1, true)
            THEN 'veracity_executions_attempt_check'
        WHEN NOT coalesce(char_length(deployment_id) BETWEEN 1 AND 128, true)
            THEN 'veracity_executions_deployment_id_check'
        WHEN NOT coalesce(char_length(engine) BETWEEN 1 AND 100, true)
            THEN 'veracity_executions_engine_check'
        WHEN NOT coalesce(char_length(external_execution_id) BETWEEN 1 AND 200, true)
            THEN 'veracity_executions_external_execution_id_check'
        WHEN NOT coalesce(char_length(ffqn) BETWEEN 1 AND 512, true)
            THEN 'veracity_executions_ffqn_check'
        WHEN NOT coalesce(flag_kind IN ('no_external_id', 'trigger_unknown',
                                        'engine_unconfigured', 'unknown_id',
                                        'stop_unconfirmed', 'forced'), true)
            THEN 'veracity_executions_flag_kind_check'
        WHEN NOT coalesce(char_length(idempotency_key) BETWEEN 1 AND 256, true)
            THEN 'veracity_executions_idempotency_key_check'
        WHEN NOT coalesce(char_length(join_set) BETWEEN 1 AND 200, true)
            THEN 'veracity_executions_join_set_check'
        WHEN NOT coalesce(json_typeof(params) = 'array', true)
            THEN 'veracity_executions_params_check'
        WHEN NOT coalesce(status <> 'completed' OR result IS NOT NULL, true)
            THEN 'completed_has_result'
        WHEN NOT coalesce(engine IS NULL OR lease_owner IS NULL, true)
            THEN 'delegated_has_no_lease'
        WHEN NOT coalesce((flag_kind IS NULL) = (flagged_at IS NULL), true)
            THEN 'flag_kind_with_flag'
        WHEN NOT coalesce(status = 'running' OR lease_owner IS NULL, true)
            THEN 'lease_only_when_running'
        WHEN NOT coalesce(status <> 'paused' OR paused_from IS NOT NULL, true)
            THEN 'paused_has_origin'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "veracity_executions" violates check constraint "%"',
            broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken,
                  TABLE = 'veracity_executions';
    END IF;
    RETURN true;
END
$$;

ALTER TABLE veracity_executions
    DROP CONSTRAINT veracity_executions_status_check,
    DROP CONSTRAINT veracity_executions_paused_from_check,
    DROP CONSTRAINT veracity_executions_attempt_check,
    DROP CONSTRAINT veracity_executions_deployment_id_check,
    DROP CONSTRAINT veracity_executions_engine_check,
    DROP CONSTRAINT veracity_executions_external_execution_id_check,
    DROP CONSTRAINT veracity_executions_ffqn_check,
    DROP CONSTRAINT veracity_executions_flag_kind_check,
    DROP CONSTRAINT veracity_executions_idempotency_key_check,
    DROP CONSTRAINT veracity_executions_join_set_check,
    DROP CONSTRAINT veracity_executions_params_check,
    DROP CONSTRAINT completed_has_result,
    DROP CONSTRAINT delegated_has_no_lease,
    DROP CONSTRAINT flag_kind_with_flag,
    DROP CONSTRAINT lease_only_when_running,
    DROP CONSTRAINT paused_has_origin,
    ADD CONSTRAINT veracity_executions_valid CHECK (veracity_execution_valid(
        status, paused_from, attempt, deployment_id, engine, external_execution_id, ffqn,
        flag_kind, flagged_at, idempotency_key, join_set, params, result, lease_owner));
