// Package sqlite is the embedded default vibejobs.Store: one SQLite database
// file, opened with the pure Go driver modernc.org/sqlite in WAL mode.
//
// Writes go through a pool of exactly one connection whose transactions begin
// IMMEDIATE, so writers queue in the process instead of failing with
// SQLITE_BUSY; reads use a separate pool and never wait for a writer. Times
// are stored as Unix milliseconds (UTC): callers pass millisecond-precision
// times and get them back in UTC.
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pressly/goose/v3"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/schemaversion"
)

//go:embed migrations/*.sql
var migrations embed.FS

// busyTimeout is how long a statement waits for another process's lock.
const busyTimeout = 10 * time.Second

// Options configure a Store. The zero value is usable.
type Options struct {
	Logger *slog.Logger     // default: slog.Default()
	Now    func() time.Time // default: time.Now
}

// Store is a vibejobs.Store on a SQLite file. It is safe for concurrent use.
type Store struct {
	reader // reads on the reader pool

	path string
	w    *sql.DB // one connection, BEGIN IMMEDIATE
	r    *sql.DB // readers, query_only
	// prepared holds writeStatements, prepared on the write connection at
	// Open: preparing one inside a transaction would wait for the
	// connection the transaction holds.
	prepared map[string]*sql.Stmt
	// onEnded is told of the runs each transaction ended (OnRunsEnded).
	onEnded atomic.Pointer[func(vibejobs.RunsEnded)]
	// onAttempts is told of the attempts each transaction recorded from
	// outcomes (OnAttemptsRecorded).
	onAttempts atomic.Pointer[func(vibejobs.AttemptsRecorded)]
	// committed is when a write last committed, by now, in Unix ns: 0
	// before the first and after a write the database could not take
	// (see noteWrite). Ping trusts a recent one instead of writing.
	committed atomic.Int64
	// closed is set when Close begins; the reader pool shares it.
	closed atomic.Bool
	logger *slog.Logger
	now    func() time.Time
	// checkpoints copies the WAL into the database in the background, so no
	// commit pays for a checkpoint (see checkpointLoop).
	ckpt     *sql.DB
	stopCkpt context.CancelFunc
	ckptDone chan struct{}
}

var _ vibejobs.Store = (*Store)(nil)

