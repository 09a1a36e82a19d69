package main

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDashboardPagesRateLimited: the dashboard limits each token's pages
// at --rate-limit, as the API limits its requests (bursts of twice that).
func TestDashboardPagesRateLimited(t *testing.T) {
	start := time.Now()
	m := NewMain(io.Discard, io.Discard)
	m.Now = func() time.Time { return start } // no refill during the test
	m.Config = Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), LogFormat: "text", LogLevel: "error",
		Concurrency: 8, PerHost: 8, RetentionDays: 90, MaxJobsPerProject: 10, RateLimit: 1}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	base := "http://" + m.Addr()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	_, form := get("/login")
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(form)
	if csrf == nil {
		t.Fatal("no login form")
	}
	resp, err := client.PostForm(base+"/login", url.Values{"csrf": {csrf[1]}, "token": {m.AdminToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	for i := range 2 {
		if code, _ := get("/"); code != http.StatusOK {
			t.Fatalf("page %d of the burst of 2: %d", i, code)
		}
	}
	if code, body := get("/"); code != http.StatusTooManyRequests || !strings.Contains(body, "Too many requests") {
		t.Errorf("third page at once with --rate-limit 1: %d, want 429", code)
	}
}
