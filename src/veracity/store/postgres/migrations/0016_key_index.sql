-- 0016: the idempotency key's uniqueness is kept by a partial unique index over the rows
-- that have a key, instead of the column's UNIQUE constraint, whose index held an entry
-- for every row: most executions have no key, and a row's every new version (its claim,
-- its completion) wrote one more entry there, for nothing (docs/scaling.md, "What a
-- worker's statements cost"). A submission whose key exists still inserts nothing
-- (ON CONFLICT DO NOTHING covers every unique index), and a key is still looked up by
-- index.
CREATE UNIQUE INDEX veracity_executions_key ON veracity_executions (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
ALTER TABLE veracity_executions DROP CONSTRAINT veracity_executions_idempotency_key_key;
