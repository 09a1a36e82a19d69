package web_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPagesLimitedPerToken: the pages of one token's sessions share a rate
// limit, as its API requests do (by default the API's, 100/s with bursts of
// 200), so a session cannot query the store faster than the API lets the
// token. Another token's sessions are not held up, and the limit refills.
func TestPagesLimitedPerToken(t *testing.T) {
	e := newEnv(t)
	a1, a2, other := e.browser(), e.browser(), e.browser()
	a1.login(tokenA)
	a2.login(tokenA)
	other.login(tokenB)
	cookie := func(b *browser) *http.Cookie {
		return &http.Cookie{Name: "vj_session", Value: b.sessionID()}
	}
	page := func(b *browser) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/", nil)
		req.AddCookie(cookie(b))
		rec := httptest.NewRecorder()
		e.handler.ServeHTTP(rec, req)
		return rec
	}
	var limited *httptest.ResponseRecorder
	for i := 0; i < 500 && limited == nil; i++ {
		b := a1
		if i%2 == 1 {
			b = a2 // two sessions of one token share the limit
		}
		switch rec := page(b); rec.Code {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			limited = rec
		default:
			t.Fatalf("page %d: %d", i, rec.Code)
		}
	}
	if limited == nil {
		t.Fatal("500 pages at one instant for one token, none refused with 429")
	}
	wait, err := strconv.Atoi(limited.Header().Get("Retry-After"))
	if err != nil || wait < 1 {
		t.Fatalf("429 with Retry-After %q", limited.Header().Get("Retry-After"))
	}
	if !strings.Contains(limited.Body.String(), "Too many requests") {
		t.Errorf("429 page does not explain:\n%s", limited.Body.String())
	}
	if rec := page(other); rec.Code != http.StatusOK {
		t.Errorf("another token's session: %d, want 200", rec.Code)
	}
	e.clock.Advance(time.Duration(wait) * time.Second)
	if rec := page(a1); rec.Code != http.StatusOK {
		t.Errorf("after Retry-After: %d, want 200", rec.Code)
	}
}
