package subscriptions_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
)

// apiHandler is the API on e's store, its URL checks opening loopback as
// the deliverer's client does.
func (e *env) apiHandler(t *testing.T) http.Handler {
	t.Helper()
	policy, err := egress.NewPolicy([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	return api.New(api.Config{Store: e.store, Sealer: e.keys, URLs: policy, Now: e.clock.Now,
		Logger: slog.New(slog.DiscardHandler), RateLimit: api.RateLimit{PerSecond: -1}}).Handler()
}

// call sends one API request with token and fails the test unless it
// answers 200.
func call(t *testing.T, h http.Handler, token, method, path, body string) map[string]any {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", method+path+body)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var out map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &out); w.Code != http.StatusOK || err != nil {
		t.Fatalf("%s %s: %d %s", method, path, w.Code, w.Body)
	}
	return out
}

// TestNewReceiverStartsItsBackoffAfresh: the failures that took a
// subscription's backoff to an hour were the old URL's, or the old
// secret's. A new URL or a rotated secret is tried at once, and if the
// receiver refuses that first try too, the retry comes after the first
// pause (12 s), not after the hour the old count had reached: the count
// starts again with the new settings. The API shows it: attempts 0 once
// the URL changed.
func TestNewReceiverStartsItsBackoffAfresh(t *testing.T) {
	for _, tc := range []struct {
		name string
		fix  func(t *testing.T, h http.Handler, token, id, goodURL string) map[string]any
		same bool // the fix keeps the URL: the old receiver gets the retry
	}{{
		name: "new URL",
		fix: func(t *testing.T, h http.Handler, token, id, goodURL string) map[string]any {
			return call(t, h, token, "PATCH", "/v1/subscriptions/"+id, `{"url":"`+goodURL+`"}`)
		},
	}, {
		name: "rotated secret",
		fix: func(t *testing.T, h http.Handler, token, id, _ string) map[string]any {
			return call(t, h, token, "POST", "/v1/subscriptions/"+id+"/rotate-secret", "")
		},
		same: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e, token := newBootstrappedEnv(t)
			e.job = e.newJob("job_a", "http://127.0.0.1:1/")
			bad, good := newRecv(t), newRecv(t)
			sub, _ := e.subscribe(bad.srv.URL)
			e.emit(e.job, vibejobs.EventJobUpdated)
			e.failN(t, bad, sub, 10) // the eleventh failure would wait an hour

			h := e.apiHandler(t)
			got := tc.fix(t, h, token, sub.ID, good.srv.URL)
			if got["attempts"] != 0.0 {
				t.Errorf("the answer to the fix shows attempts %v, want 0", got["attempts"])
			}
			to := good
			if tc.same {
				to = bad
			}
			to.answer(500)
			runOnce(t, e.deliverer("w1", nil))
			if sent := seqs(to.drain()); len(sent) != 1 || sent[0] != 1 {
				t.Fatalf("after the fix the receiver got %v, want event 1 at once", sent)
			}
			s := e.get(sub.ID)
			if s.Attempts != 1 || s.NextAttemptAt == nil || s.NextAttemptAt.Sub(e.clock.Now()) != vibejobs.SubscriptionMinBackoff {
				var in time.Duration
				if s.NextAttemptAt != nil {
					in = s.NextAttemptAt.Sub(e.clock.Now())
				}
				t.Fatalf("a first refusal after the fix: attempts %d, next attempt in %v, want 1 and %v",
					s.Attempts, in, vibejobs.SubscriptionMinBackoff)
			}
		})
	}
}
