package web_test

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
	"github.com/vibejobs/vibejobs/internal/web"
)

// t0 is the fake clock's start.
var t0 = time.Date(2026, 10, 9, 8, 0, 0, 0, time.UTC)

// Token values of the tests: "vjt_" and 43 characters, as the API mints them.
const (
	tokenA = "vjt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	tokenB = "vjt_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
)

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

// env is a dashboard on a real store (SQLite unless newEnvOn is given
// another) with two projects, A and B, each with a read token.
type env struct {
	t        *testing.T
	ctx      context.Context
	store    vibejobs.Store
	clock    *clock
	logs     *syncbuf.Buffer
	handler  http.Handler
	srv      *httptest.Server
	projectA string
	projectB string
	tokenAID string
	tokenBID string

	mu     sync.Mutex
	bodies []string // every page served, for the scans of secrets
}

// mustOpenStore opens a fresh SQLite store in a temporary directory.
func mustOpenStore(t *testing.T) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newEnv(t *testing.T, edit ...func(*web.Config)) *env {
	t.Helper()
	return newEnvOn(t, mustOpenStore(t), edit...)
}

// newEnvOn is newEnv on store, which must be empty.
func newEnvOn(t *testing.T, store vibejobs.Store, edit ...func(*web.Config)) *env {
	t.Helper()
	e := &env{t: t, ctx: context.Background(), store: store, clock: &clock{t: t0}, logs: &syncbuf.Buffer{},
		projectA: "prj_a", projectB: "prj_b"}
	e.update(func(tx vibejobs.Tx) error {
		for _, p := range []*vibejobs.Project{
			{ID: e.projectA, Name: "Project Alpha", CreatedAt: t0},
			{ID: e.projectB, Name: "Project Beta", CreatedAt: t0},
		} {
			if err := tx.CreateProject(e.ctx, p); err != nil {
				return err
			}
		}
		return nil
	})
	e.tokenAID = e.token(e.projectA, tokenA)
	e.tokenBID = e.token(e.projectB, tokenB)
	cfg := web.Config{
		Store:  e.store,
		Now:    e.clock.Now,
		Logger: slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, f := range edit {
		f(&cfg)
	}
	e.handler = web.New(cfg)
	e.srv = httptest.NewServer(e.handler)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) update(fn func(tx vibejobs.Tx) error) {
	e.t.Helper()
	if err := e.store.Update(e.ctx, fn); err != nil {
		e.t.Fatalf("Update: %v", err)
	}
}

// token stores a read token of projectID with the given value, hashed as the
// API hashes tokens, and returns its id.
func (e *env) token(projectID, value string) string {
	e.t.Helper()
	sum := sha256.Sum256([]byte(value))
	tok := &vibejobs.Token{
		ID: vibejobs.NewID("tok_", e.clock.Now(), nil), ProjectID: projectID, Name: "ops", Role: vibejobs.RoleRead,
		Prefix: value[:12], Hash: sum[:], CreatedAt: e.clock.Now(),
	}
	e.update(func(tx vibejobs.Tx) error { return tx.CreateToken(e.ctx, tok, vibejobs.MaxTokensPerProject) })
	return tok.ID
}

func (e *env) revoke(tokenID string) {
	e.t.Helper()
	e.update(func(tx vibejobs.Tx) error { return tx.RevokeToken(e.ctx, tokenID, e.clock.Now()) })
}

// secretBytes is every job's sealed secret: it must never reach a page.
var secretBytes = []byte("SEALED-SECRET-CIPHERTEXT-\x00\x01\x02-do-not-show")

// newJob returns a recurring job of projectID; mods adjust it.
func (e *env) newJob(projectID string, mods ...func(*vibejobs.Job)) *vibejobs.Job {
	next := t0.Add(5 * time.Minute)
	j := &vibejobs.Job{
		ID:             vibejobs.NewID("job_", e.clock.Now(), nil),
		ProjectID:      projectID,
		Name:           "nightly report",
		Schedule:       "*/5 * * * *",
		Timezone:       "Europe/Berlin",
		URL:            "https://app.example.test/hooks/report?key=url-marker",
		Enabled:        true,
		State:          vibejobs.JobActive,
		Retry:          vibejobs.DefaultRetryPolicy(),
		Timeout:        10 * time.Second,
		CatchUp:        vibejobs.CatchUpAll,
		ScheduleAnchor: t0.Add(-2 * time.Hour),
		NextRunAt:      &next,
		Secret:         vibejobs.SealedSecret{KeyID: "key1", Ciphertext: secretBytes},
		CreatedAt:      t0.Add(-2 * time.Hour),
		UpdatedAt:      t0.Add(-time.Hour),
	}
	for _, m := range mods {
		m(j)
	}
	return j
}

func (e *env) job(projectID string, mods ...func(*vibejobs.Job)) *vibejobs.Job {
	e.t.Helper()
	j := e.newJob(projectID, mods...)
	e.update(func(tx vibejobs.Tx) error { return tx.CreateJob(e.ctx, j) })
	return j
}

func named(name string) func(*vibejobs.Job) { return func(j *vibejobs.Job) { j.Name = name } }

// run creates a manual run of j scheduled for at.
func (e *env) run(j *vibejobs.Job, at time.Time) *vibejobs.Run {
	e.t.Helper()
	r := vibejobs.NewRun(vibejobs.NewID("run_", e.clock.Now(), nil), j, vibejobs.TriggerManual, at, e.clock.Now())
	e.update(func(tx vibejobs.Tx) error { return tx.CreateRun(e.ctx, r) })
	return r
}

// deliver creates a run of j scheduled for at (which no other due run may
// precede), claims it and records one attempt with the given answer.
func (e *env) deliver(j *vibejobs.Job, at time.Time, status int, snippet string, step vibejobs.Step) *vibejobs.Run {
	e.t.Helper()
	r := e.run(j, at)
	cs, err := e.store.ClaimDueRuns(e.ctx, "test", at, 10, time.Second)
	if err != nil || len(cs) != 1 || cs[0].Run.ID != r.ID {
		e.t.Fatalf("ClaimDueRuns: %v, %d claims", err, len(cs))
	}
	a := vibejobs.Attempt{
		Number: cs[0].Run.Attempt, StartedAt: at, FinishedAt: at.Add(231 * time.Millisecond),
		StatusCode: status, SignatureTimestamp: at.Unix(), ResponseSnippet: snippet,
	}
	if status >= 300 {
		a.ErrorCode = "http_5xx"
	}
	if err := e.store.RecordOutcomes(e.ctx, "test", []vibejobs.Outcome{{RunID: r.ID, ClaimedAt: cs[0].ClaimedAt, Attempt: a, Step: step}}); err != nil {
		e.t.Fatalf("RecordOutcomes: %v", err)
	}
	return r
}

// browser is a user agent with a cookie jar that does not follow redirects.
type browser struct {
	t      *testing.T
	e      *env
	client *http.Client
}

func (e *env) browser() *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return &browser{t: e.t, e: e, client: &http.Client{
		Jar:           jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// answer is one response, read in full.
type answer struct {
	status int
	header http.Header
	body   string
	resp   *http.Response
}

func (a *answer) location() string { return a.header.Get("Location") }

func (b *browser) do(req *http.Request) *answer {
	b.t.Helper()
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	b.e.seen(string(body))
	return &answer{status: resp.StatusCode, header: resp.Header, body: string(body), resp: resp}
}

func (b *browser) get(path string) *answer {
	b.t.Helper()
	req, err := http.NewRequest("GET", b.e.srv.URL+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.do(req)
}

// post sends a form; header adds request headers (Origin, Sec-Fetch-Site).
func (b *browser) post(path string, form url.Values, header ...string) *answer {
	b.t.Helper()
	req, err := http.NewRequest("POST", b.e.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return b.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the secret of the form on a page.
func (b *browser) csrf(a *answer) string {
	b.t.Helper()
	m := csrfField.FindStringSubmatch(a.body)
	if m == nil {
		b.t.Fatalf("no csrf field on the page:\n%s", a.body)
	}
	return m[1]
}

// loginAnswer fills in and sends the login form reached at path.
func (b *browser) loginAnswer(path, token string) *answer {
	b.t.Helper()
	form := b.get(path)
	if form.status != http.StatusOK {
		b.t.Fatalf("GET %s: %d", path, form.status)
	}
	v := url.Values{"csrf": {b.csrf(form)}, "token": {token}}
	if m := regexp.MustCompile(`name="next" value="([^"]+)"`).FindStringSubmatch(form.body); m != nil {
		v.Set("next", htmlUnescape(m[1]))
	}
	return b.post("/login", v)
}

// login logs in with token and fails the test unless it worked.
func (b *browser) login(token string) *answer {
	b.t.Helper()
	a := b.loginAnswer("/login", token)
	if a.status != http.StatusSeeOther || a.location() != "/" {
		b.t.Fatalf("login: %d to %q, want 303 to /:\n%s", a.status, a.location(), a.body)
	}
	return a
}

// sessionID is the session cookie the browser holds ("" when none).
func (b *browser) sessionID() string {
	u, _ := url.Parse(b.e.srv.URL)
	for _, c := range b.client.Jar.Cookies(u) {
		if c.Name == web.SessionCookie {
			return c.Value
		}
	}
	return ""
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">").Replace(s)
}

func (e *env) seen(body string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.bodies = append(e.bodies, body)
}

// pages returns every page served so far.
func (e *env) pages() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.bodies, "\n")
}

// onEveryStore runs f in a subtest on a fresh env of each store: SQLite,
// and PostgreSQL. Each store opens on the subtest's t: MustOpenTestWith
// skips when no PostgreSQL is configured, and only the subtest may skip
// itself.
func onEveryStore(t *testing.T, f func(t *testing.T, e *env)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) { f(t, newEnv(t)) })
	t.Run("postgres", func(t *testing.T) {
		f(t, newEnvOn(t, postgres.MustOpenTestWith(t, postgres.Options{Logger: slog.New(slog.DiscardHandler)})))
	})
}
