package web_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/ratelimit"
	"github.com/vibejobs/vibejobs/internal/secretbox"
	"github.com/vibejobs/vibejobs/internal/storetest"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
	"github.com/vibejobs/vibejobs/internal/web"
)

func TestLoginShowsProjectJobs(t *testing.T) {
	e := newEnv(t)
	e.job(e.projectA, named("nightly report"))
	e.job(e.projectA, named("hourly sync"), func(j *vibejobs.Job) {
		at := t0.Add(3 * time.Hour)
		j.Schedule, j.At, j.NextRunAt = "", &at, &at
	})
	e.job(e.projectB, named("beta secret plans"))

	b := e.browser()
	b.login(tokenA)
	if b.sessionID() == "" {
		t.Fatal("no session cookie after the login")
	}
	a := b.get("/")
	if a.status != http.StatusOK {
		t.Fatalf("GET /: %d", a.status)
	}
	for _, want := range []string{"nightly report", "hourly sync", "*/5 * * * *", "once at", "Europe/Berlin",
		"Project Alpha", "2026-10-09 08:05:00 UTC", "in 5 min", `http-equiv="refresh"`, "2 jobs"} {
		if !strings.Contains(a.body, want) {
			t.Errorf("jobs page lacks %q", want)
		}
	}
	if strings.Contains(a.body, "beta secret plans") || strings.Contains(a.body, "Project Beta") {
		t.Error("jobs page shows project B")
	}
	if strings.Contains(a.body, tokenA) {
		t.Error("a page shows the token")
	}
}

// newProxiedEnv is newEnv with 10.0.0.0/24 as the trusted proxies. The
// addresses only ever appear as a request's RemoteAddr: nothing dials them.
func newProxiedEnv(t *testing.T) *env {
	t.Helper()
	return newEnv(t, func(c *web.Config) {
		p, err := ratelimit.ParseProxies("10.0.0.0/24")
		if err != nil {
			t.Fatal(err)
		}
		c.TrustedProxies = p
	})
}

// TestSessionCookieAttributes: the cookies are HttpOnly and SameSite=Strict;
// over HTTPS (TLS, or a trusted proxy's X-Forwarded-Proto) they are Secure
// and carry the __Host- prefix (so no sibling host or plain-HTTP attacker
// can plant one), and every answer sends Strict-Transport-Security. Over
// plain HTTP the dashboard works as before, and so it does when a peer that
// is no trusted proxy claims HTTPS: X-Forwarded-Proto is believed only from
// Config.TrustedProxies, and only its last entry, the one the proxy wrote.
func TestSessionCookieAttributes(t *testing.T) {
	const proxy, client = "10.0.0.7:40000", "192.0.2.1:1234"
	e := newProxiedEnv(t)
	for _, tc := range []struct {
		name   string
		tls    bool
		peer   string   // RemoteAddr
		header []string // X-Forwarded-Proto, one value per header line
		secure bool
	}{
		{"plain", false, client, nil, false},
		{"tls", true, client, nil, true},
		{"proxy", false, proxy, []string{"https"}, true},
		{"proxy http", false, proxy, []string{"http"}, false},
		{"proxy HTTPS", false, proxy, []string{"HTTPS"}, true},
		// The client's own value left of what the proxy appended is not read.
		{"proxy appends https", false, proxy, []string{"http, https"}, true},
		{"proxy appends http", false, proxy, []string{"https, http"}, false},
		{"proxy adds a line", false, proxy, []string{"https", "http"}, false},
		// A client that is no trusted proxy claims HTTPS on plain HTTP.
		{"untrusted peer", false, client, []string{"https"}, false},
		{"untrusted peer, no IP", false, "@", []string{"https"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := ""
			if tc.secure {
				prefix = "__Host-"
			}
			var jar []*http.Cookie
			send := func(method, path string, form url.Values) *httptest.ResponseRecorder {
				t.Helper()
				req := httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
				if form != nil {
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				}
				if tc.tls {
					req.TLS = &tls.ConnectionState{}
				}
				req.RemoteAddr = tc.peer
				for _, v := range tc.header {
					req.Header.Add("X-Forwarded-Proto", v)
				}
				for _, c := range jar {
					req.AddCookie(c)
				}
				rec := httptest.NewRecorder()
				e.handler.ServeHTTP(rec, req)
				hsts := rec.Header().Get("Strict-Transport-Security")
				if tc.secure && !strings.HasPrefix(hsts, "max-age=") {
					t.Errorf("%s %s: Strict-Transport-Security %q, want max-age", method, path, hsts)
				}
				if !tc.secure && hsts != "" {
					t.Errorf("%s %s over plain HTTP: Strict-Transport-Security %q", method, path, hsts)
				}
				return rec
			}
			check := func(c *http.Cookie, name, path string) {
				t.Helper()
				if c.Name != prefix+name || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode ||
					c.Path != path || c.Domain != "" || c.Secure != tc.secure {
					t.Errorf("cookie %+v: want %s%s, HttpOnly, SameSite=Strict, Path=%s, no Domain, Secure=%v",
						c, prefix, name, path, tc.secure)
				}
			}
			rec := send("GET", "/login", nil)
			cookies := rec.Result().Cookies()
			m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(rec.Body.String())
			if len(cookies) != 1 || m == nil || m[1] != cookies[0].Value {
				t.Fatalf("login form: cookies %v, field %v", cookies, m)
			}
			loginPath := "/login"
			if tc.secure {
				loginPath = "/" // __Host- asks for Path=/
			}
			check(cookies[0], web.LoginCookie, loginPath)
			jar = cookies

			rec = send("POST", "/login", url.Values{"csrf": {m[1]}, "token": {tokenA}})
			if rec.Code != http.StatusSeeOther {
				t.Fatalf("POST /login: %d", rec.Code)
			}
			var sess *http.Cookie
			for _, c := range rec.Result().Cookies() {
				if strings.HasSuffix(c.Name, web.SessionCookie) {
					sess = c
				}
			}
			if sess == nil {
				t.Fatal("no session cookie")
			}
			check(sess, web.SessionCookie, "/")
			if len(sess.Value) != 43 || strings.Contains(sess.Value, tokenA) || strings.Contains(sess.Value, e.tokenAID) {
				t.Errorf("session cookie value %q is not an opaque 32-byte id", sess.Value)
			}
			jar = []*http.Cookie{sess}
			home := send("GET", "/", nil)
			if home.Code != http.StatusOK {
				t.Fatalf("GET / with the session cookie: %d", home.Code)
			}
			secret := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(home.Body.String())
			rec = send("POST", "/logout", url.Values{"csrf": {secret[1]}})
			if rec.Code != http.StatusSeeOther {
				t.Fatalf("POST /logout: %d", rec.Code)
			}
			cleared := rec.Result().Cookies()
			if len(cleared) != 1 || cleared[0].MaxAge >= 0 {
				t.Fatalf("logout cookies %v, want the session cookie cleared", cleared)
			}
			check(cleared[0], web.SessionCookie, "/")
		})
	}
}

