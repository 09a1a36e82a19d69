package api_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// TestBadTextOnPostgres: PostgreSQL's text refuses invalid UTF-8 and NUL
// bytes, so an id or query value holding them must be answered before it
// reaches the store: 404 for an id, 400 for a query value, never a 500.
// (SQLite stores such bytes, so the table in TestBadInput cannot tell.)
func TestBadTextOnPostgres(t *testing.T) {
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
	h := api.New(api.Config{Store: st, Sealer: mustKeyring(t), URLs: policy, Now: clk.Now,
		Logger: slog.New(slog.DiscardHandler), RateLimit: api.RateLimit{PerSecond: -1}}).Handler()
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
