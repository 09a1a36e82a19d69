package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/dispatcher"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/maintenance"
	"github.com/vibejobs/vibejobs/internal/metrics"
	"github.com/vibejobs/vibejobs/internal/pgurl"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/privatefile"
	"github.com/vibejobs/vibejobs/internal/ratelimit"
	"github.com/vibejobs/vibejobs/internal/scheduler"
	"github.com/vibejobs/vibejobs/internal/secretbox"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/subscriptions"
	"github.com/vibejobs/vibejobs/internal/web"
)

// Config is the server's configuration; every flag has an environment
// variable of the same name in upper case with the VIBEJOBS_ prefix.
type Config struct {
	Listen            string
	DataDir           string
	Database          string // "" → SQLite in DataDir; postgres:// or postgresql://, in any case → PostgreSQL; else a SQLite path
	MasterKeyFile     string
	AllowPrivate      string
	TrustedProxies    string
	CAFile            string
	LogFormat         string
	LogLevel          string
	Concurrency       int
	PerHost           int
	RetentionDays     int
	MaxJobsPerProject int
	RateLimit         int // API requests per second per token; burst twice that
	// RotationGrace is how long a subscription's replaced secret keeps
	// signing requests after rotate-secret.
	RotationGrace time.Duration
	// ClaimAhead is the dispatcher's claim-ahead window (see
	// dispatcher.Config.ClaimAhead): 0 keeps the default, negative turns it
	// off, at most a second.
	ClaimAhead time.Duration
	// StoreTimeout bounds each database call of the background loops
	// (dispatcher, scheduler, maintenance, event webhooks), so that a
	// connection gone silent without a reset does not hang them; zero
	// keeps each loop's default (10 s, 30 s for maintenance). Not a flag:
	// tests shorten it.
	StoreTimeout time.Duration
	// DrainTimeout is how long Close, once the deliveries have stopped,
	// waits for the API requests in progress; zero is DefaultDrainTimeout.
	// Not a flag: tests shorten it.
	DrainTimeout time.Duration
	// HandlerExitTimeout is how long Close, once the drain's time is up
	// and the connections still busy are cut, waits for their handlers to
	// return before it closes the database; zero is
	// DefaultHandlerExitTimeout. Not a flag: tests shorten it.
	HandlerExitTimeout time.Duration
}

// DefaultDrainTimeout is how long a stop waits for the API requests in
// progress once the deliveries have stopped (see Main.Close).
const DefaultDrainTimeout = 10 * time.Second

// DefaultHandlerExitTimeout is how long a stop waits for the handlers of
// the requests the drain cut off (see Main.Close). Their connections are
// closed: a handler that read its body whole sees its context end at once,
// another learns of it when its next read or write of the connection
// fails; each store call is bounded besides, and the longest
// call left after a failed request, the freeing of its idempotency key, is
// bounded at 5 s.
const DefaultHandlerExitTimeout = 6 * time.Second

// badDuration marks a duration setting whose environment value did not
// parse; validate reports it (as out of range where it checks one).
const badDuration = time.Duration(math.MinInt64)

// Main is the whole server. Tests start it on port 0 with Run and stop it
// with Close.
type Main struct {
	Config Config
	Stdout io.Writer
	Stderr io.Writer
	// Now and DialContext are for tests; nil means the real ones.
	Now         func() time.Time
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	// AdminToken is set when Run created the installation token.
	AdminToken string
	// WrapDispatchStore and Observer let benchmarks watch the delivery engine.
	WrapDispatchStore func(vibejobs.DispatchStore) vibejobs.DispatchStore
	Observer          dispatcher.Observer
	// RunSender replaces the egress client for run deliveries; only the
	// benchmark that prices the egress policy sets it.
	RunSender dispatcher.Sender

	logger *slog.Logger
	store  vibejobs.Store
	sealer *keyFile
	ln     net.Listener
	srv    *http.Server
	// handlers counts the HTTP handlers running, for Close to wait for.
	handlers runningHandlers
	// wrapHandler, when set, wraps the API's handler; tests hold a
	// request in it.
	wrapHandler func(http.Handler) http.Handler
	// served is closed when the HTTP server's Serve returned.
	served chan struct{}
	// stopping is set when Close begins: /readyz answers 503 stopping.
	stopping atomic.Bool
	cancel   context.CancelFunc
	// wg counts the background loops (the HTTP server apart).
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  bool
}

// NewMain returns a Main writing to the given streams.
func NewMain(stdout, stderr io.Writer) *Main {
	return &Main{Stdout: stdout, Stderr: stderr}
}

// envOr returns the value of the environment variable VIBEJOBS_<name>,
// or def when it is unset or empty.
func envOr(getenv func(string) string, name, def string) string {
	return cmp.Or(getenv("VIBEJOBS_"+name), def)
}

