package sqlitestore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/receiver/internal/storetest"
	"github.com/vibejobs/vibejobs/receiver/sqlitestore"
)

var harness = storetest.Harness{
	New:        newStore,
	Open:       openStore,
	Inspect:    inspect,
	CountItems: countItems,
	Exec: func(t *testing.T, s storetest.Store, statement string) {
		t.Helper()
		if _, err := s.(*sqlitestore.Store).DB().ExecContext(context.Background(), statement); err != nil {
			t.Fatal(err)
		}
	},
}

func TestMain(m *testing.M) {
	storetest.RunChild(harness)
	os.Exit(m.Run())
}

func TestConformance(t *testing.T) { storetest.Run(t, harness) }

func openStore(ctx context.Context, path string) (storetest.Store, func(), error) {
	s, err := sqlitestore.Open(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	return s, func() { s.Close() }, nil
}

func newStore(t *testing.T) (storetest.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "receiver.db")
	s, err := sqlitestore.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func inspect(t *testing.T, s storetest.Store, runID string) storetest.ItemState {
	t.Helper()
	db := s.(*sqlitestore.Store).DB()
	var st storetest.ItemState
	err := db.QueryRowContext(context.Background(), `SELECT
			EXISTS (SELECT 1 FROM accepted_runs WHERE run_id = ?1),
			EXISTS (SELECT 1 FROM accepted_runs WHERE run_id = ?1 AND processed_at IS NOT NULL),
			(SELECT count(*) FROM job_outbox WHERE run_id = ?1),
			coalesce((SELECT attempts FROM job_outbox WHERE run_id = ?1), 0),
			EXISTS (SELECT 1 FROM job_outbox WHERE run_id = ?1 AND processed_at IS NOT NULL),
			coalesce((SELECT locked_by FROM job_outbox WHERE run_id = ?1), ''),
			coalesce((SELECT last_error FROM job_outbox WHERE run_id = ?1), '')`, runID).
		Scan(&st.Accepted, &st.RunProcessed, &st.Items, &st.Attempts, &st.Processed, &st.LockedBy, &st.LastError)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func countItems(t *testing.T, s storetest.Store) int {
	t.Helper()
	var n int
	if err := s.(*sqlitestore.Store).DB().QueryRowContext(context.Background(), `SELECT count(*) FROM job_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestOpenSetsWALAndBusyTimeout(t *testing.T) {
	s, _ := newStore(t)
	db := s.(*sqlitestore.Store).DB()
	var mode string
	var busy int
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v", mode, err)
	}
	if err := db.QueryRow(`PRAGMA busy_timeout`).Scan(&busy); err != nil || busy != int(sqlitestore.BusyTimeout.Milliseconds()) {
		t.Fatalf("busy_timeout = %d, %v", busy, err)
	}
	// Reopening runs no migration twice.
	s2, err := sqlitestore.Open(context.Background(), dbPath(t, db))
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
}

func dbPath(t *testing.T, db *sql.DB) string {
	var seq int
	var name, file string
	if err := db.QueryRow(`PRAGMA database_list`).Scan(&seq, &name, &file); err != nil {
		t.Fatal(err)
	}
	return file
}

// Writers start with BEGIN IMMEDIATE: a transaction holds the write lock from
// its BEGIN, so another process's writer waits (or, with no busy timeout,
// fails at once) instead of both reading first and one failing on upgrade.
// DB's pool is opened with the store's own DSN, so its transactions show it.
func TestTransactionsBeginImmediate(t *testing.T) {
	s, path := newStore(t)
	tx, err := s.(*sqlitestore.Store).DB().BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Exec(`BEGIN IMMEDIATE; ROLLBACK`); err == nil {
		t.Fatal("a second writer got the write lock while a store transaction was open")
	}
	tx.Rollback()
	if _, err := other.Exec(`BEGIN IMMEDIATE; ROLLBACK`); err != nil {
		t.Fatalf("after the store's transaction ended: %v", err)
	}
}

// The app's queries on DB() must not hold up the store: an app that keeps a
// read transaction (or unclosed rows) open on DB() while a delivery arrives,
// or waits inside one for the store, would otherwise stall every acceptance
// and claim of this process, or deadlock. In WAL mode a reader does not block
// the writer, so the store's write goes ahead.
func TestAppReadDoesNotHoldUpTheStore(t *testing.T) {
	st, _ := newStore(t)
	s := st.(*sqlitestore.Store)
	ctx := context.Background()
	tx, err := s.DB().BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM accepted_runs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// The deadline only turns a hang into a failure; it is never reached
	// when the store has its own connection.
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := s.Accept(actx, "run_during_app_read", storetest.Body("run_during_app_read")); err != nil {
		t.Fatalf("Accept while the app holds a read transaction on DB(): %v", err)
	}
	// The app's snapshot predates the commit; a fresh read sees it.
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := inspect(t, s, "run_during_app_read"); !got.Accepted || got.Items != 1 {
		t.Fatalf("after the accept: %+v", got)
	}
}

// Session state the app sets on DB() (a PRAGMA, an open BEGIN) must not leak
// into the store's writes.
func TestAppSessionStateDoesNotReachTheStore(t *testing.T) {
	st, _ := newStore(t)
	s := st.(*sqlitestore.Store)
	ctx := context.Background()
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// An app guarding a reporting path against writes.
	if _, err := conn.ExecContext(ctx, `PRAGMA query_only = ON`); err != nil {
		t.Fatal(err)
	}
	conn.Close() // back to the app's pool, still query_only
	if _, _, err := s.Accept(ctx, "run_after_app_pragma", storetest.Body("run_after_app_pragma")); err != nil {
		t.Fatalf("Accept after the app set a PRAGMA on DB(): %v", err)
	}
}

// The store shares its file with the app (DB), and PRAGMA user_version is
// the usual place for an app's own schema version: the store must neither
// read the app's number as its own (an app database at version 3 would get
// no store tables, and every delivery would be answered 503 for good) nor
// overwrite it (the app would skip its own migrations).
func TestStoreLeavesTheAppsUserVersionAlone(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	app, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.ExecContext(ctx, `CREATE TABLE digests (id INTEGER PRIMARY KEY); PRAGMA user_version = 3`); err != nil {
		t.Fatal(err)
	}
	app.Close()

	for round := range 2 { // a fresh store, then a reopened one
		s, err := sqlitestore.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		runID := fmt.Sprintf("run_%d", round)
		if _, _, err := s.Accept(ctx, runID, storetest.Body(runID)); err != nil {
			s.Close()
			t.Fatalf("round %d: Accept in an app database at user_version 3: %v", round, err)
		}
		var v int
		err = s.DB().QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		if v != 3 {
			t.Fatalf("round %d: user_version = %d after Open, want the app's 3", round, v)
		}
	}

	// An app starting from user_version 0 that runs its own migrations after
	// opening the store must still find 0.
	path2 := filepath.Join(t.TempDir(), "fresh.db")
	s, err := sqlitestore.Open(ctx, path2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v int
	if err := s.DB().QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != 0 {
		t.Fatalf("user_version = %d after opening a fresh store, want 0 (the app's)", v)
	}
}

// A file written by a store that kept its version in user_version (1, with
// the tables and no receiver_migrations) opens with its receipts intact: a
// repeat of an accepted run is still a repeat.
func TestOpenUpgradesAUserVersionFile(t *testing.T) {
	ctx := context.Background()
	st, path := newStore(t)
	s := st.(*sqlitestore.Store)
	if _, _, err := s.Accept(ctx, "run_old", storetest.Body("run_old")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, `DROP TABLE receiver_migrations; PRAGMA user_version = 1`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := sqlitestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if status, _, err := s2.Accept(ctx, "run_old", storetest.Body("run_old")); err != nil || status != 202 {
		t.Fatalf("repeat after the upgrade: %d %v", status, err)
	}
	if got := inspect(t, s2, "run_old"); !got.Accepted || got.Items != 1 {
		t.Fatalf("after the upgrade: %+v", got)
	}
	var versions int
	if err := s2.DB().QueryRowContext(ctx, `SELECT count(*) FROM receiver_migrations`).Scan(&versions); err != nil || versions != 1 {
		t.Fatalf("receiver_migrations rows = %d, %v; want 1", versions, err)
	}
}

// Replicas that start together on a new file all open it. The first
// connection switches the file to WAL, and SQLite answers a switch that
// meets a lock another connection may hold while it waits itself (here a
// writer in the file's initial rollback mode; between replicas, one switching
// it at the same moment) with SQLITE_BUSY at once, without the busy handler:
// Open failed. It must wait for the lock as any writer does.
func TestOpenWaitsForTheWALSwitch(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "new.db")
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}

	retried := make(chan struct{}, 1)
	defer sqlitestore.SetBusyRetryHook(func() {
		select {
		case retried <- struct{}{}:
		default:
		}
	})()
	opened := make(chan error, 1)
	go func() {
		s, err := sqlitestore.Open(ctx, path)
		if err == nil {
			_, _, err = s.Accept(ctx, "run_start", storetest.Body("run_start"))
			s.Close()
		}
		opened <- err
	}()
	select {
	case <-retried:
	case err := <-opened:
		t.Fatalf("Open while another connection held the write lock of the new file returned at once: %v", err)
	}
	if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("Open after the lock was released: %v", err)
	}
}

// Open takes a file name, not a URI: SQLite decodes %XX in a "file:" URI's
// path, so "a%41b.db" opened aAb.db, and '?' or '#' cut the name short.
// Whatever the name, Open must use the file of that name.
func TestOpenUsesTheFileNamed(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a%41b.db", "50% off.db", "what?x=1.db", "no#1.db"} {
		s, err := sqlitestore.Open(context.Background(), filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		var seq int
		var schema, file string
		err = s.DB().QueryRow(`PRAGMA database_list`).Scan(&seq, &schema, &file)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		if file != filepath.Join(dir, name) {
			t.Errorf("Open(%q) opened %q", name, file)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A path may start with two slashes ("/" + "/var/db/app.db"), which
	// POSIX takes as one: it still names the file, not a URI authority.
	double := "/" + filepath.Join(dir, "double.db")
	s, err := sqlitestore.Open(context.Background(), double)
	if err != nil {
		t.Fatalf("%q: %v", double, err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "double.db")); err != nil {
		t.Errorf("Open(%q) did not create the file: %v", double, err)
	}
	ents, err = os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch n := e.Name(); n {
		case "a%41b.db", "50% off.db", "what?x=1.db", "no#1.db", "double.db":
		default:
			if filepath.Ext(n) == ".db" {
				t.Errorf("Open created %q", n)
			}
		}
	}
}

// TestStoreWithoutDatabase: a zero Store and a nil *Store, which Open never
// returns, answer every call with an error that says there is no database,
// as pgstore's do without a pool, not a nil pointer panic (which the handler
// would turn into a dropped connection and the Worker into a crashed app).
// DB returns nil and Close has nothing to close.
func TestStoreWithoutDatabase(t *testing.T) {
	for name, s := range map[string]*sqlitestore.Store{"zero": {}, "nil": nil} {
		storetest.CheckUnconfigured(t, name, s, "no database")
		noPanic := func(call string, f func()) {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s store: %s panicked: %v", name, call, r)
				}
			}()
			f()
		}
		noPanic("DB", func() {
			if db := s.DB(); db != nil {
				t.Errorf("%s store: DB() = %v, want nil", name, db)
			}
		})
		noPanic("Close", func() {
			if err := s.Close(); err != nil {
				t.Errorf("%s store: Close() = %v, want nil: there is nothing to close", name, err)
			}
		})
	}
}
