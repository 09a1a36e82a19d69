-- The queue moves out of runs into run_queue, so that no index of runs
-- covers a column a delivery changes.
--
-- runs_claim_idx keyed the queue on next_attempt_at under a predicate on
-- state, and runs_finished_idx keyed pruning on finished_at: an outcome
-- changes all three, so PostgreSQL could not update the run in place (HOT)
-- and wrote a new entry in every index of runs for every run delivered,
-- most of the database's work in a burst of deliveries. Now runs is only
-- indexed on columns that never change after the insert, and both the claim
-- and the outcome update a run in place.
--
-- run_queue holds one row per run waiting in scheduled or retrying with a
-- due time, keyed (leased, due_at, run_id), due_at being the time the run next
-- needs a replica: its next_attempt_at, or while it is leased its
-- lease_expires_at (runs.next_attempt_at keeps the due time of the attempt
-- in flight, as since 00005). So the walk for due runs passes no run in
-- flight, and lease recovery finds the expired leases in the same walk.
-- The key leads with whether the run is leased, so claims, the next due
-- time and the queue metrics walk only the runs waiting, and lease recovery
-- only the leases, each in due order. The row also carries the run's
-- deadline, so those walks and the deadline check pass over the rows that
-- are not theirs without reading the run.
-- Every statement that changes a waiting run's state, due time or lease
-- changes its queue row in the same transaction, under the run's row lock.
-- The table stays as small as the queue, so it is cheap to vacuum often;
-- runs, the history, is left to autovacuum.
--
-- Pruning finds old runs by creation time (runs_created_idx), which never
-- changes, instead of by finishing time: a run finishes after it is created.

-- +goose Up
CREATE TABLE run_queue (
    due_at      timestamptz NOT NULL,
    run_id      text COLLATE "C" NOT NULL,
    deadline_at timestamptz NOT NULL,
    leased      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (leased, due_at, run_id)
);
INSERT INTO run_queue (due_at, run_id, deadline_at, leased)
SELECT COALESCE(lease_expires_at, next_attempt_at), id, deadline_at, lease_owner IS NOT NULL FROM runs
WHERE state IN ('scheduled', 'retrying') AND next_attempt_at IS NOT NULL;
DROP INDEX runs_claim_idx;
DROP INDEX runs_finished_idx;
CREATE INDEX runs_created_idx ON runs (project_id, created_at);

-- +goose Down
DROP INDEX runs_created_idx;
CREATE INDEX runs_finished_idx ON runs (project_id, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_claim_idx ON runs (next_attempt_at, id) WHERE state IN ('scheduled', 'retrying');
DROP TABLE run_queue;
