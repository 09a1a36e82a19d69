package web_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/web"
)

// sessionCounter is a Store that counts session lookups.
type sessionCounter struct {
	vibejobs.Store
	n atomic.Int64
}

func (s *sessionCounter) GetSession(ctx context.Context, key []byte, now time.Time) (*vibejobs.DashboardSession, error) {
	s.n.Add(1)
	return s.Store.GetSession(ctx, key, now)
}

// unknownSession returns a well-formed session id that names no session.
func unknownSession() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// withCookie sends method path from addr with the session cookie id.
func (e *env) withCookie(method, path, addr, id string) *httptest.ResponseRecorder {
	e.t.Helper()
	req := httptest.NewRequest(method, path, nil)
	req.RemoteAddr = addr
	req.AddCookie(&http.Cookie{Name: web.SessionCookie, Value: id})
	rec := httptest.NewRecorder()
	e.handler.ServeHTTP(rec, req)
	return rec
}

// TestUnknownSessionsLimited: every well-formed session id is looked up in
// the store, so an address that keeps sending ids that name no session
// spends the same budget as failed logins: past it, its pages answer 429
// with Retry-After without the id being looked up, and its logins are
// refused too. A session in use elsewhere still works from there (a guesser
// behind the same proxy does not lock its users out); other addresses are
// not held up. The log holds neither the address nor a session id.
func TestUnknownSessionsLimited(t *testing.T) {
	var store *sessionCounter
	e := newEnv(t, func(c *web.Config) {
		store = &sessionCounter{Store: c.Store}
		c.Store = store
	})
	used, unused := e.browser(), e.browser()
	used.login(tokenA)
	unused.login(tokenA)
	if rec := e.withCookie("GET", "/", "198.51.100.3:5000", used.sessionID()); rec.Code != http.StatusOK {
		t.Fatalf("a live session: %d", rec.Code)
	}
	const attacker = "192.0.2.7:40000"
	var limited *httptest.ResponseRecorder
	for i := 0; i < 100 && limited == nil; i++ {
		rec := e.withCookie("GET", "/", attacker, unknownSession())
		switch rec.Code {
		case http.StatusSeeOther:
		case http.StatusTooManyRequests:
			limited = rec
		default:
			t.Fatalf("unknown session %d: %d", i, rec.Code)
		}
	}
	if limited == nil {
		t.Fatal("100 unknown session ids from one address, none refused with 429")
	}
	wait, err := strconv.Atoi(limited.Header().Get("Retry-After"))
	if err != nil || wait < 1 {
		t.Fatalf("429 with Retry-After %q, want whole seconds ≥ 1", limited.Header().Get("Retry-After"))
	}
	before := store.n.Load()
	for range 20 {
		if rec := e.withCookie("GET", "/jobs/x", "192.0.2.7:40001", unknownSession()); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("unknown session from the limited address: %d", rec.Code)
		}
	}
	if rec := e.withCookie("POST", "/logout", attacker, unknownSession()); rec.Code != http.StatusTooManyRequests {
		t.Errorf("logout with an unknown session from the limited address: %d, want 429", rec.Code)
	}
	if n := store.n.Load() - before; n != 0 {
		t.Errorf("the limited address's session ids were looked up %d times", n)
	}
	if rec := e.loginFrom(attacker, wrongToken); rec.Code != http.StatusTooManyRequests {
		t.Errorf("a login from the limited address: %d, want 429", rec.Code)
	}
	if rec := e.withCookie("GET", "/", attacker, unused.sessionID()); rec.Code != http.StatusTooManyRequests {
		t.Errorf("a session not yet used, from the limited address: %d, want 429", rec.Code)
	}
	if rec := e.withCookie("GET", "/", attacker, used.sessionID()); rec.Code != http.StatusOK {
		t.Errorf("a session in use elsewhere, from the limited address: %d, want 200", rec.Code)
	}
	if rec := e.withCookie("GET", "/", "198.51.100.4:5000", unknownSession()); rec.Code != http.StatusSeeOther {
		t.Errorf("an unknown session from another address: %d, want 303", rec.Code)
	}
	if rec := e.withCookie("GET", "/", attacker, "short"); rec.Code != http.StatusSeeOther {
		t.Errorf("a malformed session id (no lookup) from the limited address: %d, want 303", rec.Code)
	}
	e.clock.Advance(time.Duration(wait) * time.Second)
	if rec := e.withCookie("GET", "/", attacker, unknownSession()); rec.Code != http.StatusSeeOther {
		t.Errorf("an unknown session after Retry-After: %d, want 303", rec.Code)
	}
	logs := e.logs.String()
	if strings.Contains(logs, "192.0.2.7") || strings.Contains(logs, used.sessionID()) || strings.Contains(logs, unused.sessionID()) {
		t.Errorf("the log holds the client's address or a session id:\n%s", logs)
	}
}

// TestLoginPageDropsDeadSession: a browser whose session ended (expired
// and pruned, evicted, ended on another replica) and that opens the login
// page itself, not a page that sends it there, has the dead id cleared by
// the login page too. Kept, the id would be looked up at each visit of the
// login page, every look-up a failure against the address's login budget,
// until the right token is refused 429.
func TestLoginPageDropsDeadSession(t *testing.T) {
	e := newEnv(t, func(c *web.Config) { c.LoginLimit = web.LoginLimit{Failures: 3} })
	b := e.browser()
	u, _ := url.Parse(e.srv.URL)
	b.client.Jar.SetCookies(u, []*http.Cookie{{Name: web.SessionCookie, Value: unknownSession()}})
	if a := b.get("/login"); a.status != http.StatusOK {
		t.Fatalf("GET /login with a dead session id: %d", a.status)
	}
	if b.sessionID() != "" {
		t.Error("the login page kept the dead session id")
	}
	for range 4 {
		if a := b.get("/login"); a.status != http.StatusOK {
			t.Fatalf("GET /login again: %d", a.status)
		}
	}
	b.login(tokenA)
}
