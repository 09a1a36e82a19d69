package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/postgres"
)

// TestClaimAheadSetting: --claim-ahead and VIBEJOBS_CLAIM_AHEAD take a window
// from 0 to 1s, 0 meaning off (negative for the dispatcher), and anything
// else is refused with a message naming the range.
func TestClaimAheadSetting(t *testing.T) {
	for _, tc := range []durationCase{
		{want: 0}, // the dispatcher's default
		{args: []string{"--claim-ahead", "50ms"}, want: 50 * time.Millisecond},
		{args: []string{"--claim-ahead", "0"}, want: -1},
		{env: "0s", want: -1},
		{env: "1s", want: time.Second},
		{env: "300ms", args: []string{"--claim-ahead", "100ms"}, want: 100 * time.Millisecond},
		{args: []string{"--claim-ahead", "2s"}, bad: true},
		{args: []string{"--claim-ahead", "-5ms"}, bad: true},
		{args: []string{"--claim-ahead", "soon"}, bad: true},
		{env: "1.5s", bad: true},
		{env: "-1ms", bad: true},
		{env: "200", bad: true},
	} {
		checkDurationSetting(t, tc, "VIBEJOBS_CLAIM_AHEAD", "from 0 to 1s", func(c Config) time.Duration { return c.ClaimAhead })
	}
}

// durationCase is a serve flag or variable holding a duration: args and env
// as given, and the setting wanted, or bad.
type durationCase struct {
	args []string
	env  string
	want time.Duration // ignored when bad
	bad  bool
}

// checkDurationSetting parses tc with env as the variable's value; a bad
// case must be refused with a message holding rangeText, a good one give
// setting(Config) = tc.want.
func checkDurationSetting(t *testing.T, tc durationCase, env, rangeText string, setting func(Config) time.Duration) {
	t.Helper()
	m := NewMain(io.Discard, io.Discard)
	getenv := func(k string) string {
		if k == env {
			return tc.env
		}
		return ""
	}
	err := m.ParseFlags(tc.args, getenv)
	switch {
	case tc.bad && (err == nil || !strings.Contains(err.Error(), rangeText)):
		t.Errorf("args %q env %q: err %v, want one naming the range", tc.args, tc.env, err)
	case !tc.bad && err != nil:
		t.Errorf("args %q env %q: %v", tc.args, tc.env, err)
	case !tc.bad && setting(m.Config) != tc.want:
		t.Errorf("args %q env %q: %s %v, want %v", tc.args, tc.env, env, setting(m.Config), tc.want)
	}
}

// TestRotationGraceSetting: --subscription-rotation-grace and its variable
// take 1m to 720h; anything else, 0 included, is refused naming the range.
func TestRotationGraceSetting(t *testing.T) {
	for _, tc := range []durationCase{
		{want: 24 * time.Hour},
		{args: []string{"--subscription-rotation-grace", "1m"}, want: time.Minute},
		{env: "720h", want: 720 * time.Hour},
		{args: []string{"--subscription-rotation-grace", "0"}, bad: true},
		{env: "0s", bad: true},
		{env: "59s", bad: true},
		{args: []string{"--subscription-rotation-grace", "721h"}, bad: true},
		{args: []string{"--subscription-rotation-grace", "-1h"}, bad: true},
		{env: "a day", bad: true},
	} {
		checkDurationSetting(t, tc, "VIBEJOBS_SUBSCRIPTION_ROTATION_GRACE", "from 1m to 720h",
			func(c Config) time.Duration { return c.RotationGrace })
	}
}

