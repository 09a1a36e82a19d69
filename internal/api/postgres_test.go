package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// postgresAPI serves the API on a fresh PostgreSQL schema, bootstrapped;
// edit adjusts the Config first. It returns the handler, the bootstrap
// token and the store.
func postgresAPI(t *testing.T, edit func(*api.Config)) (http.Handler, string, *postgres.Store) {
	t.Helper()
	st := postgres.MustOpenTestWith(t, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
	clk := &clock{t: t0}
	tok, _, err := api.Bootstrap(context.Background(), st, clk.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	policy, err := egress.NewPolicy(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{Store: st, Sealer: mustKeyring(t), URLs: policy, Now: clk.Now,
		Logger: slog.New(slog.DiscardHandler), RateLimit: api.RateLimit{PerSecond: -1}}
	if edit != nil {
		edit(&cfg)
	}
	return api.New(cfg).Handler(), tok, st
}

// TestEventsAfterTheLargestSequences: any sequence number up to the largest
// int64 is read as an "after". Near it, the read window (after + the 1,000
// sequences one read covers) overflowed PostgreSQL's bigint, and the answer
// was a 500. Beyond the head, it is refused as not a cursor of this feed.
func TestEventsAfterTheLargestSequences(t *testing.T) {
	h, tok, _ := postgresAPI(t, nil)
	for _, after := range []string{"9223372036854775807", "9223372036854775000"} {
		r := httptest.NewRequest("GET", "/v1/events?after="+after, nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var answer struct {
			Error struct{ Code string } `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &answer); w.Code != http.StatusBadRequest || err != nil || answer.Error.Code != "invalid_after" {
			t.Errorf("GET /v1/events?after=%s: %d %s, want 400 invalid_after", after, w.Code, bytes.TrimSpace(w.Body.Bytes()))
		}
	}
}

// TestBadTextOnPostgres: PostgreSQL's text refuses invalid UTF-8 and NUL
// bytes, so an id or query value holding them must be answered before it
// reaches the store: 404 for an id, 400 for a query value, never a 500.
// (SQLite stores such bytes, so the table in TestBadInput cannot tell.)
func TestBadTextOnPostgres(t *testing.T) {
	h, tok, _ := postgresAPI(t, nil)
	for _, bad := range []string{"%00", "%FF", "job_%00", "job_%C3%28"} {
		for _, c := range []struct {
			method, path string
			status       int
		}{
			{"GET", "/v1/jobs/" + bad, 404},
			{"PATCH", "/v1/jobs/" + bad, 404},
			{"DELETE", "/v1/jobs/" + bad, 404},
			{"POST", "/v1/jobs/" + bad + "/pause", 404},
			{"POST", "/v1/jobs/" + bad + "/runs", 404},
			{"GET", "/v1/jobs/" + bad + "/runs", 404},
			{"GET", "/v1/jobs/" + bad + "/next", 404},
			{"GET", "/v1/runs/" + bad, 404},
			{"GET", "/v1/subscriptions/" + bad, 404},
			{"DELETE", "/v1/subscriptions/" + bad, 404},
			{"DELETE", "/v1/tokens/" + bad, 404},
			{"GET", "/v1/projects/" + bad + "/tokens", 404},
			{"GET", "/v1/runs?jobId=" + bad, 400},
			{"GET", "/v1/events?jobId=" + bad, 400},
			{"GET", "/v1/jobs?cursor=" + bad, 400},
		} {
			r := httptest.NewRequest(c.method, c.path, bytes.NewReader([]byte(`{"name":"x"}`)))
			r.Header.Set("Authorization", "Bearer "+tok)
			r.Header.Set("Idempotency-Key", "k-"+newKey())
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Errorf("%s %s: %d %s, want %d", c.method, c.path, w.Code, bytes.TrimSpace(w.Body.Bytes()), c.status)
			}
		}
	}
}

// holdStore holds the first transaction that appends events, right after
// its append, until release is closed.
type holdStore struct {
	vibejobs.Store
	first   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

type holdTx struct {
	vibejobs.Tx
	s *holdStore
}

func (s *holdStore) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	return s.Store.Update(ctx, func(tx vibejobs.Tx) error { return fn(&holdTx{Tx: tx, s: s}) })
}

func (t *holdTx) AppendEvents(ctx context.Context, events ...*vibejobs.Event) error {
	err := t.Tx.AppendEvents(ctx, events...)
	if err == nil && t.s.first.CompareAndSwap(false, true) {
		close(t.s.held)
		<-t.s.release
	}
	return err
}

// TestJobLimitHoldsAcrossConcurrentCreates: two requests create a job at
// once in a project with room for one. The first is held after its insert,
// before it commits; the second must not count on the room the first took.
func TestJobLimitHoldsAcrossConcurrentCreates(t *testing.T) {
	var st *holdStore
	h, tok, pg := postgresAPI(t, func(c *api.Config) {
		st = &holdStore{Store: c.Store, held: make(chan struct{}), release: make(chan struct{})}
		c.Store, c.MaxJobsPerProject = st, 1
	})
	create := func() int {
		body, _ := json.Marshal(jobBody(nil))
		r := httptest.NewRequest("POST", "/v1/jobs", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+tok)
		r.Header.Set("Idempotency-Key", newKey())
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	first := make(chan int, 1)
	go func() { first <- create() }()
	<-st.held
	second := make(chan int, 1)
	go func() { second <- create() }()
	// The second waits for the first's lock on the project's feed, or (were
	// it allowed past the limit) commits; either way, then let the first go.
	for deadline := time.Now().Add(10 * time.Second); len(second) == 0; time.Sleep(5 * time.Millisecond) {
		var waiting int
		if err := pg.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND starts_with(query, 'WITH ev AS')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second request neither waited nor ended")
		}
	}
	close(st.release)
	codes := []int{<-first, <-second}
	projects, _, err := pg.ListProjects(context.Background(), vibejobs.Page{})
	if err != nil || len(projects) != 1 {
		t.Fatalf("projects: %v, %v", projects, err)
	}
	n, err := pg.CountJobs(context.Background(), projects[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || codes[0] != http.StatusCreated || codes[1] != http.StatusConflict {
		t.Fatalf("a project with room for one job holds %d after two creates at once (answers %v); want 1 and [201 409]", n, codes)
	}
}
