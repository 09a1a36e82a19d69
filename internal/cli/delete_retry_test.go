package cli

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestDeleteRetryAfterDroppedAnswer: the CLI retries a DELETE whose answer
// was lost (a dropped connection), as it does a POST; a DELETE carries no
// Idempotency-Key, so the retry meets the deletion the first attempt made,
// and the command reported "not found" (exit 1) for a job it did delete.
func TestDeleteRetryAfterDroppedAnswer(t *testing.T) {
	var mu sync.Mutex
	dropped := false
	a := startAPI(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			drop := r.Method == "DELETE" && !dropped
			if drop {
				dropped = true
			}
			mu.Unlock()
			if !drop {
				h.ServeHTTP(w, r)
				return
			}
			// The deletion commits, then the connection drops.
			h.ServeHTTP(httptest.NewRecorder(), r)
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		})
	})
	j := a.okJSON(t, "jobs", "create", "--name", "d", "--schedule", "@daily", "--url", "https://example.test/")
	id := j["id"].(string)
	out, _, err := a.cli(t, "jobs", "delete", id)
	if _, _, gerr := a.cli(t, "jobs", "get", id); gerr == nil {
		t.Fatalf("job still there")
	}
	if err != nil {
		t.Fatalf("jobs delete %s deleted the job but reported: error: %v (stdout %q)", id, err, out)
	}
}
