package subscriptions_test

import (
	"net/http"
	"testing"

	"github.com/vibejobs/vibejobs/receiver"
)

// TestChangeInTheSameMillisecondIsSeen: a session notices a change of its
// subscription by its updatedAt. A PATCH of the URL, or a rotation, in the
// millisecond the session read the subscription in (a script creating and
// at once editing it; a clock stepped back) left updatedAt as the session
// had read it: the session went on with the rest of its page as before the
// change, to the old URL, signed with the old secret alone, after the API
// had answered the change.
func TestChangeInTheSameMillisecondIsSeen(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change makes the change through the API and returns the URL and
		// the secret that event 2 must go to and verify with.
		change func(t *testing.T, h http.Handler, token, id, newURL, secret string) (string, string)
	}{{
		name: "new URL",
		change: func(t *testing.T, h http.Handler, token, id, newURL, secret string) (string, string) {
			call(t, h, token, "PATCH", "/v1/subscriptions/"+id, `{"url":"`+newURL+`"}`)
			return newURL, secret
		},
	}, {
		name: "rotated secret",
		change: func(t *testing.T, h http.Handler, token, id, _, _ string) (string, string) {
			rotated := call(t, h, token, "POST", "/v1/subscriptions/"+id+"/rotate-secret", "")
			return rotated["url"].(string), rotated["secret"].(string)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e, token := newBootstrappedEnv(t)
			e.job = e.newJob("job_a", "http://127.0.0.1:1/")
			old, other := newRecv(t), newRecv(t)
			h := e.apiHandler(t)
			sub, secret := e.subscribe(old.srv.URL) // at the clock's instant, which stays still
			e.emit(e.job, e.updates(2)...)

			x, finish := old.inFlight(t, func() { runOnce(t, e.deliverer("w1", nil)) })
			if x.seq() != 1 {
				t.Fatalf("in flight: %s", x.body)
			}
			url, secret := tc.change(t, h, token, sub.ID, other.srv.URL, secret)
			finish()
			runOnce(t, e.deliverer("w1", nil))

			to, not := old, other
			if url == other.srv.URL {
				to, not = other, old
			}
			if got := seqs(not.drain()); len(got) != 0 {
				t.Fatalf("after the change the URL it replaced received %v", got)
			}
			got := to.drain()
			if len(got) != 1 || got[0].seq() != 2 {
				t.Fatalf("after the change its URL received %v, want 2", seqs(got))
			}
			if err := receiver.VerifyEvent(got[0].header.Get("Vibe-Signature"), got[0].body, e.clock.Now(), secret); err != nil {
				t.Fatalf("event 2 after the change: %v", err)
			}
		})
	}
}
