-- 0017: the list's filters answer their first page from an index in the list's order
-- (created_at DESC, id DESC), as on PostgreSQL since its 0012 (docs/operations.md, What a
-- list page costs). Until now SQLite had only veracity_executions_created: a filtered page
-- read the table newest first until it found a page, every row of it for a rare status,
-- deployment or workflow. One status, one deployment, one workflow name (an FFQN prefix
-- is the names in its range, each found by one probe of this index, then each name's
-- newest rows, merged) now read about a page from these indexes; flagged executions from
-- 0012's veracity_executions_flagged_created, which went unused until the list's query
-- named its WHERE term (queries.sql, execution_list_flagged).
-- As PostgreSQL's are keyed on the column COLLATE "C", these are keyed on CAST(column AS
-- TEXT) (the same value: the columns are TEXT NOT NULL of a STRICT table), and only the
-- list's queries compare that expression. Keyed on the plain columns, the status index
-- took the place of the partial indexes of lease recovery, the timer check, the external
-- runs' scan and retention in their plans (SQLite has no statistics unless ANALYZE is run,
-- and guesses an equality on an index's first column to be selective): each would have
-- read every row of its status, some sorting them. Each index costs every insert, and
-- every status change costs the status index: measured in docs/operations.md.
CREATE INDEX veracity_executions_status_created
    ON veracity_executions (CAST(status AS TEXT), created_at DESC, id DESC);
CREATE INDEX veracity_executions_deployment_created
    ON veracity_executions (CAST(deployment_id AS TEXT), created_at DESC, id DESC);
CREATE INDEX veracity_executions_ffqn_created
    ON veracity_executions (CAST(ffqn AS TEXT), created_at DESC, id DESC);
