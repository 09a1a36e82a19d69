// Package postgres is the vibejobs.Store on PostgreSQL, for one or many
// replicas sharing one database.
//
// The database coordinates the replicas: runs are claimed with FOR UPDATE
// SKIP LOCKED under a lease, a unique constraint keeps one run per (job,
// scheduledFor), a job's schedule advances only from the NextRunAt a plan was
// computed from, and maintenance statements skip rows another replica holds.
// Runs that become claimable are announced with NOTIFY on the channel
// vibejobs_runs (see Store.Notifications).
//
// Job.LastRun is, as in the SQLite store, the job's run with the latest
// scheduledFor (ties by id) among those that started an attempt or finished:
// occurrences materialised ahead of time do not show until they start. It is
// read with the job (one index probe) rather than kept on the job row, so it
// is never stale and a pruned run simply falls out of it.
package postgres

import (
	"cmp"
	"context"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/pgurl"
	"github.com/vibejobs/vibejobs/internal/schemaversion"
)

//go:embed migrations/*.sql
var migrations embed.FS

// NotifyChannel is the LISTEN/NOTIFY channel on which a Store announces runs
// that became claimable. The payload is the Store's schema ("" for none), so
// installations in different schemas of one database do not wake each other.
const NotifyChannel = "vibejobs_runs"

// JobsChannel is the LISTEN/NOTIFY channel on which a Store announces, at
// commit, a job whose URL, secret, timeout or retry policy changed, or that
// was deleted. The payload is the job's id, a space and the Store's schema.
const JobsChannel = "vibejobs_jobs"

// updateAttempts bounds how often Update runs fn when PostgreSQL reports a
// serialization failure or a deadlock.
const updateAttempts = 5

// Options configure Open.
type Options struct {
	// Logger receives migration and reconnection messages; slog.Default() when nil.
	Logger *slog.Logger
	// Now is the clock for the few reads that need one without taking a
	// time (NextDueAt); time.Now when nil.
	Now func() time.Time
	// Schema, when set, is created if missing and is the search_path of every
	// connection: the tables live there. When "", a search_path in the URL
	// (search_path=name, its first entry) names the schema instead, else
	// the server's search_path applies. Open refuses a URL whose options (or
	// PGOPTIONS) set search_path: a schema chosen there would get none of
	// this.
	Schema string
	// MaxConns is the pool size; 0 keeps pgx's default (pool_max_conns in the
	// URL, else max(4, GOMAXPROCS)).
	MaxConns int
	// MustExist makes Open refuse a schema that was never migrated (that
	// holds no goose_db_version table) instead of creating the schema and
	// its tables: for commands that act on a database that must be there
	// already. Pending migrations of one that was migrated are applied.
	MustExist bool

	// clock, when set, stands for this process's clock in checkClock
	// (tests); time.Now when nil.
	clock func() time.Time
}

// Store is the PostgreSQL vibejobs.Store. It is safe for concurrent use.
type Store struct {
	reader
	pool *pgxpool.Pool
	// queue is a small pool for the statements of delivery: those that
	// walk run_queue in due order (the claim and the next due time), its
	// connections planning without bitmap scans or sorts, and the record
	// of outcomes. The statistics of the queue trail it (runs are
	// materialised seconds ahead and autovacuum's analyze is a minute
	// away), and with them the planner judged the due runs few and fetched
	// every one by bitmap to sort them, for each claim: in a 20,000-run
	// burst most claims took that plan, at about three times the cost per
	// run of the ordered walk of the index, which stops after the limit.
	// Its connections also reuse one generic plan for each statement: left
	// to choose, PostgreSQL planned every record of outcomes afresh, for
	// about 0.4 ms a batch, to arrive at the same plan. A generic plan is
	// made without the parameters' values, and again whenever VacuumQueue
	// refreshes run_queue's statistics; the statements find queue rows by
	// their whole primary key, the only index of run_queue. Mind that
	// before adding one: a partial index on deadlines (WHERE NOT leased)
	// was taken for the claim's key lookup, a walk of the whole index.
	queue *pgxpool.Pool
	// onEnded is told of the runs each transaction ended (OnRunsEnded).
	onEnded atomic.Pointer[func(vibejobs.RunsEnded)]
	// onAttempts is told of the attempts each RecordOutcomes statement
	// recorded (OnAttemptsRecorded).
	onAttempts atomic.Pointer[func(vibejobs.AttemptsRecorded)]
	logger     *slog.Logger
	now        func() time.Time
	schema     string
	// connConfig makes the dedicated connections of Notifications.
	connConfig *pgx.ConnConfig

	// known is the newest migration of this build, and ahead the version
	// a newer build migrated the database to beyond it, once watchDatabase
	// saw it (0 before): from then on every call fails (see schemaGuard).
	known, ahead *atomic.Int64

	// clock is this process's clock as checkClock compares it with the
	// database's: time.Now (Options.Now is a clock for the store's reads,
	// which tests set anywhere). skew is the database's clock minus it at
	// the last check, in nanoseconds, when skewKnown; skewOff is set while
	// the skew is beyond ClockSkewLimit (see checkClock).
	clock              func() time.Time
	skew               atomic.Int64
	skewKnown, skewOff atomic.Bool

	// closing stops the Notifications listeners and watchDatabase when Close
	// is called; listeners waits for them.
	closing   context.Context
	stop      context.CancelFunc
	listeners sync.WaitGroup
}

