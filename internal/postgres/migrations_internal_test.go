package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRunQueueMigrationKeepsTheQueue: a database at version 7, whose queue
// lived in runs, keeps every waiting and leased run claimable or
// recoverable once 00008 moves the queue into run_queue.
func TestRunQueueMigrationKeepsTheQueue(t *testing.T) {
	ctx := context.Background()
	schema, pool := migrateTestSchemaTo(t, 7)
	_, err := pool.Exec(ctx, `
		INSERT INTO projects (id, name, created_at) VALUES ('prj_1', 'p', $1);
		INSERT INTO jobs (id, project_id, name, schedule, timezone, url, enabled, state, max_attempts,
			min_backoff_ns, max_backoff_ns, timeout_ns, catch_up, schedule_anchor, secret_key_id,
			secret_ciphertext, created_at, updated_at)
		VALUES ('job_1', 'prj_1', 'j', '@every 1s', 'UTC', 'https://example.com/hook', true, 'active', 4,
			1000000000, 60000000000, 10000000000, 'all', $1, 'k1', 'sealed', $1, $1);
		INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, deadline_at, state, attempt,
			next_attempt_at, attempt_started_at, lease_owner, lease_expires_at, created_at, finished_at)
		VALUES
			('run_1', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'scheduled', 0,
				$1, NULL, NULL, NULL, $1, NULL),
			('run_2', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'retrying', 1,
				$1::timestamptz + interval '1 minute', NULL, NULL, NULL, $1, NULL),
			('run_3', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'scheduled', 1,
				$1, $1, 'w1', $1::timestamptz + interval '15 seconds', $1, NULL),
			('run_4', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'succeeded', 1,
				NULL, NULL, NULL, NULL, $1, $1)`, pgx.QueryExecModeSimpleProtocol, t0)
	if err != nil {
		t.Fatalf("seeding version 7: %v", err)
	}

	s := MustOpenTestWith(t, Options{Schema: schema, Now: func() time.Time { return t0 }})
	var queued int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM run_queue`).Scan(&queued); err != nil || queued != 3 {
		t.Fatalf("run_queue holds %d rows (%v), want the waiting, retrying and leased runs", queued, err)
	}
	checkQueue(t, s)
	claims, err := s.ClaimDueRuns(ctx, "w2", t0, 10, time.Minute)
	if err != nil || len(claims) != 1 || claims[0].Run.ID != "run_1" {
		t.Fatalf("ClaimDueRuns after the migration = %d claims, %v; want run_1 alone", len(claims), err)
	}
	if n, err := s.RecoverExpiredLeases(ctx, t0.Add(20*time.Second), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases after the lease of run_3 expired = %d, %v; want 1", n, err)
	}
	checkQueue(t, s)
}