func TestBadTokenRefused(t *testing.T) {
	e := newEnv(t)
	for name, token := range map[string]string{
		"unknown":   "vjt_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC",
		"malformed": "hunter2",
		"empty":     "",
		"huge":      "vjt_" + strings.Repeat("x", 5000),
	} {
		t.Run(name, func(t *testing.T) {
			b := e.browser()
			a := b.loginAnswer("/login", token)
			if a.status != http.StatusUnauthorized {
				t.Fatalf("login with a bad token: %d, want 401", a.status)
			}
			if !strings.Contains(a.body, "not valid, or it was revoked") || !strings.Contains(a.body, `name="token"`) {
				t.Errorf("401 page does not explain and offer the form again:\n%s", a.body)
			}
			if b.sessionID() != "" {
				t.Error("a bad token got a session")
			}
			if got := b.get("/"); got.status != http.StatusSeeOther {
				t.Errorf("GET / after a refused login: %d", got.status)
			}
		})
	}
}

// TestOversizedFormRefused: a login or logout form over the dashboard's
// 8 KiB is answered 413 with a page that says so, not 400 "could not be
// read", and starts or ends no session.
func TestOversizedFormRefused(t *testing.T) {
	e := newEnv(t)
	b := e.browser()
	check := func(what string, a *answer) {
		t.Helper()
		if a.status != http.StatusRequestEntityTooLarge || !strings.Contains(a.body, "larger than the 8 KiB the dashboard accepts") {
			t.Errorf("%s: %d, want 413 saying the form is too large:\n%s", what, a.status, a.body)
		}
	}
	form := b.get("/login")
	check("9 KB login form", b.post("/login", url.Values{"csrf": {b.csrf(form)}, "token": {tokenA + strings.Repeat(" ", 9000)}}))
	if b.sessionID() != "" {
		t.Error("the oversized login form started a session")
	}

	b.login(tokenA)
	check("9 KB logout form", b.post("/logout", url.Values{"csrf": {b.csrf(b.get("/"))}, "pad": {strings.Repeat("x", 9000)}}))
	if a := b.get("/"); a.status != http.StatusOK {
		t.Errorf("the oversized logout form ended the session (%d)", a.status)
	}
}

func TestNoSessionRedirectsToLogin(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA)
	r := e.run(j, t0)
	b := e.browser()
	for path, want := range map[string]string{
		"/":                         "/login",
		"/?cursor=abc":              "/login?next=" + url.QueryEscape("/?cursor=abc"),
		"/jobs/" + j.ID:             "/login?next=" + url.QueryEscape("/jobs/"+j.ID),
		"/runs/" + r.ID:             "/login?next=" + url.QueryEscape("/runs/"+r.ID),
		"/jobs/job_does_not_exist":  "/login?next=" + url.QueryEscape("/jobs/job_does_not_exist"),
		"/runs/run_does_not_exist?": "/login?next=" + url.QueryEscape("/runs/run_does_not_exist?"),
	} {
		a := b.get(path)
		if a.status != http.StatusSeeOther || a.location() != want {
			t.Errorf("GET %s: %d to %q, want 303 to %q", path, a.status, a.location(), want)
		}
	}
	// A session id we never issued is no session.
	u, _ := url.Parse(e.srv.URL)
	b.client.Jar.SetCookies(u, []*http.Cookie{{Name: web.SessionCookie, Value: strings.Repeat("A", 43)}})
	if a := b.get("/"); a.status != http.StatusSeeOther {
		t.Errorf("GET / with a forged session id: %d", a.status)
	}
}

func TestLoginReturnsToThePageAsked(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA)
	b := e.browser()
	first := b.get("/jobs/" + j.ID + "?state=failed")
	a := b.loginAnswer(first.location(), tokenA)
	if want := "/jobs/" + j.ID + "?state=failed"; a.status != http.StatusSeeOther || a.location() != want {
		t.Fatalf("login: %d to %q, want 303 to %q", a.status, a.location(), want)
	}

	// next never leads to another site.
	for _, next := range []string{"//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:alert(1)", "/a\r\nSet-Cookie: x=y"} {
		b := e.browser()
		form := b.get("/login")
		a := b.post("/login", url.Values{"csrf": {b.csrf(form)}, "token": {tokenA}, "next": {next}})
		if a.status != http.StatusSeeOther || a.location() != "/" {
			t.Errorf("login with next=%q: %d to %q, want 303 to /", next, a.status, a.location())
		}
	}
}

