-- A claim leases a run without moving it out of the queue: state keeps the
-- waiting state the run was claimed from (scheduled or retrying) and
-- next_attempt_at the due time of the attempt in flight, and the lease
-- columns say it is delivering (readers show 'delivering' and no next
-- attempt time while a lease is held). A claim then writes no column an
-- index covers, so PostgreSQL updates the row in place (a HOT update)
-- instead of adding an entry to every index of runs; fillfactor leaves
-- each page room for those versions. Only the outcome, which moves the run
-- out of runs_claim_idx, pays for the indexes.
--
-- runs_claim_idx keeps its predicate on the waiting states, which the
-- queue statements match: a queue index keyed on next_attempt_at alone led
-- the planner to scan and sort every run for each claim. Lease recovery
-- finds the runs in flight in the same index, so the lease index goes.

-- +goose Up
ALTER TABLE runs DROP CONSTRAINT runs_lease_iff_delivering;
UPDATE runs SET state = CASE WHEN attempt <= 1 THEN 'scheduled' ELSE 'retrying' END,
    next_attempt_at = attempt_started_at
WHERE state = 'delivering';
ALTER TABLE runs ADD CONSTRAINT runs_lease_only_waiting
    CHECK (lease_owner IS NULL OR (state IN ('scheduled', 'retrying') AND next_attempt_at IS NOT NULL));
DROP INDEX runs_lease_idx;
ALTER TABLE runs SET (fillfactor = 60);

-- +goose Down
ALTER TABLE runs RESET (fillfactor);
CREATE INDEX runs_lease_idx ON runs (lease_expires_at) WHERE state = 'delivering';
ALTER TABLE runs DROP CONSTRAINT runs_lease_only_waiting;
UPDATE runs SET state = 'delivering', next_attempt_at = NULL WHERE lease_owner IS NOT NULL;
ALTER TABLE runs ADD CONSTRAINT runs_lease_iff_delivering CHECK ((state = 'delivering') = (lease_owner IS NOT NULL));
