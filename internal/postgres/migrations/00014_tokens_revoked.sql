-- Revoked tokens are kept for the record as long as the project's history,
-- then pruned (PruneRevokedTokens): a project that mints and revokes tokens
-- no longer leaves their rows behind for good.
--
-- The index holds the revoked tokens alone, so finding those to prune reads
-- none of the live ones; its columns never change once a token is revoked
-- (a second revocation keeps the first time).

-- +goose Up
CREATE INDEX tokens_revoked_idx ON tokens (project_id, revoked_at) WHERE revoked_at IS NOT NULL;

-- +goose Down
DROP INDEX tokens_revoked_idx;
