-- A run claimed ahead of its time whose occurrence a pause or a schedule
-- change withdrew (see the PostgreSQL migration of the same name): deleted
-- when given back unsent, kept when planned again first.

-- +goose Up
ALTER TABLE runs ADD COLUMN withdrawn INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_withdrawn ON runs (job_id, scheduled_for) WHERE withdrawn = 1;

-- +goose Down
DROP INDEX runs_withdrawn;
ALTER TABLE runs DROP COLUMN withdrawn;
