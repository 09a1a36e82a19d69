-- A deleted job's row is kept while runs of it are, and then pruned with
-- the project's history (PruneDeletedJobs): a project that creates and
-- deletes jobs no longer leaves their rows behind for good. This ends the
-- premise of migration 00007 that jobs are never deleted; runs still
-- cannot outlive their job, as no run of a deleted job is ever inserted
-- and a job goes only once no run refers to it.
--
-- The index holds the deleted jobs alone, so finding them reads none of
-- the live ones; its columns never change once a job is deleted, and a
-- live job's updates leave it alone.

-- +goose Up
CREATE INDEX jobs_deleted_idx ON jobs (project_id, deleted_at) WHERE deleted_at IS NOT NULL;

-- +goose Down
DROP INDEX jobs_deleted_idx;
