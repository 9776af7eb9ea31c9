-- 0016: on PostgreSQL, the idempotency key's uniqueness moves to a partial unique index
-- over the rows that have a key (its 0016 says why). SQLite keeps the column's UNIQUE
-- constraint, which cannot be dropped without rebuilding the table: its index costs
-- SQLite little, and the rules are the same (a key names at most one execution).
SELECT 1;
