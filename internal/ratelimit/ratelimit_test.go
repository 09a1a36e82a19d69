package ratelimit_test

import (
	"net/http/httptest"
	"net/netip"
	"strings"
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
		if got := (ratelimit.Proxies{}).Client(r); got != tc.want {
			t.Errorf("Client(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}

// TestForwarded: a request came through a trusted proxy when its peer is
// one, whatever its headers say; a peer that is no IP address never is, and
// the zero Proxies trusts no one.
func TestForwarded(t *testing.T) {
	proxies, err := ratelimit.ParseProxies("10.0.0.0/8, 2001:db8::1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		remote string
		want   bool
	}{
		{"10.1.2.3:1", true},
		{"[::ffff:10.1.2.3]:1", true},
		{"[2001:db8::1]:443", true},
		{"[2001:db8::2]:443", false},
		{"192.0.2.1:1", false},
		{"10.1.2.3", false}, // no port: not a peer address
		{"@", false},
		{"", false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		r.Header.Set("X-Forwarded-For", "10.0.0.1")
		if got := proxies.Forwarded(r); got != tc.want {
			t.Errorf("Forwarded(%q) = %v, want %v", tc.remote, got, tc.want)
		}
		if (ratelimit.Proxies{}).Forwarded(r) {
			t.Errorf("the zero Proxies trusts %q", tc.remote)
		}
	}
}

// TestClientBehindTrustedProxies: a trusted proxy's request counts for the
// nearest address of X-Forwarded-For that is no trusted proxy, read from
// the right; anything further left, which the client may have written, is
// never read, and an untrusted peer's X-Forwarded-For is ignored.
func TestClientBehindTrustedProxies(t *testing.T) {
	proxies, err := ratelimit.ParseProxies(" 10.0.0.0/8, 192.0.2.1 ,::ffff:172.16.0.0/108, 2001:db8:ffff::/48,")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"10.1.2.3:1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"192.0.2.1:1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"[::ffff:10.1.2.3]:1", []string{"203.0.113.9"}, "203.0.113.9"},
		// A client's own entry, left of the one its proxy appended, is not
		// believed.
		{"10.1.2.3:1", []string{"198.51.100.1, 203.0.113.9"}, "203.0.113.9"},
		// Through two trusted proxies, over two header lines.
		{"10.1.2.3:1", []string{"198.51.100.1", "203.0.113.9, 10.9.9.9"}, "203.0.113.9"},
		{"10.1.2.3:1", []string{"198.51.100.1,203.0.113.9,172.16.0.5"}, "203.0.113.9"},
		{"10.1.2.3:1", []string{"2001:db8:1:2::1"}, "2001:db8:1:2::/64"},
		{"[2001:db8:ffff::2]:1", []string{"203.0.113.9:4711"}, "203.0.113.9"},
		{"10.1.2.3:1", []string{"[2001:db8:1:2::1]:4711"}, "2001:db8:1:2::/64"},
		// Garbage stops the walk at the proxy that forwarded it.
		{"10.1.2.3:1", []string{"203.0.113.9, unknown"}, "10.1.2.3"},
		{"10.1.2.3:1", []string{"unknown, 10.7.7.7"}, "10.7.7.7"},
		// Only trusted proxies: the leftmost of them.
		{"10.1.2.3:1", []string{"10.4.4.4, 10.5.5.5"}, "10.4.4.4"},
		{"10.1.2.3:1", nil, "10.1.2.3"},
		{"10.1.2.3:1", []string{""}, "10.1.2.3"},
		// An untrusted peer writes what it likes; it is not read.
		{"203.0.113.50:1", []string{"198.51.100.1"}, "203.0.113.50"},
		{"172.32.0.1:1", []string{"198.51.100.1"}, "172.32.0.1"},
		{"@", []string{"198.51.100.1"}, "other"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := proxies.Client(r); got != tc.want {
			t.Errorf("Client(%q, X-Forwarded-For %q) = %q, want %q", tc.remote, tc.xff, got, tc.want)
		}
	}
}

func TestParseProxiesRefusesBadLists(t *testing.T) {
	for _, s := range []string{"10.0.0.0/33", "proxy.example", "10.0.0.1:80", "fe80::1%eth0", "10.0.0.0/8,x",
		strings.Repeat("10.0.0.1,", ratelimit.MaxTrustedProxies+1)} {
		if _, err := ratelimit.ParseProxies(s); err == nil {
			t.Errorf("ParseProxies(%q) accepted", s)
		}
	}
	if p, err := ratelimit.ParseProxies(" , "); err != nil || p.Client(httptest.NewRequest("GET", "/", nil)) != "192.0.2.1" {
		t.Errorf("an empty list: %v", err)
	}
}

// TestLimiterBurstAndRefill: a key takes burst at once, then one more per
// every; Retry-After is whole seconds; other keys are not held up.
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
	if _, ok := l.Take("a", t0.Add(10*time.Second)); ok {
		t.Fatal("a second one at once after every taken")
	}
	var off *ratelimit.Limiter
	if _, ok := off.Take("a", t0); !ok {
		t.Fatal("a nil Limiter refused")
	}
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
// more a minute).
func TestFailureLimitDefaults(t *testing.T) {
	f := ratelimit.FailureLimit{}.NewFailures()
	for i := range ratelimit.DefaultFailures {
		a, _, ok := f.Try("c", []byte("bad"), t0)
		if !ok {
			t.Fatalf("failure %d refused", i)
		}
		a.Failed()
	}
	if _, wait, ok := f.Try("c", []byte("bad"), t0); ok || wait != ratelimit.DefaultEvery {
		t.Fatalf("past the default budget: %v %v", wait, ok)
	}
}

// TestFailures: failures count against the client and successes are given
// back; past the limit every credential is refused unlooked except one found
// valid lately, which stops being let through once it fails; a failed
// look-up of the store counts nothing.
func TestFailures(t *testing.T) {
	f := ratelimit.FailureLimit{Failures: 2, Every: time.Minute}.NewFailures()
	good, bad, other := []byte("good"), []byte("bad"), []byte("other")
	try := func(client string, key []byte) (ratelimit.Attempt, bool) {
		t.Helper()
		a, wait, ok := f.Try(client, key, t0)
		if !ok && wait < time.Minute {
			t.Fatalf("refused with Retry-After %v, want ≥ 1m", wait)
		}
		return a, ok
	}
	for range 5 {
		a, ok := try("c", good)
		if !ok {
			t.Fatal("a valid credential refused")
		}
		a.Succeeded()
	}
	a, _ := try("c", other)
	a.Undecided()
	for i := range 2 {
		a, ok := try("c", bad)
		if !ok {
			t.Fatalf("failure %d refused", i)
		}
		a.Failed()
	}
	if _, ok := try("c", bad); ok {
		t.Fatal("a third failure let through")
	}
	if _, ok := try("c", other); ok {
		t.Fatal("a credential never found valid let through from the limited client")
	}
	a, ok := try("c", good)
	if !ok {
		t.Fatal("a credential found valid refused from the limited client")
	}
	a.Failed() // revoked since
	if _, ok := try("c", good); ok {
		t.Fatal("a credential that failed still let through")
	}
	if _, ok := try("d", bad); !ok {
		t.Fatal("another client held up")
	}
	var off *ratelimit.Failures
	a, _, ok = off.Try("c", bad, t0)
	if !ok {
		t.Fatal("a nil Failures refused")
	}
	a.Failed()
	if (ratelimit.FailureLimit{Failures: -1}).NewFailures() != nil {
		t.Fatal("a negative Failures did not turn the limit off")
	}
}

// TestFailuresRemembersBoundedCredentials: at most MaxClients credentials
// are remembered as good, the one found valid least recently forgotten
// first.
func TestFailuresRemembersBoundedCredentials(t *testing.T) {
	f := ratelimit.FailureLimit{Failures: 1, Every: time.Hour, MaxClients: 2}.NewFailures()
	now := t0
	succeed := func(key string) {
		a, _, ok := f.Try("ok", []byte(key), now)
		if !ok {
			t.Fatalf("%s refused", key)
		}
		a.Succeeded()
		now = now.Add(time.Second)
	}
	succeed("1")
	succeed("2")
	succeed("1")
	succeed("3") // forgets 2
	a, _, _ := f.Try("c", []byte("x"), now)
	a.Failed()
	for key, want := range map[string]bool{"1": true, "2": false, "3": true} {
		if _, _, ok := f.Try("c", []byte(key), now); ok != want {
			t.Errorf("%s from the limited client: %v, want %v", key, ok, want)
		}
	}
}

// TestFailuresConcurrentAttempts: attempts still being looked up hold no
// budget, so the first burst of concurrent requests with a valid credential
// is not refused; concurrent failures each count even past the budget, so
// a client that sent many at once waits until all are forgiven.
func TestFailuresConcurrentAttempts(t *testing.T) {
	f := ratelimit.FailureLimit{Failures: 2, Every: time.Minute}.NewFailures()
	var pending []ratelimit.Attempt
	for i := range 20 {
		a, _, ok := f.Try("c", []byte("good"), t0)
		if !ok {
			t.Fatalf("concurrent attempt %d with a valid credential refused", i)
		}
		pending = append(pending, a)
	}
	for _, a := range pending {
		a.Succeeded()
	}
	pending = pending[:0]
	for i := range 5 {
		a, _, ok := f.Try("d", []byte("bad"), t0)
		if !ok {
			t.Fatalf("concurrent attempt %d refused before any failed", i)
		}
		pending = append(pending, a)
	}
	for _, a := range pending {
		a.Failed()
	}
	if _, wait, ok := f.Try("d", []byte("bad"), t0); ok || wait != 4*time.Minute {
		t.Errorf("after 5 concurrent failures: %v %v, want refused for 4m (the 5th forgiven after 5m, 2 at once)", wait, ok)
	}
}

// FuzzProxiesClient: whatever X-Forwarded-For holds, Client names an IPv4
// address or an IPv6 /64, and an untrusted peer is named by its own
// address.
func FuzzProxiesClient(f *testing.F) {
	proxies, err := ratelimit.ParseProxies("10.0.0.0/8,2001:db8::/32")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("10.0.0.1:1", "192.0.2.1, 10.0.0.7")
	f.Add("10.0.0.1:1", "[2001:db9::1]:80,unknown")
	f.Add("192.0.2.9:1", "10.0.0.1")
	f.Fuzz(func(t *testing.T, peer, forwardedFor string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", forwardedFor)
		got := proxies.Client(r)
		if got == "other" {
			return
		}
		if a, err := netip.ParseAddr(got); err == nil {
			if !a.Is4() {
				t.Fatalf("Client = %q: an IPv6 address, not its /64", got)
			}
		} else if p, err := netip.ParsePrefix(got); err != nil || p.Bits() != 64 || !p.Addr().Is6() {
			t.Fatalf("Client = %q: neither an IPv4 address nor an IPv6 /64", got)
		}
		if ap, err := netip.ParseAddrPort(peer); err == nil {
			a := ap.Addr().Unmap()
			if !a.WithZone("").IsValid() || netip.MustParsePrefix("10.0.0.0/8").Contains(a) || netip.MustParsePrefix("2001:db8::/32").Contains(a.WithZone("")) {
				return
			}
			if want := (ratelimit.Proxies{}).Client(r); got != want {
				t.Fatalf("untrusted peer %q named %q, want %q", peer, got, want)
			}
		}
	})
}
