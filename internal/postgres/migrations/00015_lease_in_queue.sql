-- A claim leases a run by its run_queue row alone, and leaves the run as it
-- was: the row moves to the lease key (leased, claim time, run id) and
-- carries the lease's owner and expiry. Writing the run at every claim (its
-- lease columns, its attempt number, its lateness) made a new version of the
-- wide runs row for each claim, the largest share of the database's work for
-- a delivery; the claim now writes only the narrow queue row it already
-- moved.
--
-- So runs.attempt is the number of the latest attempt sent or interrupted,
-- never the one in flight: the claim sends attempt + 1, or attempt again
-- when redeliver is set, and the outcome (or the lease recovery) writes
-- that number, the lateness and late_decided. A run waiting in scheduled or
-- retrying is delivering exactly when its queue row is leased; its waiting
-- row would be keyed (false, next_attempt_at, id), which readers probe.
--
-- A waiting run's queue row lock is the right to claim it: a claim locks
-- the row (SKIP LOCKED) and nothing else, and every statement that moves a
-- waiting run out of the queue locks its row too, after the run's.
--
-- The leased key holds the claim time, not the expiry, so an outcome finds
-- its claim's row by what it carries (the run and the claim time). Lease
-- recovery walks the leases in claim order, passing those not yet expired:
-- the runs in flight for longer than the shortest lease, a few as a rule.
--
-- Leases held while the migration runs are moved over: the run's attempt
-- goes back to the one before the claim (or stays, for a redelivery: an
-- attempt under that number is recorded), and its lateness is decided again
-- from the claim time, as the claim decided it, unless an attempt was
-- recorded before. runs keeps its lease columns, empty from now on: a
-- column dropped and added back by the down migration would change the
-- table's column order.

-- +goose Up
ALTER TABLE run_queue ADD COLUMN owner text, ADD COLUMN lease_expires_at timestamptz;
UPDATE run_queue q SET due_at = r.attempt_started_at, owner = r.lease_owner, lease_expires_at = r.lease_expires_at
FROM runs r WHERE q.leased AND r.id = q.run_id;
UPDATE runs r SET
    redeliver = EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = r.id AND a.number = r.attempt),
    attempt = CASE WHEN EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = r.id AND a.number = r.attempt)
        THEN r.attempt ELSE r.attempt - 1 END,
    late_decided = EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = r.id),
    late = CASE WHEN EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = r.id) THEN r.late ELSE false END,
    attempt_started_at = NULL,
    lease_owner = NULL,
    lease_expires_at = NULL
WHERE r.lease_owner IS NOT NULL;

-- +goose Down
UPDATE runs r SET
    attempt = CASE WHEN r.redeliver THEN r.attempt ELSE r.attempt + 1 END,
    redeliver = false,
    late = CASE WHEN r.late_decided THEN r.late ELSE r.scheduled_for + interval '60 seconds' < q.due_at END,
    late_decided = true,
    attempt_started_at = q.due_at,
    lease_owner = q.owner,
    lease_expires_at = q.lease_expires_at
FROM run_queue q WHERE q.leased AND q.run_id = r.id;
UPDATE run_queue SET due_at = lease_expires_at WHERE leased;
ALTER TABLE run_queue DROP COLUMN owner, DROP COLUMN lease_expires_at;
