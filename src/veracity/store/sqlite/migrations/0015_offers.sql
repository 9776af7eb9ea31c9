-- 0015: hand-off offers (docs/workers.md, "Hand-off to an idle worker"). A worker that
-- found nothing to claim and has a slot free posts one offer: the next submission of one
-- of its pinned workflows in its deployment is written already claimed by that worker
-- (running, its lease, epoch 1, the `pending` and `running` events), and the worker is
-- told on its own notification channel, instead of the submission waking every worker
-- to race for it with a claim. One row per worker; a submission takes it whole (one
-- hand-off per offer); the worker's next claim withdraws it; it expires on its own.
CREATE TABLE veracity_offers (
    owner text PRIMARY KEY,
    deployment_id text NOT NULL,
    ffqns text NOT NULL, -- a JSON array of names,
    channel text NOT NULL,
    lease_ttl real NOT NULL,
    expires_at text NOT NULL
);
-- On SQLite the table stays empty: hand-offs need notifications between processes, which
-- SQLite does not have (its workers poll, or are woken in their own process).
