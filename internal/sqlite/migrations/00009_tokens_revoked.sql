-- Revoked tokens are pruned with the project's history (see the PostgreSQL
-- migration of the same name).

-- +goose Up
CREATE INDEX tokens_revoked ON tokens (project_id, revoked_at) WHERE revoked_at IS NOT NULL;

-- +goose Down
DROP INDEX tokens_revoked;
