-- 0012: cost that does not grow with history (docs/operations.md, Retention).

-- Retention reads top-level executions that ended, oldest end first (updated_at of a
-- terminal row): this index holds only those, so a tick never reads unfinished rows.
CREATE INDEX veracity_executions_ended ON veracity_executions (updated_at, id)
    WHERE parent_id IS NULL
      AND status IN ('completed', 'failed', 'failed_transient', 'cancelled');

-- Retention deletes an execution's messages, consumed ones included: the index of 0003
-- holds only the open ones.
CREATE INDEX veracity_messages_execution ON veracity_messages (execution_id);

-- Flagged executions, newest first (veracity list --flagged). The other filters' indexes
-- are PostgreSQL's: here the list stays as it was.
CREATE INDEX veracity_executions_flagged_created
    ON veracity_executions (created_at DESC, id DESC) WHERE flagged_at IS NOT NULL;
