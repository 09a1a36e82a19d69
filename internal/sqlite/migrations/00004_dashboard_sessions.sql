-- Dashboard logins live in the database (see the PostgreSQL migration of the
-- same name). key is the SHA-256 of the session id; times are Unix ms.

-- +goose Up
CREATE TABLE dashboard_sessions (
    key        BLOB    PRIMARY KEY,
    token_id   TEXT    NOT NULL,
    project_id TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX dashboard_sessions_token_idx ON dashboard_sessions (token_id, expires_at);
CREATE INDEX dashboard_sessions_expires_idx ON dashboard_sessions (expires_at);

-- +goose Down
DROP TABLE dashboard_sessions;