var (
	_ vibejobs.Store       = (*Store)(nil)
	_ vibejobs.ClaimReader = (*Store)(nil)
)

// queueConns is the size of Store.queue: a dispatcher claims, and records
// outcomes, one statement at a time.
const queueConns = 2

// Open connects to the database at url (a postgres:// URL or a key=value
// DSN), creates opts.Schema if it is set and missing, and applies the pending
// migrations. Several replicas may Open at once: migrations run under a
// session advisory lock.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	cfg, err := pgurl.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = int32(opts.MaxConns)
	}
	cfg.ConnConfig.DialFunc = dialer(cfg.ConnConfig.ConnectTimeout).DialContext
	if optionsSetSearchPath(cfg.ConnConfig.RuntimeParams["options"]) {
		return nil, errOptionsSearchPath
	}
	schema := opts.Schema
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	} else {
		schema = urlSchema(cfg.ConnConfig.RuntimeParams["search_path"])
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		registerUTC(c.TypeMap())
		return nil
	}
	cfg.AfterRelease = writable
	ahead := new(atomic.Int64)
	known := new(atomic.Int64)
	cfg.PrepareConn = schemaGuard(ahead, known)
	if schema != "" && !opts.MustExist {
		if err := createSchema(ctx, cfg.ConnConfig, schema); err != nil {
			return nil, err
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, mapError(err, "opening the pool")
	}
	if opts.MustExist {
		if err := checkMigrated(ctx, pool, schema); err != nil {
			pool.Close()
			return nil, err
		}
	}
	qcfg := cfg.Copy()
	qcfg.MaxConns = queueConns
	qcfg.ConnConfig.RuntimeParams["enable_bitmapscan"] = "off"
	qcfg.ConnConfig.RuntimeParams["enable_sort"] = "off"
	qcfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	// A plan holding a node it had to take although disabled (the sorts of
	// the record's event numbering) costs more than the JIT threshold, and
	// compiling it took 0.6 s a statement.
	qcfg.ConnConfig.RuntimeParams["jit"] = "off"
	queue, err := pgxpool.NewWithConfig(ctx, qcfg)
	if err != nil {
		pool.Close()
		return nil, mapError(err, "opening the queue pool")
	}
	closing, stop := context.WithCancel(context.Background())
	s := &Store{
		reader:     reader{q: pool},
		pool:       pool,
		queue:      queue,
		logger:     cmp.Or(opts.Logger, slog.Default()),
		now:        opts.Now,
		schema:     schema,
		connConfig: cfg.ConnConfig.Copy(),
		closing:    closing,
		stop:       stop,
		known:      known,
		ahead:      ahead,
		clock:      opts.clock,
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	s.reader.now = s.now
	if err := s.Migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	s.checkClock(ctx) // warns at once of a clock far off; a failed read tells nothing
	s.listeners.Add(1)
	go s.watchDatabase()
	return s, nil
}

// watchInterval is how often watchDatabase reads the schema version
// and the database's clock.
const watchInterval = 5 * time.Second

// schemaGuard refuses the connections of a pool once ahead is set: a newer
// build (known is this one's newest migration) migrated the database under
// this running process, as in a rolling upgrade, and this build's
// statements could break the newer schema's promises (a claim of each
// could send one run twice). Every call then fails EUNAVAILABLE: the API
// answers 503, /readyz turns not ready, the dispatcher claims nothing, and
// the runs this process held are recovered by the newer replicas once
// their leases end, as if it had died.
func schemaGuard(ahead, known *atomic.Int64) func(context.Context, *pgx.Conn) (bool, error) {
	return func(context.Context, *pgx.Conn) (bool, error) {
		if v := ahead.Load(); v != 0 {
			return true, fmt.Errorf("%w: postgres: %w", errUnavailable(),
				schemaversion.NewerError(schemaSubject, v, known.Load(), "vibejobs"))
		}
		return true, nil
	}
}

// watchDatabase runs checkSchema and checkClock every watchInterval
// until the Store is closed, or until it stood the Store down.
func (s *Store) watchDatabase() {
	defer s.listeners.Done()
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closing.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.closing, watchInterval)
		ahead, _ := s.checkSchema(ctx) // a read that failed tells nothing: the next one is due soon
		if !ahead {
			s.checkClock(ctx)
		}
		cancel()
		if ahead {
			return // stood down: every call fails from now on
		}
	}
}

