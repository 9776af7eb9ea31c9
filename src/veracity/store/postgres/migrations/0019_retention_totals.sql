-- 0019: what retention and `veracity prune` deleted, counted in the database in the same
-- transaction as each batch's deletions, whichever process made them: every server
-- serves these totals as veracity_pruned_total (docs/operations.md, Metrics).
CREATE TABLE veracity_retention_totals (
    kind text PRIMARY KEY CHECK (kind IN ('executions', 'history', 'messages')),
    deleted bigint NOT NULL DEFAULT 0 CHECK (deleted >= 0)
);
INSERT INTO veracity_retention_totals (kind) VALUES ('executions'), ('history'), ('messages');