// storeFlagSet declares on fs, with environment defaults, the flags of
// every command that opens the database: where it is, and how to log.
func (c *Config) storeFlagSet(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&c.DataDir, "data-dir", envOr(getenv, "DATA_DIR", "./vibejobs-data"), "data directory: SQLite database, master key, admin token (VIBEJOBS_DATA_DIR)")
	// Declared without the variable's value as its default, which the
	// usage (-h, or a mistyped flag) prints: it holds the database's
	// password. Set after, it is still what a --database flag overrides.
	fs.StringVar(&c.Database, "database", "", "postgres://… URL or SQLite file path; default <data-dir>/vibejobs.db (VIBEJOBS_DATABASE)")
	c.Database = getenv("VIBEJOBS_DATABASE")
	fs.StringVar(&c.LogFormat, "log-format", envOr(getenv, "LOG_FORMAT", "text"), "text or json (VIBEJOBS_LOG_FORMAT)")
	fs.StringVar(&c.LogLevel, "log-level", envOr(getenv, "LOG_LEVEL", "info"), "debug, info, warn or error (VIBEJOBS_LOG_LEVEL)")
}

// masterKeyFlagSet declares the master key file's flag on fs.
func (c *Config) masterKeyFlagSet(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&c.MasterKeyFile, "master-key-file", envOr(getenv, "MASTER_KEY_FILE", ""), "master key file; default <data-dir>/master.key, which serve creates on its first start (VIBEJOBS_MASTER_KEY_FILE)")
}

// flagSet declares every serve flag on fs, with environment defaults.
func (c *Config) flagSet(fs *flag.FlagSet, getenv func(string) string) {
	c.storeFlagSet(fs, getenv)
	c.masterKeyFlagSet(fs, getenv)
	env := func(name, def string) string { return envOr(getenv, name, def) }
	fs.StringVar(&c.Listen, "listen", env("LISTEN", "127.0.0.1:8080"), "HTTP listen address (VIBEJOBS_LISTEN)")
	fs.StringVar(&c.AllowPrivate, "allow-private", env("ALLOW_PRIVATE", ""), "comma-separated CIDRs or addresses deliveries may reach despite the egress policy, at most 32 (VIBEJOBS_ALLOW_PRIVATE)")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", env("TRUSTED_PROXIES", ""), "comma-separated addresses or CIDRs of reverse proxies whose X-Forwarded-For names the client for the failed-login limits, and whose X-Forwarded-Proto: https makes the dashboard's cookies Secure, at most 32 (VIBEJOBS_TRUSTED_PROXIES)")
	fs.StringVar(&c.CAFile, "ca-file", env("CA_FILE", ""), "PEM bundle added to the system roots for deliveries (VIBEJOBS_CA_FILE)")
	// intFlag declares an integer flag; validate checks its range, so
	// that a value out of it, from the flag or the environment, is
	// refused with the range named (retention's 0 was refused as "not a
	// positive integer", and 1 then as below 7).
	intFlag := func(p *int, name, envName string, def int, usage string) {
		fs.Func(name, fmt.Sprintf("%s (VIBEJOBS_%s, default %d)", usage, envName, def), func(s string) error {
			n, err := strconv.Atoi(s)
			if err != nil {
				return errors.New("must be an integer")
			}
			*p = n
			return nil
		})
		*p = def
		if v := getenv("VIBEJOBS_" + envName); v != "" {
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				*p = n
			} else {
				*p = -1 // reported by validate
			}
		}
	}
	intFlag(&c.Concurrency, "concurrency", "CONCURRENCY", dispatcher.DefaultConcurrency, "attempts in flight at most (1–10000)")
	intFlag(&c.PerHost, "per-host", "PER_HOST", dispatcher.DefaultPerHost, "attempts in flight per destination host at most (1–10000)")
	intFlag(&c.RetentionDays, "retention-days", "RETENTION_DAYS", maintenance.DefaultRetentionDays, "history retention in days, 7 to 3650")
	intFlag(&c.MaxJobsPerProject, "max-jobs-per-project", "MAX_JOBS_PER_PROJECT", 10000, "jobs per project at most")
	intFlag(&c.RateLimit, "rate-limit", "RATE_LIMIT", api.DefaultRatePerSecond, "API requests per second per token, and dashboard pages apart (burst twice that; 1 to 1000000)")
	// durationFlag declares a duration flag whose environment variable is
	// read first; a value parse refuses is an error of the flag, or, from
	// the environment, badDuration for validate to report.
	durationFlag := func(p *time.Duration, name, envName, usage string, parse func(string) (time.Duration, error)) {
		if v := getenv("VIBEJOBS_" + envName); v != "" {
			*p = badDuration
			if d, err := parse(v); err == nil {
				*p = d
			}
		}
		fs.Func(name, usage, func(s string) error {
			d, err := parse(s)
			if err != nil {
				return err
			}
			*p = d
			return nil
		})
	}
	durationFlag(&c.ClaimAhead, "claim-ahead", "CLAIM_AHEAD",
		fmt.Sprintf("claim runs falling due within this window and hold them until due, 0 to 1s; 0 turns it off, so a job's settings are read when its run is due (VIBEJOBS_CLAIM_AHEAD, default %s)", dispatcher.DefaultClaimAhead),
		parseClaimAhead)
	c.RotationGrace = vibejobs.DefaultRotationGrace
	durationFlag(&c.RotationGrace, "subscription-rotation-grace", "SUBSCRIPTION_ROTATION_GRACE",
		"how long a subscription's replaced secret keeps signing requests after rotate-secret, 1m to 720h (VIBEJOBS_SUBSCRIPTION_ROTATION_GRACE, default 24h)",
		func(s string) (time.Duration, error) {
			// Config's zero means the default; given, 0 is out of range too.
			d, err := time.ParseDuration(s)
			if err != nil || d < time.Minute || d > 720*time.Hour {
				return 0, errors.New("must be a duration from 1m to 720h, such as 24h")
			}
			return d, nil
		})
}

