-- When each Idempotency-Key was claimed, by the database server's clock.
-- An in-progress claim a minute old is taken over (its request is taken to
-- have died with its process). That age was the reading replica's clock
-- less created_at, the claiming replica's clock: with clocks a minute
-- apart, a request still running on one replica had its key taken over by
-- another, and answered 500. Measured on one clock, the replicas agree.
-- The claims already there count from the migration: at worst one waits a
-- minute more.

-- +goose Up
ALTER TABLE idempotency_keys ADD COLUMN claimed_at timestamptz NOT NULL DEFAULT now();

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN claimed_at;