// Open opens (creating it if needed) the database at path and applies the
// pending migrations. path is a file name; ":memory:" is not supported since
// the reader and writer pools must share one database.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if path == "" || path == ":memory:" || strings.ContainsRune(path, '?') || strings.HasPrefix(path, "file:") {
		return nil, fmt.Errorf("sqlite: opening %q: need a plain file path", path)
	}
	s := &Store{
		path:   path,
		logger: cmp.Or(opts.Logger, slog.Default()),
		now:    opts.Now,
	}
	if s.now == nil {
		s.now = time.Now
	}

	// A new database is its owner's only (SQLite gives its -wal and -shm
	// files the database file's mode): it holds the sealed secrets and the
	// history of every project.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	f.Close()
	s.w, err = sql.Open("sqlite", writerDSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	if err := s.w.PingContext(ctx); err != nil {
		s.w.Close()
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	if err := s.Migrate(ctx); err != nil {
		s.w.Close()
		return nil, err
	}
	s.prepared = make(map[string]*sql.Stmt, len(writeStatements))
	for _, q := range writeStatements {
		st, err := s.w.PrepareContext(ctx, q)
		if err != nil {
			s.w.Close()
			return nil, fmt.Errorf("sqlite: preparing %.40q: %w", q, err)
		}
		s.prepared[q] = st
	}

	s.r, err = sql.Open("sqlite", readerDSN(path))
	if err != nil {
		s.w.Close()
		return nil, fmt.Errorf("sqlite: opening %s for reading: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	s.r.SetMaxOpenConns(n)
	s.r.SetMaxIdleConns(n)
	s.r.SetConnMaxLifetime(0)
	s.r.SetConnMaxIdleTime(0)
	s.reader = reader{q: &cachedDB{db: s.r, closed: &s.closed, stmts: map[string]*sql.Stmt{}}}

	s.ckpt, err = sql.Open("sqlite", path+"?"+fmt.Sprintf("_pragma=busy_timeout(%d)", busyTimeout.Milliseconds()))
	if err != nil {
		s.r.Close()
		s.w.Close()
		return nil, fmt.Errorf("sqlite: opening %s for checkpoints: %w", path, err)
	}
	s.ckpt.SetMaxOpenConns(1)
	ckctx, stop := context.WithCancel(context.Background())
	s.stopCkpt, s.ckptDone = stop, make(chan struct{})
	go s.checkpointLoop(ckctx)
	return s, nil
}

// checkpointInterval is how often the WAL is checkpointed in the background.
const checkpointInterval = time.Second

// checkpointLoop runs a PASSIVE checkpoint every checkpointInterval on a
// connection of its own. The writer's automatic checkpoint is off: it runs
// inside the commit that crosses the WAL's size limit and makes that one
// request pay for syncing the database file, which is what a p99 sees. A
// passive checkpoint never blocks readers or the writer.
func (s *Store) checkpointLoop(ctx context.Context) {
	defer close(s.ckptDone)
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := s.ckpt.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil && ctx.Err() == nil {
				s.logger.Warn("sqlite.checkpoint_failed", "error", err)
			}
		}
	}
}

func writerDSN(path string) string {
	return path + "?_txlock=immediate" +
		fmt.Sprintf("&_pragma=busy_timeout(%d)", busyTimeout.Milliseconds()) +
		"&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(NORMAL)" +
		"&_pragma=foreign_keys(1)" +
		// A burst of claims touches thousands of pages in one transaction:
		// spilling them to the WAL before commit would write them twice.
		"&_pragma=cache_size(-65536)" +
		"&_pragma=temp_store(memory)" +
		// Checkpoints run in the background (checkpointLoop).
		"&_pragma=wal_autocheckpoint(0)"
}

func readerDSN(path string) string {
	return path + "?" +
		fmt.Sprintf("_pragma=busy_timeout(%d)", busyTimeout.Milliseconds()) +
		"&_pragma=foreign_keys(1)" +
		"&_pragma=query_only(1)"
}

// Migrate applies the embedded migrations not yet applied. Open calls it; it
// is safe to call again. A database that a newer build migrated further is
// refused with an error.
func (s *Store) Migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("sqlite: migrations: %w", err)
	}
	// Goose takes a connection for its bookkeeping and, for a migration marked
	// NO TRANSACTION, another one; the writer pool has a single connection, so
	// migrations run on a short-lived handle of their own.
	db, err := sql.Open("sqlite", writerDSN(s.path))
	if err != nil {
		return fmt.Errorf("sqlite: migrating %s: %w", s.path, err)
	}
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectSQLite3, db, sub, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("sqlite: migrating %s: %w", s.path, err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return fmt.Errorf("sqlite: migrating %s: %w", s.path, err)
	}
	for _, r := range results {
		s.logger.Info("sqlite: applied migration", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
	}
	if _, err := schemaversion.Check(ctx, p, "the schema of "+s.path); err != nil {
		return fmt.Errorf("sqlite: %w", err)
	}
	return nil
}

// writeProbeAfter is how long Ping trusts the last commit before it
// writes to check that the database still takes writes.
const writeProbeAfter = 10 * time.Second

// probeSQL is Ping's write: one small row.
const probeSQL = `INSERT INTO write_probe (singleton, probed_at) VALUES (1, ?)
	ON CONFLICT (singleton) DO UPDATE SET probed_at = excluded.probed_at`

// Ping checks that the database answers reads and takes writes: a file
// that became read-only, a full disk or an I/O error fail every change
// while reads go on. A write committed within writeProbeAfter before now
// (by the Store's clock), with no write after it that the database could
// not take, proves the second: a busy server's probes neither write nor wait
// for the one write connection. Otherwise (the server is idle, or its
// writes fail) Ping commits a one-row write itself, waiting for the write
// connection as long as ctx allows.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.r.PingContext(ctx); err != nil {
		return closedOr(&s.closed, fmt.Errorf("sqlite: ping: %w", err))
	}
	var one int
	if err := s.r.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return closedOr(&s.closed, fmt.Errorf("sqlite: ping: %w", err))
	}
	if last := s.committed.Load(); last != 0 {
		// A commit ahead of now (the wall clock was set back since) was
		// not made within writeProbeAfter: it vouches for nothing.
		if age := s.now().Sub(time.Unix(0, last)); age >= 0 && age < writeProbeAfter {
			return nil
		}
	}
	err := s.write(ctx, func(t wtx) error {
		_, err := t.ExecContext(ctx, probeSQL, ms(s.now()))
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: ping: writing: %w", err)
	}
	return nil
}