// parseClaimAhead reads a claim-ahead window from 0 to 1s; 0 (off) becomes
// negative, as dispatcher.Config wants it.
func parseClaimAhead(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > time.Second {
		return 0, errors.New("must be a duration from 0 to 1s, such as 200ms")
	}
	if d == 0 {
		return -1, nil
	}
	return d, nil
}

// Upper bounds of the integer settings: beyond them a value is a mistake
// that would hurt (the dispatcher allocates per attempt in flight at start;
// the rate limit's burst is twice the rate).
const (
	maxConcurrency = 10_000
	maxRateLimit   = 1_000_000
)

// validate checks every serve setting.
func (c *Config) validate() error {
	if err := c.validateStore(); err != nil {
		return err
	}
	switch {
	case c.ClaimAhead == badDuration:
		return errors.New("--claim-ahead (VIBEJOBS_CLAIM_AHEAD) must be a duration from 0 to 1s, such as 200ms")
	case c.Concurrency < 1 || c.Concurrency > maxConcurrency:
		return fmt.Errorf("--concurrency (VIBEJOBS_CONCURRENCY) must be an integer from 1 to %d", maxConcurrency)
	case c.PerHost < 1 || c.PerHost > maxConcurrency:
		return fmt.Errorf("--per-host (VIBEJOBS_PER_HOST) must be an integer from 1 to %d", maxConcurrency)
	case c.RetentionDays < maintenance.MinRetentionDays || c.RetentionDays > maintenance.MaxRetentionDays:
		return fmt.Errorf("--retention-days (VIBEJOBS_RETENTION_DAYS) must be an integer from %d to %d", maintenance.MinRetentionDays, maintenance.MaxRetentionDays)
	case c.RateLimit < 1 || c.RateLimit > maxRateLimit:
		return fmt.Errorf("--rate-limit (VIBEJOBS_RATE_LIMIT) must be an integer from 1 to %d", maxRateLimit)
	case c.MaxJobsPerProject < 1:
		return errors.New("--max-jobs-per-project (VIBEJOBS_MAX_JOBS_PER_PROJECT) must be a positive integer")
	case c.Listen == "":
		// Left out, it is 127.0.0.1:8080; given empty, it is a mistake (an
		// unset shell variable), not a request for the default.
		return errors.New("--listen (VIBEJOBS_LISTEN) must not be empty: give a host:port such as 127.0.0.1:8080")
	case !isListenAddr(c.Listen):
		// Caught here rather than by Listen, with the other settings:
		// a value that can never work is refused as such (exit 2).
		return fmt.Errorf("--listen (VIBEJOBS_LISTEN) must be a host:port such as 127.0.0.1:8080, not %q", c.Listen)
	case c.RotationGrace != 0 && (c.RotationGrace < time.Minute || c.RotationGrace > 720*time.Hour):
		return errors.New("--subscription-rotation-grace (VIBEJOBS_SUBSCRIPTION_ROTATION_GRACE) must be a duration from 1m to 720h")
	}
	if _, err := egress.ParseAllowList(c.AllowPrivate); err != nil {
		return fmt.Errorf("--allow-private (VIBEJOBS_ALLOW_PRIVATE): %w", err)
	}
	if _, err := ratelimit.ParseProxies(c.TrustedProxies); err != nil {
		return fmt.Errorf("--trusted-proxies (VIBEJOBS_TRUSTED_PROXIES): %w", err)
	}
	return nil
}

// isListenAddr reports whether addr has the form net.Listen takes for TCP:
// host:port, the host possibly empty, the port a number up to 65535 or a
// service name of the system's table (no network involved).
func isListenAddr(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	_, err = net.LookupPort("tcp", port)
	return err == nil
}

