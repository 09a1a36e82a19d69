package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// pgAPI is the API on a fresh PostgreSQL schema behind a loopback listener,
// with a fake clock and the bootstrap token.
type pgAPI struct {
	t      *testing.T
	url    string
	token  string
	store  *postgres.Store
	clock  *clock
	mu     sync.Mutex
	bodies []string // every answer, for the secret scans
}

func newPGAPI(t *testing.T) *pgAPI {
	t.Helper()
	clk := &clock{t: t0}
	h, tok, st := postgresAPI(t, func(c *api.Config) { c.Now = clk.Now })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &pgAPI{t: t, url: srv.URL, token: tok, store: st, clock: clk}
}

func (p *pgAPI) send(method, path, key string, body []byte) *result {
	p.t.Helper()
	hr, err := http.NewRequest(method, p.url+path, bytes.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	hr.Header.Set("Authorization", "Bearer "+p.token)
	if key != "" {
		hr.Header.Set("Idempotency-Key", key)
	}
	return roundTrip(p.t, hr, func(body string) {
		p.mu.Lock()
		p.bodies = append(p.bodies, body)
		p.mu.Unlock()
	})
}

func (p *pgAPI) project() string {
	p.t.Helper()
	ps, _, err := p.store.ListProjects(context.Background(), vibejobs.Page{})
	if err != nil || len(ps) != 1 {
		p.t.Fatalf("projects: %v, %v", ps, err)
	}
	return ps[0].ID
}

func (p *pgAPI) jobs() int {
	p.t.Helper()
	n, err := p.store.CountJobs(context.Background(), p.project())
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

// concurrently sends n copies of one POST at once and checks that every
// answer is the same 201 or a 409 idempotency_key_in_progress with
// Retry-After; it returns the 201's body (nil if none).
func (p *pgAPI) concurrently(n int, path, key string, body []byte) []byte {
	p.t.Helper()
	results := make([]*result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = p.send("POST", path, key, body)
		})
	}
	close(start)
	wg.Wait()
	var created []byte
	for _, res := range results {
		switch res.status {
		case http.StatusCreated:
			if created == nil {
				created = res.body
			} else if !bytes.Equal(created, res.body) {
				p.t.Errorf("two different 201 answers to one key:\n%s\n%s", created, res.body)
			}
		case http.StatusConflict:
			if code, _ := res.errorCode(p.t); code != "idempotency_key_in_progress" || res.header.Get("Retry-After") == "" {
				p.t.Errorf("409 answer: %s (Retry-After %q)", res, res.header.Get("Retry-After"))
			}
		default:
			p.t.Errorf("answer to one of %d requests with one key: %s", n, res)
		}
	}
	return created
}

