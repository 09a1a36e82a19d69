-- A vacuum of run_queue no longer gives its empty trailing pages back to
-- the file system. The queue empties whenever the due runs are delivered,
-- so nearly every vacuum (VacuumQueue's, every 5 s on each replica, and
-- autovacuum's) found pages to cut off, and cutting them holds an ACCESS
-- EXCLUSIVE lock on the table, which every claim, new run and recorded
-- outcome waits behind, while the truncation is written and flushed to the
-- WAL. In the lateness benchmark (2,000 jobs @every 1s, two replicas) the
-- worst second of one run, whose latest delivery came 0.3 s late, fell on
-- a vacuum of run_queue; three runs at the default settings had a p99 of
-- 22–263 ms and a worst delivery 0.1–0.9 s late. Keeping the pages, three
-- runs had a p99 of 19–28 ms and a worst delivery 58–116 ms late. The next
-- runs reuse the pages.

-- +goose Up
ALTER TABLE run_queue SET (vacuum_truncate = false);

-- +goose Down
ALTER TABLE run_queue RESET (vacuum_truncate);
