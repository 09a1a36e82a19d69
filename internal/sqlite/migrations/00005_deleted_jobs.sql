-- Deleted jobs are pruned with the project's history once no run refers to
-- them (see the PostgreSQL migration of the same name).

-- +goose Up
CREATE INDEX jobs_deleted ON jobs (project_id, deleted_at) WHERE deleted_at IS NOT NULL;

-- +goose Down
DROP INDEX jobs_deleted;
