-- The id of the master key that seals this database's secrets. Every server
-- sharing the database checks at start that its key file holds it: two
-- servers with different key files would each seal secrets the other cannot
-- open, and their deliveries would fail. One row at most.

-- +goose Up
CREATE TABLE master_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key_id text NOT NULL
);

-- +goose Down
DROP TABLE master_key;
