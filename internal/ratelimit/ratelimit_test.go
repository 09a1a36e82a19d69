package ratelimit_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/ratelimit"
)

var t0 = time.Date(2026, 10, 9, 8, 0, 0, 0, time.UTC)

// TestClient: a client is its IPv4 address or its IPv6 /64, whatever the
// port; anything that is no IP peer is one client.
func TestClient(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.7:40000", "192.0.2.7"},
		{"192.0.2.7:40001", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:1", "192.0.2.7"},
		{"[2001:db8:1:2::1]:1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::3]:1", "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:1", "fe80::/64"},
		{"[2001:db8:1:3::1]:1", "2001:db8:1:3::/64"},
		{"@", "other"},
		{"", "other"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		r.Header.Set("X-Forwarded-For", "203.0.113.9")
		if got := ratelimit.Client(r); got != tc.want {
			t.Errorf("Client(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}

// TestLimiterBurstAndRefill: a key takes burst at once, then one more per
// every; Retry-After is whole seconds; a refund gives one back; other keys
// are not held up.
func TestLimiterBurstAndRefill(t *testing.T) {
	l := ratelimit.New(3, 10*time.Second, 100)
	for i := range 3 {
		if _, ok := l.Take("a", t0); !ok {
			t.Fatalf("take %d of the burst refused", i)
		}
	}
	if wait, ok := l.Take("a", t0); ok || wait != 10*time.Second {
		t.Fatalf("past the burst: %v %v, want refused for 10s", wait, ok)
	}
	if _, ok := l.Take("b", t0); !ok {
		t.Fatal("another key held up")
	}
	if wait, ok := l.Take("a", t0.Add(9500*time.Millisecond)); ok || wait != time.Second {
		t.Fatalf("0.5 s early: %v %v, want refused for 1s (rounded up)", wait, ok)
	}
	if _, ok := l.Take("a", t0.Add(10*time.Second)); !ok {
		t.Fatal("one more after every refused")
	}
	l.Refund("a", t0.Add(10*time.Second))
	if _, ok := l.Take("a", t0.Add(10*time.Second)); !ok {
		t.Fatal("the refunded one refused")
	}
	var off *ratelimit.Limiter
	if _, ok := off.Take("a", t0); !ok {
		t.Fatal("a nil Limiter refused")
	}
	off.Refund("a", t0)
}

// TestLimiterBoundedKeys: the limiter remembers at most maxKeys keys,
// forgetting the one closest to being given back all it took, so many
// clients cannot grow its memory without bound.
func TestLimiterBoundedKeys(t *testing.T) {
	l := ratelimit.New(1, time.Hour, 2)
	now := t0
	take := func(key string, want bool) {
		t.Helper()
		if _, ok := l.Take(key, now); ok != want {
			t.Fatalf("Take(%s) = %v, want %v", key, ok, want)
		}
		now = now.Add(time.Second)
	}
	take("1", true)
	take("1", false)
	take("2", true)
	take("1", false) // still tracked: 2 of 2
	take("3", true)  // forgets 1, the least recent
	take("2", false)
	take("1", true)
}

// TestFailureLimitDefaults: zero values take the defaults (10 at once, one
// more a minute); a negative Failures turns the limit off.
func TestFailureLimitDefaults(t *testing.T) {
	l := ratelimit.FailureLimit{}.NewLimiter()
	for i := range ratelimit.DefaultFailures {
		if _, ok := l.Take("c", t0); !ok {
			t.Fatalf("failure %d refused", i)
		}
	}
	if wait, ok := l.Take("c", t0); ok || wait != ratelimit.DefaultEvery {
		t.Fatalf("past the default budget: %v %v", wait, ok)
	}
	if l := (ratelimit.FailureLimit{Failures: -1}).NewLimiter(); l != nil {
		t.Fatal("a negative Failures did not turn the limit off")
	}
}
