package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	sdk "github.com/vibejobs/vibejobs/receiver"
)

// eventSink is a loopback subscriber: it verifies every request with the
// receiver SDK and keeps the events by id (deliveries are at least once).
type eventSink struct {
	*httptest.Server
	URL string

	mu      sync.Mutex
	secrets []string
	order   []int64 // sequences in the order received, repeats included
	byID    map[string]sinkEvent
	bad     []string
	got     chan sinkEvent
}

type sinkEvent struct {
	ID         string
	Type       string
	Sequence   int64
	OccurredAt time.Time
	JobID      string
	RunID      string
	Data       map[string]any
	At         time.Time // when it arrived
}

func newEventSink(t *testing.T) *eventSink {
	t.Helper()
	s := &eventSink{byID: map[string]sinkEvent{}, got: make(chan sinkEvent, 100000)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		at := time.Now()
		var e struct {
			ID         string         `json:"id"`
			Type       string         `json:"type"`
			Sequence   int64          `json:"sequence"`
			OccurredAt string         `json:"occurredAt"`
			JobID      string         `json:"jobId"`
			RunID      string         `json:"runId"`
			Data       map[string]any `json:"data"`
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		err := sdk.VerifyEvent(r.Header.Get("Vibe-Signature"), body, at, s.secrets...)
		if err == nil {
			err = json.Unmarshal(body, &e)
		}
		if err != nil || r.Header.Get("X-Vibe-Event-Id") != e.ID || r.Header.Get("X-Vibe-Event-Type") != e.Type {
			s.bad = append(s.bad, fmt.Sprintf("%v: %s", err, body))
			w.WriteHeader(400)
			return
		}
		occurred, _ := time.Parse("2006-01-02T15:04:05.000Z", e.OccurredAt)
		ev := sinkEvent{ID: e.ID, Type: e.Type, Sequence: e.Sequence, OccurredAt: occurred, JobID: e.JobID,
			RunID: e.RunID, Data: e.Data, At: at}
		s.order = append(s.order, e.Sequence)
		if _, seen := s.byID[e.ID]; !seen {
			s.byID[e.ID] = ev
			s.got <- ev
		}
		w.WriteHeader(204)
	}))
	s.URL = s.Server.URL + "/events"
	t.Cleanup(s.Close)
	return s
}

func (s *eventSink) addSecret(secret string) {
	s.mu.Lock()
	s.secrets = append(s.secrets, secret)
	s.mu.Unlock()
}

// check fails t on a request that did not verify, or on sequences that went
// back (a repeat of the latest is allowed: at least once).
func (s *eventSink) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.bad {
		t.Errorf("refused a delivery: %s", b)
	}
	for i := 1; i < len(s.order); i++ {
		if s.order[i] < s.order[i-1] {
			t.Fatalf("sequence went back: %v", s.order)
		}
	}
}

func (s *eventSink) next(t *testing.T, d time.Duration) sinkEvent {
	t.Helper()
	select {
	case e := <-s.got:
		return e
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
		return sinkEvent{}
	}
}