// checkSchema reads the newest migration recorded in the database and
// reports whether a newer build made it; the first time, it stands the
// Store down (see schemaGuard) and logs why.
func (s *Store) checkSchema(ctx context.Context) (ahead bool, err error) {
	var v int64
	if err := s.pool.QueryRow(ctx, `SELECT COALESCE(max(version_id), 0) FROM goose_db_version`).Scan(&v); err != nil {
		return false, mapError(err, "reading the schema version")
	}
	known := s.known.Load()
	if v <= known {
		return false, nil
	}
	if s.ahead.CompareAndSwap(0, v) {
		s.logger.Error("postgres.schema_newer", "version", v, "known", known,
			"effect", "every call fails from now on: stop this process and run the newer vibejobs")
	}
	return true, nil
}

// checkMigrated fails unless schema, when set, holds the table in which
// migrations are recorded; when "", unless the search_path of pool's
// connections leads to it. A named schema is looked in alone: through a
// search_path that names others after it, a schema missing or never
// migrated would pass on a later one's table, and the work meant for it
// go to that one (or, the schema being there, to tables Migrate makes in
// it).
func checkMigrated(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var migrated bool
	q, args := `SELECT to_regclass('goose_db_version') IS NOT NULL`, []any{}
	if schema != "" {
		q = `SELECT EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = 'goose_db_version')`
		args = []any{schema}
	}
	if err := pool.QueryRow(ctx, q, args...).Scan(&migrated); err != nil {
		return mapError(err, "looking for the database")
	}
	if migrated {
		return nil
	}
	where := "the database's search_path"
	if schema != "" {
		where = fmt.Sprintf("schema %q", schema)
	}
	return fmt.Errorf("postgres: no vibejobs database in %s: it was never migrated (check the database URL, its database and search_path; vibejobs migrate makes one)", where)
}

// urlSchema returns the schema a search_path given in the URL puts first
// ("" for none or "$user"), so a schema chosen in the URL gets the same
// treatment as Options.Schema: created if missing, its own migration lock
// and its own notifications. It reads the name as the server does: in
// double quotes as written, else with its ASCII letters in lower case.
func urlSchema(searchPath string) string {
	first, _, _ := strings.Cut(searchPath, ",")
	first = strings.TrimSpace(first)
	if len(first) >= 2 && first[0] == '"' && first[len(first)-1] == '"' {
		return strings.ReplaceAll(first[1:len(first)-1], `""`, `"`)
	}
	if first == "$user" {
		return ""
	}
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, first)
}

// errOptionsSearchPath refuses a schema chosen through the server options
// of the URL (or PGOPTIONS), which the Store cannot see: see
// optionsSetSearchPath.
var errOptionsSearchPath = errors.New("postgres: the database URL's options (or PGOPTIONS) set search_path: " +
	"give the schema as search_path=<schema> in the URL instead, so that vibejobs knows it " +
	"(it creates it if missing and keeps the migration lock and notifications of its installation apart)")

