-- 0003: the durable engine: timers, join sets and child executions, messages,
-- cancellation (recursive, -cancellable only) and pause.

ALTER TABLE veracity_executions
    ADD COLUMN join_set text CHECK (char_length(join_set) BETWEEN 1 AND 200),
    -- blocked on a timer (sleep, receive with a timeout) until this time
    ADD COLUMN wake_at timestamptz,
    -- bumped by every event a blocked execution may wait for (a child finished, a message)
    ADD COLUMN signal_seq integer NOT NULL DEFAULT 0,
    -- signal_seq when it blocked: a signal since then means "wake up"
    ADD COLUMN blocked_seq integer,
    -- where a paused execution returns to
    ADD COLUMN paused_from text CHECK (paused_from IN ('pending', 'blocked')),
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN pause_requested_at timestamptz,
    ADD CONSTRAINT paused_has_origin CHECK (status <> 'paused' OR paused_from IS NOT NULL);

CREATE INDEX veracity_executions_wake ON veracity_executions (wake_at)
    WHERE status = 'blocked' AND wake_at IS NOT NULL;
CREATE INDEX veracity_executions_join_set ON veracity_executions (parent_id, join_set)
    WHERE parent_id IS NOT NULL;

CREATE TABLE veracity_messages (
    id           bigserial PRIMARY KEY,
    execution_id uuid NOT NULL REFERENCES veracity_executions (id),
    topic        text NOT NULL CHECK (char_length(topic) BETWEEN 1 AND 256),
    payload      json NOT NULL,
    created_at   timestamptz NOT NULL,
    consumed_at  timestamptz,
    consumed_pos integer
);
CREATE INDEX veracity_messages_open ON veracity_messages (execution_id, topic, id)
    WHERE consumed_at IS NULL;

-- When a child execution ends, its parent learns of it in the same transaction:
-- its signal_seq moves; a blocked parent becomes pending (it replays and sees the outcome);
-- a parent whose cancellation waits for its children is recorded cancelled once the last
-- one has ended (which in turn tells the grandparent).
CREATE FUNCTION veracity_child_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent veracity_executions%ROWTYPE;
    open_children integer;
BEGIN
    SELECT * INTO parent FROM veracity_executions WHERE id = NEW.parent_id FOR UPDATE;
    IF NOT FOUND OR parent.status IN ('completed', 'failed', 'failed_transient', 'cancelled') THEN
        RETURN NULL;
    END IF;
    IF parent.cancel_requested_at IS NOT NULL AND parent.status <> 'running' THEN
        SELECT count(*) INTO open_children FROM veracity_executions
        WHERE parent_id = parent.id
          AND status NOT IN ('completed', 'failed', 'failed_transient', 'cancelled');
        IF open_children = 0 THEN
            UPDATE veracity_executions SET
                status = 'cancelled', wake_at = NULL, paused_from = NULL,
                updated_at = NEW.updated_at,
                history_seq = history_seq + 1, signal_seq = signal_seq + 1
            WHERE id = parent.id;
            INSERT INTO veracity_history (execution_id, seq, kind, at, data)
            VALUES (parent.id, parent.history_seq + 1, 'cancelled', NEW.updated_at,
                    json_build_object('reason', 'cancel requested; its last child ended',
                                      'child_id', NEW.id));
            RETURN NULL;
        END IF;
        UPDATE veracity_executions SET signal_seq = signal_seq + 1 WHERE id = parent.id;
        RETURN NULL;
    END IF;
    IF parent.status = 'blocked' THEN
        UPDATE veracity_executions SET
            status = 'pending', wake_at = NULL, updated_at = NEW.updated_at,
            history_seq = history_seq + 1, signal_seq = signal_seq + 1
        WHERE id = parent.id;
        INSERT INTO veracity_history (execution_id, seq, kind, at, data)
        VALUES (parent.id, parent.history_seq + 1, 'pending', NEW.updated_at,
                json_build_object('reason', 'child ended', 'child_id', NEW.id,
                                  'child_status', NEW.status));
    ELSE
        UPDATE veracity_executions SET signal_seq = signal_seq + 1 WHERE id = parent.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER veracity_child_finished
    AFTER UPDATE OF status ON veracity_executions
    FOR EACH ROW
    WHEN (NEW.parent_id IS NOT NULL
          AND NEW.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'failed_transient', 'cancelled'))
    EXECUTE FUNCTION veracity_child_finished();

-- A cancellation that lost the race to another terminal state is kept as a late report.
CREATE FUNCTION veracity_cancel_lost() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE veracity_executions SET history_seq = history_seq + 1 WHERE id = NEW.id;
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    VALUES (NEW.id, NEW.history_seq + 1, 'late_report', NEW.updated_at,
            json_build_object('report', 'cancel',
                              'reason', format('the execution ended %s before the '
                                               'cancellation reached it', NEW.status),
                              'requested_at', NEW.cancel_requested_at));
    RETURN NULL;
END
$$;

CREATE TRIGGER veracity_cancel_lost
    AFTER UPDATE OF status ON veracity_executions
    FOR EACH ROW
    WHEN (NEW.cancel_requested_at IS NOT NULL
          AND NEW.status IN ('completed', 'failed', 'failed_transient')
          AND OLD.status NOT IN ('completed', 'failed', 'failed_transient', 'cancelled'))
    EXECUTE FUNCTION veracity_cancel_lost();

-- Interrupts (cancel or pause of a running execution) reach its worker at once.
CREATE FUNCTION veracity_notify_interrupt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('veracity_interrupt', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER veracity_executions_interrupt
    AFTER UPDATE OF cancel_requested_at, pause_requested_at ON veracity_executions
    FOR EACH ROW
    WHEN (NEW.status = 'running'
          AND (NEW.cancel_requested_at IS DISTINCT FROM OLD.cancel_requested_at
               OR NEW.pause_requested_at IS DISTINCT FROM OLD.pause_requested_at))
    EXECUTE FUNCTION veracity_notify_interrupt();
