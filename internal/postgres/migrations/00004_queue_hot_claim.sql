-- Cheaper writes on the delivery path, where every run is claimed once and
-- recorded once.
--
-- A claim no longer moves a run out of the queue index: next_attempt_at
-- keeps the due time of the attempt in flight while the run is delivering
-- (readers show it as NULL then), and the index is keyed on it alone, not on
-- state. A claim then changes no indexed column, so PostgreSQL can update the
-- row in place (a HOT update) instead of adding an entry to every index of
-- runs; fillfactor leaves each page room for those versions. Claims pass
-- over the runs in flight by their state: at most as many as attempts in
-- flight. Lease recovery walks the same index (an expired lease's attempt
-- was due before the lease expired), so the lease index goes.
--
-- attempts loses its foreign key to runs: checking it cost every recorded
-- outcome a lookup of its run, which the same statement has just locked.
-- PruneRuns deletes a run's attempts with the run.

-- +goose Up
ALTER TABLE runs SET (fillfactor = 60);
UPDATE runs SET next_attempt_at = attempt_started_at WHERE state = 'delivering';
CREATE INDEX runs_queue_idx ON runs (next_attempt_at, id) WHERE next_attempt_at IS NOT NULL;
DROP INDEX runs_claim_idx;
DROP INDEX runs_lease_idx;
ALTER TABLE attempts DROP CONSTRAINT attempts_run_id_fkey;

-- +goose Down
DELETE FROM attempts a WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = a.run_id);
ALTER TABLE attempts ADD CONSTRAINT attempts_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs (id) ON DELETE CASCADE;
CREATE INDEX runs_lease_idx ON runs (lease_expires_at) WHERE state = 'delivering';
CREATE INDEX runs_claim_idx ON runs (next_attempt_at, id) WHERE state IN ('scheduled', 'retrying');
DROP INDEX runs_queue_idx;
UPDATE runs SET next_attempt_at = NULL WHERE state = 'delivering';
ALTER TABLE runs RESET (fillfactor);
