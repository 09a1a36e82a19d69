-- Fewer index entries per run and per attempt. Every run insert, and every
-- outcome (which moves the run out of runs_claim_idx, so it is not a HOT
-- update), writes one entry in each index of runs; in a burst of deliveries
-- those entries are most of PostgreSQL's work.
--
-- One unique index on (job_id, scheduled_for, occurrence_at) replaces
-- runs_occurrence_key (job_id, occurrence_at) and runs_job_scheduled_idx
-- (job_id, scheduled_for, id). It allows exactly what the old key allowed:
-- occurrence_at is scheduled_for for a schedule-triggered run (now a CHECK)
-- and NULL for a manual one, and NULLs are distinct. It still serves a job's
-- latest run and the future runs of a job by scheduled_for.
--
-- Attempts are only ever read by run, in seq order: (run_id, seq) becomes
-- the primary key, and the separate key on seq goes.
--
-- runs.job_id loses its foreign key. Jobs are never deleted (a deleted job
-- keeps its row), and both statements that insert runs read the live job in
-- the same statement, locked; the key only cost each new run a locked lookup
-- of its job.

-- +goose Up
ALTER TABLE runs ADD CONSTRAINT runs_occurrence_is_schedule
    CHECK (occurrence_at IS NULL OR occurrence_at = scheduled_for);
CREATE UNIQUE INDEX runs_job_occurrence_idx ON runs (job_id, scheduled_for, occurrence_at);
ALTER TABLE runs DROP CONSTRAINT runs_occurrence_key;
DROP INDEX runs_job_scheduled_idx;
ALTER TABLE runs DROP CONSTRAINT runs_job_id_fkey;
ALTER TABLE attempts DROP CONSTRAINT attempts_pkey;
DROP INDEX attempts_run_idx;
ALTER TABLE attempts ADD PRIMARY KEY (run_id, seq);

-- +goose Down
ALTER TABLE attempts DROP CONSTRAINT attempts_pkey;
CREATE INDEX attempts_run_idx ON attempts (run_id, seq);
ALTER TABLE attempts ADD PRIMARY KEY (seq);
ALTER TABLE runs ADD CONSTRAINT runs_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id);
CREATE INDEX runs_job_scheduled_idx ON runs (job_id, scheduled_for, id);
ALTER TABLE runs ADD CONSTRAINT runs_occurrence_key UNIQUE (job_id, occurrence_at);
DROP INDEX runs_job_occurrence_idx;
ALTER TABLE runs DROP CONSTRAINT runs_occurrence_is_schedule;
