-- 0008: cron (docs/cron.md). An entry starts one execution per slot however many servers
-- run it: a slot's key (the entry's name, the slot's time) is unique, and the slot, the
-- execution it starts and that execution's pending event are written in one transaction
-- (store/_ops.py, cron_fire). A server that finds the key taken started nothing.

CREATE TABLE veracity_cron_entries (
    name          TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 100),
    schedule      TEXT NOT NULL CHECK (length(schedule) BETWEEN 1 AND 1000),
    timezone      TEXT NOT NULL CHECK (length(timezone) BETWEEN 1 AND 100),
    -- when a server first ran the entry with this schedule and time zone: no slot at or
    -- before it ever fires (a new or changed entry does not fill in the past)
    first_seen_at INTEGER NOT NULL
) STRICT;

CREATE TABLE veracity_cron_slots (
    name         TEXT NOT NULL REFERENCES veracity_cron_entries (name),
    slot_at      INTEGER NOT NULL,
    -- inserted before its execution, in the same transaction: checked at commit
    execution_id TEXT NOT NULL UNIQUE
                 REFERENCES veracity_executions (id) DEFERRABLE INITIALLY DEFERRED,
    fired_at     INTEGER NOT NULL,
    PRIMARY KEY (name, slot_at)
) STRICT;