// validateStore checks the settings of storeFlagSet, which every command
// that opens the database reads.
func (c *Config) validateStore() error {
	c.LogFormat = strings.ToLower(c.LogFormat) // as log levels are read, JSON is json
	switch {
	case c.LogFormat != "text" && c.LogFormat != "json":
		return errors.New("--log-format (VIBEJOBS_LOG_FORMAT) must be text or json")
	case c.DataDir == "":
		return errors.New("--data-dir (VIBEJOBS_DATA_DIR) must not be empty")
	}
	if scheme, _, ok := strings.Cut(c.Database, "://"); ok && !isPostgresURL(c.Database) {
		if !isURLScheme(scheme) {
			// Not quoted: what stands before "://" is no scheme, and may
			// hold a password ("app:pw@db://…", "password=…://…").
			return errors.New("--database (VIBEJOBS_DATABASE) holds \"://\" but is no postgres://… URL: give postgres://… or a SQLite file path")
		}
		return fmt.Errorf("--database (VIBEJOBS_DATABASE): %q URLs are not supported: give postgres://… or a SQLite file path", scheme)
	}
	if postgresNearMiss(c.Database) {
		// A slash or the colon short of a URL ("postgres:/app:pw@db/jobs",
		// "postgres//app:pw@db/jobs"): taken as a SQLite path, it was a
		// file named after it, password and all, or an error that printed
		// it whole. Not quoted, for the same reason.
		return errors.New("--database (VIBEJOBS_DATABASE) starts with a PostgreSQL scheme but is no postgres://… URL: check the \"://\" after it")
	}
	if keywordDSN(c.Database) {
		// Not quoted: it may hold a password. Taken as a SQLite path, it
		// was a file named after it, or an error that printed it whole.
		return errors.New("--database (VIBEJOBS_DATABASE) is a key=value connection string: give a postgres://… URL, or a SQLite file path")
	}
	if pgURL, ok := postgresURL(c.Database); ok {
		// A URL that does not parse can never connect: refused here, with
		// the settings, rather than by Open (pgurl's errors quote none of
		// it). Parsing reads no more than local files (a passfile, the
		// TLS files). A TLS file it names that cannot be read is no fault
		// of the URL but of its use, as a missing --ca-file is: Run and
		// Open report it (exit 1).
		var fe *pgurl.FileError
		if _, err := pgurl.ParseConfig(pgURL); err != nil && !errors.As(err, &fe) {
			return fmt.Errorf("--database (VIBEJOBS_DATABASE): %w", err)
		}
	}
	if _, ok := logLevel(c.LogLevel); !ok {
		return fmt.Errorf("--log-level (VIBEJOBS_LOG_LEVEL) must be debug, info, warn or error, not %q", c.LogLevel)
	}
	return nil
}

// logLevel reads one of the four levels the flag documents, in any case.
// slog's own parser also takes offsets ("INFO+2", "debug-4"), levels no
// operator can look up.
func logLevel(s string) (slog.Level, bool) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, true
	case "info":
		return slog.LevelInfo, true
	case "warn":
		return slog.LevelWarn, true
	case "error":
		return slog.LevelError, true
	}
	return 0, false
}

