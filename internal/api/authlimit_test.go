package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/ratelimit"
)

// lookupCounter is a Store that counts token lookups.
type lookupCounter struct {
	vibejobs.Store
	n atomic.Int64
}

func (s *lookupCounter) TokenByHash(ctx context.Context, hash []byte) (*vibejobs.Token, error) {
	s.n.Add(1)
	return s.Store.TokenByHash(ctx, hash)
}

// unknownToken is well formed but names no token.
const unknownToken = "vjt_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC"

// from sends GET path with token as a client at addr (a RemoteAddr) would.
func (e *env) from(addr, path, token string) *httptest.ResponseRecorder {
	e.t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = addr
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	e.server.Handler().ServeHTTP(rec, r)
	return rec
}

// TestFailedAuthLimited: an address that keeps sending tokens that do not
// exist is soon answered 429 with Retry-After, in the API's error shape,
// and then its tokens are no longer looked up, so it cannot keep the store
// busy. Other addresses are not held up; a token that is not known to be
// good is refused from the limited address too (the limit says nothing of
// any token), while one in use from elsewhere still works from there, so a
// guesser behind the same proxy or NAT does not lock its users out. Once
// Retry-After has passed the address is heard again. The log holds neither
// the address nor a token.
func TestFailedAuthLimited(t *testing.T) {
	var store *lookupCounter
	e := newEnv(t, func(c *api.Config) {
		store = &lookupCounter{Store: c.Store}
		c.Store = store
	})
	fresh := mintInStore(t, e) // valid, never used
	const attacker = "192.0.2.7:40000"
	if rec := e.from("198.51.100.3:5000", "/v1/jobs", e.admin); rec.Code != http.StatusOK {
		t.Fatalf("admin from another address: %d %s", rec.Code, rec.Body)
	}
	var limited *httptest.ResponseRecorder
	for i := 0; i < 100 && limited == nil; i++ {
		rec := e.from(attacker, "/v1/jobs", unknownToken)
		switch rec.Code {
		case http.StatusUnauthorized:
		case http.StatusTooManyRequests:
			limited = rec
		default:
			t.Fatalf("unknown token %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	if limited == nil {
		t.Fatal("100 unknown tokens from one address, none refused with 429")
	}
	wait, err := strconv.Atoi(limited.Header().Get("Retry-After"))
	if err != nil || wait < 1 {
		t.Fatalf("429 with Retry-After %q, want whole seconds ≥ 1", limited.Header().Get("Retry-After"))
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(limited.Body.Bytes(), &body); err != nil || body.Error.Code != "rate_limited" || body.Error.Message == "" {
		t.Errorf("429 body %s, want the API's error with code rate_limited", limited.Body)
	}

	before := store.n.Load()
	for range 20 {
		// Another port of the same host is the same client, on any route
		// that takes a token (the metrics' too).
		if rec := e.from("192.0.2.7:40001", "/v1/jobs", unknownToken); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("unknown token from the limited address: %d", rec.Code)
		}
	}
	if n := store.n.Load() - before; n != 0 {
		t.Errorf("the limited address's tokens were looked up %d times", n)
	}
	if rec := e.from(attacker, "/v1/jobs", fresh); rec.Code != http.StatusTooManyRequests {
		t.Errorf("a valid token not yet used, from the limited address: %d, want 429", rec.Code)
	}
	if rec := e.from(attacker, "/v1/jobs", e.admin); rec.Code != http.StatusOK {
		t.Errorf("a token in use elsewhere, from the limited address: %d %s, want 200", rec.Code, rec.Body)
	}
	if rec := e.from("198.51.100.3:5000", "/v1/jobs", fresh); rec.Code != http.StatusOK {
		t.Errorf("a valid token from another address: %d %s", rec.Code, rec.Body)
	}
	if rec := e.from("198.51.100.4:5000", "/v1/jobs", unknownToken); rec.Code != http.StatusUnauthorized {
		t.Errorf("an unknown token from another address: %d, want 401", rec.Code)
	}
	if rec := e.from(attacker, "/v1/jobs", "not-a-token"); rec.Code != http.StatusUnauthorized {
		t.Errorf("a malformed token (no lookup) from the limited address: %d, want 401", rec.Code)
	}
	if rec := e.from(attacker, "/healthz", ""); rec.Code != http.StatusOK {
		t.Errorf("a public route from the limited address: %d, want 200", rec.Code)
	}
	e.clock.Advance(time.Duration(wait) * time.Second)
	if rec := e.from(attacker, "/v1/jobs", unknownToken); rec.Code != http.StatusUnauthorized {
		t.Errorf("an unknown token after Retry-After: %d, want 401", rec.Code)
	}
	logs := e.logs.String()
	if strings.Contains(logs, "192.0.2.7") || strings.Contains(logs, unknownToken) || strings.Contains(logs, e.admin) || strings.Contains(logs, fresh) {
		t.Errorf("the log holds the client's address or a token:\n%s", logs)
	}
}

// TestFailedAuthLimitedBehindTrustedProxy: behind a trusted reverse proxy
// each client has its own budget, named by X-Forwarded-For, so a guesser
// does not use up the budget of the others behind the same proxy; an
// address that is no trusted proxy cannot pick its budget with the header.
func TestFailedAuthLimitedBehindTrustedProxy(t *testing.T) {
	proxies, err := ratelimit.ParseProxies("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *api.Config) { c.TrustedProxies = proxies })
	send := func(peer, forwardedFor string) int {
		r := httptest.NewRequest("GET", "/v1/jobs", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", forwardedFor)
		r.Header.Set("Authorization", "Bearer "+unknownToken)
		rec := httptest.NewRecorder()
		e.server.Handler().ServeHTTP(rec, r)
		return rec.Code
	}
	limited := false
	for i := 0; i < 100 && !limited; i++ {
		limited = send("10.0.0.2:5000", "192.0.2.7") == http.StatusTooManyRequests
	}
	if !limited {
		t.Fatal("100 unknown tokens from one client behind the proxy, none refused with 429")
	}
	if code := send("10.0.0.2:5001", "192.0.2.7"); code != http.StatusTooManyRequests {
		t.Errorf("the limited client through the proxy again: %d, want 429", code)
	}
	if code := send("10.0.0.2:5000", "198.51.100.3"); code != http.StatusUnauthorized {
		t.Errorf("another client behind the same proxy: %d, want 401", code)
	}
	// An untrusted peer's own address counts, whatever it claims.
	limited = false
	for i := 0; i < 100 && !limited; i++ {
		limited = send("203.0.113.5:1", "198.51.100."+strconv.Itoa(i)) == http.StatusTooManyRequests
	}
	if !limited {
		t.Error("an untrusted peer escaped its limit by changing X-Forwarded-For")
	}
}

// TestFailedAuthLimitedOnMetrics: the metrics route takes an optional
// token; an unknown one is counted and limited like on any other route.
func TestFailedAuthLimitedOnMetrics(t *testing.T) {
	e := newEnv(t, func(c *api.Config) {
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
		c.InstallationMetrics = c.Metrics
	})
	const attacker = "[2001:db8::1]:1"
	var code int
	for i := 0; i < 100 && code != http.StatusTooManyRequests; i++ {
		code = e.from(attacker, "/metrics", unknownToken).Code
	}
	if code != http.StatusTooManyRequests {
		t.Fatalf("100 unknown tokens on /metrics: last %d, want 429", code)
	}
	// The same /64 is the same client.
	if rec := e.from("[2001:db8::2]:1", "/v1/jobs", unknownToken); rec.Code != http.StatusTooManyRequests {
		t.Errorf("unknown token from the same /64: %d, want 429", rec.Code)
	}
	if rec := e.from("[2001:db8::2]:1", "/metrics", ""); rec.Code != http.StatusOK {
		t.Errorf("metrics without a token from the limited address: %d, want 200", rec.Code)
	}
}
