package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

// TestIdempotencyConcurrent: 50 identical POST /v1/jobs with one key at once
// make exactly one job; every answer is its 201 or a 409 in progress, and a
// retry after the first finished replays the same 201 byte for byte.
func TestIdempotencyConcurrent(t *testing.T) {
	e := newEnv(t)
	body := jobBody(nil)
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "one-key", body: body}
	const n = 50
	results := make([]*result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = e.send(r)
		})
	}
	close(start)
	wg.Wait()

	var created []byte
	inProgress := 0
	for _, res := range results {
		switch res.status {
		case 201:
			if created == nil {
				created = res.body
			} else if !bytes.Equal(created, res.body) {
				t.Errorf("two different 201 answers:\n%s\n%s", created, res.body)
			}
		case 409:
			if code, _ := res.errorCode(t); code != "idempotency_key_in_progress" || res.header.Get("Retry-After") == "" {
				t.Errorf("409 answer: %s", res)
			}
			inProgress++
		default:
			t.Errorf("answer %s", res)
		}
	}
	if n, err := e.store.CountJobs(context.Background(), e.project); err != nil || n != 1 {
		t.Fatalf("%d jobs, %v", n, err)
	}
	t.Logf("%d answers in progress", inProgress)
	replay := e.send(r)
	if replay.status != 201 || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %s", replay)
	}
	if created != nil && !bytes.Equal(replay.body, created) {
		t.Errorf("replay differs:\n%s\n%s", replay.body, created)
	}
	if replay.header.Get("Location") == "" || replay.header.Get("Content-Type") != "application/json" {
		t.Errorf("replay headers: %v", replay.header)
	}
	if n, _ := e.store.CountJobs(context.Background(), e.project); n != 1 {
		t.Errorf("%d jobs after the replay", n)
	}
}

func TestIdempotencyReplayRestartExpiry(t *testing.T) {
	e := newEnv(t)
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "k1", body: jobBody(nil)}
	first := e.send(r)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %s", first)
	}

	// Same key, another request: 422. Another path is another request too.
	r2 := r
	r2.body = jobBody(map[string]any{"name": "other"})
	if res := e.send(r2); res.status != 422 {
		t.Errorf("reuse: %s", res)
	} else if code, _ := res.errorCode(t); code != "idempotency_key_reuse_conflict" {
		t.Errorf("reuse code %q", code)
	}
	jobID := first.json(t)["id"].(string)
	r3 := req{method: "POST", path: "/v1/jobs/" + jobID + "/runs", token: e.admin, key: "k1"}
	if res := e.send(r3); res.status != 422 {
		t.Errorf("reuse on another route: %s", res)
	}

	// After a restart (a new Server on the same store), the same answer.
	e.restart()
	res := e.send(r)
	if res.status != 201 || !bytes.Equal(res.body, first.body) || res.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay after restart: %s", res)
	}

	// Keys are per project: the same key in another project is new.
	_, other := e.newProject("other")
	r4 := r
	r4.token = other[vibejobs.RoleWrite]
	if res := e.send(r4); res.status != 201 || res.header.Get("Idempotent-Replayed") != "" || bytes.Equal(res.body, first.body) {
		t.Errorf("same key in another project: %s", res)
	}

	// 24 h later the key is forgotten: the request runs again.
	e.clock.Advance(24*time.Hour - time.Millisecond)
	if res := e.send(r); res.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("just before expiry: %s", res)
	}
	e.clock.Advance(time.Millisecond)
	res = e.send(r)
	if res.status != 201 || res.header.Get("Idempotent-Replayed") != "" || bytes.Equal(res.body, first.body) {
		t.Errorf("after expiry: %s", res)
	}
	if n, _ := e.store.CountJobs(context.Background(), e.project); n != 2 {
		t.Errorf("%d jobs after expiry", n)
	}
}

// TestIdempotencyKeyIsPerToken: a stored answer is served before the
// effect, and so before the effect's checks of the caller. Another token of
// the project sending the same key and request must not get the answer: here
// the installation administrator minted an admin token of another project,
// which a plain admin token of the default project may not do.
func TestIdempotencyKeyIsPerToken(t *testing.T) {
	e := newEnv(t)
	other, _ := e.newProject("alpha")
	plain := e.must(http.StatusCreated, "POST", "/v1/projects/"+e.project+"/tokens", e.admin,
		map[string]any{"name": "plain admin", "role": "admin"})["token"].(string)
	r := req{method: "POST", path: "/v1/projects/" + other + "/tokens", token: e.admin, key: "mint-1",
		body: map[string]any{"name": "ops", "role": "admin"}}
	first := e.send(r)
	if first.status != http.StatusCreated {
		t.Fatalf("minting a token of another project: %s", first)
	}
	if res := e.send(r); res.status != http.StatusCreated || res.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay to the same token: %s", res)
	}
	r.token = plain
	res := e.send(r)
	if code, _ := res.errorCode(t); res.status != 422 || code != "idempotency_key_reuse_conflict" {
		t.Fatalf("the same key and request from another token: %s; want 422 idempotency_key_reuse_conflict", res)
	}
	if bytes.Contains(res.body, []byte(first.json(t)["token"].(string))) {
		t.Errorf("the other token was handed the minted token: %s", res)
	}
}

