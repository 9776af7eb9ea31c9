-- 0020: a workflow name's and a deployment's list indexes are keyed on the status too, so
-- that a status combined with an FFQN prefix or a deployment reads about a page however
-- the two are spread (docs/operations.md, What a list page costs). Before, such a page was
-- read through one filter's index and the other checked on each row: a status and a prefix
-- that each matched many rows but none together (no failed row a mail's) read every row of
-- that status, 300 ms at 10,000,000 executions. The two indexes replace the ones of 0012,
-- so that claims and completions write no more index entries than before: a status change
-- already writes a new entry in every index (the status index of 0012 keeps it from being
-- a HOT update).
-- The status is keyed COLLATE "POSIX" (the same byte order as "C"), and so is the
-- deployment: only the list's queries compare those expressions, so that a list query's
-- condition on a name and a status can be answered by the first index alone, and one on a
-- deployment and a status by the second alone, whatever the statistics say. (With the
-- status keyed COLLATE "C", as veracity_executions_status_created is, the planner read a
-- rare pair through that index, checking the name on each row; with the deployment keyed
-- COLLATE "C", a rare name of a common deployment through the second.) Writes wait while
-- they are built (docs/operations.md, What a list page costs).
DROP INDEX veracity_executions_ffqn_created;
CREATE INDEX veracity_executions_ffqn_status_created
    ON veracity_executions (ffqn COLLATE "C", status COLLATE "POSIX", created_at DESC, id DESC);
DROP INDEX veracity_executions_deployment_created;
CREATE INDEX veracity_executions_deployment_status_created
    ON veracity_executions (deployment_id COLLATE "POSIX", status COLLATE "POSIX",
                            created_at DESC, id DESC);
-- The index of the whole list's order (0001) goes: a page of no filter, of dates or after a
-- cursor reads each status's newest rows from veracity_executions_status_created, merged,
-- as a status filter does, and every insert and status change writes one index entry less.
DROP INDEX veracity_executions_created;
