-- 0013: which host and process namespace a worker runs in (docs/workers.md, "A worker
-- whose process is gone"). Another process with the same key can ask the operating system
-- whether the worker's pid still exists: a worker killed with -9 is recovered at once
-- instead of when its leases expire. NULL: unknown (not Linux, or registered before 0013).
ALTER TABLE veracity_workers ADD COLUMN host_key text;
