package web_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/web"
)

var hrefAttr = regexp.MustCompile(`(?i)\b(?:href|action|src)\s*=\s*"([^"]*)"`)

// TestTargetURLNeverALink: a job's target URL, whatever its scheme
// (javascript:, data:, one with markup), is shown as text: every link and
// form of every page leads to a path of the dashboard, none to the URL.
// The store holds URLs the API would refuse, as a database edited by hand
// or an older version might.
func TestTargetURLNeverALink(t *testing.T) {
	e := newEnv(t)
	b := e.browser()
	b.login(tokenA)
	for _, target := range []string{
		"javascript:alert(1)",
		"JaVaScRiPt:alert(1)",
		"data:text/html,<script>alert(1)</script>",
		`https://app.example.test/"><a href="javascript:alert(1)">x</a>`,
	} {
		j := e.job(e.projectA, named(target), func(j *vibejobs.Job) { j.URL = target })
		r := e.deliver(j, t0.Add(-time.Hour), 500, `<a href="`+target+`">click</a>`,
			vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAttemptsExhausted})
		e.clock.Advance(time.Hour)
		for _, path := range []string{"/", "/jobs/" + j.ID, "/runs/" + r.ID} {
			a := b.get(path)
			if a.status != http.StatusOK {
				t.Fatalf("GET %s: %d", path, a.status)
			}
			for _, m := range hrefAttr.FindAllStringSubmatch(a.body, -1) {
				if v := htmlUnescape(m[1]); !strings.HasPrefix(v, "/") || strings.HasPrefix(v, "//") {
					t.Errorf("GET %s (URL %q): a link or form leads to %q, not a path of the dashboard", path, target, v)
				}
			}
		}
	}
}

// TestNextStaysOnSite: the page to return to after the login, given in
// the login form or the login page's address, leads to a path of the
// dashboard whatever it is spelt as: never to another host through
// slashes, backslashes, their escapes, control characters or a scheme.
func TestNextStaysOnSite(t *testing.T) {
	e := newEnv(t)
	srv, _ := url.Parse(e.srv.URL)
	onSite := func(what, next, loc string) {
		t.Helper()
		u, err := srv.Parse(loc)
		if err != nil || u.Host != srv.Host || !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") ||
			strings.ContainsAny(loc, "\\\t\r\n") {
			t.Errorf("%s with next=%q: Location %q leaves the dashboard", what, next, loc)
		}
	}
	for _, next := range []string{
		"//evil.example/", "///evil.example/", "/\\evil.example", "\\\\evil.example", "/\\/evil.example",
		"/%2F%2Fevil.example", "/%5Cevil.example", "/%2f/evil.example", "/./\\evil.example",
		"/.//evil.example", "/a/..//evil.example", "/\t/evil.example", "/\r\n/evil.example", "/%0d%0aSet-Cookie:x=y",
		"https://evil.example/", "https:evil.example", "javascript:alert(1)", "data:text/html,x", " //evil.example",
		"/\x00/evil.example", "/\u2215evil.example", "/@evil.example",
	} {
		b := e.browser()
		form := b.get("/login")
		a := b.post("/login", url.Values{"csrf": {b.csrf(form)}, "token": {tokenA}, "next": {next}})
		if a.status != http.StatusSeeOther {
			t.Fatalf("login with next=%q: %d", next, a.status)
		}
		onSite("login", next, a.location())
		// Logged in, the login page sends the browser on at once.
		a = b.get("/login?next=" + url.QueryEscape(next))
		if a.status != http.StatusSeeOther {
			t.Fatalf("GET /login?next=%q logged in: %d", next, a.status)
		}
		onSite("GET /login", next, a.location())
	}
}

// TestSessionLifecycleOnEveryStore: on each store, a login issues a new
// session id and ends any the browser held before (an id planted by
// someone else, even one of a live session, is worth nothing after it);
// a logout ends the session in the store, not only in the browser; and a
// revoked token's session ends at its next page.
func TestSessionLifecycleOnEveryStore(t *testing.T) {
	onEveryStore(t, func(t *testing.T, e *env) {
		srv, _ := url.Parse(e.srv.URL)
		replay := func(id string) int {
			t.Helper()
			b := e.browser()
			b.client.Jar.SetCookies(srv, []*http.Cookie{{Name: web.SessionCookie, Value: id}})
			return b.get("/").status
		}
		planter := e.browser()
		planter.login(tokenB)
		planted := planter.sessionID()

		victim := e.browser()
		form := victim.get("/login")
		victim.client.Jar.SetCookies(srv, []*http.Cookie{{Name: web.SessionCookie, Value: planted}})
		if a := victim.post("/login", url.Values{"csrf": {victim.csrf(form)}, "token": {tokenA}}); a.status != http.StatusSeeOther {
			t.Fatalf("login over a planted id: %d", a.status)
		}
		id := victim.sessionID()
		if id == "" || id == planted {
			t.Fatalf("after the login the browser holds %q, the planted id %q", id, planted)
		}
		if a := victim.get("/"); a.status != http.StatusOK || !strings.Contains(a.body, "Project Alpha") || strings.Contains(a.body, "Project Beta") {
			t.Fatalf("the login's page: %d, not project A's alone", a.status)
		}
		if got := replay(planted); got != http.StatusSeeOther {
			t.Errorf("the planted id after the login: %d, want 303 to the login", got)
		}

		if a := victim.post("/logout", url.Values{"csrf": {victim.csrf(victim.get("/"))}}); a.status != http.StatusSeeOther {
			t.Fatalf("logout: %d", a.status)
		}
		if got := replay(id); got != http.StatusSeeOther {
			t.Errorf("the id after the logout: %d, want 303 to the login", got)
		}

		again := e.browser()
		again.login(tokenA)
		e.revoke(e.tokenAID)
		if got := replay(again.sessionID()); got != http.StatusSeeOther {
			t.Errorf("a session of a revoked token: %d, want 303 to the login", got)
		}
	})
}

// TestGetNeverChangesState: the dashboard changes state only on a form
// posted with its secret; a GET or HEAD of /logout (a link or an image on
// another site) is refused and leaves the session as it was.
func TestGetNeverChangesState(t *testing.T) {
	e := newEnv(t)
	b := e.browser()
	b.login(tokenA)
	for _, method := range []string{"GET", "HEAD"} {
		req, err := http.NewRequest(method, e.srv.URL+"/logout", nil)
		if err != nil {
			t.Fatal(err)
		}
		if a := b.do(req); a.status != http.StatusMethodNotAllowed {
			t.Errorf("%s /logout: %d, want 405", method, a.status)
		}
		if a := b.get("/"); a.status != http.StatusOK {
			t.Fatalf("%s /logout ended the session (%d)", method, a.status)
		}
	}
}
