-- 0018: a statement that inserts executions notifies veracity_pending once, not once per
-- row (docs/scaling.md, "Many submissions at once").
--
-- The trigger of 0002 ran a PL/pgSQL function for every pending row inserted: 1,000 calls
-- for a batch of 1,000, each folded into the one notification at commit. An insert now
-- runs one statement-level trigger, which notifies when any row the statement inserted is
-- pending; a row that becomes pending by an update (a retry, a timer, a child's end, an
-- unpause) still notifies from the row-level trigger, now for updates only. Workers hear
-- exactly what they heard before: one notification per transaction that made a row
-- pending (a notification is a hint; they also poll).
DROP TRIGGER veracity_executions_pending ON veracity_executions;
CREATE TRIGGER veracity_executions_pending
    AFTER UPDATE OF status ON veracity_executions
    FOR EACH ROW WHEN (NEW.status = 'pending')
    EXECUTE FUNCTION veracity_notify_pending();

CREATE FUNCTION veracity_notify_pending_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE status = 'pending') THEN
        PERFORM pg_notify('veracity_pending', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER veracity_executions_pending_inserted
    AFTER INSERT ON veracity_executions
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    EXECUTE FUNCTION veracity_notify_pending_inserted();