func TestAnotherProjectsIDsAreNotFound(t *testing.T) {
	e := newEnv(t)
	own := e.job(e.projectA)
	other := e.job(e.projectB, named("beta job"))
	otherRun := e.run(other, t0)
	ownRun := e.run(own, t0.Add(time.Minute))

	b := e.browser()
	b.login(tokenA)
	if a := b.get("/jobs/" + own.ID); a.status != http.StatusOK {
		t.Fatalf("own job: %d", a.status)
	}
	if a := b.get("/runs/" + ownRun.ID); a.status != http.StatusOK {
		t.Fatalf("own run: %d", a.status)
	}
	for _, kind := range []struct{ path, otherID, missingID string }{
		{"/jobs/", other.ID, "job_00000000000000000000000000"},
		{"/runs/", otherRun.ID, "run_00000000000000000000000000"},
	} {
		theirs := b.get(kind.path + kind.otherID)
		missing := b.get(kind.path + kind.missingID)
		if theirs.status != http.StatusNotFound || missing.status != http.StatusNotFound {
			t.Errorf("%s: another project's id %d, a missing id %d, want 404 for both", kind.path, theirs.status, missing.status)
		}
		if theirs.body != missing.body {
			t.Errorf("%s: another project's id reads differently from a missing one:\n%s\n---\n%s", kind.path, theirs.body, missing.body)
		}
		if strings.Contains(theirs.body, "beta job") {
			t.Errorf("%s: the 404 shows the other project's data", kind.path)
		}
	}
	// The run list of the own job does not show the other project's run.
	if a := b.get("/jobs/" + own.ID); strings.Contains(a.body, otherRun.ID) {
		t.Error("the job page lists another project's run")
	}
}

func TestRevokedTokenEndsSessionAtOnce(t *testing.T) {
	e := newEnv(t)
	e.job(e.projectA)
	b := e.browser()
	b.login(tokenA)
	id := b.sessionID()
	if a := b.get("/"); a.status != http.StatusOK {
		t.Fatalf("before revocation: %d", a.status)
	}

	e.revoke(e.tokenAID)
	a := b.get("/")
	if a.status != http.StatusSeeOther || !strings.HasPrefix(a.location(), "/login") {
		t.Fatalf("after revocation: %d to %q, want a redirect to the login", a.status, a.location())
	}
	if b.sessionID() != "" {
		t.Error("the session cookie was not cleared")
	}
	// The session is gone, not merely hidden: the old id gets nothing.
	u, _ := url.Parse(e.srv.URL)
	b.client.Jar.SetCookies(u, []*http.Cookie{{Name: web.SessionCookie, Value: id}})
	if a := b.get("/"); a.status != http.StatusSeeOther {
		t.Errorf("old session id after revocation: %d", a.status)
	}
	// And the revoked token cannot log in again.
	if a := e.browser().loginAnswer("/login", tokenA); a.status != http.StatusUnauthorized {
		t.Errorf("login with a revoked token: %d, want 401", a.status)
	}
	if !strings.Contains(e.logs.String(), `"reason":"token_revoked"`) {
		t.Error("the ended session was not logged")
	}
}

func TestSessionExpires(t *testing.T) {
	e := newEnv(t)
	b := e.browser()
	b.login(tokenA)
	e.clock.Advance(web.DefaultSessionLifetime - time.Second)
	if a := b.get("/"); a.status != http.StatusOK {
		t.Fatalf("just before the session ends: %d", a.status)
	}
	e.clock.Advance(time.Second)
	if a := b.get("/"); a.status != http.StatusSeeOther {
		t.Fatalf("after %v: %d, want a redirect", web.DefaultSessionLifetime, a.status)
	}
}