// optionsSetSearchPath reports whether options, the command-line options
// the server applies at the start of each session (the URL's options=, else
// PGOPTIONS), set search_path: as -c search_path=…, -csearch_path=… or
// --search_path=… (a name case-insensitive, its - read as _). Open refuses
// them rather than read the schema there: only search_path= (and
// Options.Schema) name the Store's schema, which keys its migration lock,
// its master key rotation lock and its notifications, and is created if
// missing. Arguments are split as the server splits them: at spaces not
// escaped with a backslash.
func optionsSetSearchPath(options string) bool {
	var args []string
	var arg strings.Builder
	escaped, in := false, false
	for _, c := range options {
		switch {
		case escaped:
			arg.WriteRune(c)
			escaped = false
		case c == '\\':
			escaped, in = true, true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			if in {
				args = append(args, arg.String())
				arg.Reset()
				in = false
			}
		default:
			arg.WriteRune(c)
			in = true
		}
	}
	if in {
		args = append(args, arg.String())
	}
	for i, a := range args {
		var setting string
		switch {
		case a == "-c" && i+1 < len(args):
			setting = args[i+1]
		case strings.HasPrefix(a, "--"):
			setting = a[2:]
		case strings.HasPrefix(a, "-c"):
			setting = a[2:]
		default:
			continue
		}
		name, _, _ := strings.Cut(setting, "=")
		if strings.ReplaceAll(strings.ToLower(name), "-", "_") == "search_path" {
			return true
		}
	}
	return false
}

// registerUTC makes timestamptz values scan in UTC (the domain's promise),
// whatever the process's local zone.
func registerUTC(m *pgtype.Map) {
	m.RegisterType(&pgtype.Type{
		Name:  "timestamptz",
		OID:   pgtype.TimestamptzOID,
		Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC},
	})
}

// createSchema creates schema unless it exists. Replicas racing to create it
// all succeed.
func createSchema(ctx context.Context, cc *pgx.ConnConfig, schema string) error {
	cc = cc.Copy()
	delete(cc.RuntimeParams, "search_path")
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return mapError(err, "connecting to create the schema")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
		// Another replica created it between the existence check and the insert.
		return nil
	}
	if err != nil {
		return mapError(err, "creating the schema")
	}
	return nil
}

// Migrate applies the pending embedded migrations. It holds a PostgreSQL
// session advisory lock (one per schema) while it runs, so replicas that
// start together apply each migration once; the others wait for it. A
// schema that a newer build migrated further is refused with an error; one
// that a newer build migrates while the Store is open stands it down (see
// schemaGuard).
func (s *Store) Migrate(ctx context.Context) error {
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("postgres: embedded migrations: %w", err)
	}
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(migrationLockID(s.schema)),
		lock.WithLockTimeout(1, 300), // poll every second, for up to 5 minutes
	)
	if err != nil {
		return fmt.Errorf("postgres: migration lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("postgres: preparing migrations: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return mapError(err, "migrating")
	}
	for _, r := range results {
		s.logger.Info("postgres.migrated", "version", r.Source.Version, "duration", r.Duration)
	}
	known, err := schemaversion.Check(ctx, p, schemaSubject)
	if err != nil {
		return mapError(err, "migrating")
	}
	s.known.Store(known)
	return nil
}

// schemaSubject names the schema in schemaversion's errors.
const schemaSubject = "the database schema"

// LockMasterKeyRotation waits for, and takes, the lock that makes the master
// key rotations of this database (of its schema) take turns, calling waiting
// first when another one holds it, and returns the function that releases
// it. Rotations run from several hosts, each with its copy of the key file:
// one that began while another re-sealed would put its own key first in its
// file and re-seal under it what the other had just re-sealed. A rotation
// spans many transactions, so this is a session advisory lock, held by a
// connection of its own for as long as the lock is (one of the pool would
// leave the rotation's transactions none with pool_max_conns=1); it does not
// stop servers, which never take it.
func (s *Store) LockMasterKeyRotation(ctx context.Context, waiting func()) (unlock func(), err error) {
	id := lockID("vibejobs master key rotation in schema " + s.schema)
	cc := s.connConfig.Copy()
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = strings.TrimSpace("vibejobs master key rotation " + s.schema)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, mapError(err, "locking the master key rotation")
	}
	// The session ends, and the lock with it.
	release := func() { conn.Close(context.Background()) }
	var locked bool
	err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, id).Scan(&locked)
	if err == nil && !locked {
		if waiting != nil {
			waiting()
		}
		_, err = conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, id)
	}
	if err != nil {
		release()
		return nil, mapError(err, "locking the master key rotation")
	}
	return release, nil
}