// TestSubscriptionEndToEnd: a subscription made through the API receives the
// run.failed events of a project, signed, with what the feed says.
func TestSubscriptionEndToEnd(t *testing.T) {
	app := newReceiver(t, nil)
	failing := newReceiver(t, func(received) int { return 500 })
	m, api := startMain(t, t.TempDir())
	sink := newEventSink(t)

	code, sub := api.do("POST", "/v1/subscriptions", map[string]any{"url": sink.URL, "types": []string{"run.failed", "run.succeeded"}})
	if code != 201 {
		t.Fatalf("subscribe: %d %v", code, sub)
	}
	sink.addSecret(sub["secret"].(string))
	mk := func(url string) string {
		code, job := api.do("POST", "/v1/jobs", map[string]any{"name": "j", "schedule": "0 0 1 1 *", "url": url,
			"retry": map[string]any{"maxAttempts": 1}})
		if code != 201 {
			t.Fatalf("create: %d %v", code, job)
		}
		return job["id"].(string)
	}
	good, bad := mk(app.URL), mk(failing.URL)
	_, okRun := api.do("POST", "/v1/jobs/"+good+"/runs", nil)
	e := sink.next(t, 10*time.Second)
	if e.Type != "run.succeeded" || e.RunID != okRun["id"] || e.JobID != good || e.Data["state"] != "succeeded" {
		t.Fatalf("event %+v", e)
	}
	_, badRun := api.do("POST", "/v1/jobs/"+bad+"/runs", nil)
	e = sink.next(t, 10*time.Second)
	if e.Type != "run.failed" || e.RunID != badRun["id"] || e.Data["reason"] != "attempts_exhausted" ||
		e.Data["errorCode"] != "http_5xx" || e.Data["statusCode"] != 500.0 {
		t.Fatalf("event %+v", e)
	}
	if prj := projectOf(t, m.Store()); e.ID != fmt.Sprintf("%s:%d", prj, e.Sequence) || e.Sequence != 4 {
		t.Fatalf("event id %q sequence %d", e.ID, e.Sequence)
	}
	sink.check(t)

	// The feed holds the same events, and the job events the filter left out.
	_, page := api.do("GET", "/v1/events?limit=100", nil)
	var types []string
	for _, it := range page["items"].([]any) {
		types = append(types, it.(map[string]any)["type"].(string))
	}
	if !slices.Equal(types, []string{"job.created", "job.created", "run.succeeded", "run.failed"}) {
		t.Fatalf("feed %v", types)
	}
	// The deliverer stores the cursor once the sink's answer is back, a
	// moment after the sink saw the event: wait for it (bounded).
	var got map[string]any
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, got = api.do("GET", "/v1/subscriptions/"+sub["id"].(string), nil)
		if got["cursor"] == 4.0 || time.Now().After(deadline) {
			break
		}
	}
	if got["cursor"] != 4.0 || got["failing"] != false || got["lastSuccessAt"] == nil {
		t.Fatalf("subscription %v", got)
	}
	// The per-project series go to the installation token only.
	metrics := get(t, "http://"+m.Addr()+"/metrics", api.token)
	if !strings.Contains(metrics, `vibejobs_subscription_failing{project=`) ||
		!strings.Contains(metrics, `vibejobs_subscription_last_success_timestamp_seconds{project=`) {
		t.Errorf("subscription metrics missing")
	}
	if metrics := get(t, "http://"+m.Addr()+"/metrics", ""); !strings.Contains(metrics, "vibejobs_runs_due") ||
		strings.Contains(metrics, "vibejobs_subscription_") {
		t.Errorf("the metrics without a token: %s", metrics)
	}
}