// TestIdempotencyOnPostgres runs the Idempotency-Key promises of
// SEMANTICS.md section 5 through the HTTP handlers on PostgreSQL, whose
// concurrent transactions (unlike SQLite's single writer) really race: many
// requests with one key, at once, do the work once; a retry gets the stored
// status, headers and body; another request with the key is 422; a refusal
// is stored; an abandoned claim is taken over by exactly one of many
// retries.
func TestIdempotencyOnPostgres(t *testing.T) {
	p := newPGAPI(t)
	body, _ := json.Marshal(jobBody(nil))

	created := p.concurrently(30, "/v1/jobs", "pg-one-key", body)
	if n := p.jobs(); n != 1 {
		t.Fatalf("%d jobs after 30 creates with one key, want 1", n)
	}
	replay := p.send("POST", "/v1/jobs", "pg-one-key", body)
	if replay.status != http.StatusCreated || replay.header.Get("Idempotent-Replayed") != "true" ||
		replay.header.Get("Location") == "" || replay.header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay: %s %v", replay, replay.header)
	}
	if created != nil && !bytes.Equal(replay.body, created) {
		t.Errorf("replay differs from the first answer:\n%s\n%s", replay.body, created)
	}

	other, _ := json.Marshal(jobBody(map[string]any{"name": "other"}))
	res := p.send("POST", "/v1/jobs", "pg-one-key", other)
	if code, _ := res.errorCode(t); res.status != http.StatusUnprocessableEntity || code != "idempotency_key_reuse_conflict" {
		t.Errorf("same key, another body: %s", res)
	}
	if res := p.send("POST", "/v1/jobs/"+replay.json(t)["id"].(string)+"/pause", "pg-one-key", nil); res.status != http.StatusUnprocessableEntity {
		t.Errorf("same key, another path: %s", res)
	}

	bad := []byte(`{"name":1}`)
	first := p.send("POST", "/v1/jobs", "pg-bad", bad)
	if first.status != http.StatusBadRequest {
		t.Fatalf("invalid body: %s", first)
	}
	if res := p.send("POST", "/v1/jobs", "pg-bad", bad); res.status != http.StatusBadRequest ||
		!bytes.Equal(res.body, first.body) || res.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replayed refusal: %s", res)
	}

	// A claim whose request died with its process: after 60 s by the
	// database's clock, many retries at once take it over, and exactly one
	// does the work.
	tokens, _, err := p.store.ListTokens(context.Background(), p.project(), vibejobs.Page{})
	if err != nil || len(tokens) != 1 {
		t.Fatalf("the bootstrap token: %v, %v", tokens, err)
	}
	hr, _ := http.NewRequest("POST", "/v1/jobs", nil)
	rec := &vibejobs.IdempotencyRecord{ProjectID: p.project(), Key: "pg-abandoned", RequestHash: api.RequestHash(hr, tokens[0].ID, body),
		CreatedAt: p.clock.Now(), ExpiresAt: p.clock.Now().Add(24 * time.Hour)}
	ctx := context.Background()
	if err := p.store.Update(ctx, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(ctx, rec) }); err != nil {
		t.Fatal(err)
	}
	if res := p.send("POST", "/v1/jobs", "pg-abandoned", body); res.status != http.StatusConflict {
		t.Fatalf("while the claim is fresh: %s", res)
	}
	// The replica's clock moves one second on: the retries' claims are
	// other claims than the abandoned one (CreatedAt tells them apart).
	postgres.AgeIdempotencyClaim(t, p.store, p.project(), "pg-abandoned", 60*time.Second)
	p.clock.Advance(time.Second)
	before := p.jobs()
	p.concurrently(20, "/v1/jobs", "pg-abandoned", body)
	if n := p.jobs(); n != before+1 {
		t.Errorf("%d jobs made by 20 retries taking one abandoned claim over, want 1", n-before)
	}
}

// pgReplicas serves the API from two replicas sharing one fresh PostgreSQL
// schema, each with its own Store, master keyring copy and fake clock: the
// second's runs skew ahead of the first's (behind when negative). Each
// replica's Store sits behind a hookedStore. Both use the bootstrap token.
func pgReplicas(t *testing.T, skew time.Duration) (first, second *pgAPI, firstHooks, secondHooks *hookedStore) {
	t.Helper()
	schema := postgres.NewTestSchema(t)
	keyring := mustKeyring(t)
	var token string
	replica := func(at time.Time) (*pgAPI, *hookedStore) {
		st := postgres.MustOpenTestWith(t, postgres.Options{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
		clk := &clock{t: at}
		if token == "" {
			tok, _, err := api.Bootstrap(context.Background(), st, clk.Now(), nil)
			if err != nil {
				t.Fatal(err)
			}
			token = tok
		}
		policy, err := egress.NewPolicy(nil)
		if err != nil {
			t.Fatal(err)
		}
		hooks := &hookedStore{Store: st}
		h := api.New(api.Config{Store: hooks, Sealer: keyring, URLs: policy, Now: clk.Now,
			Logger: slog.New(slog.DiscardHandler), RateLimit: api.RateLimit{PerSecond: -1}}).Handler()
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return &pgAPI{t: t, url: srv.URL, token: token, store: st, clock: clk}, hooks
	}
	first, firstHooks = replica(t0)
	second, secondHooks = replica(t0.Add(skew))
	return first, second, firstHooks, secondHooks
}

// hookedStore calls its hooks at the Idempotency-Key steps of the requests
// made through it; a nil hook does nothing.
type hookedStore struct {
	vibejobs.Store
	// beforeCompletion runs in the transaction of a request's effect, just
	// before the key's completion.
	beforeCompletion func()
	// claimed runs once a transaction that claimed a key has committed.
	claimed func()
}

func (h *hookedStore) Update(ctx context.Context, fn func(vibejobs.Tx) error) error {
	var claimed bool
	err := h.Store.Update(ctx, func(tx vibejobs.Tx) error {
		claimed = false
		return fn(hookedTx{Tx: tx, h: h, claimed: &claimed})
	})
	if err == nil && claimed && h.claimed != nil {
		h.claimed()
	}
	return err
}

type hookedTx struct {
	vibejobs.Tx
	h       *hookedStore
	claimed *bool
}

func (t hookedTx) InsertIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	err := t.Tx.InsertIdempotencyKey(ctx, rec)
	*t.claimed = err == nil
	return err
}

func (t hookedTx) CompleteIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	if t.h.beforeCompletion != nil {
		t.h.beforeCompletion()
	}
	return t.Tx.CompleteIdempotencyKey(ctx, rec)
}