// ParseFlags reads the serve flags and their environment equivalents.
func (m *Main) ParseFlags(args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("vibejobs serve", flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	m.Config.flagSet(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return badInput(m.Config.validate())
}

func (c *Config) masterKeyPath() string {
	return cmp.Or(c.MasterKeyFile, filepath.Join(c.DataDir, "master.key"))
}

// jsonLogs reports whether c asks for JSON logs. validateStore makes the
// format lower case; before it, any case counts.
func (c *Config) jsonLogs() bool { return strings.EqualFold(c.LogFormat, "json") }

func (c *Config) newLogger(w io.Writer) *slog.Logger {
	lvl, _ := logLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.jsonLogs() {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// postgresNearMiss reports whether database, no postgres://… URL, starts
// as one does but for a slash or the colon: "postgres:" or "postgresql:"
// without the "//", or "postgres//" without the colon, in any case. No
// SQLite path is meant so: a colon is rare in a file name, and a doubled
// slash after a directory named postgres rarer still.
func postgresNearMiss(database string) bool {
	if isPostgresURL(database) {
		return false
	}
	lower := strings.ToLower(database)
	for _, scheme := range []string{"postgres", "postgresql"} {
		if strings.HasPrefix(lower, scheme+":") || strings.HasPrefix(lower, scheme+"//") {
			return true
		}
	}
	return false
}

// postgresURL returns database with its scheme in lower case, and whether
// that scheme is postgres:// or postgresql://. Schemes are case-insensitive
// (RFC 3986, section 3.1), but pgx reads a connection string as a URL only
// when it starts with one of them in lower case.
func postgresURL(database string) (string, bool) {
	scheme, rest, ok := strings.Cut(database, "://")
	scheme = strings.ToLower(scheme)
	if !ok || scheme != "postgres" && scheme != "postgresql" {
		return "", false
	}
	return scheme + "://" + rest, true
}

// keywordDSN reports whether database reads as a PostgreSQL key=value
// connection string ("host=db user=app password=…"): one of its words sets
// a libpq connection keyword.
func keywordDSN(database string) bool {
	for _, word := range strings.Fields(database) {
		key, _, ok := strings.Cut(word, "=")
		switch strings.ToLower(key) {
		case "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "sslmode", "service", "connect_timeout":
			if ok {
				return true
			}
		}
	}
	return false
}

// isURLScheme reports whether s is a URL scheme (RFC 3986, section 3.1): a
// letter, then letters, digits, "+", "-" or ".".
func isURLScheme(s string) bool {
	for i, c := range []byte(s) {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}

// isPostgresURL reports whether database names a PostgreSQL database (see
// postgresURL) rather than a SQLite file.
func isPostgresURL(database string) bool {
	_, ok := postgresURL(database)
	return ok
}

// openStore opens the configured database and runs its migrations.
func (c *Config) openStore(ctx context.Context, logger *slog.Logger, now func() time.Time) (vibejobs.Store, error) {
	if pgURL, ok := postgresURL(c.Database); ok {
		return postgres.Open(ctx, pgURL, postgres.Options{Logger: logger, Now: now})
	}
	if c.Database == "" {
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("creating data dir: %w", err)
		}
	}
	return sqlite.Open(ctx, c.sqlitePath(), sqlite.Options{Logger: logger, Now: now})
}

// sqlitePath is the SQLite file of a configuration without a PostgreSQL
// URL: --database, else vibejobs.db in the data directory.
func (c *Config) sqlitePath() string {
	return cmp.Or(c.Database, filepath.Join(c.DataDir, "vibejobs.db"))
}

// Run starts the server and returns once it is listening; the work goes on
// in the background until Close.
func (m *Main) Run(ctx context.Context) error {
	cfg := &m.Config
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8080"
	}
	m.logger = cfg.newLogger(m.Stderr)
	now := m.Now
	if now == nil {
		now = time.Now
	}
	// The egress clients read the CA file: a missing or empty one must
	// stop the start before it creates anything, as a taken port does.
	allow, _ := egress.ParseAllowList(cfg.AllowPrivate)
	policy, err := egress.NewPolicy(allow)
	if err != nil {
		return fmt.Errorf("allow-private: %w", err)
	}
	newClient := func() (*egress.Client, error) {
		return egress.NewClient(egress.Config{
			Policy: policy, CAFile: cfg.CAFile, UserAgent: "vibejobs/" + Version,
			MaxConnsPerHost: cfg.PerHost, DialContext: m.DialContext,
		})
	}
	client, err := newClient()
	if err != nil {
		return fmt.Errorf("--ca-file (VIBEJOBS_CA_FILE): %w", err)
	}
	// So are the TLS files the database URL names (sslrootcert, …),
	// which validate leaves to the use.
	if pgURL, ok := postgresURL(cfg.Database); ok {
		if _, err := pgurl.ParseConfig(pgURL); err != nil {
			return fmt.Errorf("--database (VIBEJOBS_DATABASE): %w", err)
		}
	}
	// Bind before the rest: a taken port must stop the start before it
	// creates anything (a first start prints the admin token only once).
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	m.ln = ln
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	keys, created, err := secretbox.LoadOrCreate(cfg.masterKeyPath())
	if err != nil {
		return err
	}
	if created {
		m.logger.Info("master_key.created", "path", cfg.masterKeyPath())
	}
	store, err := cfg.openStore(ctx, m.logger, now)
	if err != nil {
		return fmt.Errorf("opening database: %w", err)
	}
	m.store = store
	if err := checkMasterKey(ctx, store, keys); err != nil {
		if created && errors.Is(err, errForeignMasterKey) {
			// The key this start made is of no use to this database: leave
			// no stray key file at a mistyped path. But only that key: the
			// path may hold another file by now (the database's, moved
			// into place by the operator), perhaps its last copy.
			if onDisk, _, err := secretbox.Load(cfg.masterKeyPath()); err == nil && slices.Equal(onDisk.IDs(), keys.IDs()) {
				os.Remove(cfg.masterKeyPath())
			}
		}
		return err
	}
	sealer := newKeyFile(cfg.masterKeyPath(), keys, m.logger)
	m.sealer = sealer
	if err := m.bootstrap(ctx, now); err != nil {
		return err
	}

	met := metrics.New()
	if n, ok := store.(vibejobs.RunsEndedNotifier); ok {
		n.OnRunsEnded(met.RunsEnded)
	}
	if c, ok := store.(interface{ ClockSkew() (time.Duration, bool) }); ok {
		met.WatchClockSkew(c.ClockSkew) // PostgreSQL: replicas share its clock
	}
	owner := newOwnerID()
	var dispStore vibejobs.DispatchStore = store
	if m.WrapDispatchStore != nil {
		dispStore = m.WrapDispatchStore(store)
	}
	if n, ok := store.(vibejobs.AttemptsRecordedNotifier); ok {
		n.OnAttemptsRecorded(met.AttemptsRecorded)
	}
	obs := observers{met}
	if m.Observer != nil {
		obs = append(obs, m.Observer)
	}
	// Webhooks of the event feed: their own goroutines, concurrency and
	// client, so a receiver that hangs or refuses never holds up run
	// deliveries, not even by taking the connections the dispatcher's
	// per-host limit counts on.
	subsClient, err := newClient()
	if err != nil {
		return fmt.Errorf("egress client: %w", err)
	}
	subs := subscriptions.New(subscriptions.Config{
		Store: store, Sender: subsClient, Opener: sealer, Owner: owner,
		UserAgent: "vibejobs/" + Version, Logger: m.logger, Now: now, StoreTimeout: cfg.StoreTimeout,
	})
	met.WatchSubscriptions(store.AllSubscriptions)
	// Recorded outcomes appended run events: look for subscribers at once.
	dispStore = wakeAfterRecord{DispatchStore: dispStore, wake: subs.Wake}
	var runSender dispatcher.Sender = client
	if m.RunSender != nil {
		runSender = m.RunSender
	}
	disp := dispatcher.New(dispatcher.Config{
		Store: dispStore, Sender: runSender, Opener: sealer, Owner: owner,
		UserAgent: "vibejobs/" + Version, Logger: m.logger, Now: now,
		Concurrency: cfg.Concurrency, PerHost: cfg.PerHost, ClaimAhead: cfg.ClaimAhead, Observer: obs,
		StoreTimeout: cfg.StoreTimeout,
	})
	sched := scheduler.New(scheduler.Config{
		Store: store, Logger: m.logger, Now: now,
		OnRunsCreated: func(n int) { met.RunsCreated(n); disp.Wake() },
		OnSkipped:     met.Skipped,
		OnUnplannable: met.Unplannable,
		// While scans fail, the count is unknown: absent, like the
		// queue gauges, not the last scan's figure.
		OnUnplannableUnknown: met.UnplannableUnknown,
		StoreTimeout:         cfg.StoreTimeout,
	})
	maint := maintenance.New(maintenance.Config{
		Store: store, Logger: m.logger, Now: now, RetentionDays: cfg.RetentionDays,
		Observer: met, OnRecovered: func() { disp.Wake(); subs.Wake() },
		StoreTimeout: cfg.StoreTimeout,
	})
	met.WatchLoops(now,
		metrics.Loop{Name: "scheduler", FailingSince: sched.FailingSince},
		metrics.Loop{Name: "dispatcher", FailingSince: disp.FailingSince},
		metrics.Loop{Name: "maintenance", FailingSince: maint.FailingSince},
		metrics.Loop{Name: "webhooks", FailingSince: subs.FailingSince})
	// The dashboard limits each token's pages as the API limits its
	// requests, in a bucket of its own.
	rate := cmp.Or(cfg.RateLimit, api.DefaultRatePerSecond)
	proxies, _ := ratelimit.ParseProxies(cfg.TrustedProxies) // validated
	dashboard := web.New(web.Config{Store: store, Now: now, Logger: m.logger, TrustedProxies: proxies,
		PageLimit: web.PageLimit{PerSecond: float64(rate), Burst: 2 * rate}})
	apiSrv := api.New(api.Config{
		Store: store, Sealer: sealer, URLs: policy, Now: now, Logger: m.logger,
		Wake:                func() { sched.Wake(); disp.Wake(); subs.Wake() },
		JobChanged:          disp.JobChanged,
		RunCreated:          met.ManualRunCreated,
		OccurrencesSkipped:  met.Skipped,
		Ready:               func(context.Context) error { return loopsMoving(now(), sched, disp) },
		Stopping:            m.stopping.Load,
		Metrics:             met.Handler(),
		InstallationMetrics: met.InstallationHandler(),
		Extra:               dashboard,
		MaxJobsPerProject:   cfg.MaxJobsPerProject,
		RateLimit:           api.RateLimit{PerSecond: float64(rate), Burst: 2 * rate},
		RotationGrace:       cfg.RotationGrace,
		TrustedProxies:      proxies,
	})

	handler := apiSrv.Handler()
	if m.wrapHandler != nil {
		handler = m.wrapHandler(handler)
	}
	m.srv = &http.Server{
		Handler:           m.handlers.wrap(handler),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(m.logger.Handler(), slog.LevelWarn),
	}
	workCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	if n, ok := store.(interface {
		Notifications(context.Context) (<-chan struct{}, <-chan string)
	}); ok {
		// Other replicas' new runs wake the dispatcher; their job changes
		// withdraw its unsent claims of the job (this replica's own come
		// from the API as well; a second withdrawal finds nothing).
		wakeups, jobs := n.Notifications(workCtx)
		m.goRun(func() {
			for range wakeups {
				disp.Wake()
			}
		})
		m.goRun(func() {
			for id := range jobs {
				if id == "" {
					disp.WithdrawAll() // changes may have been missed
				} else {
					disp.JobChanged(id)
				}
			}
		})
	}
	m.goRun(func() { sched.Run(workCtx) })
	m.goRun(func() { disp.Run(workCtx) })
	m.goRun(func() { subs.Run(workCtx) })
	m.goRun(func() { maint.Run(workCtx) })
	m.served = make(chan struct{})
	go func() {
		defer close(m.served)
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.logger.Error("http.serve_failed", "error", err)
		}
	}()
	m.logger.Info("server.started", "listen", ln.Addr().String(), "owner", owner, "version", Version)
	return nil
}

func (m *Main) goRun(f func()) {
	m.wg.Add(1)
	go func() { defer m.wg.Done(); f() }()
}

// Addr is the address the server listens on (after Run).
func (m *Main) Addr() string { return m.ln.Addr().String() }

// Store is the open store (after Run); tests inspect it.
func (m *Main) Store() vibejobs.Store { return m.store }

// Close stops the server, in the order a load balancer or an orchestrator
// expects of a replica on its way out:
//
//  1. At once, /readyz answers 503 stopping, while the listener stays open
//     and every other route answers as before; responses close their
//     connections (idle ones are closed), so that clients come back
//     through the load balancer, which sends them elsewhere.
//  2. The background loops stop: no run is claimed, no occurrence planned.
//     Claims waiting for their host go back to the queue unsent, claims
//     held ahead go out at their time, and every attempt in flight runs to
//     its answer or its job's timeout and its outcome is recorded (an
//     outcome the database does not take, or a claim it does not take
//     back, is given up dispatcher.DefaultStopRecordTimeout after the last
//     attempt ended, for lease recovery to send again). Webhook deliveries
//     in flight finish too.
//  3. Then the listener closes and the API requests in progress get up to
//     DrainTimeout; connections still busy after it are cut, and their
//     handlers get up to HandlerExitTimeout to return.
//  4. The database is closed: no handler uses it afterwards, unless one
//     outlasted HandlerExitTimeout (logged), whose store calls then fail.
//
// With nothing in flight and no request held open, each step is immediate.
// The deliveries come before the drain: they are what a stop must not
// lose, and a SIGKILL past the grace period then cuts only requests from
// clients that ignored /readyz.
func (m *Main) Close() error {
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	if m.srv == nil && m.ln != nil {
		errs = append(errs, m.ln.Close()) // Run failed before serving
	}
	drain := cmp.Or(m.Config.DrainTimeout, DefaultDrainTimeout)
	if m.srv != nil {
		m.stopping.Store(true)
		m.srv.SetKeepAlivesEnabled(false)
		// Said at once: the stop can take a job's timeout and more, and an
		// operator watching the log should see that it began.
		m.logger.Info("server.stopping", "drain", drain.String())
	}
	if m.cancel != nil {
		m.cancel()
	}
	m.wg.Wait()
	if m.srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), drain)
		if err := m.srv.Shutdown(sctx); errors.Is(err, context.DeadlineExceeded) {
			// A client holds a request open (a body that never comes):
			// its connection is cut, which ends its handler's wait, and
			// the stop is no failure for it.
			m.logger.Warn("http.drain_timeout", "waited", drain.String())
			_ = m.srv.Close()
		} else {
			errs = append(errs, err)
		}
		cancel()
		if m.served != nil {
			<-m.served
		}
		// Close cut the connections but does not wait for their handlers,
		// which may still be on their way out through the store (freeing
		// an idempotency key, say): closed under them, it failed their
		// calls, and a key stayed claimed.
		exit := cmp.Or(m.Config.HandlerExitTimeout, DefaultHandlerExitTimeout)
		if n := m.handlers.stop(); n > 0 {
			m.logger.Warn("http.handlers_running", "handlers", n, "wait", exit.String())
			if n := m.handlers.wait(exit); n > 0 {
				m.logger.Error("http.handlers_abandoned", "handlers", n)
			}
		}
	}
	if m.store != nil {
		errs = append(errs, m.store.Close())
	}
	if m.logger != nil && m.srv != nil {
		m.logger.Info("server.stopped")
	}
	return errors.Join(errs...)
}