// TestSessionsSharedByReplicas: two dashboards over one database, as two
// replicas behind a load balancer: a login on one is known to the other,
// with the same form secret, and a logout on one ends it on both.
func TestSessionsSharedByReplicas(t *testing.T) {
	e := newEnv(t)
	replica := httptest.NewServer(web.New(web.Config{Store: e.store, Now: e.clock.Now,
		Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(replica.Close)
	b := e.browser()
	b.login(tokenA)
	id := b.sessionID()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	home := func(base string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", base+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.AddCookie(&http.Cookie{Name: web.SessionCookie, Value: id})
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		if _, err := io.Copy(&sb, resp.Body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, sb.String()
	}
	status, body := home(replica.URL)
	if status != http.StatusOK {
		t.Fatalf("the other replica with the session: %d, want 200", status)
	}
	if got, want := b.csrf(&answer{body: body}), b.csrf(b.get("/")); got != want {
		t.Errorf("the replicas give the session different form secrets")
	}
	if a := b.post("/logout", url.Values{"csrf": {b.csrf(b.get("/"))}}); a.status != http.StatusSeeOther {
		t.Fatalf("logout: %d", a.status)
	}
	if status, _ := home(replica.URL); status != http.StatusSeeOther {
		t.Errorf("the other replica after the logout: %d, want a redirect to the login", status)
	}
}

func TestOldestSessionEvicted(t *testing.T) {
	e := newEnv(t, func(c *web.Config) { c.MaxSessions = 2 })
	bs := []*browser{e.browser(), e.browser(), e.browser()}
	for _, b := range bs {
		b.login(tokenA)
		e.clock.Advance(time.Second)
	}
	for i, want := range []int{http.StatusSeeOther, http.StatusOK, http.StatusOK} {
		if a := bs[i].get("/"); a.status != want {
			t.Errorf("session %d: %d, want %d", i, a.status, want)
		}
	}
}

func TestPagesEscapeWhatTheyShow(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA, named(`<script>alert("name")</script>`), func(j *vibejobs.Job) {
		j.URL = `https://app.example.test/"><script>alert("url")</script>`
	})
	r := e.deliver(j, t0.Add(-time.Hour), 503, `<img src=x onerror=alert("snippet")></pre><script>x()</script>`,
		vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAttemptsExhausted})

	b := e.browser()
	b.login(tokenA)
	for _, path := range []string{"/", "/jobs/" + j.ID, "/runs/" + r.ID} {
		a := b.get(path)
		if a.status != http.StatusOK {
			t.Fatalf("GET %s: %d", path, a.status)
		}
		if strings.Contains(a.body, "<script") || strings.Contains(a.body, "<img") {
			t.Errorf("GET %s carries markup from the data:\n%s", path, a.body)
		}
	}
	if a := b.get("/jobs/" + j.ID); !strings.Contains(a.body, "&lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;") {
		t.Errorf("the job name is not shown escaped:\n%s", a.body)
	}
	if a := b.get("/runs/" + r.ID); !strings.Contains(a.body, "&lt;img src=x onerror=alert(&#34;snippet&#34;)&gt;") {
		t.Errorf("the snippet is not shown escaped:\n%s", a.body)
	}
}

func TestRunPageShowsAttempts(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA, named("billing"))
	scheduled := t0.Add(-2 * time.Hour)
	r := e.deliver(j, scheduled, 200, `{"ok":true}`, vibejobs.Step{State: vibejobs.RunSucceeded})

	b := e.browser()
	b.login(tokenA)
	a := b.get("/runs/" + r.ID)
	if a.status != http.StatusOK {
		t.Fatalf("GET run: %d", a.status)
	}
	for _, want := range []string{
		r.ID, "billing", "/jobs/" + j.ID, "succeeded", "manual",
		"2026-10-09 06:00:00 UTC", // scheduled for / started
		"2 h ago",
		"231 ms",                     // duration
		">200<",                      // status code
		fmt.Sprint(scheduled.Unix()), // signature timestamp
		"{&#34;ok&#34;:true}",        // snippet
		"2026-10-09 08:00:00 CEST",   // the job's time zone
		"2026-10-13 06:00:00 UTC",    // deadline: 96 h
		`<pre class="snippet">`,      // the snippet as text
		"Response (first 1 KiB)",     // column
		`title="2026-10-09 06:00:00 UTC">` + // the signature time spelled out
			fmt.Sprint(scheduled.Unix()),
	} {
		if !strings.Contains(a.body, want) {
			t.Errorf("run page lacks %q", want)
		}
	}
	if strings.Contains(a.body, `http-equiv="refresh"`) {
		t.Error("a finished run's page refreshes")
	}

	// The job page links the run as its last run.
	if a := b.get("/jobs/" + j.ID); !strings.Contains(a.body, `href="/runs/`+r.ID+`"`) {
		t.Error("the job page does not link its last run")
	}
}

func TestJobRunsPaginateAndFilter(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA)
	failed := e.deliver(j, t0.Add(-10*time.Hour), 500, "boom",
		vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAttemptsExhausted})
	for i := range 59 {
		e.clock.Advance(time.Millisecond) // run ids sort by creation
		e.run(j, t0.Add(time.Duration(i)*time.Minute))
	}
	b := e.browser()
	b.login(tokenA)

	runLinks := regexp.MustCompile(`<td><a href="/runs/(run_[a-z0-9]+)">`)
	first := b.get("/jobs/" + j.ID)
	got := runLinks.FindAllStringSubmatch(first.body, -1)
	if len(got) != 50 {
		t.Fatalf("first page: %d runs, want 50", len(got))
	}
	next := regexp.MustCompile(`href="([^"]+)">Older runs`).FindStringSubmatch(first.body)
	if next == nil {
		t.Fatal("no link to the next page")
	}
	second := b.get(htmlUnescape(next[1]))
	rest := runLinks.FindAllStringSubmatch(second.body, -1)
	if second.status != http.StatusOK || len(rest) != 10 {
		t.Fatalf("second page: %d, %d runs, want 10", second.status, len(rest))
	}
	if rest[len(rest)-1][1] != failed.ID {
		t.Errorf("the oldest run is not last on the last page")
	}
	if strings.Contains(second.body, "Older runs") {
		t.Error("the last page links a next one")
	}

	filtered := b.get("/jobs/" + j.ID + "?state=failed")
	got = runLinks.FindAllStringSubmatch(filtered.body, -1)
	if len(got) != 1 || got[0][1] != failed.ID {
		t.Errorf("state=failed lists %v, want only %s", got, failed.ID)
	}
	if !strings.Contains(filtered.body, `class="pill on" aria-current="page">failed<`) {
		t.Error("the failed filter is not marked as selected")
	}
	if a := b.get("/jobs/" + j.ID + "?state=bogus"); a.status != http.StatusBadRequest {
		t.Errorf("unknown state: %d, want 400", a.status)
	}
	if a := b.get("/jobs/" + j.ID + "?cursor=%21%21"); a.status != http.StatusBadRequest {
		t.Errorf("bad cursor: %d, want 400", a.status)
	}
}