// holdCompletions makes h hold every request's completion, inside the
// transaction of its effect, until the returned release is called (or the
// test ends); reached receives when one is held.
func holdCompletions(t *testing.T, h *hookedStore) (reached <-chan struct{}, release func()) {
	r, open := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(open) }) }
	t.Cleanup(release)
	h.beforeCompletion = func() {
		select {
		case r <- struct{}{}:
		default:
		}
		<-open
	}
	return r, release
}

// signal returns a hook that sends on the returned channel each time it
// runs, without waiting.
func signal() (func(), <-chan struct{}) {
	c := make(chan struct{}, 1)
	return func() {
		select {
		case c <- struct{}{}:
		default:
		}
	}, c
}

// sendAsync sends the POST from a goroutine and returns where its answer
// arrives.
func (p *pgAPI) sendAsync(path, key string, body []byte) <-chan *result {
	c := make(chan *result, 1)
	go func() { c <- p.send("POST", path, key, body) }()
	return c
}

// TestIdempotencyOnSkewedReplicas: the age at which an in-progress claim is
// taken over (60 s) is measured on the database server's clock. A request
// still in progress on one replica keeps its key against a retry sent to a
// replica whose clock runs ten minutes ahead: the retry is told the first
// is in progress, the first completes, and the retry then gets its answer.
// (Measured on the replicas' clocks, the claim looked ten minutes old to
// the second replica, which took it over: the first request answered 500.)
func TestIdempotencyOnSkewedReplicas(t *testing.T) {
	first, second, firstHooks, secondHooks := pgReplicas(t, 10*time.Minute)
	reached, release := holdCompletions(t, firstHooks)
	claimed, claimedBySecond := signal()
	secondHooks.claimed = claimed
	body, _ := json.Marshal(jobBody(nil))

	slow := first.sendAsync("/v1/jobs", "skewed", body)
	<-reached // the first request has made the job and holds the key
	retry := second.sendAsync("/v1/jobs", "skewed", body)
	select {
	case res := <-retry:
		if code, _ := res.errorCode(t); res.status != http.StatusConflict || code != "idempotency_key_in_progress" ||
			res.header.Get("Retry-After") == "" {
			t.Errorf("a retry on the replica ahead while the first request is in progress: %s, want 409 in progress", res)
		}
	case <-claimedBySecond:
		t.Errorf("the replica ten minutes ahead took over a claim the database made moments ago")
		release()
		<-retry
	}
	release()
	res := <-slow
	if res.status != http.StatusCreated {
		t.Fatalf("the first request: %s, want 201", res)
	}
	wantReplayedOnce(t, second, "skewed", body, res, "the retry after the first request completed")
}

// wantReplayedOnce sends POST /v1/jobs with key and body to api and wants
// done's answer replayed, and one job in the project: the request did its
// work once.
func wantReplayedOnce(t *testing.T, api *pgAPI, key string, body []byte, done *result, what string) {
	t.Helper()
	replay := api.send("POST", "/v1/jobs", key, body)
	if replay.status != http.StatusCreated || !bytes.Equal(replay.body, done.body) || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("%s: %s, want %s replayed", what, replay, done)
	}
	if n := api.jobs(); n != 1 {
		t.Errorf("%d jobs, want 1", n)
	}
}