// bootstrap creates the default project and the installation token on the
// first start, prints the token once and writes it to <data-dir>/admin.token.
func (m *Main) bootstrap(ctx context.Context, now func() time.Time) error {
	token, created, err := api.Bootstrap(ctx, m.store, now(), rand.Reader)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if !created {
		return nil
	}
	m.AdminToken = token
	path := filepath.Join(m.Config.DataDir, "admin.token")
	// Shown before it is saved: the token is committed, and no later start
	// creates one again, so a start that failed to save it must not fail
	// to show it.
	fmt.Fprintf(m.Stdout, "Created project \"default\" and an admin API token (shown once):\n\n    %s\n\n", token)
	if err := privatefile.Replace(path, []byte(token+"\n")); err != nil {
		fmt.Fprintf(m.Stdout, "It could not be saved (%v): keep it from above.\n\n", err)
		m.logger.Warn("admin_token.not_saved", "error", err.Error())
		return nil
	}
	fmt.Fprintf(m.Stdout, "It is also saved to %s (mode 0600).\n\n", path)
	return nil
}

// errForeignMasterKey is checkMasterKey's refusal of a key file that lacks
// the database's master key.
var errForeignMasterKey = errors.New("wrong master key")

// checkMasterKey refuses to start when stored secrets do not open with the
// master key: the server would otherwise send deliveries with bad
// signatures. Nor does it start when the key file lacks the database's
// master key (recorded by the first server to start), even before any
// secret is stored: servers sharing a database with different key files
// would each seal secrets the others cannot open.
func checkMasterKey(ctx context.Context, store vibejobs.Store, keys *secretbox.Keyring) error {
	return store.Update(ctx, func(tx vibejobs.Tx) error {
		id, err := tx.RecordMasterKey(ctx, keys.CurrentID())
		if err != nil {
			return fmt.Errorf("checking master key: %w", err)
		}
		if !slices.Contains(keys.IDs(), id) {
			return fmt.Errorf("%w: the master key file holds no key %s, the master key of this database: every server sharing a database needs the same key file (wrong VIBEJOBS_MASTER_KEY_FILE?)", errForeignMasterKey, id)
		}
		jobs, err := tx.SecretsNotUnder(ctx, "", 5)
		if err != nil {
			return fmt.Errorf("checking master key: %w", err)
		}
		for _, j := range jobs {
			if _, err := keys.Open(j.Secret, j.ID); err != nil {
				return fmt.Errorf("the master key does not open the stored job secrets (wrong VIBEJOBS_MASTER_KEY_FILE?): %w", err)
			}
		}
		subs, err := tx.SubscriptionSecretsNotUnder(ctx, "", 5)
		if err != nil {
			return fmt.Errorf("checking master key: %w", err)
		}
		for _, s := range subs {
			if _, err := keys.Open(s.Secret, s.ID); err != nil {
				return fmt.Errorf("the master key does not open the stored subscription secrets (wrong VIBEJOBS_MASTER_KEY_FILE?): %w", err)
			}
		}
		return nil
	})
}

