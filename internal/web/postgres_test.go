package web_test

import (
	"log/slog"
	"net/http"
	"testing"

	"github.com/vibejobs/vibejobs/internal/postgres"
)

// TestBadIDIsNotFoundOnEveryStore: a job or run id holding a NUL byte or
// invalid UTF-8 names nothing, so its page is the same 404 as any other
// unknown id's. SQLite simply finds no such row; PostgreSQL's text refuses
// the bytes, which the store reports as invalid input, and the page said
// "Bad request: this link is not valid (any more)" instead.
func TestBadIDIsNotFoundOnEveryStore(t *testing.T) {
	// Each store opens on the subtest's t: MustOpenTestWith skips when no
	// PostgreSQL is configured, and only the subtest may skip itself.
	stores := map[string]func(t *testing.T) *env{
		"sqlite": func(t *testing.T) *env { return newEnv(t) },
		"postgres": func(t *testing.T) *env {
			return newEnvOn(t, postgres.MustOpenTestWith(t, postgres.Options{Logger: slog.New(slog.DiscardHandler)}))
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			e := open(t)
			b := e.browser()
			b.login(tokenA)
			for _, path := range []string{"/jobs/%00", "/jobs/job_%FF", "/runs/run_%00", "/runs/%C3%28"} {
				if a := b.get(path); a.status != http.StatusNotFound {
					t.Errorf("GET %s: %d, want 404", path, a.status)
				}
			}
		})
	}
}
