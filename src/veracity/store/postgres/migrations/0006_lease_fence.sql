-- 0006: the lease fence, written once. Every write a worker makes to an execution it runs
-- holds only while the execution is running under that worker's lease: its owner, its
-- epoch (the fencing token) and a lease not yet expired by the database's clock
-- (docs/workers.md). Each fenced statement in queries.sql calls this; it is inlined.

CREATE FUNCTION veracity_holds_lease(
    status text, lease_owner text, lease_epoch bigint, lease_expires_at timestamptz,
    claim_owner text, claim_epoch bigint, at timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT status = 'running'
       AND lease_owner = claim_owner
       AND lease_epoch = claim_epoch
       AND lease_expires_at > at
$$;