func TestJobsPaginate(t *testing.T) {
	e := newEnv(t)
	e.update(func(tx vibejobs.Tx) error {
		for i := range 55 {
			e.clock.Advance(time.Millisecond)
			if err := tx.CreateJob(e.ctx, e.newJob(e.projectA, named(fmt.Sprintf("job number %02d", i)))); err != nil {
				return err
			}
		}
		return nil
	})
	b := e.browser()
	b.login(tokenA)
	first := b.get("/")
	if n := strings.Count(first.body, "job number "); n != 50 || !strings.Contains(first.body, "55 jobs") {
		t.Fatalf("first page: %d jobs", n)
	}
	next := regexp.MustCompile(`href="([^"]+)">Next page`).FindStringSubmatch(first.body)
	if next == nil {
		t.Fatal("no next page link")
	}
	second := b.get(htmlUnescape(next[1]))
	if n := strings.Count(second.body, "job number "); n != 5 || !strings.Contains(second.body, "job number 54") {
		t.Errorf("second page: %d jobs", n)
	}
	if a := b.get("/?cursor=not-a-cursor"); a.status != http.StatusBadRequest {
		t.Errorf("bad cursor: %d, want 400", a.status)
	}
}

// TestMalformedQueryRefused: a query url.ParseQuery would drop part of (a
// bad %-escape, a ';', more than 10,000 parameters) is refused with the
// error page, as the API refuses it, rather than read as if the filter or
// cursor were missing, which would show the unfiltered list or first page.
func TestMalformedQueryRefused(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA)
	run := e.deliver(j, t0, 200, "ok", vibejobs.Step{State: vibejobs.RunSucceeded})
	b := e.browser()
	b.login(tokenA)
	listed := `<td><a href="/runs/` + run.ID + `">`
	tooMany := strings.Repeat("x=1&", 10000) + "state=failed"
	for _, p := range []string{
		"/jobs/" + j.ID + "?state=failed%2", "/jobs/" + j.ID + "?state=failed;x", "/jobs/" + j.ID + "?" + tooMany,
		"/?cursor=%zz", "/?" + tooMany,
	} {
		a := b.get(p)
		if a.status != http.StatusBadRequest || !strings.Contains(a.body, "The query of this address could not be read") {
			t.Errorf("GET %.60s: %d, want 400 with the error page (succeeded run listed: %v)", p, a.status, strings.Contains(a.body, listed))
		}
	}
	// A filter or cursor given twice: the first was read, the other
	// dropped.
	for _, p := range []string{"/jobs/" + j.ID + "?state=failed&state=succeeded", "/jobs/" + j.ID + "?cursor=&cursor=x", "/?cursor=&cursor=x"} {
		if a := b.get(p); a.status != http.StatusBadRequest || !strings.Contains(a.body, "is given more than once") {
			t.Errorf("GET %s: %d (succeeded run listed: %v), want 400 naming the repeated parameter", p, a.status, strings.Contains(a.body, listed))
		}
	}
	// 10,000 parameters are still read, the filter with them.
	if a := b.get("/jobs/" + j.ID + "?state=failed" + strings.Repeat("&x=1", 9999)); a.status != http.StatusOK || strings.Contains(a.body, listed) {
		t.Errorf("10,000 parameters: %d (succeeded run listed: %v), want 200 listing failed runs only", a.status, strings.Contains(a.body, listed))
	}
}

func TestSecretNeverShown(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA)
	r := e.deliver(j, t0.Add(-time.Hour), 200, "ok", vibejobs.Step{State: vibejobs.RunSucceeded})
	b := e.browser()
	b.login(tokenA)
	for _, p := range []string{"/", "/jobs/" + j.ID, "/runs/" + r.ID, "/jobs/" + j.ID + "?state=succeeded"} {
		if a := b.get(p); a.status != http.StatusOK {
			t.Fatalf("GET %s: %d", p, a.status)
		}
	}
	all := e.pages()
	for _, form := range []string{
		string(secretBytes), "SEALED-SECRET", hex.EncodeToString(secretBytes),
		base64.StdEncoding.EncodeToString(secretBytes), base64.RawURLEncoding.EncodeToString(secretBytes),
		base64.StdEncoding.EncodeToString(secretBytes[:24]),
	} {
		if strings.Contains(all, form) {
			t.Errorf("a page shows the sealed secret as %q", form)
		}
	}
}

func TestLoginFormCSRF(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		header []string
		cookie bool
		field  bool
		want   int
	}{
		{"same site", nil, true, true, http.StatusSeeOther},
		{"origin null (our Referrer-Policy)", []string{"Origin", "null"}, true, true, http.StatusSeeOther},
		{"same origin header", []string{"Origin", "ORIGIN"}, true, true, http.StatusSeeOther},
		{"fetch metadata same-origin", []string{"Sec-Fetch-Site", "same-origin"}, true, true, http.StatusSeeOther},
		{"no cookie", nil, false, true, http.StatusForbidden},
		{"no field", nil, true, false, http.StatusForbidden},
		{"other origin", []string{"Origin", "https://evil.example"}, true, true, http.StatusForbidden},
		{"cross-site fetch", []string{"Sec-Fetch-Site", "cross-site"}, true, true, http.StatusForbidden},
		// A sibling host can plant the login cookie over plain HTTP.
		{"same-site fetch (a sibling host)", []string{"Sec-Fetch-Site", "same-site"}, true, true, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := e.browser()
			form := b.get("/login")
			v := url.Values{"token": {tokenA}}
			if tc.field {
				v.Set("csrf", b.csrf(form))
			}
			if !tc.cookie {
				u, _ := url.Parse(e.srv.URL + "/login")
				b.client.Jar.SetCookies(u, []*http.Cookie{{Name: web.LoginCookie, Value: "", MaxAge: -1, Path: "/login"}})
			}
			header := append([]string(nil), tc.header...)
			for i := range header {
				if header[i] == "ORIGIN" {
					header[i] = e.srv.URL
				}
			}
			a := b.post("/login", v, header...)
			if a.status != tc.want {
				t.Fatalf("POST /login: %d, want %d", a.status, tc.want)
			}
			if tc.want == http.StatusForbidden {
				if b.sessionID() != "" {
					t.Error("a forged login got a session")
				}
				// The refusal offers a fresh form that works.
				retry := b.post("/login", url.Values{"csrf": {b.csrf(a)}, "token": {tokenA}})
				if retry.status != http.StatusSeeOther {
					t.Errorf("retry after the refusal: %d", retry.status)
				}
			}
		})
	}
}

