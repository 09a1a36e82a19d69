-- A run some process holds, claimed ahead of its time, when a pause or a
-- schedule change withdraws its occurrence. Only the holder knows whether
-- its attempt went out, so the change marks the run instead of deleting
-- it: given back unsent (ReleaseClaims), it is deleted then; sent, it is
-- recorded as usual; planned again before that (a resume, or a new
-- schedule with the same occurrence), the mark goes.
--
-- The index holds the marked runs alone, a handful at most: finding the
-- ones a plan wants again reads nothing else. The column is set by the
-- change and cleared by a plan only, so the claim's and the outcome's
-- updates, which leave it alone, stay HOT.
--
-- Adding a column with a constant default rewrites nothing. The index is
-- built in the migration's transaction, which reads the whole table and
-- holds writers to runs back meanwhile (0.4 s per million runs on the
-- development machine, the table cached).
-- CONCURRENTLY would not, but it waits for every older transaction in the
-- database, of any schema, to end, and a start would hang behind one left
-- open.

-- +goose Up
ALTER TABLE runs ADD COLUMN withdrawn boolean NOT NULL DEFAULT false;
CREATE INDEX runs_withdrawn_idx ON runs (job_id, scheduled_for) WHERE withdrawn;

-- +goose Down
DROP INDEX runs_withdrawn_idx;
ALTER TABLE runs DROP COLUMN withdrawn;