// migrationLockID is the id of the session advisory lock under which Migrate
// applies the migrations of schema.
func migrationLockID(schema string) int64 {
	if schema == "" {
		return lock.DefaultLockID
	}
	return lockID("vibejobs migrations in schema " + schema)
}

// lockID is the id of the advisory lock named name: a hash, so that the
// locks of different schemas (and purposes) of one database differ.
func lockID(name string) int64 {
	h := fnv.New64a()
	io.WriteString(h, name)
	return int64(h.Sum64() >> 1)
}

// Schema returns the schema the Store was opened on: Options.Schema, else
// the first entry of the URL's search_path ("" for the server's default).
func (s *Store) Schema() string { return s.schema }

// Pool returns the connection pool, for tests and tools that need raw SQL.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// writable reports whether a connection given back to its pool may serve
// again: not when its server takes no writes, a hot standby or one made
// read-only (PostgreSQL 14 and later report both settings to the client as
// they change). In a failover the old primary is fenced or turned standby
// while the address leads to the new one; a connection kept to the old one
// would fail every write (an outage, see unavailableState) until its lifetime
// ran out, an hour by default, so it is closed and the next use dials
// again.
func writable(c *pgx.Conn) bool {
	pc := c.PgConn()
	return pc.ParameterStatus("default_transaction_read_only") != "on" && pc.ParameterStatus("in_hot_standby") != "on"
}

// Ping checks that the database answers and takes writes, on each pool: a
// server that is read-only (a standby reached during a failover) refuses
// every change as unavailable, so it is not ready either; and the queue
// pool makes the claims and records the outcomes, so when it gets no
// working connection nothing is delivered, whatever the main pool says.
func (s *Store) Ping(ctx context.Context) error {
	if err := pingPool(ctx, s.pool, "ping"); err != nil {
		return err
	}
	return pingPool(ctx, s.queue, "ping of the queue pool")
}

// pingPool runs one statement on a connection of pool, a round trip, and
// refuses a session that takes no writes.
func pingPool(ctx context.Context, pool *pgxpool.Pool, doing string) error {
	var readOnly string
	if err := pool.QueryRow(ctx, `SELECT current_setting('transaction_read_only')`).Scan(&readOnly); err != nil {
		return mapError(err, doing)
	}
	if readOnly == "on" {
		return fmt.Errorf("%w: %s: the server is read-only", errUnavailable(), doing)
	}
	return nil
}

// Close stops the Notifications listeners and closes the pool. It waits for
// queries in progress to finish.
func (s *Store) Close() error {
	s.stop()
	s.listeners.Wait()
	s.pool.Close()
	s.queue.Close()
	return nil
}

// Update runs fn in one READ COMMITTED transaction. fn runs again (at most
// updateAttempts times in all) when PostgreSQL aborts the transaction with a
// serialization failure or a deadlock.
func (s *Store) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	var err error
	for range updateAttempts {
		err = s.update(ctx, fn)
		if !retryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func (s *Store) update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	ptx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return mapError(err, "beginning a transaction")
	}
	defer ptx.Rollback(context.WithoutCancel(ctx))
	t := &tx{reader: reader{q: ptx, now: s.now}, s: s}
	if err := fn(t); err != nil {
		return err
	}
	if err := t.flushJobCounts(ctx); err != nil {
		return err
	}
	if err := ptx.Commit(ctx); err != nil {
		return mapError(err, "committing")
	}
	s.ended(t.ended)
	return nil
}

// OnRunsEnded implements vibejobs.RunsEndedNotifier.
func (s *Store) OnRunsEnded(f func(vibejobs.RunsEnded)) { s.onEnded.Store(&f) }

// OnAttemptsRecorded implements vibejobs.AttemptsRecordedNotifier.
func (s *Store) OnAttemptsRecorded(f func(vibejobs.AttemptsRecorded)) { s.onAttempts.Store(&f) }

// ended tells the OnRunsEnded function of e, runs a committed transaction
// ended.
func (s *Store) ended(e vibejobs.RunsEnded) {
	if f := s.onEnded.Load(); f != nil && len(e) > 0 {
		(*f)(e)
	}
}