// TestIntegerSettingsBounds: the integer settings refuse values past their
// upper bounds with a message naming the range, from a flag or from the
// environment. A huge concurrency panicked the dispatcher at start, and a
// huge retention overflowed the prune cutoff into the future, pruning every
// finished run.
func TestIntegerSettingsBounds(t *testing.T) {
	for _, tc := range []struct {
		flag, env, value, rangeText string
	}{
		{"--concurrency", "VIBEJOBS_CONCURRENCY", "1125899906842624", "from 1 to 10000"},
		{"--concurrency", "VIBEJOBS_CONCURRENCY", "10001", "from 1 to 10000"},
		{"--per-host", "VIBEJOBS_PER_HOST", "10001", "from 1 to 10000"},
		{"--retention-days", "VIBEJOBS_RETENTION_DAYS", "9223372036854775807", "from 7 to 3650"},
		{"--retention-days", "VIBEJOBS_RETENTION_DAYS", "3651", "from 7 to 3650"},
		{"--retention-days", "VIBEJOBS_RETENTION_DAYS", "6", "from 7 to 3650"},
		// Refused from a flag as "a positive integer", which 1 … 6 are.
		{"--retention-days", "VIBEJOBS_RETENTION_DAYS", "0", "from 7 to 3650"},
		{"--retention-days", "VIBEJOBS_RETENTION_DAYS", "-30", "from 7 to 3650"},
		{"--concurrency", "VIBEJOBS_CONCURRENCY", "0", "from 1 to 10000"},
		{"--rate-limit", "VIBEJOBS_RATE_LIMIT", "4611686018427387904", "from 1 to 1000000"},
	} {
		fromEnv := func(k string) string {
			if k == tc.env {
				return tc.value
			}
			return ""
		}
		for what, parse := range map[string]func(m *Main) error{
			"flag": func(m *Main) error {
				return m.ParseFlags([]string{tc.flag, tc.value}, func(string) string { return "" })
			},
			"env": func(m *Main) error { return m.ParseFlags(nil, fromEnv) },
		} {
			if err := parse(NewMain(io.Discard, io.Discard)); err == nil || !strings.Contains(err.Error(), tc.rangeText) {
				t.Errorf("%s %s=%s: %v, want an error naming the range %q", what, tc.env, tc.value, err, tc.rangeText)
			}
		}
	}
	m := NewMain(io.Discard, io.Discard)
	if err := m.ParseFlags([]string{"--concurrency", "10000", "--retention-days", "3650", "--rate-limit", "1000000"}, func(string) string { return "" }); err != nil {
		t.Fatalf("the bounds themselves: %v", err)
	}
	if err := NewMain(io.Discard, io.Discard).ParseFlags([]string{"--retention-days", "7"}, func(string) string { return "" }); err != nil {
		t.Fatalf("--retention-days 7, the minimum: %v", err)
	}
	for _, v := range []string{"ninety", "90d", "7.5", " 30"} {
		if err := NewMain(io.Discard, io.Discard).ParseFlags([]string{"--retention-days", v}, func(string) string { return "" }); err == nil {
			t.Errorf("--retention-days %q accepted", v)
		}
		env := func(k string) string {
			if k == "VIBEJOBS_RETENTION_DAYS" {
				return v
			}
			return ""
		}
		if err := NewMain(io.Discard, io.Discard).ParseFlags(nil, env); err == nil {
			t.Errorf("VIBEJOBS_RETENTION_DAYS=%q accepted", v)
		}
	}
}

// TestHelpIsNotAnError: -h prints a command's usage and exits 0, as the
// top-level usage ("see vibejobs serve -h") invites; serve, migrate and
// master-key rotate reported it as a usage error (exit 2).
func TestHelpIsNotAnError(t *testing.T) {
	for _, args := range [][]string{{"serve", "-h"}, {"migrate", "-h"}, {"master-key", "rotate", "-h"}, {"bench", "burst", "-h"}, {"jobs", "create", "-h"},
		// These answered with a usage error, exit 2.
		{"master-key", "-h"}, {"master-key", "--help"}, {"bench", "--help"}} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, func(string) string { return "" }, &out, &errb)
		if code != 0 || strings.Contains(errb.String(), "error:") || !strings.Contains(out.String()+errb.String(), "-") {
			t.Errorf("vibejobs %s: exit %d, stderr %q", strings.Join(args, " "), code, errb.String())
		}
	}
}

// TestBenchRefusesExtraArgument: "bench burst 5000" ran the default 20,000
// runs; like every other command, bench refuses an argument it does not
// take.
func TestBenchRefusesExtraArgument(t *testing.T) {
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"bench", "burst", "--runs", "1", "5000"}, func(string) string { return "" }, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), `"5000"`) {
		t.Fatalf("bench burst --runs 1 5000: exit %d, stderr %q; want 2 and the argument named", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"bench", "burst", "--per-host", "-1"}, func(string) string { return "" }, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), "--per-host") {
		t.Fatalf("bench burst --per-host -1: exit %d, stderr %q; want 2 and the flag named", code, errb.String())
	}
	for _, d := range []string{"-1s", "2m"} {
		errb.Reset()
		if code := run(context.Background(), []string{"bench", "burst", "--receiver-delay", d}, func(string) string { return "" }, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), "--receiver-delay") {
			t.Fatalf("bench burst --receiver-delay %s: exit %d, stderr %q; want 2 and the flag named", d, code, errb.String())
		}
	}
}

