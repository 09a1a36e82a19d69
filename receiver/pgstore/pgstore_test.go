package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vibejobs/vibejobs/internal/pgurl/pgurltest"
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
	Exec: func(t *testing.T, s storetest.Store, statement string) {
		t.Helper()
		if _, err := s.(*pgstore.Store).Pool().Exec(context.Background(), statement); err != nil {
			t.Fatal(err)
		}
	},
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
	return newStoreAt(t, pgtest.TestSchema(t))
}

// TestConformanceQueryExecModes runs the suite on pools whose statements the
// server does not describe first: "exec" and "simple_protocol", the modes
// that PgBouncer in transaction pooling and similar proxies require. pgx then
// encodes each argument by its Go type alone, so an argument whose Go type
// does not fit its column (a []byte, sent as bytea, for jsonb) fails every
// call in these modes while passing in pgx's default one.
func TestConformanceQueryExecModes(t *testing.T) {
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			h := harness
			h.New = func(t *testing.T) (storetest.Store, string) {
				t.Helper()
				u, err := url.Parse(pgtest.TestSchema(t))
				if err != nil {
					t.Fatal(err)
				}
				q := u.Query()
				q.Set("default_query_exec_mode", mode)
				u.RawQuery = q.Encode()
				return newStoreAt(t, u.String())
			}
			storetest.Run(t, h)
		})
	}
}

