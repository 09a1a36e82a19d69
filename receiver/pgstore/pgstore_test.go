package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vibejobs/vibejobs/receiver"
	"github.com/vibejobs/vibejobs/receiver/internal/pgtest"
	"github.com/vibejobs/vibejobs/receiver/internal/storetest"
	"github.com/vibejobs/vibejobs/receiver/pgstore"
)

var harness = storetest.Harness{
	New:        newStore,
	Open:       openStore,
	Inspect:    inspect,
	CountItems: countItems,
}

func TestMain(m *testing.M) {
	storetest.RunChild(harness)
	os.Exit(m.Run())
}

func TestConformance(t *testing.T) { storetest.Run(t, harness) }

func openStore(ctx context.Context, dsn string) (storetest.Store, func(), error) {
	s, err := pgstore.Open(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

// newStore returns a migrated store in a schema of its own.
func newStore(t *testing.T) (storetest.Store, string) {
	t.Helper()
	dsn := pgtest.TestSchema(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := pgstore.New(pool)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, dsn
}

func inspect(t *testing.T, s storetest.Store, runID string) storetest.ItemState {
	t.Helper()
	pool := s.(*pgstore.Store).Pool()
	var st storetest.ItemState
	err := pool.QueryRow(context.Background(), `SELECT
			EXISTS (SELECT 1 FROM accepted_runs WHERE run_id = $1),
			EXISTS (SELECT 1 FROM accepted_runs WHERE run_id = $1 AND processed_at IS NOT NULL),
			(SELECT count(*) FROM job_outbox WHERE run_id = $1),
			coalesce((SELECT attempts FROM job_outbox WHERE run_id = $1), 0),
			EXISTS (SELECT 1 FROM job_outbox WHERE run_id = $1 AND processed_at IS NOT NULL),
			coalesce((SELECT locked_by FROM job_outbox WHERE run_id = $1), ''),
			coalesce((SELECT last_error FROM job_outbox WHERE run_id = $1), '')`, runID).
		Scan(&st.Accepted, &st.RunProcessed, &st.Items, &st.Attempts, &st.Processed, &st.LockedBy, &st.LastError)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func countItems(t *testing.T, s storetest.Store) int {
	t.Helper()
	var n int
	if err := s.(*pgstore.Store).Pool().QueryRow(context.Background(), `SELECT count(*) FROM job_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Migrate is idempotent and upgrades tables created from the contract's
// example, keeping their rows.
func TestMigrateUpgradesContractTables(t *testing.T) {
	dsn := pgtest.TestSchema(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE accepted_runs (
			run_id text PRIMARY KEY,
			accepted_at timestamptz NOT NULL DEFAULT now(),
			processed_at timestamptz,
			response_status integer NOT NULL CHECK (response_status BETWEEN 200 AND 299),
			response_body jsonb NOT NULL);
		CREATE TABLE job_outbox (
			run_id text PRIMARY KEY REFERENCES accepted_runs(run_id),
			payload jsonb NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(),
			processed_at timestamptz);
		INSERT INTO accepted_runs (run_id, response_status, response_body) VALUES ('run_old', 202, '{"accepted":true}');
		INSERT INTO job_outbox (run_id, payload) VALUES ('run_old', '{}')`); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- s.Migrate(ctx) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	items, err := s.ClaimOutbox(ctx, "w", now, now.Add(time.Minute), 10)
	if err != nil || len(items) != 1 || items[0].RunID != "run_old" || items[0].Attempt != 1 {
		t.Fatalf("claim after upgrade = %+v, %v", items, err)
	}
}

// A store whose database is gone answers with an error, never a response.
func TestAcceptDatabaseDown(t *testing.T) {
	s, _ := newStore(t)
	s.(*pgstore.Store).Pool().Close()
	if status, body, err := s.Accept(context.Background(), "run_down", storetest.Body("run_down")); err == nil || status != 0 || body != nil {
		t.Fatalf("Accept on a closed pool = %d %q %v", status, body, err)
	}
}

// BenchmarkAccept measures durable acceptances of fresh run ids at the store
// level, 32 concurrent callers on 2 CPUs (SetParallelism scales with
// GOMAXPROCS). The HTTP-level figure and the pgbench comparison come from
// receiver/internal/benchaccept.
func BenchmarkAccept(b *testing.B) {
	dsn := pgtest.TestSchema(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	s := pgstore.New(pool)
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "run_" + strconv.FormatInt(seq.Add(1), 10)
			if _, _, err := s.Accept(ctx, id, storetest.Body(id)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "accepts/s")
}

// TestFailureWithNULByteIsRecorded: an app error with a NUL byte (a
// downstream's binary reply) is valid UTF-8, but PostgreSQL text refuses
// it. The worker records the failure without it, so the item waits out its
// backoff instead of being claimed again once its lease ends.
func TestFailureWithNULByteIsRecorded(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if _, _, err := s.Accept(ctx, "run_nul", storetest.Body("run_nul")); err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:  s,
		Now:     clock.Now,
		Lease:   time.Minute,
		Backoff: func(int) time.Duration { return time.Hour },
		Logger:  slog.New(slog.DiscardHandler),
		Process: func(context.Context, string, []byte) error {
			return errors.New("smtp said \x00\x01 garbage")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.ProcessBatch(ctx); err != nil {
		t.Errorf("recording the app's failure: %v", err)
	}
	clock.Add(2 * time.Minute) // lease over, backoff (1 h) not
	if n, _ := w.ProcessBatch(ctx); n != 0 {
		t.Fatalf("item claimed again after 2 min despite a 1 h backoff: %+v", inspect(t, s, "run_nul"))
	}
}

// TestAcceptConcurrentUnderRepeatableReadDefault: the acceptance relies on READ
// COMMITTED (its SELECT must see a concurrent winner's receipt), so it must
// not inherit a database whose default isolation is stricter. A redelivery
// that waits on the first delivery's uncommitted receipt must, once that
// commits, be answered with the stored 2xx, not an error (a 503 to the
// platform, which on the last attempt fails a run the app has accepted).
func TestAcceptConcurrentUnderRepeatableReadDefault(t *testing.T) {
	dsn := pgtest.TestSchema(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := pgstore.New(pool)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	// The first delivery: its receipt is written but not yet committed.
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	var firstPID int
	if err := first.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&firstPID); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Exec(ctx, `INSERT INTO accepted_runs (run_id, response_status, response_body) VALUES ('run_rr', 202, '{"accepted":true}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Exec(ctx, `INSERT INTO job_outbox (run_id, payload) VALUES ('run_rr', $1::jsonb)`, storetest.Body("run_rr")); err != nil {
		t.Fatal(err)
	}

	type result struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan result, 1)
	go func() {
		status, body, err := s.Accept(ctx, "run_rr", storetest.Body("run_rr"))
		done <- result{status, body, err}
	}()
	// Wait until the redelivery is blocked behind the first one's row lock.
	storetest.Eventually(t, 30*time.Second, "the redelivery waits for the first delivery's lock", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, firstPID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.status != receiver.AcceptedStatus || string(r.body) != receiver.AcceptedBody {
		t.Fatalf("redelivery after a concurrent acceptance = %d %q %v; want %d %s", r.status, r.body, r.err, receiver.AcceptedStatus, receiver.AcceptedBody)
	}
	if n := countItems(t, s); n != 1 {
		t.Fatalf("%d outbox items, want 1", n)
	}
}
