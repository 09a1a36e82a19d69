package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestURLEnv names the environment variable holding the database URL tests
// use, for example postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
const TestURLEnv = "VIBEJOBS_TEST_POSTGRES_URL"

// TestURL returns the URL of the test database. When TestURLEnv is unset it
// skips the test, or fails it when the CI environment variable is set (CI
// must not silently skip the PostgreSQL tests).
func TestURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(TestURLEnv)
	if url == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: the PostgreSQL tests need a server in CI", TestURLEnv)
		}
		t.Skipf("%s is not set: skipping the PostgreSQL tests (set it to a database URL to run them)", TestURLEnv)
	}
	return url
}

// NewTestSchema returns the name of a fresh schema for one test and drops
// it, with everything in it, when the test ends. Stores opened on it with
// Options.Schema share its tables.
func NewTestSchema(t testing.TB) string {
	t.Helper()
	url := TestURL(t)
	var b [8]byte
	rand.Read(b[:])
	schema := "vjtest_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("dropping test schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping test schema %s: %v", schema, err)
		}
	})
	return schema
}

// HoldMigrationLock takes the lock under which Open applies the migrations of
// schema and returns the function that releases it (the test's end does, if
// it did not): an Open of schema waits meanwhile, as behind a replica that
// migrates.
func HoldMigrationLock(t testing.TB, schema string) (release func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, TestURL(t))
	if err != nil {
		t.Fatalf("holding the migration lock of %s: %v", schema, err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLockID(schema)); err != nil {
		conn.Close(ctx)
		t.Fatalf("holding the migration lock of %s: %v", schema, err)
	}
	var once sync.Once
	release = func() { once.Do(func() { conn.Close(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// MustOpenTest opens a Store on a fresh schema of the test database (see
// TestURL), closed and dropped when the test ends.
func MustOpenTest(t testing.TB) *Store {
	t.Helper()
	return MustOpenTestWith(t, Options{})
}

// MustOpenTestWith is MustOpenTest with options. An empty opts.Schema gets a
// fresh schema dropped at the end of the test; a set one (from
// NewTestSchema) is shared, so several Stores act as replicas.
func MustOpenTestWith(t testing.TB, opts Options) *Store {
	t.Helper()
	url := TestURL(t)
	if opts.Schema == "" {
		opts.Schema = NewTestSchema(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Open(ctx, url, opts)
	if err != nil {
		t.Fatalf("opening the test store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	// Cleanups run last first: this one while the store is still open, and
	// after those of whatever the test started on it later.
	t.Cleanup(func() { checkQueue(t, s) })
	return s
}

// checkQueue fails t unless run_queue holds exactly one row for each run
// waiting in scheduled or retrying with a due time, with its deadline and
// key, and no other row: a waiting row at the run's due time, or a leased
// one (its claim time, with the lease's owner and expiry), the promise every
// statement that moves a run keeps (see migrations 00008 and 00015). Each
// transaction keeps it whole, so one snapshot sees it hold even while
// other stores of the schema still work. A store the test closed itself
// is not checked.
func checkQueue(t testing.TB, s *Store) {
	t.Helper()
	if s.closing.Err() != nil {
		return // the test closed the store itself: there is nothing to read it with
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := s.pool.Query(ctx, `WITH waiting AS (
		SELECT id, next_attempt_at, deadline_at FROM runs
		WHERE state IN ('scheduled', 'retrying') AND next_attempt_at IS NOT NULL
	), queued AS (
		SELECT run_id, count(*) OVER (PARTITION BY run_id) AS n, due_at, deadline_at, leased, owner, lease_expires_at
		FROM run_queue
	)
	SELECT CASE WHEN q.run_id IS NULL THEN 'waiting, not queued'
			WHEN w.id IS NULL THEN 'queued, not waiting'
			WHEN q.n > 1 THEN 'queued twice'
			WHEN q.deadline_at <> w.deadline_at THEN 'queued with another deadline'
			WHEN NOT q.leased AND q.due_at <> w.next_attempt_at THEN 'queued at another due time'
			WHEN NOT q.leased AND (q.owner IS NOT NULL OR q.lease_expires_at IS NOT NULL) THEN 'waiting with a lease'
			ELSE 'leased without an owner or expiry' END,
		COALESCE(q.run_id, w.id), COALESCE(q.due_at, w.next_attempt_at), COALESCE(q.leased, false)
	FROM queued q FULL JOIN waiting w ON w.id = q.run_id
	WHERE q.run_id IS NULL OR w.id IS NULL OR q.n > 1 OR q.deadline_at <> w.deadline_at
		OR (NOT q.leased AND (q.due_at <> w.next_attempt_at OR q.owner IS NOT NULL OR q.lease_expires_at IS NOT NULL))
		OR (q.leased AND (q.owner IS NULL OR q.lease_expires_at IS NULL))
	LIMIT 10`)
	if err != nil {
		t.Errorf("checking run_queue: %v", err)
		return
	}
	var (
		what, id string
		due      time.Time
		leased   bool
	)
	_, err = pgx.ForEachRow(rows, []any{&what, &id, &due, &leased}, func() error {
		t.Errorf("run_queue out of step with runs: run %s due %s (leased %v) is %s",
			id, due.Format(time.RFC3339Nano), leased, what)
		return nil
	})
	if err != nil {
		t.Errorf("checking run_queue: %v", err)
	}
}

// AgeIdempotencyClaim makes the record of key read as by older than it is:
// what the database server's clock passing by would do, and nothing a
// replica's clock can. It changes neither CreatedAt, which identifies the
// claim, nor the record's expiry.
func AgeIdempotencyClaim(t testing.TB, s *Store, projectID, key string, by time.Duration) {
	t.Helper()
	tag, err := s.pool.Exec(context.Background(), `UPDATE idempotency_keys
		SET claimed_at = claimed_at - make_interval(secs => $3)
		WHERE project_id = $1 AND key = $2`, projectID, key, by.Seconds())
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("ageing the claim of an idempotency key: %v (%d rows)", err, tag.RowsAffected())
	}
}