// answering is an app that answers every request with status.
func answering(t *testing.T, status int) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// get reads url, with token as the bearer when it is not "".
func get(t *testing.T, url, token string) string {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestBusyProjectFailuresReachSubscriber (PostgreSQL, two replicas): a
// project with many jobs firing every second, a third of them against an
// app that refuses; a subscription to run.failed receives every failure,
// in sequence order, within seconds of it.
func TestBusyProjectFailuresReachSubscriber(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two servers for several seconds")
	}
	url, st := pgReplicaURL(t, "")
	app, refusing := answering(t, 200), answering(t, 503)
	dataDir := t.TempDir()
	var mains []*Main
	for range 2 {
		m := NewMain(io.Discard, io.Discard)
		if testing.Verbose() {
			m.Stderr = os.Stderr
		}
		m.Config = Config{Listen: "127.0.0.1:0", DataDir: dataDir, Database: url, AllowPrivate: "127.0.0.0/8",
			LogFormat: "text", LogLevel: "warn", Concurrency: 64, PerHost: 64, RetentionDays: 90, MaxJobsPerProject: 1000}
		if err := m.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		mains = append(mains, m)
	}
	tok, err := os.ReadFile(filepath.Join(dataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	api := apiClient{t: t, base: "http://" + mains[1].Addr(), token: strings.TrimSpace(string(tok))}
	sink := newEventSink(t)
	code, sub := api.do("POST", "/v1/subscriptions", map[string]any{"url": sink.URL, "types": []string{"run.failed"}})
	if code != 201 {
		t.Fatalf("subscribe: %d %v", code, sub)
	}
	sink.addSecret(sub["secret"].(string))

	const jobs = 60
	var batch []any
	for i := range jobs {
		u := app.URL
		if i%3 == 0 {
			u = refusing.URL
		}
		batch = append(batch, map[string]any{"name": fmt.Sprintf("busy %d", i), "schedule": "@every 1s", "url": u,
			"retry": map[string]any{"maxAttempts": 1}})
	}
	if code, out := (apiClient{t: t, base: "http://" + mains[0].Addr(), token: api.token}).do("POST", "/v1/jobs/batch", map[string]any{"jobs": batch}); code != 201 {
		t.Fatalf("batch: %d %v", code, out)
	}
	time.Sleep(6 * time.Second) // the project is busy for a few seconds
	_, list := api.do("GET", "/v1/jobs?limit=100", nil)
	for _, j := range list["jobs"].([]any) {
		api.do("POST", "/v1/jobs/"+j.(map[string]any)["id"].(string)+"/pause", nil)
	}

	// Every failed run, once every run has finished.
	ctx := context.Background()
	prj := projectOf(t, st)
	deadline := time.Now().Add(30 * time.Second)
	var failed []*vibejobs.Run
	for {
		failed = failed[:0]
		unfinished := 0
		cursor := ""
		for {
			runs, next, err := st.ListRuns(ctx, prj, vibejobs.RunFilter{}, vibejobs.Page{Limit: 100, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range runs {
				switch {
				case !r.State.Finished():
					unfinished++
				case r.State == vibejobs.RunFailed:
					failed = append(failed, r)
				}
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if unfinished == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs still unfinished", unfinished)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(failed) < jobs/3*3 {
		t.Fatalf("only %d failed runs: the project was not busy", len(failed))
	}
	want := map[string]bool{}
	for _, r := range failed {
		want[r.ID] = true
	}
	var delays []time.Duration
	seenRun := map[string]bool{}
	deadline = time.Now().Add(10 * time.Second)
	for len(seenRun) < len(want) {
		e := sink.next(t, time.Until(deadline))
		if e.Type != "run.failed" || !want[e.RunID] || seenRun[e.RunID] {
			t.Fatalf("unexpected event %+v", e)
		}
		seenRun[e.RunID] = true
		delays = append(delays, e.At.Sub(e.OccurredAt))
	}
	sink.check(t)
	slices.Sort(delays)
	p99 := delays[len(delays)*99/100]
	t.Logf("%d run.failed events received; delay from the run failing: p50 %v p99 %v max %v",
		len(delays), delays[len(delays)/2], p99, delays[len(delays)-1])
	if delays[len(delays)-1] > 5*time.Second {
		t.Errorf("an event took %v to reach the subscriber", delays[len(delays)-1])
	}
	if _, got := api.do("GET", "/v1/subscriptions/"+sub["id"].(string), nil); got["failing"] != false {
		t.Errorf("subscription %v", got)
	}
}

// TestMasterKeyRotationResealsSubscriptions: "master-key rotate" re-seals
// subscription secrets (current and previous), so dropping the old key
// afterwards keeps webhooks signed.
func TestMasterKeyRotationResealsSubscriptions(t *testing.T) {
	dataDir := t.TempDir()
	m, api := startMain(t, dataDir)
	sink := newEventSink(t)
	_, sub := api.do("POST", "/v1/subscriptions", map[string]any{"url": sink.URL})
	_, rot := api.do("POST", "/v1/subscriptions/"+sub["id"].(string)+"/rotate-secret", nil)
	m.Close()

	if out := rotateMasterKey(t, map[string]string{"VIBEJOBS_DATA_DIR": dataDir}); !strings.Contains(out, "1 secrets and 2 stored Idempotency-Key answers re-sealed") {
		t.Fatalf("rotate said %q", out)
	}
	dropOlderKeys(t, dataDir)
	_, api = startMain(t, dataDir)
	sink.addSecret(rot["secret"].(string))
	sink.addSecret(sub["secret"].(string))
	if code, _ := api.do("POST", "/v1/jobs", map[string]any{"name": "k", "schedule": "@daily", "url": "http://127.0.0.1:9/"}); code != 201 {
		t.Fatal(code)
	}
	if e := sink.next(t, 10*time.Second); e.Type != "job.created" {
		t.Fatalf("event %+v", e)
	}
	sink.check(t)
}