// Close closes both pools. It checkpoints the WAL when it is the last
// connection to the database. Calls that began before Close finish; every
// call after it fails at once with the error of a database that does not
// answer (see closedError). A second Close does nothing.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, st := range s.prepared {
		errs = append(errs, st.Close())
	}
	if c, ok := s.q.(*cachedDB); ok {
		c.mu.Lock()
		for _, st := range c.stmts {
			errs = append(errs, st.Close())
		}
		c.mu.Unlock()
	}
	if s.stopCkpt != nil {
		s.stopCkpt()
		<-s.ckptDone
		errs = append(errs, s.ckpt.Close())
	}
	return errors.Join(append(errs, s.r.Close(), s.w.Close())...)
}

// Update runs fn in a write transaction. fn must do its writes (and the reads
// they depend on) through tx: the Store's own write methods would wait for the
// one write connection that fn holds. fn is called again when the database
// stayed locked by another process beyond the busy timeout.
func (s *Store) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	var err error
	for range 3 {
		err = s.write(ctx, func(t wtx) error { return fn(&tx{reader: reader{q: t}, t: t}) })
		if !isBusy(err) {
			return err
		}
	}
	return err
}

// write runs fn in one IMMEDIATE transaction on the write connection. A
// database that cannot take the write for now is EUNAVAILABLE (see
// unavailable).
func (s *Store) write(ctx context.Context, fn func(wtx) error) (err error) {
	defer func() { s.noteWrite(err) }()
	t, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return closedOr(&s.closed, unavailable(fmt.Errorf("sqlite: beginning transaction: %w", err)))
	}
	ended, attempts := vibejobs.RunsEnded{}, vibejobs.AttemptsRecorded{}
	if err := fn(wtx{Tx: t, prepared: s.prepared, ended: ended, attempts: attempts}); err != nil {
		_ = t.Rollback()
		return unavailable(err)
	}
	if err := t.Commit(); err != nil {
		return unavailable(fmt.Errorf("sqlite: committing: %w", err))
	}
	if f := s.onEnded.Load(); f != nil && len(ended) > 0 {
		(*f)(ended)
	}
	if f := s.onAttempts.Load(); f != nil && len(attempts) > 0 {
		(*f)(attempts)
	}
	return nil
}

// noteWrite keeps, for Ping, what the outcome of a write says: a commit,
// that the database takes writes; an error of cannotWrite, that it does not
// for now. Other errors (the write's own fault, a cancelled context) say
// neither.
func (s *Store) noteWrite(err error) {
	switch {
	case err == nil:
		s.committed.Store(s.now().UnixNano())
	case cannotWrite(err):
		s.committed.Store(0)
	}
}

// OnRunsEnded implements vibejobs.RunsEndedNotifier.
func (s *Store) OnRunsEnded(f func(vibejobs.RunsEnded)) { s.onEnded.Store(&f) }

// OnAttemptsRecorded implements vibejobs.AttemptsRecordedNotifier.
func (s *Store) OnAttemptsRecorded(f func(vibejobs.AttemptsRecorded)) { s.onAttempts.Store(&f) }

// wtx is a write transaction that runs the statements prepared at Open
// without parsing them again.
type wtx struct {
	*sql.Tx
	prepared map[string]*sql.Stmt
	// ended counts the runs the transaction ended: every statement that
	// ends runs appends their events, and counts them as it does.
	ended vibejobs.RunsEnded
	// attempts counts the attempts the transaction recorded from outcomes,
	// by the state their run moved to (recordRound).
	attempts vibejobs.AttemptsRecorded
}

func (t wtx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st, ok := t.prepared[query]; ok {
		return t.Tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, query, args...)
}