// TestIdempotencyTakenOverAnswersConflict: a request that stalls for over a
// minute by the database's clock has its key taken over by a retry (here on
// a replica whose clock runs ten minutes behind: the database's clock
// decides). When the stalled request then completes, nothing of it is
// applied, and it answers 409 idempotency_key_in_progress with
// Retry-After, not 500; retried, it gets the answer of the request that
// took the key over, which did the work once.
func TestIdempotencyTakenOverAnswersConflict(t *testing.T) {
	first, second, firstHooks, secondHooks := pgReplicas(t, -10*time.Minute)
	reached, release := holdCompletions(t, firstHooks)
	claimed, claimedBySecond := signal()
	secondHooks.claimed = claimed
	body, _ := json.Marshal(jobBody(nil))

	stalled := first.sendAsync("/v1/jobs", "stalled", body)
	<-reached
	postgres.AgeIdempotencyClaim(t, first.store, first.project(), "stalled", 61*time.Second)
	takeover := second.sendAsync("/v1/jobs", "stalled", body)
	select {
	case <-claimedBySecond: // the retry holds the key now
	case res := <-takeover:
		release()
		t.Fatalf("a retry once the first request held its key 61 s by the database's clock: %s, want it to take the key over", res)
	}
	release()
	res := <-stalled
	if code, _ := res.errorCode(t); res.status != http.StatusConflict || code != "idempotency_key_in_progress" ||
		res.header.Get("Retry-After") == "" {
		t.Errorf("the request whose key was taken over: %s (Retry-After %q), want 409 idempotency_key_in_progress",
			res, res.header.Get("Retry-After"))
	}
	created := <-takeover
	if created.status != http.StatusCreated {
		t.Fatalf("the request that took the key over: %s, want 201", created)
	}
	wantReplayedOnce(t, first, "stalled", body, created, "the stalled request, retried")
}

// TestNoSecretAtRestOnPostgres: on PostgreSQL too, no job or subscription
// secret and no API token rests in any table in clear (the stored
// Idempotency-Key answers that hold them included), and only the answers
// that create or rotate a secret show it.
func TestNoSecretAtRestOnPostgres(t *testing.T) {
	p := newPGAPI(t)
	var secrets []string
	var allowed []string
	keep := func(res *result, want int) map[string]any {
		t.Helper()
		if res.status != want {
			t.Fatalf("got %s, want %d", res, want)
		}
		m := res.json(t)
		secrets = append(secrets, m["secret"].(string))
		allowed = append(allowed, string(res.body))
		return m
	}
	body, _ := json.Marshal(jobBody(nil))
	job := keep(p.send("POST", "/v1/jobs", "create-job", body), http.StatusCreated)
	jobID := job["id"].(string)
	keep(p.send("POST", "/v1/jobs/"+jobID+"/rotate-secret", "rotate-job", nil), http.StatusOK)
	sub := keep(p.send("POST", "/v1/subscriptions", "create-sub", []byte(`{"url":"https://example.test/feed"}`)), http.StatusCreated)
	subID := sub["id"].(string)
	keep(p.send("POST", "/v1/subscriptions/"+subID+"/rotate-secret", "rotate-sub", nil), http.StatusOK)
	tok := p.send("POST", "/v1/projects/"+p.project()+"/tokens", "mint", []byte(`{"name":"t","role":"read"}`))
	if tok.status != http.StatusCreated {
		t.Fatalf("minting a token: %s", tok)
	}
	allowed = append(allowed, string(tok.body))
	tokens := []string{p.token, tok.json(t)["token"].(string)}
	// Replays are read back from the database.
	p.send("POST", "/v1/jobs", "create-job", body)
	p.send("POST", "/v1/subscriptions/"+subID+"/rotate-secret", "rotate-sub", nil)
	for _, path := range []string{"/v1/jobs", "/v1/jobs/" + jobID, "/v1/jobs/" + jobID + "/runs", "/v1/subscriptions",
		"/v1/subscriptions/" + subID, "/v1/events", "/v1/projects/" + p.project() + "/tokens"} {
		if res := p.send("GET", path, "", nil); res.status != http.StatusOK {
			t.Errorf("GET %s: %s", path, res)
		}
	}
	p.mu.Lock()
	bodies := append([]string(nil), p.bodies...)
	p.mu.Unlock()
	for _, b := range bodies {
		if strings.Contains(b, "vjs_") && !slices.Contains(allowed, b) {
			t.Errorf("an answer other than create or rotate holds a secret: %s", b)
		}
	}

	ctx := context.Background()
	rows, err := p.store.Pool().Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(tables) == 0 {
		t.Fatalf("tables: %v, %v", tables, err)
	}
	for _, table := range tables {
		var dump string
		q := `SELECT coalesce(string_agg(t::text, E'\n'), '') FROM "` + table + `" t`
		if err := p.store.Pool().QueryRow(ctx, q).Scan(&dump); err != nil {
			t.Fatal(err)
		}
		for _, s := range append(append([]string{"vjs_"}, secrets...), tokens...) {
			if strings.Contains(dump, s) {
				t.Errorf("table %s holds a secret or token in clear", table)
			}
		}
	}
}
