-- attempts loses its foreign key to runs: checking it cost every recorded
-- outcome a lookup of its run, which the recording statement has just
-- locked and updated. PruneRuns deletes a run's attempts with the run, in
-- the same statement; no other statement deletes a run that has attempts.

-- +goose Up
ALTER TABLE attempts DROP CONSTRAINT attempts_run_id_fkey;

-- +goose Down
DELETE FROM attempts a WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = a.run_id);
ALTER TABLE attempts ADD CONSTRAINT attempts_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs (id) ON DELETE CASCADE;
