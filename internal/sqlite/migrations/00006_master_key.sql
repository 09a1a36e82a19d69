-- The id of the master key that seals this database's secrets (see the
-- PostgreSQL migration of the same name). One row at most.

-- +goose Up
CREATE TABLE master_key (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    key_id TEXT NOT NULL
) STRICT;

-- +goose Down
DROP TABLE master_key;
