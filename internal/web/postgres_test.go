package web_test

import (
	"net/http"
	"testing"
)

// TestBadIDIsNotFoundOnEveryStore: a job or run id holding a NUL byte or
// invalid UTF-8 names nothing, so its page is the same 404 as any other
// unknown id's. SQLite simply finds no such row; PostgreSQL's text refuses
// the bytes, which the store reports as invalid input, and the page said
// "Bad request: this link is not valid (any more)" instead.
func TestBadIDIsNotFoundOnEveryStore(t *testing.T) {
	onEveryStore(t, func(t *testing.T, e *env) {
		b := e.browser()
		b.login(tokenA)
		for _, path := range []string{"/jobs/%00", "/jobs/job_%FF", "/runs/run_%00", "/runs/%C3%28"} {
			if a := b.get(path); a.status != http.StatusNotFound {
				t.Errorf("GET %s: %d, want 404", path, a.status)
			}
		}
	})
}