// TestLoginOriginIsSchemeHostAndPort: without Sec-Fetch-Site, the login
// form is taken only from an Origin with the dashboard's scheme, host and
// port (a missing port is the scheme's default): an http:// page does not
// pass for an https dashboard, nor another port for this one. The scheme is
// https over TLS or behind a trusted proxy that says so.
func TestLoginOriginIsSchemeHostAndPort(t *testing.T) {
	const proxy, client = "10.0.0.7:40000", "192.0.2.1:1234"
	e := newProxiedEnv(t)
	type how struct {
		host  string
		tls   bool
		peer  string
		proto string   // X-Forwarded-Proto
		fwd   []string // X-Forwarded-Host, one value per header line
	}
	plain := how{host: "dash.example:8080", peer: client}
	bare := how{host: "dash.example", peer: client}
	secure := how{host: "dash.example", tls: true, peer: client}
	proxied := how{host: "dash.example", peer: proxy, proto: "https"}
	forged := how{host: "dash.example", peer: client, proto: "https"}
	v6 := how{host: "[::1]:8080", peer: client}
	// A proxy that passes its upstream address as Host and the browser's in
	// X-Forwarded-Host (nginx's default Host); the header of an untrusted
	// peer is not read.
	upstream := how{host: "127.0.0.1:8080", peer: proxy, proto: "https", fwd: []string{"dash.example"}}
	chained := how{host: "127.0.0.1:8080", peer: proxy, proto: "https", fwd: []string{"evil.example", "a.example, dash.example:8443"}}
	forgedHost := how{host: "127.0.0.1:8080", peer: client, fwd: []string{"dash.example"}}
	for _, tc := range []struct {
		name   string
		how    how
		origin string
		ok     bool
	}{
		{"http same", plain, "http://dash.example:8080", true},
		{"http same, other case", plain, "HTTP://Dash.Example:8080", true},
		{"http, https origin", plain, "https://dash.example:8080", false},
		{"http, other port", plain, "http://dash.example:8081", false},
		{"http, default port", plain, "http://dash.example", false},
		{"http, other host", plain, "http://evil.example:8080", false},
		{"http, explicit default port", bare, "http://dash.example:80", true},
		{"http, no port", bare, "http://dash.example", true},
		{"http, no host", bare, "http://", false},
		{"ipv6", v6, "http://[::1]:8080", true},
		{"ipv6, other port", v6, "http://[::1]:8081", false},
		{"tls same", secure, "https://dash.example", true},
		{"tls, explicit default port", secure, "https://dash.example:443", true},
		{"tls, http origin", secure, "http://dash.example", false},
		{"tls, http origin on 443", secure, "http://dash.example:443", false},
		{"tls, other port", secure, "https://dash.example:8443", false},
		{"trusted proxy, https origin", proxied, "https://dash.example", true},
		{"trusted proxy, http origin", proxied, "http://dash.example", false},
		{"untrusted peer says https", forged, "https://dash.example", false},
		{"untrusted peer, http origin", forged, "http://dash.example", true},
		{"trusted proxy, forwarded host", upstream, "https://dash.example", true},
		{"trusted proxy, forwarded host, other origin", upstream, "https://evil.example", false},
		{"trusted proxy, upstream address as origin", upstream, "https://127.0.0.1:8080", false},
		{"trusted proxy, last forwarded host", chained, "https://dash.example:8443", true},
		{"trusted proxy, earlier forwarded host", chained, "https://evil.example", false},
		{"untrusted peer's forwarded host", forgedHost, "http://dash.example", false},
		{"untrusted peer, its Host", forgedHost, "http://127.0.0.1:8080", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			send := func(method string, form url.Values, header http.Header, cookies []*http.Cookie) *httptest.ResponseRecorder {
				t.Helper()
				req := httptest.NewRequest(method, "/login", strings.NewReader(form.Encode()))
				req.Host, req.RemoteAddr = tc.how.host, tc.how.peer
				if tc.how.tls {
					req.TLS = &tls.ConnectionState{}
				}
				if tc.how.proto != "" {
					req.Header.Set("X-Forwarded-Proto", tc.how.proto)
				}
				for _, v := range tc.how.fwd {
					req.Header.Add("X-Forwarded-Host", v)
				}
				if form != nil {
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				}
				for k, v := range header {
					req.Header[k] = v
				}
				for _, c := range cookies {
					req.AddCookie(c)
				}
				rec := httptest.NewRecorder()
				e.handler.ServeHTTP(rec, req)
				return rec
			}
			form := send("GET", nil, nil, nil)
			m := csrfField.FindStringSubmatch(form.Body.String())
			if form.Code != http.StatusOK || m == nil {
				t.Fatalf("GET /login: %d, csrf field %v", form.Code, m)
			}
			rec := send("POST", url.Values{"csrf": {m[1]}, "token": {tokenA}},
				http.Header{"Origin": {tc.origin}}, form.Result().Cookies())
			want := http.StatusForbidden
			if tc.ok {
				want = http.StatusSeeOther
			}
			if rec.Code != want {
				t.Errorf("POST /login from Origin %q: %d, want %d", tc.origin, rec.Code, want)
			}
		})
	}
}