// TestSettingsErrorsNameTheFlag: a refused setting's message names the flag
// and its variable, and what it takes; a database URL of another kind is
// refused rather than opened as a SQLite file of that name; an empty
// --listen or --data-dir is refused rather than read as the default; the
// log format is read regardless of case, as the log level is.
func TestSettingsErrorsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--concurrency", "10001"}, "--concurrency (VIBEJOBS_CONCURRENCY) must be an integer from 1 to 10000"},
		{[]string{"--log-level", "trace"}, "--log-level (VIBEJOBS_LOG_LEVEL) must be debug, info, warn or error"},
		{[]string{"--log-level", "INFO+2"}, "--log-level (VIBEJOBS_LOG_LEVEL) must be debug, info, warn or error"},
		{[]string{"--log-level", "debug-4"}, "--log-level (VIBEJOBS_LOG_LEVEL) must be debug, info, warn or error"},
		{[]string{"--log-level", ""}, "--log-level (VIBEJOBS_LOG_LEVEL) must be debug, info, warn or error"},
		{[]string{"--log-format", "xml"}, "--log-format (VIBEJOBS_LOG_FORMAT) must be text or json"},
		{[]string{"--database", "mysql://db/x"}, `--database (VIBEJOBS_DATABASE): "mysql" URLs are not supported`},
		// Taken as a SQLite path, it was a file named after it, password
		// and all, or an error that printed it whole.
		{[]string{"--database", "host=db user=app password=hunter2 dbname=jobs"},
			"--database (VIBEJOBS_DATABASE) is a key=value connection string: give a postgres://… URL"},
		// What stands before "://" is no scheme: it was quoted as one.
		{[]string{"--database", "app:hunter2@127.0.0.1://jobs"},
			`--database (VIBEJOBS_DATABASE) holds "://" but is no postgres://… URL`},
		{[]string{"--database", "postgres:/app:hunter2@db.example/jobs"},
			"--database (VIBEJOBS_DATABASE) starts with a PostgreSQL scheme but is no postgres://… URL"},
		{[]string{"--database", "PostgreSQL:app:hunter2@db.example"},
			"--database (VIBEJOBS_DATABASE) starts with a PostgreSQL scheme but is no postgres://… URL"},
		{[]string{"--database", "postgres//app:hunter2@db.example/jobs"},
			"--database (VIBEJOBS_DATABASE) starts with a PostgreSQL scheme but is no postgres://… URL"},
		{[]string{"--database", "POSTGRESQL//app:hunter2@db.example/jobs"},
			"--database (VIBEJOBS_DATABASE) starts with a PostgreSQL scheme but is no postgres://… URL"},
		// Given empty (an unset shell variable), it listened on the default.
		{[]string{"--listen", ""}, "--listen (VIBEJOBS_LISTEN) must not be empty: give a host:port"},
		{[]string{"--data-dir", ""}, "--data-dir (VIBEJOBS_DATA_DIR) must not be empty"},
		{[]string{"--trusted-proxies", "10.0.0.0/8,proxy.example"}, `--trusted-proxies (VIBEJOBS_TRUSTED_PROXIES): trusted proxies: "proxy.example" is neither`},
	} {
		err := NewMain(io.Discard, io.Discard).ParseFlags(tc.args, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: the error quotes the password: %v", tc.args, err)
		}
	}
	m := NewMain(io.Discard, io.Discard)
	if err := m.ParseFlags([]string{"--log-format", "JSON", "--log-level", "DEBUG"}, func(string) string { return "" }); err != nil || m.Config.LogFormat != "json" {
		t.Fatalf("--log-format JSON: %v (%q)", err, m.Config.LogFormat)
	}
}

