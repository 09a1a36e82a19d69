package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/storetest"
)

// TestUpgrade: a database an older vibejobs left behind, at every schema
// version since the first, with runs in every state (one in flight under
// the stopped process's lease), attempts, an idempotency key and, from the
// event feed (00002) on, events and a subscription, keeps every promise
// once the new version migrates it at start: see storetest.CheckUpgrade.
// 00005 (claims in place) and 00008 (the queue moves to run_queue) change
// how a waiting or leased run is stored; the versions before and after
// each are covered.
func TestUpgrade(t *testing.T) {
	latest := latestVersion(t)
	for v := int64(1); v < latest; v++ {
		t.Run(fmt.Sprintf("from%05d", v), func(t *testing.T) {
			schema, pool := migrateTestSchemaTo(t, v)
			u := storetest.UpgradeData()
			seedUpgrade(t, pool, v, u)
			s := MustOpenTestWith(t, Options{Schema: schema, Now: func() time.Time { return storetest.T0 },
				Logger: slog.New(slog.DiscardHandler)})
			checkQueue(t, s)
			storetest.CheckUpgrade(t, s, u)
		})
	}
}

// latestVersion is the version of the last embedded migration.
func latestVersion(t *testing.T) int64 {
	t.Helper()
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	return storetest.LatestMigration(t, fsys)
}

// migrateTestSchemaTo creates a fresh schema (dropped when t ends),
// migrates it up to version and returns it with a pool whose connections
// use it.
func migrateTestSchemaTo(t *testing.T, version int64) (string, *pgxpool.Pool) {
	t.Helper()
	schema, pool, p := gooseTestSchema(t)
	if _, err := p.UpTo(context.Background(), version); err != nil {
		t.Fatalf("migrating to version %d: %v", version, err)
	}
	return schema, pool
}