func TestLogoutCSRF(t *testing.T) {
	e := newEnv(t)
	b := e.browser()
	b.login(tokenA)
	home := b.get("/")
	secret := b.csrf(home)
	if !strings.Contains(home.body, `action="/logout"`) {
		t.Fatal("no logout form")
	}

	for name, tc := range map[string]struct {
		form   url.Values
		header []string
	}{
		"no secret":    {url.Values{}, nil},
		"wrong secret": {url.Values{"csrf": {strings.Repeat("x", 43)}}, nil},
		"cross-site":   {url.Values{"csrf": {secret}}, []string{"Sec-Fetch-Site", "cross-site"}},
		"same-site":    {url.Values{"csrf": {secret}}, []string{"Sec-Fetch-Site", "same-site"}},
		"other origin": {url.Values{"csrf": {secret}}, []string{"Origin", "https://evil.example"}},
	} {
		if a := b.post("/logout", tc.form, tc.header...); a.status != http.StatusForbidden {
			t.Errorf("logout, %s: %d, want 403", name, a.status)
		}
		if a := b.get("/"); a.status != http.StatusOK {
			t.Fatalf("logout, %s, ended the session (%d)", name, a.status)
		}
	}

	// Another session's secret does not log this one out.
	other := e.browser()
	other.login(tokenA)
	if a := b.post("/logout", url.Values{"csrf": {other.csrf(other.get("/"))}}); a.status != http.StatusForbidden {
		t.Errorf("logout with another session's secret: %d, want 403", a.status)
	}

	id := b.sessionID()
	a := b.post("/logout", url.Values{"csrf": {secret}})
	if a.status != http.StatusSeeOther || a.location() != "/login" {
		t.Fatalf("logout: %d to %q", a.status, a.location())
	}
	if b.sessionID() != "" {
		t.Error("the session cookie survived the logout")
	}
	u, _ := url.Parse(e.srv.URL)
	b.client.Jar.SetCookies(u, []*http.Cookie{{Name: web.SessionCookie, Value: id}})
	if a := b.get("/"); a.status != http.StatusSeeOther {
		t.Errorf("the old session id still works after the logout: %d", a.status)
	}
	if a := other.get("/"); a.status != http.StatusOK {
		t.Errorf("the logout ended another session: %d", a.status)
	}
}

func TestSecurityHeaders(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA)
	b := e.browser()
	check := func(what string, a *answer) {
		t.Helper()
		h := a.header
		csp := h.Get("Content-Security-Policy")
		// The pages need the dashboard's stylesheet and nothing else: no
		// script, plugin, frame, fetch or worker, not even one of this
		// origin, where the API answers with text that tenants wrote.
		for directive, want := range map[string]string{
			"script-src": "'none'", "object-src": "'none'", "connect-src": "'none'", "frame-src": "'none'",
			"worker-src": "'none'", "img-src": "'none'", "style-src": "'self'",
			"base-uri": "'none'", "form-action": "'self'", "frame-ancestors": "'none'",
		} {
			if got := cspSources(csp, directive); got != want {
				t.Errorf("%s: Content-Security-Policy %q allows %s %s, want %s", what, csp, directive, got, want)
			}
		}
		for k, want := range map[string]string{
			"X-Frame-Options":        "DENY",
			"X-Content-Type-Options": "nosniff",
			"Referrer-Policy":        "no-referrer",
		} {
			if got := h.Get(k); got != want {
				t.Errorf("%s: %s %q, want %q", what, k, got, want)
			}
		}
	}
	// Every answer but the stylesheet may show a project's data or a
	// form's secret: no browser or proxy keeps it.
	page := func(what string, a *answer) *answer {
		t.Helper()
		check(what, a)
		if cc := a.header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s: Cache-Control %q, want no-store", what, cc)
		}
		return a
	}
	page("redirect", b.get("/"))
	page("login", b.get("/login"))
	page("unknown path", b.get("/nope"))
	page("login answer", b.login(tokenA))
	jobs := page("jobs", b.get("/"))
	page("job", b.get("/jobs/"+j.ID))
	page("run", b.get("/runs/"+e.run(j, t0).ID))
	page("missing job", b.get("/jobs/job_nope"))

	css := regexp.MustCompile(`<link rel="stylesheet" href="([^"]+)">`).FindStringSubmatch(jobs.body)
	if css == nil {
		t.Fatal("no stylesheet link")
	}
	a := b.get(css[1])
	check("css", a)
	if a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("Content-Type"), "text/css") || !strings.Contains(a.body, ".state") {
		t.Errorf("stylesheet: %d %q", a.status, a.header.Get("Content-Type"))
	}
	if strings.Contains(jobs.body, "<script") || strings.Contains(jobs.body, "style=") {
		t.Error("a page carries script or inline style, which the policy blocks")
	}
}

func TestUnknownPathsAndMethods(t *testing.T) {
	e := newEnv(t)
	b := e.browser()
	a := b.get("/no/such/page")
	if a.status != http.StatusNotFound || !strings.Contains(a.body, "Page not found") || !strings.Contains(a.header.Get("Content-Type"), "text/html") {
		t.Errorf("unknown path: %d %q", a.status, a.body)
	}
	a = b.post("/jobs/job_x", url.Values{})
	if a.status != http.StatusMethodNotAllowed || !strings.Contains(a.header.Get("Allow"), "GET") {
		t.Errorf("POST to a page: %d, Allow %q", a.status, a.header.Get("Allow"))
	}
	req, _ := http.NewRequest("HEAD", e.srv.URL+"/login", nil)
	if a := b.do(req); a.status != http.StatusOK || a.body != "" {
		t.Errorf("HEAD /login: %d with %d bytes", a.status, len(a.body))
	}
}