// TestPostgresSchemeInAnyCase: URL schemes are case-insensitive, so
// --database takes postgres:// and postgresql:// in any case, and opens
// PostgreSQL with it (pgx reads a URL only with a lower-case scheme). An
// upper-case scheme was refused as "not supported".
func TestPostgresSchemeInAnyCase(t *testing.T) {
	for _, scheme := range []string{"POSTGRES", "PostgreSQL", "postgresql"} {
		m := NewMain(io.Discard, io.Discard)
		if err := m.ParseFlags([]string{"--database", scheme + "://db.example/x"}, func(string) string { return "" }); err != nil {
			t.Errorf("--database %s://…: %v", scheme, err)
		}
	}

	base, _ := pgReplicaURL(t, "")
	_, rest, _ := strings.Cut(base, "://")
	dir := t.TempDir()
	m := NewMain(io.Discard, io.Discard)
	if err := m.ParseFlags([]string{"--data-dir", dir, "--database", "POSTGRESQL://" + rest}, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := m.Config.openStore(ctx, m.Config.newLogger(io.Discard), time.Now)
	if err != nil {
		t.Fatalf("opening POSTGRESQL://…: %v", err)
	}
	defer st.Close()
	if _, ok := st.(*postgres.Store); !ok {
		t.Errorf("POSTGRESQL://… opened a %T, want a *postgres.Store", st)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("POSTGRESQL://… created %s in the data directory", entries[0].Name())
	}
}

// TestBadCAFileStopsTheStartFirst: a CA file that is missing or holds no
// certificate stops the start, its message naming the flag, before
// anything is created: a first start used to create the database and the
// master key, mint and print the admin token, and only then fail.
func TestBadCAFileStopsTheStartFirst(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ca := range []string{filepath.Join(t.TempDir(), "missing.pem"), empty} {
		dir := filepath.Join(t.TempDir(), "data")
		var stdout strings.Builder
		m := NewMain(&stdout, io.Discard)
		m.Config = Config{
			Listen: "127.0.0.1:0", DataDir: dir, CAFile: ca,
			LogFormat: "text", LogLevel: "info", Concurrency: 4, PerHost: 4,
			RetentionDays: 90, MaxJobsPerProject: 10,
		}
		err := m.Run(context.Background())
		m.Close()
		if err == nil || !strings.Contains(err.Error(), "--ca-file (VIBEJOBS_CA_FILE)") {
			t.Errorf("CA file %s: Run: %v, want an error naming --ca-file", filepath.Base(ca), err)
		}
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("CA file %s: the data directory was created (%v)", filepath.Base(ca), serr)
		}
		if m.AdminToken != "" || stdout.Len() > 0 {
			t.Errorf("CA file %s: an admin token was minted and printed", filepath.Base(ca))
		}
	}
}