func newOwnerID() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", cmp.Or(host, "host"), os.Getpid(), hex.EncodeToString(b[:]))
}

// loopStallLimit is how long the scheduler or the dispatcher may fail every
// pass against the database before the server says it is not ready: long
// enough for a pass or two ending at the default StoreTimeout.
const loopStallLimit = 30 * time.Second

// loopsMoving fails, for /readyz, when the scheduler or the dispatcher has
// failed every pass against the database for longer than loopStallLimit at
// now: the database may still answer Ping (a statement of theirs that
// keeps timing out, a full disk that refuses new rows), but no run is
// created or delivered. Loops with nothing to do are moving.
func loopsMoving(now time.Time, sched *scheduler.Scheduler, disp *dispatcher.Dispatcher) error {
	for _, l := range []struct {
		name  string
		since time.Time
	}{{"scheduler", sched.FailingSince()}, {"dispatcher", disp.FailingSince()}} {
		if !l.since.IsZero() && now.Sub(l.since) > loopStallLimit {
			return fmt.Errorf("the %s has failed every pass against the database since %s", l.name, l.since.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// runningHandlers counts the HTTP handlers running. http.Server.Shutdown
// waits for them, but Close, which cuts the connections Shutdown did not
// see idle in time, does not. The zero value is ready for use.
type runningHandlers struct {
	mu      sync.Mutex
	n       int
	stopped bool
	// idle is closed when n falls to 0 after stop; nil until then.
	idle chan struct{}
}

// wrap counts h's calls. A call that begins after stop is aborted: its
// connection is closed already.
func (rh *runningHandlers) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rh.mu.Lock()
		if rh.stopped {
			rh.mu.Unlock()
			panic(http.ErrAbortHandler)
		}
		rh.n++
		rh.mu.Unlock()
		defer func() {
			rh.mu.Lock()
			if rh.n--; rh.n == 0 && rh.idle != nil {
				close(rh.idle)
			}
			rh.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

// stop refuses the handlers still to begin and returns how many run.
func (rh *runningHandlers) stop() int {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	if !rh.stopped {
		rh.stopped = true
		rh.idle = make(chan struct{})
		if rh.n == 0 {
			close(rh.idle)
		}
	}
	return rh.n
}

// wait waits, after stop, up to timeout for the running handlers to
// return, and returns how many still run.
func (rh *runningHandlers) wait(timeout time.Duration) int {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-rh.idle:
	case <-t.C:
	}
	rh.mu.Lock()
	defer rh.mu.Unlock()
	return rh.n
}

// wakeAfterRecord wakes the subscription deliverer after outcomes were
// recorded: they appended run events. Polling alone would add up to its
// interval to every event's delay.
type wakeAfterRecord struct {
	vibejobs.DispatchStore
	wake func()
}

func (w wakeAfterRecord) RecordOutcomes(ctx context.Context, owner string, outcomes []vibejobs.Outcome) error {
	err := w.DispatchStore.RecordOutcomes(ctx, owner, outcomes)
	if err == nil {
		w.wake()
	}
	return err
}

// ReadClaims passes vibejobs.ClaimReader on, which the embedded interface
// would hide: none when the store cannot read claims back (SQLite, whose
// claims cannot lose their answer on the way).
func (w wakeAfterRecord) ReadClaims(ctx context.Context, owner string, now time.Time) ([]*vibejobs.Claim, error) {
	if r, ok := w.DispatchStore.(vibejobs.ClaimReader); ok {
		return r.ReadClaims(ctx, owner, now)
	}
	return nil, nil
}

// observers fans dispatcher events out to several observers.
type observers []dispatcher.Observer

func (o observers) AttemptFinished(code string, step vibejobs.Step, late time.Duration, first bool, d time.Duration) {
	for _, x := range o {
		x.AttemptFinished(code, step, late, first, d)
	}
}

func (o observers) SecretUnavailable() {
	for _, x := range o {
		x.SecretUnavailable()
	}
}