func (t wtx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st, ok := t.prepared[query]; ok {
		return t.Tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return t.Tx.QueryContext(ctx, query, args...)
}

func (t wtx) QueryRowContext(ctx context.Context, query string, args ...any) scanner {
	if st, ok := t.prepared[query]; ok {
		return t.Tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return t.Tx.QueryRowContext(ctx, query, args...)
}

// cachedDB runs reads on the reader pool, each SQL text prepared once (per
// connection, by database/sql). Only constant texts and the few variants
// ListRuns builds reach it, so the cache stays small. Once the Store is
// closed, its errors are closedError's.
type cachedDB struct {
	db *sql.DB
	// closed is the Store's: set when Close begins.
	closed *atomic.Bool
	mu     sync.Mutex
	stmts  map[string]*sql.Stmt
}

func (c *cachedDB) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.stmts[query]; ok {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, closedOr(c.closed, err)
	}
	c.stmts[query] = st
	return st, nil
}

func (c *cachedDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	res, err := st.ExecContext(ctx, args...)
	return res, closedOr(c.closed, err)
}

func (c *cachedDB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, args...)
	return rows, closedOr(c.closed, err)
}

func (c *cachedDB) QueryRowContext(ctx context.Context, query string, args ...any) scanner {
	st, err := c.stmt(ctx, query)
	if err != nil {
		return errRow{err}
	}
	return cachedRow{st.QueryRowContext(ctx, args...), c}
}

// cachedRow is a row of the reader pool: its Scan reports a Store closed
// under it as closedError.
type cachedRow struct {
	row *sql.Row
	c   *cachedDB
}

func (r cachedRow) Scan(dest ...any) error { return closedOr(r.c.closed, r.row.Scan(dest...)) }

// errRow is a row whose query could not start: its Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// querier is what reads need: the reader pool or a transaction. A row's
// error, sql.ErrNoRows included, comes from its Scan.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) scanner
}

// unavailable marks err EUNAVAILABLE (wrapping it still) when it says the
// database cannot take writes for now, not that the write was wrong: locked
// by another process past the busy timeout, a full disk, an I/O error, a
// file turned read-only. So the API answers 503, not 500, and the
// dispatcher keeps the outcomes it could not record until the database
// takes them, as it does when PostgreSQL is gone: an outcome given up would
// have its run, which the app may have accepted, sent again once its lease
// ended.
func unavailable(err error) error {
	if !cannotWrite(err) {
		return err
	}
	return fmt.Errorf("%w: %w", errDatabaseUnavailable(), err)
}

// errDatabaseUnavailable is the error of a database that cannot do the
// work for now, the PostgreSQL store's too: the API answers it 503
// database_unavailable.
func errDatabaseUnavailable() *vibejobs.Error {
	return vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
}

// errClosed is the cause of the errors of a closed Store.
var errClosed = errors.New("sqlite: the store is closed")

// closedError is the error of a call on a closed Store, wrapping cause
// (database/sql's "database is closed" or "statement is closed", which it
// returns at once, never waiting for a lock): the error of a database that
// does not answer, as the PostgreSQL store gives once its pool is closed.
// So a request that outlasted a server's stop, its store closed under it,
// is answered 503, not 500 internal.
func closedError(cause error) error {
	return fmt.Errorf("%w: %w: %w", errDatabaseUnavailable(), errClosed, cause)
}

// closedOr returns err, or closedError's for it when closed, the Store's
// flag, says the Store was closed under the call (its statements and pools
// closed). A read that found no row found none, closed or not.
func closedOr(closed *atomic.Bool, err error) error {
	if err == nil || errors.Is(err, sql.ErrNoRows) || !closed.Load() {
		return err
	}
	return closedError(err)
}

// cannotWrite reports whether err says that the database cannot take
// writes for now (see unavailable).
func cannotWrite(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY,
		sqlite3.SQLITE_CANTOPEN:
		return true
	}
	return false
}

func isBusy(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_BUSY
}

// constraint returns the SQLite extended result code of a constraint
// violation, or 0.
func constraint(err error) int {
	var e *sqlite.Error
	if errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_CONSTRAINT {
		return e.Code()
	}
	return 0
}

func isUniqueViolation(err error) bool {
	c := constraint(err)
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

func isForeignKeyViolation(err error) bool {
	return constraint(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

// ms is the stored form of a time.
func ms(t time.Time) int64 { return t.UnixMilli() }

// msPtr is the stored form of an optional time.
func msPtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

func fromNullMS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromMS(v.Int64)
	return &t
}
