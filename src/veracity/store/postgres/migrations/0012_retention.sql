-- 0012: cost that does not grow with history (docs/operations.md, Retention).

-- Retention reads top-level executions that ended, oldest end first (updated_at of a
-- terminal row): this index holds only those, so a tick never reads unfinished rows.
CREATE INDEX veracity_executions_ended ON veracity_executions (updated_at, id)
    WHERE parent_id IS NULL
      AND status IN ('completed', 'failed', 'failed_transient', 'cancelled');

-- Retention deletes an execution's messages, consumed ones included: the index of 0003
-- holds only the open ones.
CREATE INDEX veracity_messages_execution ON veracity_messages (execution_id);

-- The list's filters, each answering its first page from an index in the list's order
-- (created_at DESC, id DESC) instead of filtering the whole table: one status, one
-- deployment, an FFQN prefix (a range of the "C" collation), flagged executions.
-- The status, deployment and FFQN indexes are keyed on the column COLLATE "C", and only the
-- list asks for that expression: the claim, lease recovery and every update by id, which
-- compare the plain columns, cannot pick them. (Keyed on status itself, the index looked
-- cheapest to the claim on a large table, where pending rows are rare: it then read every
-- pending row and sorted them, for every claim.)
CREATE INDEX veracity_executions_status_created
    ON veracity_executions ((status COLLATE "C"), created_at DESC, id DESC);
CREATE INDEX veracity_executions_deployment_created
    ON veracity_executions ((deployment_id COLLATE "C"), created_at DESC, id DESC);
CREATE INDEX veracity_executions_ffqn_created
    ON veracity_executions ((ffqn COLLATE "C"), created_at DESC, id DESC);
CREATE INDEX veracity_executions_flagged_created
    ON veracity_executions (created_at DESC, id DESC) WHERE flagged_at IS NOT NULL;