// A refusal from validation is the key's answer too: the same request gets
// it again, even once the cause is gone.
func TestIdempotencyStoresRefusals(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.MaxJobsPerProject = 1 })
	id := e.createJob(e.admin, nil)["id"].(string)
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "full", body: jobBody(nil)}
	first := e.send(r)
	if first.status != 409 {
		t.Fatalf("first: %s", first)
	}
	e.must(204, "DELETE", "/v1/jobs/"+id, e.admin, nil)
	res := e.send(r)
	if res.status != 409 || !bytes.Equal(res.body, first.body) || res.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replayed refusal: %s", res)
	}
	bad := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "bad", body: `{"name":1}`}
	first = e.send(bad)
	if res := e.send(bad); res.status != 400 || !bytes.Equal(res.body, first.body) || res.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replayed 400: %s", res)
	}
	// Nothing of a refused effect commits.
	if n, _ := e.store.CountJobs(context.Background(), e.project); n != 0 {
		t.Errorf("%d jobs", n)
	}
}

// failingStore fails CreateJob with an internal error while fail is set,
// and frees no idempotency key while down is.
type failingStore struct {
	vibejobs.Store
	mu   sync.Mutex
	fail bool
	down bool
}

func (f *failingStore) set(fail, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail, f.down = fail, down
}

func (t *failingTx) DeleteIdempotencyKey(ctx context.Context, projectID, key string, createdAt time.Time) error {
	t.s.mu.Lock()
	down := t.s.down
	t.s.mu.Unlock()
	if down {
		return &vibejobs.Error{Kind: vibejobs.EUNAVAILABLE, Code: "database_unavailable", Message: "the database does not answer"}
	}
	return t.Tx.DeleteIdempotencyKey(ctx, projectID, key, createdAt)
}

func (f *failingStore) failing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail
}

func (f *failingStore) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	return f.Store.Update(ctx, func(tx vibejobs.Tx) error { return fn(&failingTx{Tx: tx, s: f}) })
}

type failingTx struct {
	vibejobs.Tx
	s *failingStore
}

func (t *failingTx) CreateJob(ctx context.Context, j *vibejobs.Job) error {
	if t.s.failing() {
		return errors.New("disk on fire at /var/lib/secret")
	}
	return t.Tx.CreateJob(ctx, j)
}

func (t *failingTx) CreateRun(ctx context.Context, r *vibejobs.Run) error {
	if t.s.failing() {
		panic("bug in CreateRun")
	}
	return t.Tx.CreateRun(ctx, r)
}

// An internal failure answers 500 without details and frees the key, so a
// retry with it proceeds; so does a panic.
func TestIdempotencyInternalFailureFreesKey(t *testing.T) {
	var fs *failingStore
	e := newEnv(t, func(c *api.Config) {
		fs = &failingStore{Store: c.Store, fail: true}
		c.Store = fs
	})
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "retry-me", body: jobBody(nil)}
	res := e.send(r)
	if code, _ := res.errorCode(t); res.status != 500 || code != "internal" {
		t.Fatalf("failure: %s", res)
	}
	if bytes.Contains(res.body, []byte("fire")) {
		t.Errorf("the answer shows the internal error: %s", res.body)
	}
	if !bytes.Contains([]byte(e.logs.String()), []byte("disk on fire")) {
		t.Errorf("the internal error is not logged")
	}
	fs.mu.Lock()
	fs.fail = false
	fs.mu.Unlock()
	if res := e.send(r); res.status != 201 || res.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after failure: %s", res)
	}

	id := e.createJob(e.admin, nil)["id"].(string)
	fs.mu.Lock()
	fs.fail = true
	fs.mu.Unlock()
	tr := req{method: "POST", path: "/v1/jobs/" + id + "/runs", token: e.admin, key: "panics"}
	if res := e.send(tr); res.status != 500 {
		t.Fatalf("panic: %s", res)
	} else if code, _ := res.errorCode(t); code != "internal" {
		t.Errorf("panic answer: %s", res)
	}
	fs.mu.Lock()
	fs.fail = false
	fs.mu.Unlock()
	if res := e.send(tr); res.status != 202 {
		t.Errorf("retry after panic: %s", res)
	}
	// The server still serves.
	e.must(http.StatusOK, "GET", "/v1/jobs/"+id, e.admin, nil)
}

