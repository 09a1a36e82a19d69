package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/secretbox"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// testAPI is the real API on a real SQLite store, with its bootstrap token.
type testAPI struct {
	url, token string
	srv        *httptest.Server
}

func startAPI(t *testing.T, wrap func(http.Handler) http.Handler) *testAPI {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, _ := secretbox.NewKey()
	keys, err := secretbox.Parse([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	policy, _ := egress.NewPolicy([]string{"127.0.0.0/8"})
	now := time.Date(2026, 10, 9, 8, 0, 0, 0, time.UTC)
	tok, _, err := api.Bootstrap(ctx, st, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = api.New(api.Config{Store: st, Sealer: keys, URLs: policy, Now: func() time.Time { return now },
		Logger: slog.New(slog.DiscardHandler)}).Handler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testAPI{url: srv.URL, token: tok, srv: srv}
}

// cli runs one command against a; it returns stdout, stderr and the error.
func (a *testAPI) cli(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		switch k {
		case "VIBEJOBS_SERVER":
			return a.url
		case "VIBEJOBS_TOKEN":
			return a.token
		}
		return ""
	}
	err := run(context.Background(), args, getenv, &out, &errOut, func(c *client) {
		c.sleep = func(context.Context, time.Duration) error { return nil }
	})
	return out.String(), errOut.String(), err
}

// ok runs a command that must succeed.
func (a *testAPI) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := a.cli(t, args...)
	if err != nil {
		t.Fatalf("vibejobs %s: %v\nstderr: %s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// okJSON runs a command with --json and decodes its output.
func (a *testAPI) okJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out := a.ok(t, append(args, "--json")...)
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("vibejobs %s --json: %v: %q", strings.Join(args, " "), err, out)
	}
	return m
}

func TestJobCommands(t *testing.T) {
	a := startAPI(t, nil)

	// create: a table and the secret, once.
	out := a.ok(t, "jobs", "create", "--name", "nightly", "--schedule", "0 3 * * *", "--timezone", "Europe/Paris",
		"--url", "https://example.test/hook", "--max-attempts", "3", "--min-backoff", "10s", "--max-backoff", "2h",
		"--timeout", "15s", "--catch-up", "latest")
	for _, want := range []string{"FIELD", "VALUE", "nightly", "0 3 * * *", "Europe/Paris", "3 attempts, backoff 10s to 2h", "15s", "latest", "secret: vjs_"} {
		if !strings.Contains(out, want) {
			t.Errorf("create output lacks %q:\n%s", want, out)
		}
	}
	created := a.okJSON(t, "jobs", "create", "--name", "every minute", "--schedule", "@every 1m", "--url", "https://example.test/2")
	id := created["id"].(string)
	if s, _ := created["secret"].(string); !strings.HasPrefix(s, "vjs_") {
		t.Errorf("create --json: %v", created)
	}
	oneOff := a.okJSON(t, "jobs", "create", "--name", "once", "--at", "2026-10-10T00:00:00Z", "--url", "https://example.test/3", "--paused")
	if oneOff["state"] != "paused" || oneOff["at"] != "2026-10-10T00:00:00.000Z" {
		t.Errorf("one-off paused: %v", oneOff)
	}

	// list: table with headers, and JSON.
	out = a.ok(t, "jobs", "list")
	for _, want := range []string{"ID", "NAME", "SCHEDULE", "STATE", "NEXT RUN", id, "every minute", "at 2026-10-10T00:00:00.000Z"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	if l := a.okJSON(t, "jobs", "list", "--all"); len(l["jobs"].([]any)) != 3 {
		t.Errorf("list --json: %v", l)
	}
	_, errOut, err := a.cli(t, "jobs", "list", "--limit", "1")
	if err != nil || !strings.Contains(errOut, "more: --cursor") {
		t.Errorf("paged list: %v %q", err, errOut)
	}

	// get (flags after the argument), update, pause, resume.
	if g := a.okJSON(t, "jobs", "get", id); g["id"] != id || g["secret"] != nil {
		t.Errorf("get: %v", g)
	}
	if out := a.ok(t, "jobs", "get", id); !strings.Contains(out, "every minute") || strings.Contains(out, "vjs_") {
		t.Errorf("get table:\n%s", out)
	}
	u := a.okJSON(t, "jobs", "update", id, "--name", "renamed", "--timeout", "20s")
	if u["name"] != "renamed" || u["timeout"] != "20s" || u["schedule"] != "@every 1m" {
		t.Errorf("update: %v", u)
	}
	if p := a.okJSON(t, "jobs", "pause", id); p["state"] != "paused" {
		t.Errorf("pause: %v", p)
	}
	if r := a.okJSON(t, "jobs", "resume", id); r["state"] != "active" {
		t.Errorf("resume: %v", r)
	}
	if p := a.okJSON(t, "jobs", "update", "--enabled=false", id); p["enabled"] != false {
		t.Errorf("update --enabled=false: %v", p)
	}
	a.ok(t, "jobs", "resume", id)

	// next.
	n := a.okJSON(t, "jobs", "next", id, "--count", "3")
	if times := n["times"].([]any); len(times) != 3 || times[0] != "2026-10-09T08:01:00.000Z" {
		t.Errorf("next: %v", n)
	}
	if out := a.ok(t, "jobs", "next", id); !strings.Contains(out, "FIRE TIME") || strings.Count(out, "\n") != 6 {
		t.Errorf("next table:\n%s", out)
	}

	// trigger, then the runs.
	run := a.okJSON(t, "jobs", "trigger", id)
	runID := run["id"].(string)
	if run["trigger"] != "manual" || run["state"] != "scheduled" {
		t.Errorf("trigger: %v", run)
	}
	if out := a.ok(t, "jobs", "trigger", id); !strings.Contains(out, "manual") {
		t.Errorf("trigger table:\n%s", out)
	}
	out = a.ok(t, "runs", "list", "--job", id)
	for _, want := range []string{"ID", "TRIGGER", "SCHEDULED FOR", "STATE", runID, "manual"} {
		if !strings.Contains(out, want) {
			t.Errorf("runs list lacks %q:\n%s", want, out)
		}
	}
	if l := a.okJSON(t, "runs", "list", "--state", "scheduled"); len(l["runs"].([]any)) != 2 {
		t.Errorf("runs list --json: %v", l)
	}
	if r := a.okJSON(t, "runs", "get", runID); r["id"] != runID || r["attempts"] == nil {
		t.Errorf("runs get: %v", r)
	}
	if out := a.ok(t, "runs", "get", runID); !strings.Contains(out, runID) {
		t.Errorf("runs get table:\n%s", out)
	}

	// rotate-secret prints the new secret.
	rot := a.okJSON(t, "jobs", "rotate-secret", id)
	if s, _ := rot["secret"].(string); !strings.HasPrefix(s, "vjs_") || s == created["secret"] {
		t.Errorf("rotate-secret: %v", rot)
	}

	// delete, then the job is gone.
	if out := a.ok(t, "jobs", "delete", id); !strings.Contains(out, "deleted job "+id) {
		t.Errorf("delete: %q", out)
	}
	_, _, err = a.cli(t, "jobs", "get", id)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || err.Error() != "job_not_found: job not found" {
		t.Errorf("get after delete: %v", err)
	}
	// Its runs stay listed while the history keeps them.
	if out := a.ok(t, "runs", "list", "--job", id); !strings.Contains(out, runID) {
		t.Errorf("runs list --job of the deleted job lacks %s:\n%s", runID, out)
	}
}

// TestNextOfAPausedJob: jobs next on a paused job lists its schedule's
// times, as the API does, and says on stderr that none of them runs while
// the job stays paused; an active job's gets no such note.
func TestNextOfAPausedJob(t *testing.T) {
	a := startAPI(t, nil)
	id := a.okJSON(t, "jobs", "create", "--name", "paused", "--schedule", "*/5 * * * *", "--url", "https://example.test/", "--paused")["id"].(string)
	out, errOut, err := a.cli(t, "jobs", "next", id, "--count", "2")
	if err != nil || !strings.Contains(out, "2026-10-09T08:05:00.000Z") || !strings.Contains(errOut, "paused") {
		t.Errorf("next of a paused job: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	a.ok(t, "jobs", "resume", id)
	if out, errOut, err := a.cli(t, "jobs", "next", id, "--count", "2"); err != nil || !strings.Contains(out, "2026-10-09T08:05:00.000Z") || errOut != "" {
		t.Errorf("next of an active job: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
}

func TestAPIErrorText(t *testing.T) {
	a := startAPI(t, nil)
	_, _, err := a.cli(t, "jobs", "create", "--name", "x", "--schedule", "@every 1ms", "--url", "https://example.test/")
	if err == nil || !strings.HasPrefix(err.Error(), "every_too_short: ") || !strings.HasSuffix(err.Error(), " (schedule)") {
		t.Errorf("error text %q", err)
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		t.Error("an API error is not a usage error")
	}
}

func TestUsageErrors(t *testing.T) {
	a := startAPI(t, nil)
	for _, args := range [][]string{
		{},
		{"widgets", "list"},
		{"jobs"},
		{"jobs", "explode"},
		{"jobs", "get"},
		{"jobs", "get", "job_a", "job_b"},
		{"jobs", "list", "--bogus"},
		{"jobs", "list", "--limit", "many"},
		{"jobs", "create", "--schedule", "@daily", "--url", "https://example.test/"},
		{"jobs", "create", "--name", "x", "--url", "https://example.test/"},
		{"jobs", "create", "--name", "x", "--url", "https://example.test/", "--schedule", "@daily", "--at", "2026-10-10T00:00:00Z"},
		{"jobs", "update", "job_a"},
		{"jobs", "update", "job_a", "--enabled", "maybe"},
		{"jobs", "list", "--server", "ftp://example.test"},
		// Paths appended after a query or a fragment named no route: the
		// answer was "http_303: See Other".
		{"jobs", "list", "--server", a.url + "?x=1"},
		{"jobs", "list", "--server", a.url + "#top"},
		{"jobs", "list", "--server", a.url + "/#"},
		{"tokens", "create", "--name", "x"},
		{"tokens", "list", "--project", ""},
		{"projects", "create"},
	} {
		out, errOut, err := a.cli(t, args...)
		var ue *UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a UsageError", args, err)
			continue
		}
		if !strings.Contains(errOut, "Usage") {
			t.Errorf("%q: no usage printed: %q", args, errOut)
		}
		if out != "" {
			t.Errorf("%q: wrote to stdout: %q", args, out)
		}
	}
	// Both given, the error said one of them was needed.
	if _, _, err := a.cli(t, "jobs", "create", "--name", "x", "--url", "https://example.test/", "--schedule", "@daily", "--at", "2026-10-10T00:00:00Z"); err == nil ||
		!strings.Contains(err.Error(), "not both") {
		t.Errorf("--schedule and --at: %v, want an error saying not both", err)
	}
	// -h is not an error.
	if _, errOut, err := a.cli(t, "jobs", "create", "-h"); err != nil || !strings.Contains(errOut, "--schedule") ||
		!strings.Contains(errOut, "(default 4)") {
		t.Errorf("-h: %v %q", err, errOut)
	}
	// jobs update changes only the flags given: it names no defaults,
	// which would read as what an omitted flag resets to.
	if _, errOut, err := a.cli(t, "jobs", "update", "-h"); err != nil || !strings.Contains(errOut, "--max-attempts") ||
		strings.Contains(errOut, "(default 4)") || strings.Contains(errOut, "(default all)") {
		t.Errorf("jobs update -h: %v %q", err, errOut)
	}
}

func TestTokenResolution(t *testing.T) {
	a := startAPI(t, nil)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(a.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runWith := func(env map[string]string, args ...string) error {
		return run(context.Background(), args, func(k string) string { return env[k] }, io.Discard, io.Discard, nil)
	}
	// The token file in VIBEJOBS_DATA_DIR.
	if err := runWith(map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_DATA_DIR": dir}, "jobs", "list"); err != nil {
		t.Errorf("token from the data dir: %v", err)
	}
	// --token-file.
	if err := runWith(map[string]string{}, "jobs", "list", "--server", a.url, "--token-file", filepath.Join(dir, "admin.token")); err != nil {
		t.Errorf("--token-file: %v", err)
	}
	// The flag wins over the environment, which wins over the file.
	err := runWith(map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_TOKEN": a.token, "VIBEJOBS_DATA_DIR": dir}, "jobs", "list", "--token", "vjt_wrong")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "unauthorized" {
		t.Errorf("--token: %v", err)
	}
	err = runWith(map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_TOKEN": "vjt_wrong", "VIBEJOBS_DATA_DIR": dir}, "jobs", "list")
	if !errors.As(err, &ae) || ae.Code != "unauthorized" {
		t.Errorf("VIBEJOBS_TOKEN: %v", err)
	}
	// No token anywhere.
	err = runWith(map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_DATA_DIR": t.TempDir()}, "jobs", "list")
	if err == nil || !strings.Contains(err.Error(), "no API token") {
		t.Errorf("no token: %v", err)
	}
	if strings.Contains(err.Error(), a.token) {
		t.Error("an error shows the token")
	}
}

// startCountingAPI is startAPI with a count of the requests it served.
func startCountingAPI(t *testing.T) (*testAPI, *atomic.Int64) {
	var requests atomic.Int64
	a := startAPI(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			h.ServeHTTP(w, r)
		})
	})
	return a, &requests
}

// TestEmptyConnectionFlagsAreRefused: --token, --token-file and --server
// given empty (an unset shell variable) are refused before any request.
// They fell back to VIBEJOBS_TOKEN, the token file of the data directory
// (the installation's admin token) or VIBEJOBS_SERVER, so the command ran
// with another token, or against another server, than the one it named.
func TestEmptyConnectionFlagsAreRefused(t *testing.T) {
	a, requests := startCountingAPI(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(a.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag string
		env  map[string]string
	}{
		{"--token", map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_TOKEN": a.token}},
		{"--token", map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_DATA_DIR": dir}},
		{"--token-file", map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_DATA_DIR": dir}},
		{"--server", map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_TOKEN": a.token}},
	} {
		args := []string{"jobs", "list", c.flag, ""}
		var out, errOut strings.Builder
		err := run(context.Background(), args, func(k string) string { return c.env[k] }, &out, &errOut, nil)
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.flag+" is empty") {
			t.Errorf("%q with %v: %v, stdout %q; want a usage error naming %s", args, c.env, err, out.String(), c.flag)
		}
		if n := requests.Swap(0); n != 0 {
			t.Errorf("%q with %v: %d requests; want none", args, c.env, n)
		}
	}
	// A bad VIBEJOBS_SERVER is named as such, not as --server.
	err := run(context.Background(), []string{"jobs", "list"}, func(k string) string {
		return map[string]string{"VIBEJOBS_SERVER": "ftp://example.test", "VIBEJOBS_TOKEN": a.token}[k]
	}, io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "VIBEJOBS_SERVER") {
		t.Errorf("bad VIBEJOBS_SERVER: %v; want an error naming it", err)
	}
}

// TestUnsendableHeaderValuesAreRefused: a token or an Idempotency-Key that
// cannot be sent (a control character, a newline pasted with the value) or
// that the API would refuse is an error naming where it came from, before
// any request. net/http refused to send it, and the command retried three
// times and said it could not reach the server.
func TestUnsendableHeaderValuesAreRefused(t *testing.T) {
	a, requests := startCountingAPI(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(tokenFile, []byte(a.token[:10]+"\x1b"+a.token[10:]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args  []string
		env   map[string]string
		names string // where the value came from
		usage bool   // a usage error (exit 2): the value is a flag's or a variable's
	}{
		{[]string{"jobs", "list", "--token", a.token + "\n"}, nil, "--token", true},
		{[]string{"jobs", "list", "--token", "\x7f" + a.token}, nil, "--token", true},
		// As a bad VIBEJOBS_SERVER is: it exited with 1, a failure.
		{[]string{"jobs", "list"}, map[string]string{"VIBEJOBS_TOKEN": a.token[:8] + "\r\n" + a.token[8:]}, "VIBEJOBS_TOKEN", true},
		{[]string{"jobs", "list", "--token-file", tokenFile}, nil, tokenFile, false},
		{[]string{"jobs", "trigger", "job_x", "--idempotency-key", "a\nb"}, map[string]string{"VIBEJOBS_TOKEN": a.token}, "--idempotency-key", true},
		{[]string{"jobs", "trigger", "job_x", "--idempotency-key", "a b"}, map[string]string{"VIBEJOBS_TOKEN": a.token}, "--idempotency-key", true},
		{[]string{"jobs", "trigger", "job_x", "--idempotency-key", "é"}, map[string]string{"VIBEJOBS_TOKEN": a.token}, "--idempotency-key", true},
		{[]string{"jobs", "trigger", "job_x", "--idempotency-key", strings.Repeat("k", 256)}, map[string]string{"VIBEJOBS_TOKEN": a.token}, "--idempotency-key", true},
		// Given empty (an unset shell variable), it was replaced by a fresh key.
		{[]string{"jobs", "trigger", "job_x", "--idempotency-key", ""}, map[string]string{"VIBEJOBS_TOKEN": a.token}, "--idempotency-key", true},
	} {
		sleeps := 0
		var errOut strings.Builder
		err := run(context.Background(), c.args, func(k string) string {
			if k == "VIBEJOBS_SERVER" {
				return a.url
			}
			return c.env[k]
		}, io.Discard, &errOut, func(cl *client) {
			cl.sleep = func(context.Context, time.Duration) error { sleeps++; return nil }
		})
		var ue *UsageError
		if err == nil || !strings.Contains(err.Error(), c.names) || errors.As(err, &ue) != c.usage ||
			strings.Contains(errOut.String(), "Usage") != c.usage {
			t.Errorf("%q: %v; want an error naming %s (a usage error: %v)", c.args, err, c.names, c.usage)
		}
		if err != nil && strings.Contains(err.Error(), a.token[4:]) {
			t.Errorf("%q: the error shows the token: %v", c.args, err)
		}
		if n := requests.Load(); n != 0 || sleeps != 0 {
			t.Fatalf("%q: %d requests, %d retries; want none", c.args, n, sleeps)
		}
	}
	// A key the API takes is sent as given.
	id := a.okJSON(t, "jobs", "create", "--name", "n", "--schedule", "@daily", "--url", "https://example.test/",
		"--idempotency-key", strings.Repeat("~", 255))["id"]
	if id == nil {
		t.Error("a 255-character key was not taken")
	}
}

// TestIdempotencyKeyOnlyOnPosts: --idempotency-key is taken by the
// commands that send a POST, which carries it, and refused by the others,
// which sent it nowhere ("jobs update --idempotency-key k" sent a PATCH
// without it, and a retry of it by hand had no protection). Every command
// is run first without the flag, to see whether it POSTs.
func TestIdempotencyKeyOnlyOnPosts(t *testing.T) {
	type request struct{ method, key string }
	var mu sync.Mutex
	var sent []request
	a := startAPI(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			sent = append(sent, request{r.Method, r.Header.Get("Idempotency-Key")})
			mu.Unlock()
			h.ServeHTTP(w, r)
		})
	})
	taken := func() []request {
		mu.Lock()
		defer mu.Unlock()
		s := sent
		sent = nil
		return s
	}
	job := a.okJSON(t, "jobs", "create", "--name", "n", "--schedule", "@daily", "--url", "https://example.test/")["id"].(string)
	sub := a.okJSON(t, "subscriptions", "create", "--url", "https://example.test/feed")["id"].(string)
	tok := a.okJSON(t, "tokens", "create", "--name", "t", "--role", "read")["id"].(string)
	// Arguments that get each command past its own checks to the API.
	args := map[string][]string{
		"jobs create":                 {"--name", "n", "--schedule", "@daily", "--url", "https://example.test/"},
		"jobs list":                   nil,
		"jobs get":                    {job},
		"jobs update":                 {job, "--name", "z"},
		"jobs pause":                  {job},
		"jobs resume":                 {job},
		"jobs delete":                 {"job_01a11fad1800000000000000000"},
		"jobs trigger":                {job},
		"jobs rotate-secret":          {job},
		"jobs next":                   {job},
		"runs list":                   nil,
		"runs get":                    {"run_01a11fad1800000000000000000"},
		"events tail":                 {"--after", "0", "--follow=false"},
		"subscriptions create":        {"--url", "https://example.test/feed2"},
		"subscriptions list":          nil,
		"subscriptions get":           {sub},
		"subscriptions update":        {sub, "--types", "run.failed"},
		"subscriptions delete":        {"sub_01a11fad1800000000000000000"},
		"subscriptions rotate-secret": {sub},
		"subscriptions reset":         {sub},
		"projects create":             {"--name", "p"},
		"projects list":               nil,
		"tokens create":               {"--name", "t2", "--role", "read"},
		"tokens list":                 nil,
		"tokens revoke":               {tok},
	}
	for resource, verbs := range resources {
		for verb, cmd := range verbs {
			name := resource + " " + verb
			rest, ok := args[name]
			if !ok {
				t.Errorf("%s: no arguments for this test", name)
				continue
			}
			line := append([]string{resource, verb}, rest...)
			taken()
			a.cli(t, line...)
			posts := slices.ContainsFunc(taken(), func(r request) bool { return r.method == "POST" })
			if posts != cmd.post {
				t.Errorf("%s: sends a POST: %v, but command.post is %v", name, posts, cmd.post)
			}

			key := "key-" + strings.ReplaceAll(name, " ", "-")
			_, _, err := a.cli(t, append(line, "--idempotency-key", key)...)
			got := taken()
			var ue *UsageError
			switch {
			case posts && errors.As(err, &ue):
				t.Errorf("%s --idempotency-key: %v", name, err)
			case posts && !slices.Contains(got, request{"POST", key}):
				t.Errorf("%s --idempotency-key %s: sent %v, want a POST with the key", name, key, got)
			case !posts && (!errors.As(err, &ue) || !strings.Contains(err.Error(), "--idempotency-key") || len(got) > 0):
				t.Errorf("%s --idempotency-key: error %v after %d requests; want a usage error naming the flag, before any", name, err, len(got))
			}
			// -h lists the flag where it is taken.
			_, errOut, _ := a.cli(t, resource, verb, "-h")
			if strings.Contains(errOut, "--idempotency-key") != posts {
				t.Errorf("%s -h lists --idempotency-key: %v, want %v", name, !posts, posts)
			}
		}
	}
}

// TestRetriesReuseKey: the CLI retries a POST after a 503, a dropped
// connection and a 409 in progress with the same Idempotency-Key, and the
// platform makes one job.
func TestRetriesReuseKey(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	failures := []int{503, -1, 409}
	a := startAPI(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != "POST" {
				h.ServeHTTP(w, r)
				return
			}
			mu.Lock()
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			var fail int
			if len(failures) > 0 {
				fail, failures = failures[0], failures[1:]
			}
			mu.Unlock()
			switch fail {
			case 0:
				h.ServeHTTP(w, r)
			case -1:
				// Let the request commit, then drop the connection.
				h.ServeHTTP(httptest.NewRecorder(), r)
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
			case 409:
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(409)
				w.Write([]byte(`{"error":{"code":"idempotency_key_in_progress","message":"busy"}}`))
			default:
				w.WriteHeader(fail)
				w.Write([]byte(`{"error":{"code":"internal","message":"internal error"}}`))
			}
		})
	})
	j := a.okJSON(t, "jobs", "create", "--name", "retried", "--schedule", "@daily", "--url", "https://example.test/")
	if len(keys) != 4 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] || keys[2] != keys[3] {
		t.Errorf("keys sent: %q", keys)
	}
	l := a.okJSON(t, "jobs", "list")
	if jobs := l["jobs"].([]any); len(jobs) != 1 || jobs[0].(map[string]any)["id"] != j["id"] {
		t.Errorf("jobs after retries: %v", l)
	}
	// A new command is a new operation: a new key.
	a.ok(t, "jobs", "trigger", j["id"].(string))
	if len(keys) != 5 || keys[4] == keys[0] {
		t.Errorf("second operation's key: %q", keys)
	}

	// Retries give up after 3 and report the last answer.
	failures = []int{503, 503, 503, 503, 503}
	_, _, err := a.cli(t, "jobs", "trigger", j["id"].(string))
	if err == nil || err.Error() != "internal: internal error" {
		t.Errorf("after 4 failures: %v", err)
	}
}

func TestProjectAndTokenCommands(t *testing.T) {
	a := startAPI(t, nil)
	p := a.okJSON(t, "projects", "create", "--name", "team", "--retention-days", "30")
	pid := p["id"].(string)
	if out := a.ok(t, "projects", "list"); !strings.Contains(out, "RETENTION") || !strings.Contains(out, "30 days") || !strings.Contains(out, "default") {
		t.Errorf("projects list:\n%s", out)
	}
	// A page at a time, as the other lists: --limit and --cursor, or --all
	// (three projects: the bootstrap one, team and this one).
	a.ok(t, "projects", "create", "--name", "other")
	out, errOut, err := a.cli(t, "projects", "list", "--limit", "2")
	if err != nil || strings.Count(out, "\nprj_") != 2 || !strings.Contains(errOut, "more: --cursor") {
		t.Errorf("projects list --limit 2: %v\n%s%s", err, out, errOut)
	}
	page := a.okJSON(t, "projects", "list", "--limit", "2")
	cursor, _ := page["nextCursor"].(string)
	if rest := a.okJSON(t, "projects", "list", "--cursor", cursor); cursor == "" ||
		len(rest["projects"].([]any)) != 1 || rest["nextCursor"] != nil {
		t.Errorf("projects list --cursor %q: %v", cursor, rest)
	}
	if all := a.okJSON(t, "projects", "list", "--limit", "1", "--all"); len(all["projects"].([]any)) != 3 || all["nextCursor"] != nil {
		t.Errorf("projects list --all: %v", all)
	}
	if _, _, err := a.cli(t, "projects", "list", "--limit", "0"); err == nil {
		t.Error("projects list --limit 0: no error")
	}
	out = a.ok(t, "tokens", "create", "--project", pid, "--name", "ci", "--role", "write")
	if !strings.Contains(out, "token: vjt_") || !strings.Contains(out, "ROLE") {
		t.Errorf("tokens create:\n%s", out)
	}
	tk := a.okJSON(t, "tokens", "create", "--project", pid, "--name", "reader", "--role", "read")
	l := a.okJSON(t, "tokens", "list", "--project", pid)
	if len(l["tokens"].([]any)) != 2 {
		t.Errorf("tokens list: %v", l)
	}
	if out := a.ok(t, "tokens", "list", "--project", pid); strings.Contains(out, tk["token"].(string)) || !strings.Contains(out, "PREFIX") {
		t.Errorf("tokens list table:\n%s", out)
	}
	// A page at a time, as the other lists: --limit and --cursor, or --all.
	a.ok(t, "tokens", "create", "--project", pid, "--name", "third", "--role", "read")
	out, errOut, err = a.cli(t, "tokens", "list", "--project", pid, "--limit", "2")
	if err != nil || strings.Count(out, "\ntok_") != 2 || !strings.Contains(errOut, "more: --cursor") {
		t.Errorf("tokens list --limit 2: %v\n%s%s", err, out, errOut)
	}
	page = a.okJSON(t, "tokens", "list", "--project", pid, "--limit", "2")
	cursor, _ = page["nextCursor"].(string)
	if rest := a.okJSON(t, "tokens", "list", "--project", pid, "--cursor", cursor); cursor == "" ||
		len(rest["tokens"].([]any)) != 1 || rest["nextCursor"] != nil {
		t.Errorf("tokens list --cursor %q: %v", cursor, rest)
	}
	if all := a.okJSON(t, "tokens", "list", "--project", pid, "--limit", "1", "--all"); len(all["tokens"].([]any)) != 3 {
		t.Errorf("tokens list --all: %v", all)
	}
	if out := a.ok(t, "tokens", "revoke", tk["id"].(string)); !strings.Contains(out, "revoked") {
		t.Errorf("revoke: %q", out)
	}
	// The revoked token no longer works.
	b := &testAPI{url: a.url, token: tk["token"].(string)}
	if _, _, err := b.cli(t, "jobs", "list"); err == nil || !strings.HasPrefix(err.Error(), "unauthorized: ") {
		t.Errorf("revoked token: %v", err)
	}
}

func TestServerUnreachable(t *testing.T) {
	a := startAPI(t, nil)
	a.srv.Close()
	_, _, err := a.cli(t, "jobs", "list")
	if err == nil || !strings.Contains(err.Error(), "cannot reach the server") || strings.Contains(err.Error(), a.token) {
		t.Errorf("unreachable: %v", err)
	}
}

// TestDotIdsAndRedirects: "." and ".." are no ids (the server would clean
// them out of the path and redirect, to the list, say). And a redirect is
// an error, never followed: following it reads another resource, or turns
// a POST into a GET.
func TestDotIdsAndRedirects(t *testing.T) {
	a := startAPI(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/jobs/moved" {
				http.Redirect(w, r, "/v1/jobs", http.StatusMovedPermanently)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	for _, args := range [][]string{
		{"jobs", "get", "."},
		{"jobs", "trigger", ".."},
		{"runs", "get", "."},
		{"subscriptions", "get", ".."},
		// An empty id answered "not_found: no such route", or
		// "http_307" where the path had a segment after it.
		{"jobs", "get", ""},
		{"jobs", "delete", ""},
		{"jobs", "pause", ""},
		{"jobs", "next", ""},
		{"runs", "get", ""},
		{"subscriptions", "reset", ""},
		{"tokens", "revoke", ""},
	} {
		out, _, err := a.cli(t, args...)
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "is not an id") {
			t.Errorf("vibejobs %s: %v (stdout %q), want a usage error", strings.Join(args, " "), err, out)
		}
	}
	out, _, err := a.cli(t, "jobs", "get", "moved")
	if err == nil {
		t.Errorf("a redirect was followed: exit 0, stdout %q", out)
	}
}

// TestTokenCommandsDefaultToTheTokensProject: like every other command,
// tokens list and tokens create act on the project of the token they are
// given unless --project names another; against a server that cannot say
// which project that is, they ask for --project.
func TestTokenCommandsDefaultToTheTokensProject(t *testing.T) {
	a := startAPI(t, nil)
	l := a.okJSON(t, "tokens", "list")
	if ts := l["tokens"].([]any); len(ts) != 1 || ts[0].(map[string]any)["projectId"] != api.BootstrapProjectID {
		t.Errorf("tokens list with the bootstrap token: %v", l)
	}
	pid := a.okJSON(t, "projects", "create", "--name", "team")["id"].(string)
	tenant := &testAPI{url: a.url, token: a.okJSON(t, "tokens", "create", "--project", pid, "--name", "team admin", "--role", "admin")["token"].(string)}
	made := tenant.okJSON(t, "tokens", "create", "--name", "ci", "--role", "write")
	if made["projectId"] != pid {
		t.Errorf("tokens create without --project, by the team's admin: %v", made)
	}
	if out := tenant.ok(t, "tokens", "list"); !strings.Contains(out, "team admin") || !strings.Contains(out, "ci") ||
		strings.Contains(out, "bootstrap") {
		t.Errorf("tokens list by the team's admin:\n%s", out)
	}
	// --project still names another project.
	if out := a.ok(t, "tokens", "list", "--project", pid); !strings.Contains(out, "team admin") {
		t.Errorf("tokens list --project:\n%s", out)
	}

	old := fakeAPI(t, nil)
	_, errOut, err := old.cli(t, "tokens", "list")
	var ue *UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--project") || !strings.Contains(errOut, "Usage") {
		t.Errorf("a server that does not name the token's project: %v\n%s", err, errOut)
	}
}

// TestEmptyFiltersAreRefused: a filter flag given empty (an unset shell
// variable, say) is refused. It was dropped, and the command listed the
// runs of every job or state, or followed the events of every job or type.
func TestEmptyFiltersAreRefused(t *testing.T) {
	a := startAPI(t, nil)
	id := a.okJSON(t, "jobs", "create", "--name", "n", "--schedule", "@daily", "--url", "https://example.test/")["id"].(string)
	a.ok(t, "jobs", "trigger", id)
	for _, args := range [][]string{
		{"runs", "list", "--job", ""},
		{"runs", "list", "--state", ""},
		{"events", "tail", "--after", "0", "--follow=false", "--job", ""},
		{"events", "tail", "--after", "0", "--follow=false", "--type", ""},
	} {
		out, _, err := a.cli(t, args...)
		if err == nil {
			t.Errorf("vibejobs %q: exit 0, stdout %q, want an error", args, out)
		}
	}
}

// TestOutOfRangePagingIsRefused: --limit out of 1–100, an empty --cursor
// and a negative --after given on the command line are refused, naming the
// flag. They were dropped: --limit 0 showed the default page, --cursor ""
// the first page, --after -5 started at the head.
func TestOutOfRangePagingIsRefused(t *testing.T) {
	a := startAPI(t, nil)
	a.ok(t, "jobs", "create", "--name", "n", "--schedule", "@daily", "--url", "https://example.test/")
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"jobs", "list", "--limit", "0"}, "--limit"},
		{[]string{"jobs", "list", "--limit", "101"}, "--limit"},
		{[]string{"runs", "list", "--limit", "-1"}, "--limit"},
		{[]string{"jobs", "list", "--cursor", ""}, "--cursor"},
		{[]string{"events", "tail", "--follow=false", "--after", "-5"}, "--after"},
	} {
		out, _, err := a.cli(t, c.args...)
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("vibejobs %q: stdout %q, error %v; want a usage error naming %s", c.args, out, err, c.flag)
		}
	}
	// In range, they are taken.
	for _, args := range [][]string{{"jobs", "list", "--limit", "1"}, {"jobs", "list", "--limit", "100"}, {"events", "tail", "--follow=false", "--after", "0"}} {
		if _, _, err := a.cli(t, args...); err != nil {
			t.Errorf("vibejobs %q: %v", args, err)
		}
	}
}
