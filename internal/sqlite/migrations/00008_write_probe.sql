-- The row Ping writes to prove the database takes writes, when no other
-- write committed lately (see Store.Ping). One row at most; probed_at is
-- the time of the last probe, Unix ms.

-- +goose Up
CREATE TABLE write_probe (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    probed_at INTEGER NOT NULL
) STRICT;

-- +goose Down
DROP TABLE write_probe;