// TestExitCodes: through the command's entry point, a command line or an
// environment wrong in itself (a flag or a variable that does not parse, a
// value out of range or malformed) exits with 2, as the flag package's own
// refusals do, before anything is opened; a failure of the work a
// well-formed setting asks for (a port taken, a file missing) exits with
// 1. Values the flag package parsed but the command then refused, and
// every refused variable, exited with 1.
func TestExitCodes(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		// osenv is set in the process's environment, which the API
		// commands read.
		osenv map[string]string
		code  int
		want  string // in stderr
	}{
		// A flag that does not parse, or an argument: the flag package's kind.
		{"flag not an integer", []string{"serve", "--concurrency", "abc"}, nil, nil, 2, "must be an integer"},
		{"unknown flag", []string{"serve", "--colour", "red"}, nil, nil, 2, "colour"},
		{"argument", []string{"serve", "now"}, nil, nil, 2, `"now"`},
		// A flag's value out of range or malformed.
		{"flag out of range", []string{"serve", "--concurrency", "0"}, nil, nil, 2, "--concurrency (VIBEJOBS_CONCURRENCY)"},
		{"log format", []string{"serve", "--log-format", "xml"}, nil, nil, 2, "--log-format"},
		{"listen without a port", []string{"serve", "--listen", "8080"}, nil, nil, 2, "--listen (VIBEJOBS_LISTEN)"},
		{"listen port out of range", []string{"serve", "--listen", "127.0.0.1:70000"}, nil, nil, 2, "--listen (VIBEJOBS_LISTEN)"},
		{"database URL that does not parse", []string{"serve", "--database", "postgres://app@127.0.0.1:port/jobs"}, nil, nil, 2, "--database (VIBEJOBS_DATABASE)"},
		{"database of another kind", []string{"serve", "--database", "mysql://db.example/jobs"}, nil, nil, 2, "--database"},
		// The same from the environment.
		{"variable not an integer", []string{"serve"}, map[string]string{"VIBEJOBS_CONCURRENCY": "abc"}, nil, 2, "VIBEJOBS_CONCURRENCY"},
		{"variable out of range", []string{"serve"}, map[string]string{"VIBEJOBS_RETENTION_DAYS": "1"}, nil, 2, "VIBEJOBS_RETENTION_DAYS"},
		{"variable duration", []string{"serve"}, map[string]string{"VIBEJOBS_CLAIM_AHEAD": "5s"}, nil, 2, "VIBEJOBS_CLAIM_AHEAD"},
		{"variable allow list", []string{"serve"}, map[string]string{"VIBEJOBS_ALLOW_PRIVATE": "intranet"}, nil, 2, "VIBEJOBS_ALLOW_PRIVATE"},
		{"variable listen", []string{"serve"}, map[string]string{"VIBEJOBS_LISTEN": "localhost"}, nil, 2, "VIBEJOBS_LISTEN"},
		{"migrate flag", []string{"migrate", "--log-level", "loud"}, nil, nil, 2, "--log-level"},
		{"migrate variable", []string{"migrate"}, map[string]string{"VIBEJOBS_LOG_FORMAT": "xml"}, nil, 2, "VIBEJOBS_LOG_FORMAT"},
		{"migrate serve flag", []string{"migrate", "--concurrency", "4"}, nil, nil, 2, "setting of vibejobs serve"},
		{"rotate empty data dir", []string{"master-key", "rotate", "--data-dir", ""}, nil, nil, 2, "--data-dir"},
		{"rotate variable", []string{"master-key", "rotate"}, map[string]string{"VIBEJOBS_DATABASE": "host=db user=app"}, nil, 2, "VIBEJOBS_DATABASE"},
		// Well-formed settings whose use fails.
		{"port taken", []string{"serve", "--listen", taken.Addr().String()}, nil, nil, 1, "listening"},
		{"CA file missing", []string{"serve", "--ca-file", missing}, nil, nil, 1, "--ca-file"},
		{"database URL's sslrootcert missing", []string{"serve", "--database", "postgres://app@127.0.0.1:1/jobs?sslrootcert=" + missing}, nil, nil, 1,
			"--database (VIBEJOBS_DATABASE): cannot read the sslrootcert file"},
		{"migrate sslrootcert missing", []string{"migrate", "--database", "postgres://app@127.0.0.1:1/jobs?sslrootcert=" + missing}, nil, nil, 1,
			"cannot read the sslrootcert file"},
		{"database directory missing", []string{"migrate", "--database", filepath.Join(missing, "vibejobs.db")}, nil, nil, 1, "migrating"},
		{"master key file missing", []string{"master-key", "rotate"}, nil, nil, 1, "master key file"},
		// The API commands, which read the process's environment; none
		// gets as far as a request.
		{"CLI flag", []string{"jobs", "list", "--limit", "many"}, nil, nil, 2, "--limit"},
		{"CLI server variable", []string{"jobs", "list"}, nil, map[string]string{"VIBEJOBS_SERVER": "ftp://127.0.0.1", "VIBEJOBS_TOKEN": "vjt_x"}, 2, "VIBEJOBS_SERVER"},
		{"CLI token variable", []string{"jobs", "list"}, nil, map[string]string{"VIBEJOBS_TOKEN": "vjt_x\nvjt_y"}, 2, "VIBEJOBS_TOKEN"},
		{"CLI token file missing", []string{"jobs", "list"}, nil, map[string]string{"VIBEJOBS_TOKEN": "", "VIBEJOBS_DATA_DIR": missing}, 1, "no API token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Were a refusal missed, serve would start on a port of its own.
			env := map[string]string{"VIBEJOBS_DATA_DIR": filepath.Join(t.TempDir(), "data"), "VIBEJOBS_LISTEN": "127.0.0.1:0"}
			for k, v := range tc.env {
				env[k] = v
			}
			for k, v := range tc.osenv {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			code := run(context.Background(), tc.args, func(k string) string { return env[k] }, io.Discard, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("vibejobs %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}
