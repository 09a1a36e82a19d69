package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/secretbox"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

// t0 is the fake clock's start: a Friday morning in 2026.
var t0 = time.Date(2026, 10, 9, 8, 0, 0, 0, time.UTC)

// clock is a fake clock that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// env is one API on a real SQLite store, with its bootstrap token.
type env struct {
	t       testing.TB
	dbPath  string
	store   *sqlite.Store
	keys    *secretbox.Keyring
	clock   *clock
	cfg     api.Config
	server  *api.Server
	http    *httptest.Server
	admin   string // installation administrator token of project "default"
	project string // id of project "default"
	logs    *syncbuf.Buffer
	wakes   int
	mu      sync.Mutex
	bodies  []string // every response body seen, for the secret scans
}

// mustOpenStore opens a fresh SQLite store in a temporary directory.
func mustOpenStore(t testing.TB) (*sqlite.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vibejobs.db")
	st, err := sqlite.Open(context.Background(), path, sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, path
}

func mustKeyring(t testing.TB) *secretbox.Keyring {
	t.Helper()
	key, err := secretbox.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := secretbox.Parse([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newEnv starts an API; edit adjusts its Config before the Server is built.
func newEnv(t testing.TB, edit ...func(*api.Config)) *env {
	t.Helper()
	st, path := mustOpenStore(t)
	e := &env{t: t, dbPath: path, store: st, keys: mustKeyring(t), clock: &clock{t: t0}, logs: &syncbuf.Buffer{}}
	tok, created, err := api.Bootstrap(context.Background(), st, e.clock.Now(), nil)
	if err != nil || !created {
		t.Fatalf("Bootstrap: %v, created %v", err, created)
	}
	e.admin = tok
	ps, _, err := st.ListProjects(context.Background(), vibejobs.Page{})
	if err != nil || len(ps) != 1 {
		t.Fatalf("projects after bootstrap: %v %v", ps, err)
	}
	e.project = ps[0].ID
	policy, err := egress.NewPolicy([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	e.cfg = api.Config{
		Store:  st,
		Sealer: e.keys,
		URLs:   policy,
		Now:    e.clock.Now,
		Logger: slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Wake: func() {
			e.mu.Lock()
			e.wakes++
			e.mu.Unlock()
		},
		RateLimit: api.RateLimit{PerSecond: 1e6, Burst: 1e6},
	}
	for _, f := range edit {
		f(&e.cfg)
	}
	e.restart()
	return e
}

// restart replaces the Server by a new one on the same store (a restart of
// the process, as far as the API goes).
func (e *env) restart() {
	if e.http != nil {
		e.http.Close()
	}
	e.server = api.New(e.cfg)
	e.http = httptest.NewServer(e.server.Handler())
	e.t.Cleanup(e.http.Close)
}

// result is one answer.
type result struct {
	status int
	header http.Header
	body   []byte
}

func (r *result) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

// json decodes the body as an object.
func (r *result) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %v: %s", err, r.body)
	}
	return m
}

func (r *result) errorCode(t testing.TB) (code, field string) {
	t.Helper()
	m := r.json(t)
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("answer has no error object: %s", r.body)
	}
	code, _ = e["code"].(string)
	field, _ = e["field"].(string)
	return code, field
}

// req is a request to send; Key "" sends no Idempotency-Key, keyAuto a fresh one.
type req struct {
	method, path, token string
	body                any // string or []byte sent as is; anything else as JSON
	key                 string
	header              map[string]string
}

const keyAuto = "\x00auto"

func (e *env) send(r req) *result {
	e.t.Helper()
	var body io.Reader
	switch b := r.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	case []byte:
		body = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		body = bytes.NewReader(j)
	}
	hr, err := http.NewRequest(r.method, e.http.URL+r.path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	switch r.key {
	case "":
	case keyAuto:
		hr.Header.Set("Idempotency-Key", newKey())
	default:
		hr.Header.Set("Idempotency-Key", r.key)
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	return roundTrip(e.t, hr, func(body string) {
		e.mu.Lock()
		e.bodies = append(e.bodies, body)
		e.mu.Unlock()
	})
}

// roundTrip sends hr and returns the answer, its body passed to record
// first (for the secret scans).
func roundTrip(t testing.TB, hr *http.Request, record func(body string)) *result {
	t.Helper()
	// Redirects are not followed: the API answers none, and one followed
	// would hide which route answered.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	record(string(b))
	return &result{status: resp.StatusCode, header: resp.Header, body: b}
}

// do sends method path as token: a POST gets a fresh Idempotency-Key.
func (e *env) do(method, path, token string, body any) *result {
	e.t.Helper()
	r := req{method: method, path: path, token: token, body: body}
	if method == http.MethodPost {
		r.key = keyAuto
	}
	return e.send(r)
}

// must is do, failing the test unless the answer has status want.
func (e *env) must(want int, method, path, token string, body any) map[string]any {
	e.t.Helper()
	res := e.do(method, path, token, body)
	if res.status != want {
		e.t.Fatalf("%s %s: got %s, want %d", method, path, res, want)
	}
	if len(res.body) == 0 {
		return nil
	}
	return res.json(e.t)
}

// pageIDs returns the ids of the items of a list's page: the objects in
// its field items.
func pageIDs(page map[string]any, items string) []string {
	var out []string
	for _, it := range page[items].([]any) {
		out = append(out, it.(map[string]any)["id"].(string))
	}
	return out
}

// walkPages lists path (which has no query) as token, limit items a page,
// following nextCursor to the page where it is null, and returns the ids of
// the items (the objects in field items) in the order read.
func (e *env) walkPages(path, token, items string, limit int) []string {
	e.t.Helper()
	var walked []string
	for cursor, pages := "", 0; ; pages++ {
		q := path + "?limit=" + strconv.Itoa(limit)
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		page := e.must(200, "GET", q, token, nil)
		walked = append(walked, pageIDs(page, items)...)
		nc, present := page["nextCursor"]
		if !present {
			e.t.Fatal("a page without nextCursor")
		}
		if nc == nil {
			return walked
		}
		if cursor = nc.(string); pages > 1000 {
			e.t.Fatal("the cursors never end")
		}
	}
}

// listCase is a request for a page of a list: its query, sent as token,
// and the answer wanted (status, and for an error its code and field).
type listCase struct {
	query, token string
	status       int
	code, field  string
}

// checkListCases sends each case's query to path, a list of items (the
// objects in field items): a 200 must hold exactly the ids in rest, an
// error the code and field wanted.
func (e *env) checkListCases(path, items string, rest []string, cases []listCase) {
	e.t.Helper()
	for _, c := range cases {
		res := e.do("GET", path+c.query, c.token, nil)
		if res.status != c.status {
			e.t.Errorf("GET %s%s: %d, want %d", path, c.query, res.status, c.status)
			continue
		}
		if c.status == 200 {
			if got := pageIDs(res.json(e.t), items); !slices.Equal(got, rest) {
				e.t.Errorf("GET %s%s: %d %s, want the last %d", path, c.query, len(got), items, len(rest))
			}
			continue
		}
		if code, field := res.errorCode(e.t); code != c.code || field != c.field {
			e.t.Errorf("GET %s%s: %s (%s), want %s (%s)", path, c.query, code, field, c.code, c.field)
		}
	}
}

func newKey() string {
	var b [16]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x", b)
}

// jobBody is a valid create body; over replaces or adds fields.
func jobBody(over map[string]any) map[string]any {
	b := map[string]any{
		"name":     "nightly report",
		"schedule": "*/5 * * * *",
		"url":      "https://example.test/hooks/report",
	}
	for k, v := range over {
		if v == nil {
			delete(b, k)
			continue
		}
		b[k] = v
	}
	return b
}

// createJob creates a job as token and returns its answer.
func (e *env) createJob(token string, over map[string]any) map[string]any {
	e.t.Helper()
	return e.must(http.StatusCreated, "POST", "/v1/jobs", token, jobBody(over))
}

// newProject creates a project with an admin, a write and a read token.
func (e *env) newProject(name string) (id string, tokens map[vibejobs.Role]string) {
	e.t.Helper()
	p := e.must(http.StatusCreated, "POST", "/v1/projects", e.admin, map[string]any{"name": name})
	id = p["id"].(string)
	tokens = map[vibejobs.Role]string{}
	for _, role := range []vibejobs.Role{vibejobs.RoleAdmin, vibejobs.RoleWrite, vibejobs.RoleRead} {
		tk := e.must(http.StatusCreated, "POST", "/v1/projects/"+id+"/tokens", e.admin, map[string]any{"name": name + " " + string(role), "role": role})
		tokens[role] = tk["token"].(string)
	}
	return id, tokens
}

// deliver plays the dispatcher for due runs: claims them and records an
// attempt answered with status (0: a timeout).
func (e *env) deliver(status int) int {
	e.t.Helper()
	ctx := context.Background()
	now := e.clock.Now()
	claims, err := e.store.ClaimDueRuns(ctx, "test", now, 100, time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	var outs []vibejobs.Outcome
	for _, c := range claims {
		res := vibejobs.AttemptResult{StatusCode: status}
		a := vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: now, FinishedAt: now.Add(120 * time.Millisecond),
			StatusCode: status, SignatureTimestamp: now.Unix(), ResponseSnippet: "ok"}
		if status == 0 {
			res.ErrorCode, a.ErrorCode, a.ResponseSnippet = "timeout", "timeout", ""
		} else if status >= 300 {
			res.ErrorCode = fmt.Sprintf("http_%dxx", status/100)
			a.ErrorCode = res.ErrorCode
		}
		outs = append(outs, vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Attempt: a,
			Step: vibejobs.NextStep(c.Retry, c.Run.Attempt, res, c.Run.DeadlineAt, a.FinishedAt, 0.5)})
	}
	if err := e.store.RecordOutcomes(ctx, "test", outs); err != nil {
		e.t.Fatal(err)
	}
	return len(claims)
}

func apiBootstrapAgain(e *env) (string, bool, error) {
	return api.Bootstrap(context.Background(), e.store, e.clock.Now(), nil)
}