// TestLogsHoldNoSecrets: the log has events but never a token, a session id,
// a URL, a response snippet or a page address.
func TestLogsHoldNoSecrets(t *testing.T) {
	e := newEnv(t)
	j := e.job(e.projectA)
	r := e.deliver(j, t0.Add(-time.Hour), 500, "snippet-marker", vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAttemptsExhausted})
	b := e.browser()
	e.browser().loginAnswer("/login", tokenB[:len(tokenB)-1]+"C") // refused
	b.login(tokenA)
	b.get("/")
	b.get("/jobs/" + j.ID + "?state=failed")
	b.get("/runs/" + r.ID)
	b.get("/nope-path-marker")
	id := b.sessionID()
	b.post("/logout", url.Values{"csrf": {b.csrf(b.get("/"))}})

	logs := e.logs.String()
	for _, want := range []string{"web.login", "web.login_refused", "web.logout"} {
		if !strings.Contains(logs, `"msg":"`+want+`"`) {
			t.Errorf("no %s event in the log", want)
		}
	}
	for _, secret := range []string{tokenA, tokenA[4:20], tokenB[:30], id, "url-marker", "snippet-marker", "nope-path-marker", "state=failed", j.ID, r.ID} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds %q:\n%s", secret, logs)
		}
	}
}

// TestMountedUnderAPI wires the dashboard as cmd does: the API answers its
// paths and hands every other to the dashboard; a token the API minted logs in.
func TestMountedUnderAPI(t *testing.T) {
	st := mustOpenStore(t)
	ctx := context.Background()
	now := func() time.Time { return t0 }
	admin, created, err := api.Bootstrap(ctx, st, t0, nil)
	if err != nil || !created {
		t.Fatalf("Bootstrap: %v %v", err, created)
	}
	key, err := secretbox.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secretbox.Parse([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	srv := httptest.NewServer(api.New(api.Config{
		Store: st, Sealer: keys, Now: now, Logger: logger,
		Extra: web.New(web.Config{Store: st, Now: now, Logger: logger}),
	}).Handler())
	t.Cleanup(srv.Close)
	e := &env{t: t, srv: srv, logs: logs}
	b := e.browser()

	if a := b.get("/v1/jobs"); a.status != http.StatusUnauthorized || !strings.Contains(a.header.Get("Content-Type"), "json") {
		t.Errorf("GET /v1/jobs: %d %s", a.status, a.header.Get("Content-Type"))
	}
	if a := b.get("/healthz"); a.status != http.StatusOK {
		t.Errorf("GET /healthz: %d", a.status)
	}
	b.login(admin)
	if a := b.get("/"); a.status != http.StatusOK || !strings.Contains(a.body, "No jobs yet") {
		t.Errorf("jobs page under the API: %d", a.status)
	}
	if a := b.get("/elsewhere"); a.status != http.StatusNotFound || !strings.Contains(a.body, "Page not found") {
		t.Errorf("unknown path under the API: %d", a.status)
	}
	if l := logs.String(); strings.Contains(l, admin) || strings.Contains(l, b.sessionID()) || strings.Contains(l, "/elsewhere") {
		t.Errorf("the log holds a token, a session id or a path:\n%s", l)
	}
}

// TestDatabaseDownIsUnavailable: while the database does not answer (or
// takes no writes, as in a failover), the dashboard answers 503, as the
// API does, not 500, which says the dashboard itself is at fault; and, as
// the API's, its 503 says when to try again (Retry-After: 2).
func TestDatabaseDownIsUnavailable(t *testing.T) {
	st := &storetest.Outage{Store: mustOpenStore(t)}
	e := newEnvOn(t, st)
	b := e.browser()
	b.login(tokenA)
	other := e.browser()
	form := other.get("/login")
	for _, c := range []struct {
		call string
		send func() *answer
	}{
		{"GetSession", func() *answer { return b.get("/") }},
		{"ListJobs", func() *answer { return b.get("/") }},
		{"TokenByHash", func() *answer {
			return other.post("/login", url.Values{"csrf": {other.csrf(form)}, "token": {tokenB}})
		}},
	} {
		st.Set(c.call)
		if a := c.send(); a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "Database unavailable") {
			t.Errorf("%s failing: %d\n%s", c.call, a.status, a.body)
		} else if h := a.header.Get("Retry-After"); h != "2" {
			t.Errorf("%s failing: a 503 with Retry-After %q, want 2 as the API gives", c.call, h)
		}
	}
	st.Set()
	if a := b.get("/"); a.status != http.StatusOK {
		t.Errorf("database back: %d", a.status)
	}
}

// cspSources is the source list that policy applies to directive: its own,
// or for a fetch directive without one, default-src's ("" when neither is
// given, which allows everything).
func cspSources(policy, directive string) string {
	lists := map[string]string{}
	for _, d := range strings.Split(policy, ";") {
		name, sources, _ := strings.Cut(strings.TrimSpace(d), " ")
		if _, dup := lists[strings.ToLower(name)]; !dup && name != "" {
			lists[strings.ToLower(name)] = strings.Join(strings.Fields(sources), " ")
		}
	}
	if s, ok := lists[directive]; ok {
		return s
	}
	if strings.HasSuffix(directive, "-src") {
		return lists["default-src"]
	}
	return ""
}