// newStoreAt returns a migrated store on the database at dsn.
func newStoreAt(t *testing.T, dsn string) (storetest.Store, string) {
	t.Helper()
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

// TestStoreWithoutPool: a Store made by New(nil), a zero Store and a nil
// *Store answer every call with an error that says there is no pool, not
// a nil pointer panic (which the handler would turn into a dropped
// connection and the Worker into a crashed app).
func TestStoreWithoutPool(t *testing.T) {
	for name, s := range map[string]*pgstore.Store{"New(nil)": pgstore.New(nil), "zero": {}, "nil": nil} {
		storetest.CheckUnconfigured(t, name, s, "no pool")
		s.Close() // nothing to close, and no panic either
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

// serializableStore returns a store on the migrated-or-not schema at dsn
// whose pool opens at most maxConns connections, each defaulting to
// SERIALIZABLE as a database or role configured so would.
func serializableStore(t *testing.T, dsn string, maxConns int32) (*pgstore.Store, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pgstore.New(pool), pool
}

// connectPID opens a session of the test's own on dsn and returns its pid.
func connectPID(t *testing.T, dsn string) (*pgx.Conn, int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, backendPID(t, conn)
}

func backendPID(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	t.Helper()
	var pid int
	if err := q.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitBlocked waits until the session pid waits for a lock.
func waitBlocked(t *testing.T, conn *pgx.Conn, pid int, what string) {
	t.Helper()
	storetest.Eventually(t, 30*time.Second, what, func() bool {
		var blocked bool
		if err := conn.QueryRow(context.Background(), `SELECT cardinality(pg_blocking_pids($1)) > 0`, pid).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		return blocked
	})
}

type claimResult struct {
	items []receiver.OutboxItem
	err   error
}

// TestConcurrentClaimsUnderSerializableDefault: two claimers sharing a
// database whose default isolation is SERIALIZABLE. Claimer b takes its
// snapshot while claimer a's claim of the first item is uncommitted, and
// reaches that item once a has committed. b must skip it and claim the next,
// not fail with a serialization error (SQLSTATE 40001), which delays the
// outbox and surfaces as an error in every worker's log.
//
// The interleaving is forced, not hoped for: a trigger holds a's claim on an
// advisory lock of the test after a has locked its item, and a LOCK TABLE
// queued behind a holds b between its snapshot (taken when its statement is
// bound) and its scan, until a has committed.
func TestConcurrentClaimsUnderSerializableDefault(t *testing.T) {
	dsn := pgtest.TestSchema(t)
	ctx := context.Background()
	a, poolA := serializableStore(t, dsn, 1)
	b, poolB := serializableStore(t, dsn, 1)
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ctl, _ := connectPID(t, dsn)
	if _, err := ctl.Exec(ctx, `CREATE FUNCTION hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM pg_advisory_xact_lock_shared(hashtext(current_schema()));
			RETURN NEW;
		END $$;
		CREATE TRIGGER hold_claim BEFORE UPDATE ON job_outbox
			FOR EACH ROW WHEN (NEW.locked_by = 'a') EXECUTE FUNCTION hold_claim()`); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	// Each pool's one connection prepares the claim now, so that b is held
	// below in the execution of its claim, not in its preparation.
	for _, s := range []*pgstore.Store{a, b} {
		if items, err := s.ClaimOutbox(ctx, "warm-up", now, now.Add(time.Minute), 2); err != nil || len(items) != 0 {
			t.Fatalf("warm-up claim = %+v, %v", items, err)
		}
	}
	pidA, pidB := backendPID(t, poolA), backendPID(t, poolB)
	for _, id := range []string{"run_1", "run_2"} {
		if _, _, err := a.Accept(ctx, id, storetest.Body(id)); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := ctl.Exec(ctx, `SELECT pg_advisory_lock(hashtext(current_schema()))`); err != nil {
		t.Fatal(err)
	}
	claimedA := make(chan claimResult, 1)
	go func() {
		items, err := a.ClaimOutbox(ctx, "a", now, now.Add(time.Minute), 1)
		claimedA <- claimResult{items, err}
	}()
	waitBlocked(t, ctl, pidA, "claimer a to hold run_1")

	locker, pidLocker := connectPID(t, dsn)
	lockTx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() {
		_, err := lockTx.Exec(ctx, `LOCK TABLE job_outbox IN SHARE MODE`)
		locked <- err
	}()
	waitBlocked(t, ctl, pidLocker, "the table lock to queue behind claimer a")

	claimedB := make(chan claimResult, 1)
	go func() {
		items, err := b.ClaimOutbox(ctx, "b", now, now.Add(time.Minute), 2)
		claimedB <- claimResult{items, err}
	}()
	waitBlocked(t, ctl, pidB, "claimer b to queue behind the table lock")

	if _, err := ctl.Exec(ctx, `SELECT pg_advisory_unlock(hashtext(current_schema()))`); err != nil {
		t.Fatal(err)
	}
	ra := <-claimedA
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	if err := lockTx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	rb := <-claimedB

	if ra.err != nil || len(ra.items) != 1 || ra.items[0].RunID != "run_1" {
		t.Fatalf("claimer a = %+v, %v; want run_1", ra.items, ra.err)
	}
	if rb.err != nil {
		t.Fatalf("claimer b after a's concurrent claim: %v", rb.err)
	}
	if len(rb.items) != 1 || rb.items[0].RunID != "run_2" {
		t.Fatalf("claimer b = %+v; want run_2 only (run_1 is a's)", rb.items)
	}
}

// TestWritesReadCommittedUnderSerializableDefault: every statement with which
// the store writes runs READ COMMITTED whatever the pool's default isolation,
// so that a row changed by a transaction that committed after the statement
// began is re-read (and skipped or updated) instead of failing the statement
// with a serialization error. A trigger records each write's isolation.
func TestWritesReadCommittedUnderSerializableDefault(t *testing.T) {
	dsn := pgtest.TestSchema(t)
	ctx := context.Background()
	s, pool := serializableStore(t, dsn, 4)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE isolation_seen (write text, isolation text);
		CREATE FUNCTION record_isolation() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO isolation_seen VALUES (TG_OP || ' ' || TG_TABLE_NAME, current_setting('transaction_isolation'));
			RETURN NULL;
		END $$;
		CREATE TRIGGER record_isolation AFTER INSERT OR UPDATE OR DELETE ON accepted_runs
			FOR EACH STATEMENT EXECUTE FUNCTION record_isolation();
		CREATE TRIGGER record_isolation AFTER INSERT OR UPDATE OR DELETE ON job_outbox
			FOR EACH STATEMENT EXECUTE FUNCTION record_isolation()`); err != nil {
		t.Fatal(err)
	}

	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, _, err := s.Accept(ctx, "run_1", storetest.Body("run_1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimOutbox(ctx, "w", now, now.Add(time.Minute), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.FailOutbox(ctx, "run_1", "w", now, "down"); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteOutbox(ctx, "run_1", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteProcessedOutbox(ctx, now.Add(time.Hour), 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteProcessedRuns(ctx, now.Add(time.Hour), 10); err != nil {
		t.Fatal(err)
	}

	rows, err := pool.Query(ctx, `SELECT write, isolation FROM isolation_seen`)
	if err != nil {
		t.Fatal(err)
	}
	writes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Write, Isolation string }])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, w := range writes {
		seen[w.Write] = true
		if w.Isolation != "read committed" {
			t.Errorf("%s ran %s, want read committed", w.Write, w.Isolation)
		}
	}
	for _, w := range []string{"INSERT accepted_runs", "INSERT job_outbox", "UPDATE job_outbox", "UPDATE accepted_runs", "DELETE job_outbox", "DELETE accepted_runs"} {
		if !seen[w] {
			t.Errorf("no %s recorded", w)
		}
	}
}

// TestConcurrentMigrateUnderSerializableDefault: a Migrate that waited for a
// concurrent one must see the versions that one recorded, whatever the pool's
// default isolation. Under REPEATABLE READ or SERIALIZABLE its snapshot, taken
// before it waited, would show none, and it would apply the migrations again
// and fail on recording them.
func TestConcurrentMigrateUnderSerializableDefault(t *testing.T) {
	dsn := pgtest.TestSchema(t)
	ctx := context.Background()
	s, _ := serializableStore(t, dsn, 2)
	ctl, pidCtl := connectPID(t, dsn)
	// Holding Migrate's lock queues both migrations behind the test.
	const migrateLock = `hashtext('vibejobs.receiver.migrate.' || current_schema())`
	if _, err := ctl.Exec(ctx, `SELECT pg_advisory_lock(`+migrateLock+`)`); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for queued := 1; queued <= 2; queued++ {
		go func() { errs <- s.Migrate(ctx) }()
		storetest.Eventually(t, 30*time.Second, "Migrate to wait for its lock", func() bool {
			var n int
			if err := ctl.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, pidCtl).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == queued
		})
	}
	if _, err := ctl.Exec(ctx, `SELECT pg_advisory_unlock(`+migrateLock+`)`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
}

// TestOpenErrorNeverQuotesThePassword: a connection string that cannot be
// used is refused by Open with an error that holds no part of its password.
// pgx quotes a string it cannot parse with the passwords it recognizes
// masked, and a malformed one (an unterminated quote, spaces around the =)
// keeps them: the app logging Open's error logged its database password.
// An @ left unescaped in a URL's password parses: pgx ends the password at
// the first @ and takes the rest for the host name, which every connect
// error names (after a DNS lookup of it), and the handler logs the error of
// each delivery it could not store. Each string of pgurltest.Refused is
// refused before any lookup.
func TestOpenErrorNeverQuotesThePassword(t *testing.T) {
	for _, dsn := range pgurltest.Refused {
		s, err := pgstore.Open(context.Background(), dsn)
		if err == nil {
			// What the app would see next.
			_, _, err = s.Accept(context.Background(), "run_x", []byte("{}"))
			s.Close()
			t.Errorf("Open(%q) = nil error, want one; Accept: %v", dsn, err)
			continue
		}
		if strings.Contains(err.Error(), pgurltest.Canary) {
			t.Errorf("Open(%q): the error quotes the password: %v", dsn, err)
		}
	}
}