// retryable reports whether a transaction failed only because it raced
// another one and may simply run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// errUnavailable is the kind of error a lost or refused database connection
// becomes: the caller answers "unavailable" and tries again later.
func errUnavailable() *vibejobs.Error {
	return vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
}

// mapError turns a driver error into what the domain expects: an
// *vibejobs.Error stays as it is, a lost connection becomes EUNAVAILABLE
// (wrapping the cause too), and anything else is wrapped with what was being
// done. Constraint violations a user can cause are mapped where they occur.
func mapError(err error, doing string) error {
	if err == nil {
		return nil
	}
	var vErr *vibejobs.Error
	if errors.As(err, &vErr) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("postgres: %s: %w", doing, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case retryable(err):
			return fmt.Errorf("postgres: %s: %w", doing, err) // Update retries on it; keep the code visible
		case unavailableState(pgErr):
			return fmt.Errorf("%w: %s: %w", errUnavailable(), doing, err)
		case pgErr.Code == characterNotInRepertoire || pgErr.Code == untranslatableCharacter:
			// Text PostgreSQL cannot hold (a NUL byte, invalid UTF-8) is the
			// caller's input, not our failure. The API refuses it first.
			return &vibejobs.Error{Kind: vibejobs.EINVALID, Code: "invalid_text",
				Message: "text must be UTF-8 without NUL bytes"}
		}
		return fmt.Errorf("postgres: %s: %w", doing, err)
	}
	if isConnectionError(err) {
		return fmt.Errorf("%w: %s: %w", errUnavailable(), doing, err)
	}
	return fmt.Errorf("postgres: %s: %w", doing, err)
}

// pgCode returns the SQLSTATE of a server error, or "".
func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// SQLSTATEs of text PostgreSQL refuses: invalid UTF-8 or a NUL byte, and a
// character the database's encoding lacks.
const (
	characterNotInRepertoire = "22021"
	untranslatableCharacter  = "22P05"
)

// foreignKeyViolation is the SQLSTATE of an insert naming a missing parent.
const foreignKeyViolation = "23503"

// unavailableState reports server errors that mean the database cannot do
// the work for now, whatever the statement: the session is gone or cannot
// start (connection exceptions, class 08; an administrator or crash
// shutdown; a server starting or shutting down), or the server lacks the
// resources (class 53: disk, memory, connections), or it cancelled the
// statement at its statement_timeout (57014; a cancel this process asked
// for comes back as its context's error).
func unavailableState(e *pgconn.PgError) bool {
	switch {
	case strings.HasPrefix(e.Code, "08"), strings.HasPrefix(e.Code, "53"):
		return true
	case e.Code == "57P01", e.Code == "57P02", e.Code == "57P03", e.Code == "57014":
		return true
	case e.Code == "25006":
		// read_only_sql_transaction: the server is a standby now (a
		// failover in progress); the primary comes back elsewhere.
		return true
	}
	return false
}

// isConnectionError reports errors of the transport rather than of a
// statement: refused or reset connections, EOF mid-message, a closed pool.
func isConnectionError(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr), errors.As(err, &netErr):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return true
	case pgconn.SafeToRetry(err):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "closed pool") || strings.Contains(msg, "conn closed")
}

// Page limits.
const (
	defaultLimit = 50
	maxLimit     = 100
)

// pageLimit validates p.Limit: 0 means defaultLimit.
func pageLimit(p vibejobs.Page) (int, error) {
	switch {
	case p.Limit == 0:
		return defaultLimit, nil
	case p.Limit < 1 || p.Limit > maxLimit:
		return 0, vibejobs.FieldError("invalid_limit", "limit", "limit must be between 1 and %d", maxLimit)
	}
	return p.Limit, nil
}

// A cursor is the unpadded base64url of the last id of the previous page
// (the same encoding as the SQLite store, so cursors behave alike).
func encodeCursor(id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(id))
}

// decodeCursor returns the id cursor points after ("" for the first page).
func decodeCursor(cursor string) (string, error) {
	if cursor == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(cursor)
	if err != nil || len(b) == 0 || !validID(string(b)) {
		return "", vibejobs.FieldError("invalid_cursor", "cursor", "cursor is not one this API returned")
	}
	return string(b), nil
}

// validID reports whether id uses only the characters ids are made of.
func validID(id string) bool {
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return len(id) <= 128
}