// TestIdempotencyKeyFreedAfterAnOutage: a request that failed while the
// database was down could not free its key either; the next request with
// the key, once the database answers again, frees it and proceeds, rather
// than being told for a minute that the first is still in progress.
func TestIdempotencyKeyFreedAfterAnOutage(t *testing.T) {
	var fs *failingStore
	e := newEnv(t, func(c *api.Config) {
		fs = &failingStore{Store: c.Store}
		c.Store = fs
	})
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "outage", body: jobBody(nil)}
	fs.set(true, true)
	if res := e.send(r); res.status != 500 {
		t.Fatalf("during the outage: %s", res)
	}
	// Still down for the release: the retry fails, and the key stays
	// remembered.
	fs.set(false, true)
	if res := e.send(r); res.status < 500 {
		t.Fatalf("retry while the key cannot be freed: %s", res)
	}
	fs.set(false, false)
	res := e.send(r)
	if res.status != 201 || res.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the outage: %s", res)
	}
	if res := e.send(r); res.status != 201 || res.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %s", res)
	}
}

// Every creating POST takes the key: a replay of each returns its first answer.
func TestIdempotencyOnEveryPost(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, nil)["id"].(string)
	for _, r := range []req{
		{method: "POST", path: "/v1/jobs/" + id + "/runs"},
		{method: "POST", path: "/v1/jobs/" + id + "/rotate-secret"},
		{method: "POST", path: "/v1/jobs/" + id + "/pause"},
		{method: "POST", path: "/v1/jobs/" + id + "/resume"},
		{method: "POST", path: "/v1/projects", body: `{"name":"p"}`},
		{method: "POST", path: "/v1/projects/" + e.project + "/tokens", body: `{"name":"t","role":"read"}`},
	} {
		r.token, r.key = e.admin, "key-"+r.path
		first := e.send(r)
		if first.status >= 300 {
			t.Fatalf("%s: %s", r.path, first)
		}
		e.clock.Advance(time.Second)
		again := e.send(r)
		if again.status != first.status || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s replay: %s, first %s", r.path, again, first)
		}
	}
	runs := e.must(200, "GET", "/v1/jobs/"+id+"/runs", e.admin, nil)["runs"].([]any)
	if len(runs) != 1 {
		t.Errorf("%d manual runs after a replayed trigger", len(runs))
	}
}

// TestIdempotencyKeyRuleIsStated: a key with a space is refused, and the
// refusal and the OpenAPI document both say so: a space is printable ASCII,
// so "1 to 255 printable ASCII characters" alone told a client whose key
// was refused that it was fine.
func TestIdempotencyKeyRuleIsStated(t *testing.T) {
	e := newEnv(t)
	res := e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: "order 42", body: jobBody(nil)})
	if code, _ := res.errorCode(t); res.status != 400 || code != "invalid_idempotency_key" {
		t.Fatalf("a key with a space: %s", res)
	}
	msg, _ := res.json(t)["error"].(map[string]any)["message"].(string)
	if !strings.Contains(msg, "space") {
		t.Errorf("the refusal of a key with a space does not mention spaces: %q", msg)
	}

	var doc struct {
		Components struct {
			Parameters map[string]struct {
				Schema struct {
					Pattern string `json:"pattern"`
				} `json:"schema"`
			} `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(e.do("GET", "/v1/openapi.json", "", nil).body, &doc); err != nil {
		t.Fatal(err)
	}
	pattern := doc.Components.Parameters["IdempotencyKey"].Schema.Pattern
	re, err := regexp.Compile(pattern)
	if pattern == "" || err != nil {
		t.Fatalf("the IdempotencyKey parameter's pattern %q: %v", pattern, err)
	}
	for _, key := range []string{"k", "7a3c2d1e-9b8f-4a7e-8c5d-2e1f4a6b8c0d", "a~!#", strings.Repeat("k", 255),
		"", "order 42", "clé", "tab\there", strings.Repeat("k", 256)} {
		if got, want := re.MatchString(key), vibejobs.ValidIdempotencyKey(key); got != want {
			t.Errorf("pattern %q matches %q: %v; the server takes it: %v", pattern, key, got, want)
		}
	}
}

// completeDownStore answers every CompleteIdempotencyKey as a database that
// stopped answering would.
type completeDownStore struct{ vibejobs.Store }

func (s completeDownStore) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	return s.Store.Update(ctx, func(tx vibejobs.Tx) error { return fn(completeDownTx{tx}) })
}

type completeDownTx struct{ vibejobs.Tx }

func (completeDownTx) CompleteIdempotencyKey(context.Context, *vibejobs.IdempotencyRecord) error {
	return &vibejobs.Error{Kind: vibejobs.EUNAVAILABLE, Code: "database_unavailable", Message: "the database does not answer"}
}

// A database that stops answering as the request completes its key is a
// passing fault like any other: 503 database_unavailable with Retry-After,
// not 500 internal, and nothing is created.
func TestIdempotencyCompletionUnavailableIs503(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.Store = completeDownStore{c.Store} })
	res := e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: "complete-down", body: jobBody(nil)})
	if code, _ := res.errorCode(t); res.status != 503 || code != "database_unavailable" || res.header.Get("Retry-After") == "" {
		t.Fatalf("completion while the database is down: %s, want 503 database_unavailable with Retry-After", res)
	}
	if res := e.send(req{method: "GET", path: "/v1/jobs", token: e.admin}); !strings.Contains(string(res.body), `"jobs":[]`) {
		t.Errorf("a job was created by a request that answered 503: %s", res.body)
	}
}
