-- Dashboard logins live in the database, so a browser behind a load
-- balancer stays logged in whichever replica answers. key is the SHA-256 of
-- the session id the browser holds; the id itself is never stored.

-- +goose Up
CREATE TABLE dashboard_sessions (
    key        bytea PRIMARY KEY,
    token_id   text COLLATE "C" NOT NULL,
    project_id text COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL
);
-- A token's sessions, first to expire first (the bound per token), and the
-- expired ones (pruning).
CREATE INDEX dashboard_sessions_token_idx ON dashboard_sessions (token_id, expires_at);
CREATE INDEX dashboard_sessions_expires_idx ON dashboard_sessions (expires_at);

-- +goose Down
DROP TABLE dashboard_sessions;
