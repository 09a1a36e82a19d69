package subscriptions_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/dispatcher"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/secretbox"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/subscriptions"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
	"github.com/vibejobs/vibejobs/receiver"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// clock is a fake clock the test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// request is one request a receiver got.
type request struct {
	path   string
	header http.Header
	body   []byte
	event  map[string]any
}

func (r request) seq() int { return int(r.event["sequence"].(float64)) }

// recv is a loopback receiver answering from a script (default 200).
type recv struct {
	srv    *httptest.Server
	got    chan request
	mu     sync.Mutex
	script []int
	hold   chan struct{} // when set, requests wait for it to close
}

func newRecv(t *testing.T) *recv {
	t.Helper()
	r := &recv{got: make(chan request, 1000)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var ev map[string]any
		_ = json.Unmarshal(body, &ev)
		r.mu.Lock()
		status := 200
		if len(r.script) > 0 {
			status, r.script = r.script[0], r.script[1:]
		}
		hold := r.hold
		r.mu.Unlock()
		r.got <- request{path: req.URL.Path, header: req.Header.Clone(), body: body, event: ev}
		if hold != nil {
			<-hold
		}
		if status == 302 {
			w.Header().Set("Location", "http://127.0.0.1:1/")
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recv) answer(statuses ...int) {
	r.mu.Lock()
	r.script = append(r.script, statuses...)
	r.mu.Unlock()
}

// drain returns the requests received so far.
func (r *recv) drain() []request {
	var out []request
	for {
		select {
		case x := <-r.got:
			out = append(out, x)
		default:
			return out
		}
	}
}

func (r *recv) next(t *testing.T) request {
	t.Helper()
	select {
	case x := <-r.got:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received")
		return request{}
	}
}

func seqs(rs []request) []int {
	var out []int
	for _, r := range rs {
		out = append(out, r.seq())
	}
	return out
}

type env struct {
	t       *testing.T
	store   *sqlite.Store
	keys    *secretbox.Keyring
	client  *egress.Client
	clock   *clock
	logs    *syncbuf.Buffer
	project string
	job     *vibejobs.Job
}

// newEmptyEnv is an env on a store without a project.
func newEmptyEnv(t *testing.T) *env {
	t.Helper()
	c := &clock{t: t0}
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"), sqlite.Options{Now: c.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, _ := secretbox.NewKey()
	keys, err := secretbox.Parse([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	policy, err := egress.NewPolicy([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	client, err := egress.NewClient(egress.Config{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.CloseIdleConnections)
	return &env{t: t, store: st, keys: keys, client: client, clock: c, logs: &syncbuf.Buffer{}}
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := newEmptyEnv(t)
	e.project = "prj_test"
	e.update(func(tx vibejobs.Tx) error {
		return tx.CreateProject(context.Background(), &vibejobs.Project{ID: e.project, Name: "test", CreatedAt: t0})
	})
	e.job = e.newJob("job_a", "http://127.0.0.1:1/")
	return e
}

func (e *env) update(fn func(tx vibejobs.Tx) error) {
	e.t.Helper()
	if err := e.store.Update(context.Background(), fn); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) newJob(id, url string) *vibejobs.Job {
	e.t.Helper()
	now := e.clock.Now()
	secret, _ := contract.NewSecret(nil)
	sealed, _ := e.keys.Seal(secret, id)
	j := &vibejobs.Job{ID: id, ProjectID: e.project, Name: id, Schedule: "0 0 1 1 *", Timezone: "UTC", URL: url,
		Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.RetryPolicy{MaxAttempts: 1, MinBackoff: time.Second, MaxBackoff: time.Second},
		Timeout: 5 * time.Second, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: now, CreatedAt: now, UpdatedAt: now, Secret: sealed}
	e.update(func(tx vibejobs.Tx) error { return tx.CreateJob(context.Background(), j) })
	return j
}

// subscribe creates a subscription to url and returns it with its secret.
func (e *env) subscribe(url string, mods ...func(*vibejobs.Subscription)) (*vibejobs.Subscription, string) {
	e.t.Helper()
	now := e.clock.Now()
	s := &vibejobs.Subscription{ID: vibejobs.NewID("sub_", now, nil), ProjectID: e.project, URL: url, CreatedAt: now, UpdatedAt: now}
	secret, _ := contract.NewSecret(nil)
	s.Secret, _ = e.keys.Seal(secret, s.ID)
	for _, m := range mods {
		m(s)
	}
	e.update(func(tx vibejobs.Tx) error {
		return tx.CreateSubscription(context.Background(), s, vibejobs.MaxSubscriptionsPerProject)
	})
	return s, secret
}

func (e *env) get(id string) *vibejobs.Subscription {
	e.t.Helper()
	s, err := e.store.GetSubscription(context.Background(), e.project, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// emit appends job events of the given types for job.
func (e *env) emit(job *vibejobs.Job, types ...vibejobs.EventType) {
	e.t.Helper()
	e.update(func(tx vibejobs.Tx) error {
		var evs []*vibejobs.Event
		for _, t := range types {
			evs = append(evs, vibejobs.JobEvent(t, job, e.clock.Now()))
		}
		return tx.AppendEvents(context.Background(), evs...)
	})
}

func (e *env) updates(n int) []vibejobs.EventType {
	out := make([]vibejobs.EventType, n)
	for i := range out {
		out[i] = vibejobs.EventJobUpdated
	}
	return out
}

func (e *env) deliverer(owner string, store subscriptions.Store) *subscriptions.Deliverer {
	return e.delivererWith(owner, store, e.keys)
}

// delivererWith is deliverer opening the secrets with opener, its Config
// then changed by mods.
func (e *env) delivererWith(owner string, store subscriptions.Store, opener subscriptions.SecretOpener, mods ...func(*subscriptions.Config)) *subscriptions.Deliverer {
	if store == nil {
		store = e.store
	}
	cfg := subscriptions.Config{
		Store: store, Sender: e.client, Opener: opener, Owner: owner, UserAgent: "vibejobs/test",
		Logger: slog.New(slog.NewJSONHandler(e.logs, nil)), Now: e.clock.Now,
		Rand:         func() float64 { return 0.5 }, // jitter at the middle: the plain backoff
		PollInterval: 10 * time.Millisecond,
	}
	for _, m := range mods {
		m(&cfg)
	}
	return subscriptions.New(cfg)
}

func runOnce(t *testing.T, d *subscriptions.Deliverer) {
	t.Helper()
	if err := d.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestOrderKeptAcrossRetries(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, secret := e.subscribe(r.srv.URL + "/hook")
	d := e.deliverer("w1", nil)
	e.emit(e.job, e.updates(3)...)
	r.answer(200, 500)

	runOnce(t, d)
	got := r.drain()
	if s := seqs(got); len(s) != 2 || s[0] != 1 || s[1] != 2 {
		t.Fatalf("first round received %v, want 1 2", s)
	}
	for _, x := range got {
		if err := receiver.VerifyEvent(x.header.Get("Vibe-Signature"), x.body, e.clock.Now(), secret); err != nil {
			t.Fatalf("signature: %v", err)
		}
		id := e.project + ":" + x.header.Get(subscriptions.HeaderEventID)[len(e.project)+1:]
		if x.header.Get(subscriptions.HeaderEventID) != x.event["id"] || x.event["id"] != id ||
			x.header.Get(subscriptions.HeaderEventType) != "job.updated" || x.header.Get("Content-Type") != "application/json" {
			t.Fatalf("headers %v for %s", x.header, x.body)
		}
	}
	s := e.get(sub.ID)
	if s.Cursor != 1 || s.ErrorCode != "http_5xx" || s.Attempts != 1 || !s.NextAttemptAt.Equal(t0.Add(12*time.Second)) || s.LastSuccessAt == nil {
		t.Fatalf("after a 500: %+v", s)
	}

	// Nothing before its time; then event 2 again (same id), refused again:
	// the pause doubles.
	e.emit(e.job, vibejobs.EventJobPaused)
	e.clock.Add(12*time.Second - time.Millisecond)
	runOnce(t, d)
	if got := r.drain(); len(got) != 0 {
		t.Fatalf("retried before its time: %v", seqs(got))
	}
	e.clock.Add(time.Millisecond)
	r.answer(503)
	runOnce(t, d)
	again := r.drain()
	if len(again) != 1 || again[0].seq() != 2 || !bytes.Equal(again[0].body, got[1].body) {
		t.Fatalf("retry: %v", seqs(again))
	}
	s = e.get(sub.ID)
	if s.Cursor != 1 || s.Attempts != 2 || !s.NextAttemptAt.Equal(e.clock.Now().Add(24*time.Second)) {
		t.Fatalf("after a second failure: %+v", s)
	}
	// 12 s doubling, capped at 1 h.
	for n, want := range map[int]time.Duration{1: 12 * time.Second, 3: 48 * time.Second, 9: 3072 * time.Second, 10: time.Hour, 30: time.Hour} {
		if got := vibejobs.SubscriptionBackoff(n); got != want {
			t.Errorf("backoff after %d failures = %v, want %v", n, got, want)
		}
	}

	e.clock.Add(24 * time.Second)
	runOnce(t, d)
	if s := seqs(r.drain()); len(s) != 3 || s[0] != 2 || s[1] != 3 || s[2] != 4 {
		t.Fatalf("after recovery received %v, want 2 3 4", s)
	}
	s = e.get(sub.ID)
	if s.Cursor != 4 || s.Failing() || s.Attempts != 0 || s.NextAttemptAt != nil || !s.LastSuccessAt.Equal(e.clock.Now()) {
		t.Fatalf("recovered: %+v", s)
	}
	logs := e.logs.String()
	if strings.Count(logs, `"msg":"subscription.step_failed"`) != 2 || strings.Count(logs, `"msg":"subscription.recovered"`) != 1 {
		t.Errorf("logs:\n%s", logs)
	}
	for _, bad := range []string{"127.0.0.1", "/hook", "vjs_", secret} {
		if strings.Contains(logs, bad) {
			t.Errorf("the log holds %q:\n%s", bad, logs)
		}
	}
}

// TestCursorOnlyAfter2xx: no answer but a 2xx moves the cursor, whatever
// the refusal: a redirect, a 4xx (even 401), a timeout, a closed port.
func TestCursorOnlyAfter2xx(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL)
	e.emit(e.job, e.updates(2)...)
	d := e.deliverer("w1", nil)
	for i, c := range []struct {
		status int
		code   string
	}{{302, "redirect"}, {404, "http_4xx"}, {401, "http_4xx"}, {500, "http_5xx"}, {204, ""}} {
		r.answer(c.status)
		if c.code == "" {
			r.answer(200)
		}
		runOnce(t, d)
		s := e.get(sub.ID)
		if c.code != "" {
			if s.Cursor != 0 || s.ErrorCode != c.code || s.Attempts != i+1 {
				t.Fatalf("after %d: %+v", c.status, s)
			}
			e.clock.Add(2 * time.Hour)
			continue
		}
		if s.Cursor != 2 || s.Failing() {
			t.Fatalf("after %d: %+v", c.status, s)
		}
	}
	if got := seqs(r.drain()); len(got) != 6 {
		t.Fatalf("received %v", got)
	}

	// A closed port: network, the cursor stays.
	dead, _ := e.subscribe("http://127.0.0.1:1/")
	e.emit(e.job, vibejobs.EventJobUpdated)
	runOnce(t, d)
	if s := e.get(dead.ID); s.Cursor != 2 || s.ErrorCode != egress.CodeNetwork {
		t.Fatalf("closed port: %+v", s)
	}
}

// failingStepStore fails the first delivered step after the receiver's 2xx:
// the process "crashes" before the cursor is written.
type failingStepStore struct {
	subscriptions.Store
	mu     sync.Mutex
	failed bool
}

func (f *failingStepStore) RecordSubscriptionStep(ctx context.Context, owner string, st vibejobs.SubscriptionStep) (*vibejobs.Subscription, error) {
	f.mu.Lock()
	fail := st.Delivered && !f.failed
	f.failed = f.failed || fail
	f.mu.Unlock()
	if fail {
		return nil, errors.New("connection reset while writing the cursor")
	}
	return f.Store.RecordSubscriptionStep(ctx, owner, st)
}

// TestCrashBetween2xxAndCursorRepeatsEvent: the receiver accepted events
// but the cursor write failed (the process died): whoever takes the
// subscription over sends them again, under the same ids, in order.
func TestCrashBetween2xxAndCursorRepeatsEvent(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL)
	e.emit(e.job, e.updates(2)...)

	runOnce(t, e.deliverer("dies", &failingStepStore{Store: e.store}))
	first := r.drain()
	if s := seqs(first); len(s) != 2 || s[0] != 1 || s[1] != 2 {
		t.Fatalf("before the crash: %v", s)
	}
	if s := e.get(sub.ID); s.Cursor != 0 || s.LastSuccessAt != nil {
		t.Fatalf("cursor moved without its write: %+v", s)
	}
	// Another process takes over once the lease expires.
	next := e.deliverer("takes-over", nil)
	runOnce(t, next)
	if got := r.drain(); len(got) != 0 {
		t.Fatalf("taken over while leased: %v", seqs(got))
	}
	e.clock.Add(subscriptions.DefaultLease + time.Millisecond)
	runOnce(t, next)
	again := r.drain()
	if len(again) != 2 {
		t.Fatalf("after the takeover: %v", seqs(again))
	}
	for i := range again {
		if again[i].event["id"] != first[i].event["id"] ||
			again[i].header.Get(subscriptions.HeaderEventID) != first[i].header.Get(subscriptions.HeaderEventID) ||
			!bytes.Equal(again[i].body, first[i].body) {
			t.Fatalf("the repeated event changed: %s vs %s", again[i].body, first[i].body)
		}
	}
	if s := e.get(sub.ID); s.Cursor != 2 || s.LastSuccessAt == nil {
		t.Fatalf("after the takeover: %+v", s)
	}
	if !strings.Contains(e.logs.String(), "subscription.step_failed") {
		t.Error("the failed cursor write was not logged")
	}
}

func TestFilters(t *testing.T) {
	e := newEnv(t)
	other := e.newJob("job_b", "http://127.0.0.1:1/")
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL, func(s *vibejobs.Subscription) {
		s.Types = []vibejobs.EventType{vibejobs.EventJobPaused, vibejobs.EventJobDeleted}
		s.JobIDs = []string{e.job.ID}
	})
	all, _ := e.subscribe(r.srv.URL + "/all")
	e.emit(e.job, vibejobs.EventJobUpdated, vibejobs.EventJobPaused, vibejobs.EventJobUpdated)
	e.emit(other, vibejobs.EventJobPaused, vibejobs.EventJobDeleted)
	e.emit(e.job, vibejobs.EventJobDeleted, vibejobs.EventJobUpdated, vibejobs.EventJobUpdated)
	runOnce(t, e.deliverer("w1", nil))
	var filtered, unfiltered []int
	for _, x := range r.drain() {
		if x.path == "/all" {
			unfiltered = append(unfiltered, x.seq())
		} else {
			filtered = append(filtered, x.seq())
		}
	}
	if len(filtered) != 2 || filtered[0] != 2 || filtered[1] != 6 || len(unfiltered) != 8 {
		t.Fatalf("the filtered subscription got %v (want 2 6), the other %v", filtered, unfiltered)
	}
	if s := e.get(sub.ID); s.Cursor != 8 || s.Failing() {
		t.Fatalf("filtered subscription: cursor %d (excluded events move it without a request)", s.Cursor)
	}
	if s := e.get(all.ID); s.Cursor != 8 {
		t.Fatalf("unfiltered subscription: cursor %d", s.Cursor)
	}
	// Only excluded events: the cursor moves, nothing is sent.
	e.emit(other, vibejobs.EventJobUpdated, vibejobs.EventJobUpdated)
	e.update(func(tx vibejobs.Tx) error { return tx.DeleteSubscription(context.Background(), e.project, all.ID) })
	runOnce(t, e.deliverer("w1", nil))
	if got := r.drain(); len(got) != 0 {
		t.Fatalf("sent excluded events: %v", seqs(got))
	}
	if s := e.get(sub.ID); s.Cursor != 10 {
		t.Fatalf("cursor %d, want 10", s.Cursor)
	}
}

// TestSixteenSubscriptions: the cap is 16 per project and every one of them
// gets every event.
func TestSixteenSubscriptions(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	for range vibejobs.MaxSubscriptionsPerProject {
		e.subscribe(r.srv.URL)
	}
	err := e.store.Update(context.Background(), func(tx vibejobs.Tx) error {
		s := &vibejobs.Subscription{ID: "sub_17", ProjectID: e.project, URL: r.srv.URL, Secret: vibejobs.SealedSecret{KeyID: "k", Ciphertext: []byte{1}}}
		return tx.CreateSubscription(context.Background(), s, vibejobs.MaxSubscriptionsPerProject)
	})
	if vibejobs.ErrorKind(err) != vibejobs.ECONFLICT {
		t.Fatalf("a 17th subscription: %v", err)
	}
	e.emit(e.job, e.updates(5)...)
	runOnce(t, e.deliverer("w1", nil))
	perEvent := map[string]int{}
	for _, x := range r.drain() {
		perEvent[x.header.Get(subscriptions.HeaderEventID)]++
	}
	if len(perEvent) != 5 {
		t.Fatalf("events received: %v", perEvent)
	}
	for id, n := range perEvent {
		if n != vibejobs.MaxSubscriptionsPerProject {
			t.Errorf("event %s reached %d subscriptions, want 16", id, n)
		}
	}
}

func TestRotationSignsWithBothSecrets(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	oldSecret, _ := contract.NewSecret(nil)
	until := t0.Add(24 * time.Hour)
	sub, newSecret := e.subscribe(r.srv.URL, func(s *vibejobs.Subscription) {
		s.PreviousSecret, _ = e.keys.Seal(oldSecret, s.ID)
		s.PreviousExpiresAt = &until
	})
	d := e.deliverer("w1", nil)
	e.emit(e.job, vibejobs.EventJobUpdated)
	runOnce(t, d)
	x := r.next(t)
	sig := x.header.Get("Vibe-Signature")
	if strings.Count(sig, ",v1=") != 2 || len(x.header.Values("Vibe-Signature")) != 1 {
		t.Fatalf("during the grace window: %q", sig)
	}
	now := e.clock.Now()
	for name, secret := range map[string]string{"new": newSecret, "old": oldSecret} {
		if err := receiver.VerifyEvent(sig, x.body, now, secret); err != nil {
			t.Errorf("a receiver holding only the %s secret refuses: %v", name, err)
		}
	}
	if err := receiver.VerifyEvent(sig, x.body, now, oldSecret, newSecret); err != nil {
		t.Errorf("with both: %v", err)
	}
	other, _ := contract.NewSecret(nil)
	if err := receiver.VerifyEvent(sig, x.body, now, other); !errors.Is(err, contract.ErrBadSignature) {
		t.Errorf("another secret: %v", err)
	}
	if err := receiver.VerifyEvent(sig, []byte(strings.Replace(string(x.body), "job.updated", "job.deleted", 1)), now, newSecret); err == nil {
		t.Error("a changed body verifies")
	}

	// After the window, only the new secret signs.
	e.clock.Add(24 * time.Hour)
	e.emit(e.job, vibejobs.EventJobUpdated)
	runOnce(t, d)
	x = r.next(t)
	sig = x.header.Get("Vibe-Signature")
	if strings.Count(sig, ",v1=") != 1 {
		t.Fatalf("after the grace window: %q", sig)
	}
	if err := receiver.VerifyEvent(sig, x.body, e.clock.Now(), newSecret); err != nil {
		t.Errorf("new secret: %v", err)
	}
	if err := receiver.VerifyEvent(sig, x.body, e.clock.Now(), oldSecret); err == nil {
		t.Error("the old secret still verifies after the grace window")
	}
	if s := e.get(sub.ID); s.Cursor != 2 {
		t.Errorf("cursor %d", s.Cursor)
	}
}

// TestStuckSubscriptionDelaysNothing: a receiver that hangs and one that
// keeps refusing hold only their own subscriptions; another subscription
// and a run delivery, sharing the egress client, go on at once.
func TestStuckSubscriptionDelaysNothing(t *testing.T) {
	e := newEnv(t)
	hanging, refusing, healthy, app := newRecv(t), newRecv(t), newRecv(t), newRecv(t)
	hanging.hold = make(chan struct{})
	for range 50 {
		refusing.answer(500)
	}
	e.subscribe(hanging.srv.URL)
	stuck, _ := e.subscribe(refusing.srv.URL)
	ok, _ := e.subscribe(healthy.srv.URL)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subs := e.deliverer("w1", nil)
	done := make(chan struct{})
	go func() { subs.Run(ctx); close(done) }()
	job := e.newJob("job_app", app.srv.URL)
	disp := dispatcher.New(dispatcher.Config{Store: e.store, Sender: e.client, Opener: e.keys, Owner: "disp",
		Now: e.clock.Now, Concurrency: 8, PollInterval: 10 * time.Millisecond})
	dispDone := make(chan struct{})
	go func() { disp.Run(ctx); close(dispDone) }()
	defer func() { cancel(); close(hanging.hold); <-done; <-dispDone }()

	e.emit(e.job, e.updates(3)...)
	subs.Wake()
	if x := hanging.next(t); x.seq() != 1 {
		t.Fatalf("hanging receiver got %s", x.body)
	}
	for want := 1; want <= 3; want++ {
		if x := healthy.next(t); x.seq() != want {
			t.Fatalf("healthy receiver got %s, want sequence %d", x.body, want)
		}
	}
	// A run goes out while the hanging receiver still holds its request.
	run := vibejobs.NewRun("run_app", job, vibejobs.TriggerManual, e.clock.Now(), e.clock.Now())
	e.update(func(tx vibejobs.Tx) error { return tx.CreateRun(context.Background(), run) })
	disp.Wake()
	if x := app.next(t); x.event["runId"] != "run_app" {
		t.Fatalf("run delivery: %s", x.body)
	}
	// More events: the healthy subscription gets them, the refusing one
	// waits for its retry, the hanging one is still on its first.
	// plus the run's own run.succeeded, in whichever order they committed.
	e.emit(e.job, e.updates(2)...)
	subs.Wake()
	sawRun := false
	for want := 4; want <= 6; want++ {
		x := healthy.next(t)
		if x.seq() != want {
			t.Fatalf("healthy receiver got %s, want sequence %d", x.body, want)
		}
		sawRun = sawRun || x.event["type"] == "run.succeeded" && x.event["runId"] == "run_app"
	}
	if !sawRun {
		t.Error("the run's event did not reach the healthy subscription")
	}
	// The store is written just after the answer: wait for it (not a timing).
	deadline := time.Now().Add(10 * time.Second)
	for e.get(stuck.ID).Attempts != 1 || e.get(ok.ID).Cursor != 6 {
		if time.Now().After(deadline) {
			t.Fatalf("the refusing subscription: %+v; the healthy one: %+v", e.get(stuck.ID), e.get(ok.ID))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := len(hanging.drain()); n != 0 {
		t.Fatalf("the hanging receiver got %d more requests while its first hangs", n)
	}
	if s := e.get(stuck.ID); s.Cursor != 0 || s.ErrorCode != "http_5xx" {
		t.Fatalf("refusing subscription: %+v", s)
	}
}

// TestReplicasShareWithoutDoubling: two Deliverers (replicas) on one store
// work the same subscriptions at once; each event reaches each receiver
// once, in order.
func TestReplicasShareWithoutDoubling(t *testing.T) {
	e := newEnv(t)
	var recvs []*recv
	for range 6 {
		r := newRecv(t)
		recvs = append(recvs, r)
		e.subscribe(r.srv.URL)
	}
	a, b := e.deliverer("a", nil), e.deliverer("b", nil)
	for round := range 5 {
		e.emit(e.job, e.updates(7)...)
		var wg sync.WaitGroup
		wg.Go(func() { runOnce(t, a) })
		wg.Go(func() { runOnce(t, b) })
		wg.Wait()
		if round == 2 {
			a = e.deliverer("c", nil) // a third replica joins
		}
	}
	for i, r := range recvs {
		got := seqs(r.drain())
		if len(got) != 35 {
			t.Fatalf("receiver %d got %d events: %v", i, len(got), got)
		}
		for j, s := range got {
			if s != j+1 {
				t.Fatalf("receiver %d: %v", i, got)
			}
		}
	}
}

// countingStore counts the cursor writes that carry deliveries.
type countingStore struct {
	subscriptions.Store
	mu      sync.Mutex
	cursors []int64
}

func (c *countingStore) RecordSubscriptionStep(ctx context.Context, owner string, st vibejobs.SubscriptionStep) (*vibejobs.Subscription, error) {
	if st.Delivered {
		c.mu.Lock()
		c.cursors = append(c.cursors, st.Cursor)
		c.mu.Unlock()
	}
	return c.Store.RecordSubscriptionStep(ctx, owner, st)
}

// TestCursorWrittenWhileStreaming: a long stream writes its cursor at least
// every 100 ms (of the clock) and at the end of each page, not once per
// event and not only at the end.
func TestCursorWrittenWhileStreaming(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		e.clock.Add(40 * time.Millisecond) // each request takes 40 ms of the fake clock
		r.srv.Config.Handler.ServeHTTP(w, req)
	}))
	defer slow.Close()
	e.subscribe(slow.URL)
	e.emit(e.job, e.updates(250)...)
	cs := &countingStore{Store: e.store}
	// One session streams all 250 events (10 s of the clock): the writes
	// at the end of each turn are TestOverloadServesEverySubscriptionInTurn's.
	runOnce(t, e.delivererWith("w1", cs, e.keys, func(c *subscriptions.Config) { c.Turn = time.Hour }))
	if got := len(r.drain()); got != 250 {
		t.Fatalf("received %d events", got)
	}
	// Every third event (120 ms ≥ 100 ms), plus the ends of pages 100 and 200.
	if n := len(cs.cursors); n < 80 || n > 90 {
		t.Fatalf("%d cursor writes for 250 events: %v", n, cs.cursors)
	}
	for _, want := range []int64{100, 200, 250} {
		if !slices.Contains(cs.cursors, want) {
			t.Errorf("no cursor write at %d: %v", want, cs.cursors)
		}
	}
}

// resetOnFirstList resets the subscription (as POST .../reset would) right
// after the session's first page is read: an operator's reset that lands
// while a session is passing over events its filters exclude.
type resetOnFirstList struct {
	subscriptions.Store
	e    *env
	id   string
	once sync.Once
}

func (r *resetOnFirstList) ListEvents(ctx context.Context, projectID string, f vibejobs.EventFilter) (vibejobs.EventPage, error) {
	page, err := r.Store.ListEvents(ctx, projectID, f)
	r.once.Do(func() {
		r.e.clock.Add(time.Millisecond)
		r.e.update(func(tx vibejobs.Tx) error {
			_, err := tx.ResetSubscription(context.Background(), r.e.project, r.id, r.e.clock.Now())
			return err
		})
	})
	return page, err
}

// TestResetDuringFilteredPageSkipsForGood: a reset jumps the cursor to the
// head, and "the events skipped are never sent" (resetSubscription). A
// session that was passing over excluded events when the reset landed must
// not go on to send the events the reset skipped.
func TestResetDuringFilteredPageSkipsForGood(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL, func(s *vibejobs.Subscription) {
		s.Types = []vibejobs.EventType{vibejobs.EventJobPaused}
	})
	// A first page of 100 excluded events, then 50 matching ones.
	e.emit(e.job, e.updates(100)...)
	paused := make([]vibejobs.EventType, 50)
	for i := range paused {
		paused[i] = vibejobs.EventJobPaused
	}
	e.emit(e.job, paused...)

	runOnce(t, e.deliverer("w1", &resetOnFirstList{Store: e.store, e: e, id: sub.ID}))
	if s := e.get(sub.ID); s.Cursor != 150 {
		t.Fatalf("cursor %d after the reset, want the head 150", s.Cursor)
	}
	if got := seqs(r.drain()); len(got) != 0 {
		t.Fatalf("the reset skipped events 1..150, yet %d of them were sent: %v", len(got), got)
	}
}

// TestFilteredOutFailedEventRestartsBackoff: a subscription failing at an
// event its filters then exclude passes over it without a request. Its
// failure was about that event: once past it, the subscription is not
// failing, and the next event to fail is at its first attempt, retried
// after 12 s (it counted on from the old event's six, and waited 12 min).
func TestFilteredOutFailedEventRestartsBackoff(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL)
	e.emit(e.job, vibejobs.EventJobUpdated) // sequence 1, refused six times
	e.failN(t, r, sub, 6)

	// What PATCH /v1/subscriptions/{id} {"types":["job.paused"]} runs.
	e.update(func(tx vibejobs.Tx) error {
		s, err := tx.GetSubscription(context.Background(), e.project, sub.ID)
		if err != nil {
			return err
		}
		s.Types, s.UpdatedAt = []vibejobs.EventType{vibejobs.EventJobPaused}, e.clock.Now()
		return tx.UpdateSubscription(context.Background(), s)
	})
	e.emit(e.job, vibejobs.EventJobUpdated) // sequence 2, excluded too
	runOnce(t, e.deliverer("w1", nil))
	if s := e.get(sub.ID); s.Cursor != 2 || s.Failing() || s.Attempts != 0 {
		t.Errorf("past the excluded events: cursor %d, failing %v (%q), attempts %d", s.Cursor, s.Failing(), s.ErrorCode, s.Attempts)
	}

	e.emit(e.job, vibejobs.EventJobPaused) // sequence 3, its first attempt is refused
	r.answer(500)
	runOnce(t, e.deliverer("w1", nil))
	if got := seqs(r.drain()); len(got) != 1 || got[0] != 3 {
		t.Fatalf("sent %v, want 3", got)
	}
	s := e.get(sub.ID)
	if s.Attempts != 1 || !s.NextAttemptAt.Equal(e.clock.Now().Add(12*time.Second)) {
		t.Fatalf("first failure at event 3: attempts %d, next attempt in %v, want 1 and 12s",
			s.Attempts, s.NextAttemptAt.Sub(e.clock.Now()))
	}
}

// lostKey opens no secret while lost is set, as a keyring that no longer
// holds the master key the secrets were sealed under.
type lostKey struct {
	keys *secretbox.Keyring
	lost atomic.Bool
}

func (k *lostKey) Open(s vibejobs.SealedSecret, id string) (string, error) {
	if k.lost.Load() {
		return "", secretbox.ErrUnknownKey
	}
	return k.keys.Open(s, id)
}

// TestSecretThatDoesNotOpenMarksFailing: a subscription whose secret does
// not open can send nothing until an operator acts, so it is marked failing
// with its own code, logged once (no secret), and tried again after
// ErrorPause. It is not the receiver's failure: it does not count in the
// attempts that set the receiver's backoff.
func TestSecretThatDoesNotOpenMarksFailing(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, secret := e.subscribe(r.srv.URL + "/hook")
	keys := &lostKey{keys: e.keys}
	keys.lost.Store(true)
	d := e.delivererWith("w1", nil, keys)
	e.emit(e.job, e.updates(2)...)

	runOnce(t, d)
	if got := r.drain(); len(got) != 0 {
		t.Fatalf("sent without a secret: %v", seqs(got))
	}
	s := e.get(sub.ID)
	if !s.Failing() || s.ErrorCode != subscriptions.CodeSecretUnavailable || s.Cursor != 0 || s.Attempts != 0 ||
		s.NextAttemptAt == nil || !s.NextAttemptAt.Equal(e.clock.Now().Add(subscriptions.ErrorPause)) {
		t.Fatalf("secret does not open: %+v", s)
	}

	// Still failing at the next try, and logged no more.
	e.clock.Add(subscriptions.ErrorPause)
	runOnce(t, d)
	if s := e.get(sub.ID); s.ErrorCode != subscriptions.CodeSecretUnavailable || s.Attempts != 0 ||
		!s.NextAttemptAt.Equal(e.clock.Now().Add(subscriptions.ErrorPause)) {
		t.Fatalf("second try: %+v", s)
	}
	logs := e.logs.String()
	if n := strings.Count(logs, `"msg":"subscription.secret_unavailable"`); n != 1 {
		t.Errorf("%d secret_unavailable lines, want 1:\n%s", n, logs)
	}
	for _, bad := range []string{"127.0.0.1", "/hook", "vjs_", secret} {
		if strings.Contains(logs, bad) {
			t.Errorf("the log holds %q:\n%s", bad, logs)
		}
	}

	// The key is back; the receiver refuses: the first of its failures.
	keys.lost.Store(false)
	e.clock.Add(subscriptions.ErrorPause)
	r.answer(500)
	runOnce(t, d)
	if got := seqs(r.drain()); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after the key came back received %v, want 1", got)
	}
	if s := e.get(sub.ID); s.ErrorCode != "http_5xx" || s.Attempts != 1 || !s.NextAttemptAt.Equal(e.clock.Now().Add(vibejobs.SubscriptionMinBackoff)) {
		t.Fatalf("a refusal after the key came back: %+v", s)
	}
	e.clock.Add(vibejobs.SubscriptionMinBackoff)
	runOnce(t, d)
	if got := seqs(r.drain()); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("recovery received %v, want 1 2", got)
	}
	if s := e.get(sub.ID); s.Failing() || s.Cursor != 2 {
		t.Fatalf("recovered: %+v", s)
	}
}

// TestRotationRevivesSubscriptionWhoseSecretIsLost: a subscription whose
// secret was sealed under a master key the key file no longer holds is
// failing (secret_unavailable) until an operator acts. Rotating its secret
// through the API is that act: the new secret opens, and delivery resumes
// at once (see TestOperatorFixWakesDelivery), signed with the new secret
// alone. The replaced secret, which cannot be opened, must not hold the
// subscription through the rotation's grace window (24 h).
func TestRotationRevivesSubscriptionWhoseSecretIsLost(t *testing.T) {
	e, token := newBootstrappedEnv(t)
	r := newRecv(t)
	job := e.newJob("job_lost", "http://127.0.0.1:1/")
	lostKeys := mustKeyring(t) // the key the old secret was sealed under: gone from the key file
	sub, _ := e.subscribe(r.srv.URL, func(s *vibejobs.Subscription) {
		old, _ := contract.NewSecret(nil)
		s.Secret, _ = lostKeys.Seal(old, s.ID)
	})
	d := e.deliverer("w1", nil) // opens with e.keys only
	e.emit(job, vibejobs.EventJobUpdated)
	runOnce(t, d)
	if got := r.drain(); len(got) != 0 {
		t.Fatalf("sent without a secret: %v", seqs(got))
	}
	if s := e.get(sub.ID); s.ErrorCode != subscriptions.CodeSecretUnavailable {
		t.Fatalf("before the rotation: %+v", s)
	}

	h := api.New(api.Config{Store: e.store, Sealer: e.keys, Now: e.clock.Now,
		Logger: slog.New(slog.DiscardHandler), RateLimit: api.RateLimit{PerSecond: -1}}).Handler()
	req := httptest.NewRequest("POST", "/v1/subscriptions/"+sub.ID+"/rotate-secret", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", "rotate-lost-secret")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var rotated struct{ Secret string }
	if err := json.Unmarshal(w.Body.Bytes(), &rotated); w.Code != http.StatusOK || err != nil || rotated.Secret == "" {
		t.Fatalf("rotate-secret: %d", w.Code)
	}

	runOnce(t, d)
	got := r.drain()
	if len(got) != 1 || got[0].seq() != 1 {
		s := e.get(sub.ID)
		t.Fatalf("after the rotation received %v, want event 1; subscription error %q, next attempt %v",
			seqs(got), s.ErrorCode, s.NextAttemptAt)
	}
	if err := receiver.VerifyEvent(got[0].header.Get("Vibe-Signature"), got[0].body, e.clock.Now(), rotated.Secret); err != nil {
		t.Errorf("the new secret does not verify: %v", err)
	}
	if s := e.get(sub.ID); s.Failing() || s.Cursor != 1 {
		t.Errorf("after the rotation: failing %v (%s), cursor %d, want caught up", s.Failing(), s.ErrorCode, s.Cursor)
	}
}

// newBootstrappedEnv is an env on a store the API bootstrapped: its
// project is the bootstrap project, and token is its admin token.
func newBootstrappedEnv(t *testing.T) (*env, string) {
	t.Helper()
	e := newEmptyEnv(t)
	token, _, err := api.Bootstrap(context.Background(), e.store, e.clock.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.project = api.BootstrapProjectID
	return e, token
}

func mustKeyring(t *testing.T) *secretbox.Keyring {
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

// claimSignal tells each ClaimSubscriptions call on claimed.
type claimSignal struct {
	subscriptions.Store
	claimed chan struct{}
}

func (c claimSignal) ClaimSubscriptions(ctx context.Context, owner string, now time.Time, limit int, lease time.Duration) ([]*vibejobs.Subscription, error) {
	subs, err := c.Store.ClaimSubscriptions(ctx, owner, now, limit, lease)
	select {
	case c.claimed <- struct{}{}:
	default:
	}
	return subs, err
}

// TestOperatorFixWakesDelivery: a change that lets a stuck subscription go
// on is tried at once, as a new URL is: rotating a secret that did not open
// (secret_unavailable, retried every ErrorPause), rotating the secret a
// receiver refused (its backoff reaches 1 h), or filters that exclude the
// event it refused. The API wakes the deliverer and clears the wait: with
// the clock stopped and no poll due for an hour, the receiver gets the
// next event to send.
func TestOperatorFixWakesDelivery(t *testing.T) {
	rotate := func(t *testing.T, h http.Handler, token, id string) string {
		t.Helper()
		req := httptest.NewRequest("POST", "/v1/subscriptions/"+id+"/rotate-secret", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", "rotate-"+id)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var rotated struct{ Secret string }
		if err := json.Unmarshal(w.Body.Bytes(), &rotated); w.Code != http.StatusOK || err != nil || rotated.Secret == "" {
			t.Fatalf("rotate-secret: %d", w.Code)
		}
		return rotated.Secret
	}
	for _, tc := range []struct {
		name string
		// stick leaves sub failing at event 1 with its next attempt ahead,
		// using d; fix is the operator's act, returning the secret that
		// signs afterwards ("" when it did not change) and the event then
		// expected.
		stick func(t *testing.T, e *env, r *recv, d *subscriptions.Deliverer, sub *vibejobs.Subscription)
		fix   func(t *testing.T, e *env, h http.Handler, token string, sub *vibejobs.Subscription) (string, int)
		lost  bool // the subscription's secret is sealed under a key the deliverer lacks
	}{{
		name: "rotation after secret_unavailable",
		lost: true,
		stick: func(t *testing.T, e *env, r *recv, d *subscriptions.Deliverer, sub *vibejobs.Subscription) {
			runOnce(t, d)
			if s := e.get(sub.ID); s.ErrorCode != subscriptions.CodeSecretUnavailable {
				t.Fatalf("setup: %+v", s)
			}
		},
		fix: func(t *testing.T, e *env, h http.Handler, token string, sub *vibejobs.Subscription) (string, int) {
			return rotate(t, h, token, sub.ID), 1
		},
	}, {
		name: "rotation during a receiver backoff",
		stick: func(t *testing.T, e *env, r *recv, d *subscriptions.Deliverer, sub *vibejobs.Subscription) {
			r.answer(401, 401, 401, 401, 401, 401, 401, 401, 401)
			for range 9 {
				runOnce(t, d)
				if s := e.get(sub.ID); s.NextAttemptAt != nil {
					e.clock.Add(s.NextAttemptAt.Sub(e.clock.Now()))
				}
			}
			r.answer(401)
			runOnce(t, d)
			if s := e.get(sub.ID); s.Attempts != 10 || s.NextAttemptAt.Sub(e.clock.Now()) != time.Hour {
				t.Fatalf("setup: attempts %d, next attempt in %v", s.Attempts, s.NextAttemptAt.Sub(e.clock.Now()))
			}
			r.drain()
		},
		fix: func(t *testing.T, e *env, h http.Handler, token string, sub *vibejobs.Subscription) (string, int) {
			return rotate(t, h, token, sub.ID), 1
		},
	}, {
		name: "filters that exclude the refused event",
		stick: func(t *testing.T, e *env, r *recv, d *subscriptions.Deliverer, sub *vibejobs.Subscription) {
			r.answer(500)
			runOnce(t, d)
			r.drain()
			if s := e.get(sub.ID); s.Attempts != 1 || s.NextAttemptAt == nil {
				t.Fatalf("setup: %+v", s)
			}
			e.emit(e.job, vibejobs.EventJobPaused) // sequence 2
		},
		fix: func(t *testing.T, e *env, h http.Handler, token string, sub *vibejobs.Subscription) (string, int) {
			req := httptest.NewRequest("PATCH", "/v1/subscriptions/"+sub.ID, strings.NewReader(`{"types":["job.paused"]}`))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				t.Fatalf("PATCH: %d", w.Code)
			}
			return "", 2
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e, token := newBootstrappedEnv(t)
			r := newRecv(t)
			e.job = e.newJob("job_stuck", "http://127.0.0.1:1/")
			sub, secret := e.subscribe(r.srv.URL, func(s *vibejobs.Subscription) {
				if tc.lost {
					old, _ := contract.NewSecret(nil)
					s.Secret, _ = mustKeyring(t).Seal(old, s.ID)
				}
			})
			e.emit(e.job, vibejobs.EventJobUpdated) // sequence 1
			tc.stick(t, e, r, e.deliverer("w1", nil), sub)

			claims := claimSignal{Store: e.store, claimed: make(chan struct{}, 1)}
			d := subscriptions.New(subscriptions.Config{
				Store: claims, Sender: e.client, Opener: e.keys, Owner: "w1", UserAgent: "vibejobs/test",
				Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now, Rand: func() float64 { return 0.5 },
				PollInterval: time.Hour, // only a wake makes it look again
			})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { d.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			<-claims.claimed // the first look found nothing due: Run waits now

			h := api.New(api.Config{Store: e.store, Sealer: e.keys, Now: e.clock.Now, Wake: d.Wake,
				Logger: slog.New(slog.DiscardHandler), RateLimit: api.RateLimit{PerSecond: -1}}).Handler()
			newSecret, want := tc.fix(t, e, h, token, sub)
			if newSecret != "" {
				secret = newSecret
			}
			select {
			case got := <-r.got:
				if got.seq() != want {
					t.Fatalf("after the fix received %d, want %d", got.seq(), want)
				}
				if err := receiver.VerifyEvent(got.header.Get("Vibe-Signature"), got.body, e.clock.Now(), secret); err != nil {
					t.Errorf("signature: %v", err)
				}
			case <-time.After(10 * time.Second):
				s := e.get(sub.ID)
				next := "none"
				if s.NextAttemptAt != nil {
					next = s.NextAttemptAt.Sub(e.clock.Now()).String()
				}
				t.Fatalf("nothing sent after the fix: error %q, attempts %d, next attempt in %s", s.ErrorCode, s.Attempts, next)
			}
		})
	}
}

// TestAtMostFiveFailedAttemptsAMinute: a receiver that refuses every event
// once and takes it on the retry restarts the failure count at each event,
// so each failure is a first one. At the lowest jitter (−20 %) it was
// retried after 9.6 s, 7 failed attempts in the first minute; the pause
// never goes under 12 s, so there are at most 5.
func TestAtMostFiveFailedAttemptsAMinute(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL + "/hook")
	d := subscriptions.New(subscriptions.Config{
		Store: e.store, Sender: e.client, Opener: e.keys, Owner: "w1", UserAgent: "vibejobs/test",
		Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now,
		Rand:         func() float64 { return 0 }, // the lowest jitter
		PollInterval: 10 * time.Millisecond,
	})
	e.emit(e.job, e.updates(20)...)
	var failures []time.Time
	for e.clock.Now().Before(t0.Add(2 * time.Minute)) {
		r.answer(500, 200)
		runOnce(t, d)
		r.drain()
		s := e.get(sub.ID)
		if s.NextAttemptAt == nil {
			t.Fatalf("no retry pending after a refusal: %+v", s)
		}
		failures = append(failures, e.clock.Now())
		e.clock.Add(s.NextAttemptAt.Sub(e.clock.Now()))
	}
	for i := range failures {
		n := 0
		for _, f := range failures[i:] {
			if f.Sub(failures[i]) < time.Minute {
				n++
			}
		}
		if n > 5 {
			t.Fatalf("%d failed attempts in the minute from %s (failures at %v)", n, failures[i].Sub(t0), failures)
		}
	}
	// Later pauses keep their ±20 %.
	if got := vibejobs.SubscriptionRetryPause(2, 0); got != 19200*time.Millisecond {
		t.Errorf("pause after 2 failures at the lowest jitter = %v, want 19.2s", got)
	}
	if got := vibejobs.SubscriptionRetryPause(1, 0.999); got <= 14*time.Second || got > 14400*time.Millisecond {
		t.Errorf("pause after 1 failure at the highest jitter = %v, want just under 14.4s", got)
	}
}
