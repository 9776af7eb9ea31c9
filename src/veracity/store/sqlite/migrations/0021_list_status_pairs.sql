-- 0021: the list's indexes of a workflow name and of a deployment (0017) are keyed on the
-- status too, as PostgreSQL's are since its 0020 (docs/operations.md, What a list page
-- costs): a status with an FFQN prefix or a deployment reads about a page however the two
-- are spread. Before, such a page was read by whichever filter's index held the fewest
-- rows in its range, the other checked on each row: a status and a prefix that each
-- matched many rows but none together read every row of the smaller. A name or a
-- deployment without a status is read one status at a time, the pages merged. The two
-- indexes replace 0017's: a write costs no more index entries than before.
DROP INDEX veracity_executions_ffqn_created;
CREATE INDEX veracity_executions_ffqn_status_created
    ON veracity_executions (CAST(ffqn AS TEXT), CAST(status AS TEXT), created_at DESC,
                            id DESC);
DROP INDEX veracity_executions_deployment_created;
CREATE INDEX veracity_executions_deployment_status_created
    ON veracity_executions (CAST(deployment_id AS TEXT), CAST(status AS TEXT),
                            created_at DESC, id DESC);
