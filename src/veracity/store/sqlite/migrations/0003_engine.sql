-- 0003: the durable engine: timers, join sets and child executions, messages,
-- cancellation (recursive, -cancellable only) and pause. See the PostgreSQL migration of
-- the same number for the reasoning; the triggers here do the same with SQLite's means
-- (the store turns on recursive_triggers so that a cancellation climbs the tree).

ALTER TABLE veracity_executions ADD COLUMN join_set TEXT
    CHECK (join_set IS NULL OR length(join_set) BETWEEN 1 AND 200);
ALTER TABLE veracity_executions ADD COLUMN wake_at INTEGER;
ALTER TABLE veracity_executions ADD COLUMN signal_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE veracity_executions ADD COLUMN blocked_seq INTEGER;
ALTER TABLE veracity_executions ADD COLUMN paused_from TEXT
    CHECK (paused_from IS NULL OR paused_from IN ('pending', 'blocked'));
ALTER TABLE veracity_executions ADD COLUMN cancel_requested_at INTEGER;
ALTER TABLE veracity_executions ADD COLUMN pause_requested_at INTEGER;

CREATE INDEX veracity_executions_wake ON veracity_executions (wake_at)
    WHERE status = 'blocked' AND wake_at IS NOT NULL;
CREATE INDEX veracity_executions_join_set ON veracity_executions (parent_id, join_set)
    WHERE parent_id IS NOT NULL;

CREATE TABLE veracity_messages (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id TEXT NOT NULL REFERENCES veracity_executions (id),
    topic        TEXT NOT NULL CHECK (length(topic) BETWEEN 1 AND 256),
    payload      TEXT NOT NULL CHECK (json_valid(payload)),
    created_at   INTEGER NOT NULL,
    consumed_at  INTEGER,
    consumed_pos INTEGER
) STRICT;
CREATE INDEX veracity_messages_open ON veracity_messages (execution_id, topic, id)
    WHERE consumed_at IS NULL;

CREATE TRIGGER veracity_child_finished
AFTER UPDATE OF status ON veracity_executions
WHEN NEW.parent_id IS NOT NULL
 AND NEW.status IN ('completed', 'failed', 'failed_transient', 'cancelled')
 AND OLD.status NOT IN ('completed', 'failed', 'failed_transient', 'cancelled')
BEGIN
    -- a cancellation waiting for its children: the last one ended
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT p.id, p.history_seq + 1, 'cancelled', NEW.updated_at,
           json_object('reason', 'cancel requested; its last child ended', 'child_id', NEW.id)
    FROM veracity_executions AS p
    WHERE p.id = NEW.parent_id
      AND p.cancel_requested_at IS NOT NULL
      AND p.status IN ('pending', 'blocked', 'paused')
      AND NOT EXISTS (SELECT 1 FROM veracity_executions AS c
                      WHERE c.parent_id = p.id
                        AND c.status NOT IN ('completed', 'failed', 'failed_transient',
                                             'cancelled'));
    UPDATE veracity_executions SET
        status = 'cancelled', wake_at = NULL, paused_from = NULL,
        updated_at = NEW.updated_at, history_seq = history_seq + 1
    WHERE id = NEW.parent_id
      AND cancel_requested_at IS NOT NULL
      AND status IN ('pending', 'blocked', 'paused')
      AND NOT EXISTS (SELECT 1 FROM veracity_executions AS c
                      WHERE c.parent_id = NEW.parent_id
                        AND c.status NOT IN ('completed', 'failed', 'failed_transient',
                                             'cancelled'));
    -- a blocked parent wakes up and replays
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    SELECT p.id, p.history_seq + 1, 'pending', NEW.updated_at,
           json_object('reason', 'child ended', 'child_id', NEW.id, 'child_status', NEW.status)
    FROM veracity_executions AS p
    WHERE p.id = NEW.parent_id AND p.status = 'blocked' AND p.cancel_requested_at IS NULL;
    UPDATE veracity_executions SET
        status = 'pending', wake_at = NULL, updated_at = NEW.updated_at,
        history_seq = history_seq + 1
    WHERE id = NEW.parent_id AND status = 'blocked' AND cancel_requested_at IS NULL;
    -- in every case, the parent's signal moves
    UPDATE veracity_executions SET signal_seq = signal_seq + 1
    WHERE id = NEW.parent_id
      AND status NOT IN ('completed', 'failed', 'failed_transient');
END;

CREATE TRIGGER veracity_cancel_lost
AFTER UPDATE OF status ON veracity_executions
WHEN NEW.cancel_requested_at IS NOT NULL
 AND NEW.status IN ('completed', 'failed', 'failed_transient')
 AND OLD.status NOT IN ('completed', 'failed', 'failed_transient', 'cancelled')
BEGIN
    INSERT INTO veracity_history (execution_id, seq, kind, at, data)
    VALUES (NEW.id, NEW.history_seq + 1, 'late_report', NEW.updated_at,
            json_object('report', 'cancel',
                        'reason', 'the execution ended ' || NEW.status ||
                                  ' before the cancellation reached it',
                        'requested_at',
                        strftime('%Y-%m-%dT%H:%M:%S', NEW.cancel_requested_at / 1000000,
                                 'unixepoch')
                        || printf('.%06d+00:00', NEW.cancel_requested_at % 1000000)));
    UPDATE veracity_executions SET history_seq = history_seq + 1 WHERE id = NEW.id;
END;
