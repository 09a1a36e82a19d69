package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/vibejobs/vibejobs/internal/storetest"
)

// TestUpgrade: a database an older vibejobs left behind, at every schema
// version since the first, with runs in every state (one in flight under
// the stopped process's lease), attempts, an idempotency key and, from the
// event feed (00002) on, events and a subscription, keeps every promise
// once the new version migrates it at start: see storetest.CheckUpgrade.
func TestUpgrade(t *testing.T) {
	latest := storetest.LatestMigration(t, migrationsFS(t))
	for v := int64(1); v < latest; v++ {
		t.Run(fmt.Sprintf("from%05d", v), func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "vibejobs.db")
			db, p := gooseOn(t, path)
			if _, err := p.UpTo(ctx, v); err != nil {
				t.Fatalf("migrating to version %d: %v", v, err)
			}
			u := storetest.UpgradeData()
			seedUpgrade(t, db, v, u)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}

			s := openAtT0(t, path)
			storetest.CheckUpgrade(t, s, u)
		})
	}
}

// migrationsFS returns the embedded migrations as goose reads them.
func migrationsFS(t *testing.T) fs.FS {
	t.Helper()
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// gooseOn opens the database at path as Migrate does and returns it with
// a goose provider of the embedded migrations on it. The handle is closed
// when t ends, if the test has not closed it before.
func gooseOn(t *testing.T, path string) (*sql.DB, *goose.Provider) {
	t.Helper()
	db, err := sql.Open("sqlite", writerDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectSQLite3, db, migrationsFS(t), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	return db, p
}

// openAtT0 opens the Store on path, migrating it, with its clock at
// storetest.T0; it is closed when t ends.
func openAtT0(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, Options{Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return storetest.T0 }})
	if err != nil {
		t.Fatalf("opening the database: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// seedUpgrade writes u with the statements a vibejobs at schema version v
// would have left (the shape of a run has not changed since 00001). Before
// 00002 there is no feed: u loses its events and subscription.
func seedUpgrade(t *testing.T, db *sql.DB, v int64, u *storetest.Upgrade) {
	t.Helper()
	if v < 2 {
		u.DropFeed()
	}
	ctx := context.Background()
	exec := func(q string, args ...any) sql.Result {
		t.Helper()
		res, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("seeding version %d: %v", v, err)
		}
		return res
	}
	b := func(x bool) int {
		if x {
			return 1
		}
		return 0
	}
	p := u.Project
	exec(`INSERT INTO projects (id, name, retention_days, created_at) VALUES (?, ?, ?, ?)`,
		p.ID, p.Name, p.RetentionDays, ms(p.CreatedAt))
	live := 0
	for _, j := range u.Jobs {
		exec(`INSERT INTO jobs (id, project_id, name, schedule, at, timezone, url, enabled, state, max_attempts,
				min_backoff_ns, max_backoff_ns, timeout_ns, catch_up, schedule_anchor, next_run_at, skipped_runs,
				secret_key_id, secret_ciphertext, created_at, updated_at, deleted_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			j.ID, j.ProjectID, j.Name, j.Schedule, msPtr(j.At), j.Timezone, j.URL, b(j.Enabled), string(j.State),
			j.Retry.MaxAttempts, int64(j.Retry.MinBackoff), int64(j.Retry.MaxBackoff), int64(j.Timeout),
			string(j.CatchUp), ms(j.ScheduleAnchor), msPtr(j.NextRunAt), j.SkippedRuns, j.Secret.KeyID,
			j.Secret.Ciphertext, ms(j.CreatedAt), ms(j.UpdatedAt), msPtr(j.DeletedAt))
		if j.DeletedAt == nil {
			live++
		}
	}
	if v >= 3 {
		exec(`INSERT INTO project_job_counts (project_id, live_jobs) VALUES (?, ?)`, p.ID, live)
	}
	for _, r := range u.Runs {
		var occurrence, late, owner any
		if r.Trigger == "schedule" {
			occurrence = 1
		}
		if r.LateDecided {
			late = b(r.Late)
		}
		if r.LeaseOwner != "" {
			owner = r.LeaseOwner
		}
		res := exec(`INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, occurrence, deadline_at, late,
				state, attempt, next_attempt_at, attempt_started_at, lease_owner, lease_expires_at, failure_reason,
				created_at, finished_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.ID, r.JobID, r.ProjectID, r.Trigger, ms(r.ScheduledFor), occurrence, ms(r.DeadlineAt), late,
			string(r.State), r.Attempt, msPtr(r.NextAttemptAt), msPtr(r.AttemptStartedAt), owner,
			msPtr(r.LeaseExpiresAt), r.FailureReason, ms(r.CreatedAt), msPtr(r.FinishedAt))
		seq, err := res.LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range r.Attempts {
			exec(`INSERT INTO attempts (run_seq, number, started_at, finished_at, status_code, error_code,
					signature_timestamp, response_snippet)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
				seq, a.Number, ms(a.StartedAt), ms(a.FinishedAt), a.StatusCode, a.ErrorCode, a.SignatureTimestamp,
				a.ResponseSnippet)
		}
	}
	if v >= 2 {
		for _, e := range u.Events {
			exec(`INSERT INTO events (project_id, sequence, type, occurred_at, job_id, run_id, state, reason, attempt,
					error_code, status_code, next_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				e.ProjectID, e.Sequence, string(e.Type), ms(e.OccurredAt), e.JobID, e.RunID, e.State, e.Reason,
				e.Attempt, e.ErrorCode, e.StatusCode, msPtr(e.NextAt))
		}
		exec(`INSERT INTO event_heads (project_id, head) VALUES (?, ?)`, p.ID, int64(len(u.Events)))
		sub := u.Subscription
		types, err := json.Marshal(sub.Types)
		if err != nil {
			t.Fatal(err)
		}
		jobIDs, err := json.Marshal(sub.JobIDs)
		if err != nil {
			t.Fatal(err)
		}
		exec(`INSERT INTO subscriptions (id, project_id, url, types, job_ids, secret_key_id, secret_ciphertext,
				cursor_seq, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sub.ID, sub.ProjectID, sub.URL, string(types), string(jobIDs), sub.Secret.KeyID, sub.Secret.Ciphertext,
			sub.Cursor, ms(sub.CreatedAt), ms(sub.UpdatedAt))
	}
	rec := u.Idempotency
	headers, err := json.Marshal(rec.ResponseHeaders)
	if err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO idempotency_keys (project_id, key, request_hash, done, response_status, response_headers,
			response_body, created_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		rec.ProjectID, rec.Key, rec.RequestHash, b(rec.Done), rec.ResponseStatus, string(headers), rec.ResponseBody,
		ms(rec.CreatedAt), ms(rec.ExpiresAt))
}
