package web_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/ratelimit"
	"github.com/vibejobs/vibejobs/internal/web"
)

// loginFrom sends the login form with token as a browser at addr (a
// RemoteAddr) would: it fetches the form for its secret, then posts it.
func (e *env) loginFrom(addr, token string) *httptest.ResponseRecorder {
	e.t.Helper()
	return e.loginVia(addr, "", token)
}

// loginVia is loginFrom through a proxy at addr that names the browser in
// X-Forwarded-For (none if forwardedFor is empty).
func (e *env) loginVia(addr, forwardedFor, token string) *httptest.ResponseRecorder {
	e.t.Helper()
	req := httptest.NewRequest("GET", "/login", nil)
	req.RemoteAddr = addr
	rec := httptest.NewRecorder()
	e.handler.ServeHTTP(rec, req)
	cookies := rec.Result().Cookies()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(rec.Body.String())
	if rec.Code != http.StatusOK || len(cookies) == 0 || m == nil {
		e.t.Fatalf("GET /login from %s: %d, cookies %v", addr, rec.Code, cookies)
	}
	form := url.Values{"csrf": {m[1]}, "token": {token}}
	req = httptest.NewRequest("POST", "/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = addr
	if forwardedFor != "" {
		req.Header.Set("X-Forwarded-For", forwardedFor)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	rec = httptest.NewRecorder()
	e.handler.ServeHTTP(rec, req)
	return rec
}

const wrongToken = "vjt_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC"

// TestFailedLoginsLimited: an address that keeps sending wrong tokens is
// soon answered 429 with Retry-After, without its tokens being checked (not
// even a right one, which would make the limit an oracle); other addresses
// log in as before; once Retry-After has passed the address may try again.
func TestFailedLoginsLimited(t *testing.T) {
	e := newEnv(t)
	const attacker = "192.0.2.7:40000"
	var limited *httptest.ResponseRecorder
	for i := 0; i < 100 && limited == nil; i++ {
		rec := e.loginFrom(attacker, wrongToken)
		switch rec.Code {
		case http.StatusUnauthorized:
		case http.StatusTooManyRequests:
			limited = rec
		default:
			t.Fatalf("failed login %d: %d", i, rec.Code)
		}
	}
	if limited == nil {
		t.Fatal("100 failed logins from one address, none refused with 429")
	}
	wait, err := strconv.Atoi(limited.Header().Get("Retry-After"))
	if err != nil || wait < 1 {
		t.Fatalf("429 with Retry-After %q, want whole seconds ≥ 1", limited.Header().Get("Retry-After"))
	}
	if body := limited.Body.String(); !strings.Contains(body, "Too many failed logins") || !strings.Contains(body, `name="token"`) {
		t.Errorf("429 page does not explain and offer the form:\n%s", body)
	}
	// Another port of the same host is the same client.
	if rec := e.loginFrom("192.0.2.7:40001", tokenA); rec.Code != http.StatusTooManyRequests {
		t.Errorf("the right token from the limited address: %d, want 429", rec.Code)
	}
	if rec := e.loginFrom("198.51.100.3:5000", tokenA); rec.Code != http.StatusSeeOther {
		t.Errorf("the right token from another address: %d, want 303", rec.Code)
	}
	if rec := e.loginFrom("198.51.100.4:5000", wrongToken); rec.Code != http.StatusUnauthorized {
		t.Errorf("a wrong token from another address: %d, want 401", rec.Code)
	}
	e.clock.Advance(time.Duration(wait) * time.Second)
	if rec := e.loginFrom(attacker, tokenA); rec.Code != http.StatusSeeOther {
		t.Errorf("the right token after Retry-After: %d, want 303", rec.Code)
	}
	if !strings.Contains(e.logs.String(), `"reason":"rate_limited"`) {
		t.Error("the limited login was not logged")
	}
	if strings.Contains(e.logs.String(), "192.0.2.7") {
		t.Error("the log holds the client's address")
	}
}

// TestFailedLoginsLimitedBehindTrustedProxy: behind a trusted reverse proxy
// each browser has its own budget, named by X-Forwarded-For; a peer that
// is no trusted proxy is counted by its own address, whatever it claims.
func TestFailedLoginsLimitedBehindTrustedProxy(t *testing.T) {
	proxies, err := ratelimit.ParseProxies("10.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *web.Config) { c.TrustedProxies = proxies })
	limitedAfter := func(peer string, forwardedFor func(i int) string) bool {
		for i := range 100 {
			if e.loginVia(peer, forwardedFor(i), wrongToken).Code == http.StatusTooManyRequests {
				return true
			}
		}
		return false
	}
	if !limitedAfter("10.0.0.2:5000", func(int) string { return "192.0.2.7" }) {
		t.Fatal("100 failed logins from one browser behind the proxy, none refused with 429")
	}
	if rec := e.loginVia("10.0.0.2:5000", "198.51.100.3", tokenA); rec.Code != http.StatusSeeOther {
		t.Errorf("another browser behind the same proxy: %d, want 303", rec.Code)
	}
	if !limitedAfter("10.0.0.3:5000", func(i int) string { return "198.51.100." + strconv.Itoa(i) }) {
		t.Error("an untrusted peer escaped its limit by changing X-Forwarded-For")
	}
}