// gooseTestSchema creates a fresh schema (dropped when t ends) and returns
// it with a pool whose connections use it and a goose provider of the
// embedded migrations on that pool.
func gooseTestSchema(t *testing.T) (string, *pgxpool.Pool, *goose.Provider) {
	t.Helper()
	ctx := context.Background()
	schema := NewTestSchema(t)
	cfg, err := pgxpool.ParseConfig(TestURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := createSchema(ctx, cfg.ConnConfig, schema); err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	return schema, pool, p
}

// seedUpgrade writes u with the statements a vibejobs at schema version v
// would have left: before 00005 a claimed run is in delivering with no due
// time; from 00005 it keeps its waiting state and the due time its claim
// took it at; from 00008 every waiting or leased run has its run_queue row.
// Before 00002 there is no feed: u loses its events and subscription.
func seedUpgrade(t *testing.T, pool *pgxpool.Pool, v int64, u *storetest.Upgrade) {
	t.Helper()
	if v < 2 {
		u.DropFeed()
	}
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("seeding version %d: %v", v, err)
		}
	}
	p := u.Project
	exec(`INSERT INTO projects (id, name, retention_days, created_at) VALUES ($1, $2, $3, $4)`,
		p.ID, p.Name, p.RetentionDays, p.CreatedAt)
	live := 0
	for _, j := range u.Jobs {
		exec(`INSERT INTO jobs (id, project_id, name, schedule, at, timezone, url, enabled, state, max_attempts,
				min_backoff_ns, max_backoff_ns, timeout_ns, catch_up, schedule_anchor, next_run_at, skipped_runs,
				secret_key_id, secret_ciphertext, created_at, updated_at, deleted_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)`,
			j.ID, j.ProjectID, j.Name, j.Schedule, j.At, j.Timezone, j.URL, j.Enabled, string(j.State),
			j.Retry.MaxAttempts, int64(j.Retry.MinBackoff), int64(j.Retry.MaxBackoff), int64(j.Timeout),
			string(j.CatchUp), j.ScheduleAnchor, j.NextRunAt, j.SkippedRuns, j.Secret.KeyID, j.Secret.Ciphertext,
			j.CreatedAt, j.UpdatedAt, j.DeletedAt)
		if j.DeletedAt == nil {
			live++
		}
	}
	if v >= 3 {
		exec(`INSERT INTO project_job_counts (project_id, live_jobs) VALUES ($1, $2)`, p.ID, live)
	}
	for _, r := range u.Runs {
		state, next := string(r.State), r.NextAttemptAt
		if r.LeaseOwner != "" && v >= 5 {
			state, next = string(vibejobs.RunScheduled), r.DueAt
			if r.Attempt > 1 {
				state = string(vibejobs.RunRetrying)
			}
		}
		var occurrence *time.Time
		if r.Trigger == "schedule" {
			occurrence = &r.ScheduledFor
		}
		var owner *string
		if r.LeaseOwner != "" {
			owner = &r.LeaseOwner
		}
		if v >= 15 {
			seedRun15(t, exec, r, state, next, occurrence)
		} else {
			exec(`INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, occurrence_at, deadline_at, late,
					late_decided, state, attempt, next_attempt_at, attempt_started_at, lease_owner, lease_expires_at,
					failure_reason, created_at, finished_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`,
				r.ID, r.JobID, r.ProjectID, r.Trigger, r.ScheduledFor, occurrence, r.DeadlineAt, r.Late,
				r.LateDecided, state, r.Attempt, next, r.AttemptStartedAt, owner, r.LeaseExpiresAt,
				r.FailureReason, r.CreatedAt, r.FinishedAt)
		}
		if v >= 8 && v < 15 && next != nil && (state == "scheduled" || state == "retrying") {
			due := *next
			if r.LeaseExpiresAt != nil {
				due = *r.LeaseExpiresAt
			}
			exec(`INSERT INTO run_queue (due_at, run_id, deadline_at, leased) VALUES ($1, $2, $3, $4)`,
				due, r.ID, r.DeadlineAt, owner != nil)
		}
		for _, a := range r.Attempts {
			exec(`INSERT INTO attempts (run_id, number, started_at, finished_at, status_code, error_code,
					signature_timestamp, response_snippet)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
				r.ID, a.Number, a.StartedAt, a.FinishedAt, a.StatusCode, a.ErrorCode, a.SignatureTimestamp,
				[]byte(a.ResponseSnippet))
		}
	}
	if v >= 2 {
		for _, e := range u.Events {
			exec(`INSERT INTO events (project_id, sequence, type, occurred_at, job_id, run_id, state, reason, attempt,
					error_code, status_code, next_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
				e.ProjectID, e.Sequence, string(e.Type), e.OccurredAt, e.JobID, e.RunID, e.State, e.Reason, e.Attempt,
				e.ErrorCode, e.StatusCode, e.NextAt)
		}
		exec(`INSERT INTO event_heads (project_id, head) VALUES ($1, $2)`, p.ID, int64(len(u.Events)))
		sub := u.Subscription
		types := make([]string, len(sub.Types))
		for i, ty := range sub.Types {
			types[i] = string(ty)
		}
		exec(`INSERT INTO subscriptions (id, project_id, url, types, job_ids, secret_key_id, secret_ciphertext,
				cursor_seq, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			sub.ID, sub.ProjectID, sub.URL, types, sub.JobIDs, sub.Secret.KeyID, sub.Secret.Ciphertext, sub.Cursor,
			sub.CreatedAt, sub.UpdatedAt)
	}
	rec := u.Idempotency
	headers, err := json.Marshal(rec.ResponseHeaders)
	if err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO idempotency_keys (project_id, key, request_hash, done, response_status, response_headers,
			response_body, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		rec.ProjectID, rec.Key, rec.RequestHash, rec.Done, rec.ResponseStatus, headers, rec.ResponseBody,
		rec.CreatedAt, rec.ExpiresAt)
}

// seedRun15 writes run r as a vibejobs from 00015 on leaves it (state and
// next are its waiting state and due time): a leased run keeps the attempt
// number and lateness it had before its claim, and its run_queue row
// carries the lease at its claim time.
func seedRun15(t *testing.T, exec func(string, ...any), r storetest.UpgradeRun, state string, next, occurrence *time.Time) {
	t.Helper()
	attempt, redeliver, late, decided := r.Attempt, false, r.Late, r.LateDecided
	if r.LeaseOwner != "" {
		redeliver = slices.ContainsFunc(r.Attempts, func(a vibejobs.Attempt) bool { return a.Number == r.Attempt })
		if !redeliver {
			attempt--
		}
		decided = len(r.Attempts) > 0
		late = late && decided
	}
	exec(`INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, occurrence_at, deadline_at, late,
			late_decided, state, attempt, redeliver, next_attempt_at, failure_reason, created_at, finished_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`,
		r.ID, r.JobID, r.ProjectID, r.Trigger, r.ScheduledFor, occurrence, r.DeadlineAt, late,
		decided, state, attempt, redeliver, next, r.FailureReason, r.CreatedAt, r.FinishedAt)
	if next == nil || (state != "scheduled" && state != "retrying") {
		return
	}
	if r.LeaseOwner == "" {
		exec(`INSERT INTO run_queue (due_at, run_id, deadline_at) VALUES ($1, $2, $3)`, *next, r.ID, r.DeadlineAt)
		return
	}
	exec(`INSERT INTO run_queue (due_at, run_id, deadline_at, leased, owner, lease_expires_at)
		VALUES ($1, $2, $3, true, $4, $5)`, r.AttemptStartedAt, r.ID, r.DeadlineAt, r.LeaseOwner, r.LeaseExpiresAt)
}
