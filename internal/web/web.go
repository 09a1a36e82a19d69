// Package web is the operator dashboard: server-rendered, read-only pages of
// one project's jobs, runs and attempts. An operator logs in with an API
// token of the project; changes go through the API or the CLI.
//
// The dashboard keeps its sessions in the Store, so every replica knows
// them, and never puts the token in a cookie: the browser holds a random
// session id only. Every request checks the token again, so revoking it
// ends its sessions at once. Failed logins, and session ids that name no
// live session, are limited per client address (LoginLimit), and the pages of each token's sessions as its API requests
// are (PageLimit). Pages carry no script, every response forbids
// framing, sniffing and referrers, and nothing it logs holds a token, a
// session id, a URL or a response snippet.
package web

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/display"
	"github.com/vibejobs/vibejobs/internal/ratelimit"
)

// Defaults of Config.
const (
	DefaultMaxSessions     = 100
	DefaultSessionLifetime = 12 * time.Hour
)

// Cookies of the dashboard. SessionCookie holds the session id; LoginCookie
// the double-submit secret of the login form (it is no credential). Both are
// HttpOnly and SameSite=Strict. Over HTTPS (see secureRequest) they are
// Secure, have Path=/ and no Domain, and their names carry the __Host-
// prefix, which makes the browser keep exactly that: no sibling host and no
// attacker on plain HTTP can plant one (a session of their own, or a login
// secret they know).
const (
	SessionCookie = "vj_session"
	LoginCookie   = "vj_login"
)

// The security headers of every response. The policy allows the dashboard's
// own stylesheet and nothing else: no script, plugin, frame, image or fetch,
// not even one of this origin (where the API answers with text tenants
// wrote), no inline style, no framing of the dashboard, and forms post only
// to the dashboard. default-src 'none' rather than 'self': a markup
// injection that html/template missed could otherwise still load this
// origin's answers as script or plugin.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// pageSize is the number of jobs or runs on one page.
const pageSize = 50

// maxFormBytes bounds the body of a login or logout form.
const maxFormBytes = 8 << 10

// unavailableRetryAfter is the Retry-After, in seconds, of a 503 answered
// while the database is unavailable; the API's 503 gives the same.
const unavailableRetryAfter = "2"

// Config holds what the dashboard needs. Store is required.
type Config struct {
	Store  vibejobs.Store
	Now    func() time.Time // time.Now when nil
	Logger *slog.Logger     // slog.Default() when nil
	// MaxSessions bounds each token's sessions (0: DefaultMaxSessions); a
	// login beyond it ends the one that expires first.
	MaxSessions int
	// SessionLifetime is how long a login lasts, however active
	// (0: DefaultSessionLifetime).
	SessionLifetime time.Duration
	// LoginLimit bounds failed logins per client address, together with
	// the requests whose session id names no live session.
	LoginLimit LoginLimit
	// TrustedProxies name the client behind a reverse proxy for
	// LoginLimit (see ratelimit.Proxies.Client), and are the only peers
	// whose X-Forwarded-Proto: https is believed (see secureRequest): a
	// dashboard behind a TLS-terminating proxy must list it to set Secure,
	// __Host- cookies. None by default.
	TrustedProxies ratelimit.Proxies
	// PageLimit bounds the pages of each token's sessions.
	PageLimit PageLimit
}

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed assets/style.css
var styleCSS []byte

// cssPath names the stylesheet by its content, so browsers may keep it for
// good and a new build is fetched at once.
var cssPath = func() string {
	sum := sha256.Sum256(styleCSS)
	return "/assets/style-" + hex.EncodeToString(sum[:6]) + ".css"
}()

// dashboard is the handler New returns. It is safe for concurrent use.
type dashboard struct {
	store    vibejobs.Store
	now      func() time.Time
	log      *slog.Logger
	sessions *sessions
	failures *ratelimit.Failures // failed logins and unknown session ids per client; nil when off
	proxies  ratelimit.Proxies
	pageRate *ratelimit.Limiter // pages per token; nil when off
	pages    map[string]*template.Template
	mux      *http.ServeMux
}

// New returns the dashboard's handler, meant to answer every path the API
// does not (api.Config.Extra). It panics when Store is missing.
func New(cfg Config) http.Handler {
	if cfg.Store == nil {
		panic("web: Config.Store is required")
	}
	d := &dashboard{
		store: cfg.Store,
		now:   cfg.Now,
		log:   cmp.Or(cfg.Logger, slog.Default()),
		sessions: &sessions{store: cfg.Store, max: cmp.Or(max(cfg.MaxSessions, 0), DefaultMaxSessions),
			lifetime: cmp.Or(max(cfg.SessionLifetime, 0), DefaultSessionLifetime)},
		failures: cfg.LoginLimit.NewFailures(),
		proxies:  cfg.TrustedProxies,
		pageRate: newPageLimiter(cfg.PageLimit),
		pages:    parsePages(),
	}
	if d.now == nil {
		d.now = time.Now
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login", d.loginForm)
	mux.HandleFunc("POST /login", d.login)
	mux.HandleFunc("POST /logout", d.logout)
	mux.HandleFunc("GET /{$}", d.withSession(d.jobsPage))
	mux.HandleFunc("GET /jobs/{id}", d.withSession(d.jobPage))
	mux.HandleFunc("GET /runs/{id}", d.withSession(d.runPage))
	mux.HandleFunc("GET "+cssPath, serveCSS)
	d.mux = mux
	return d
}

func parsePages() map[string]*template.Template {
	names, err := fs.Glob(templateFiles, "templates/*.html")
	if err != nil {
		panic(err)
	}
	pages := map[string]*template.Template{}
	for _, name := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(name, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		pages[base] = template.Must(template.New(base).ParseFS(templateFiles, "templates/layout.html", name))
	}
	return pages
}

func (d *dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if d.secureRequest(r) {
		// Browsers heed it only over HTTPS. Not includeSubDomains: other
		// hosts of the domain are not ours to decide.
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			d.log.Error("web.panic", "route", r.Pattern, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	}()

	handler, pattern := d.mux.Handler(r)
	if pattern != "" {
		d.mux.ServeHTTP(w, r)
		return
	}
	// The mux answers an unknown path or method in plain text: find out
	// which, and answer with a page.
	cw := &captureWriter{header: http.Header{}}
	handler.ServeHTTP(cw, r)
	if cw.status == http.StatusMethodNotAllowed {
		if allow := cw.header.Get("Allow"); allow != "" {
			h.Set("Allow", allow)
		}
		d.renderError(w, r, nil, http.StatusMethodNotAllowed, "Method not allowed",
			"The dashboard only shows pages; changes go through the API or the CLI.")
		return
	}
	d.renderError(w, r, nil, http.StatusNotFound, "Page not found", "There is no page at this address.")
}

// captureWriter records what the mux's fallback handler answers.
type captureWriter struct {
	header http.Header
	status int
}

func (c *captureWriter) Header() http.Header         { return c.header }
func (c *captureWriter) Write(p []byte) (int, error) { return len(p), nil }
func (c *captureWriter) WriteHeader(status int)      { c.status = status }

func serveCSS(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	_, _ = w.Write(styleCSS)
}

// viewer is the logged-in operator of a request.
type viewer struct {
	token   *vibejobs.Token
	project *vibejobs.Project
	csrf    string
	now     time.Time
}

func (v *viewer) projectID() string { return v.token.ProjectID }

// errNoSession means the request carries no live session.
var errNoSession = errors.New("no live session")

// clientLimitedError refuses a client past its LoginLimit.
type clientLimitedError struct{ retryAfter time.Duration }

func (e *clientLimitedError) Error() string { return "too many failed logins or unknown sessions" }

// trySession counts the look-up of session id against the client's
// LoginLimit before it is made: each well-formed id costs a look-up in the
// store. A malformed id costs nothing and is not counted (the zero
// Attempt). Past the limit it returns a *clientLimitedError.
func (d *dashboard) trySession(r *http.Request, id string, now time.Time) (ratelimit.Attempt, error) {
	key, ok := keyOf(id)
	if !ok {
		return ratelimit.Attempt{}, nil
	}
	a, wait, ok := d.failures.Try(d.proxies.Client(r), key, now)
	if !ok {
		return a, &clientLimitedError{retryAfter: wait}
	}
	return a, nil
}

// tooManyFailures answers a client past its LoginLimit on a page that needs
// a session.
func (d *dashboard) tooManyFailures(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	d.log.Info("web.session_refused", "reason", "rate_limited")
	w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)))
	d.renderError(w, r, nil, http.StatusTooManyRequests, "Too many requests",
		"Too many failed logins or expired sessions from your address. Try again in "+retryText(wait)+".")
}

// authenticate finds the request's session and checks its token again: a
// token revoked (or gone) since the login ends the session at once. A
// client past its LoginLimit gets a *clientLimitedError, its session id
// not looked up (see ratelimit.Failures for the ids let through all the
// same).
func (d *dashboard) authenticate(ctx context.Context, r *http.Request) (*viewer, error) {
	c, err := r.Cookie(d.cookieName(r, SessionCookie))
	if err != nil {
		return nil, errNoSession
	}
	now := d.now()
	attempt, err := d.trySession(r, c.Value, now)
	if err != nil {
		return nil, err
	}
	v, err := d.sessionViewer(ctx, c.Value, now)
	switch {
	case err == nil:
		attempt.Succeeded()
	case errors.Is(err, errNoSession):
		attempt.Failed()
	default:
		attempt.Undecided()
	}
	return v, err
}

// sessionViewer is authenticate's look-up of session id at now.
func (d *dashboard) sessionViewer(ctx context.Context, id string, now time.Time) (*viewer, error) {
	sess, ok, err := d.sessions.get(ctx, id, now)
	if err != nil {
		return nil, fmt.Errorf("reading the session: %w", err)
	}
	if !ok {
		return nil, errNoSession
	}
	tok, err := d.store.GetToken(ctx, sess.tokenID)
	switch {
	case vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND:
		if err := d.sessions.delete(ctx, id); err != nil {
			return nil, fmt.Errorf("ending a session: %w", err)
		}
		d.log.Info("web.session_ended", "reason", "token_gone", "token_id", sess.tokenID)
		return nil, errNoSession
	case err != nil:
		return nil, fmt.Errorf("checking the session's token: %w", err)
	case tok.RevokedAt != nil || tok.ProjectID != sess.projectID:
		if err := d.sessions.delete(ctx, id); err != nil {
			return nil, fmt.Errorf("ending a session: %w", err)
		}
		d.log.Info("web.session_ended", "reason", "token_revoked", "token_id", sess.tokenID, "project", sess.projectID)
		return nil, errNoSession
	}
	p, err := d.store.GetProject(ctx, tok.ProjectID)
	if err != nil {
		return nil, fmt.Errorf("getting the session's project: %w", err)
	}
	return &viewer{token: tok, project: p, csrf: sess.csrf, now: now}, nil
}

// withSession serves page to a logged-in operator and sends anyone else to
// the login page, coming back here afterwards.
func (d *dashboard) withSession(page func(w http.ResponseWriter, r *http.Request, v *viewer)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := d.authenticate(r.Context(), r)
		var limited *clientLimitedError
		if errors.As(err, &limited) {
			d.tooManyFailures(w, r, limited.retryAfter)
			return
		}
		if errors.Is(err, errNoSession) {
			if _, cerr := r.Cookie(d.cookieName(r, SessionCookie)); cerr == nil {
				d.clearCookie(w, r, SessionCookie, "/")
			}
			target := "/login"
			if next := r.URL.RequestURI(); next != "/" && safeNext(next) {
				target += "?next=" + url.QueryEscape(next)
			}
			http.Redirect(w, r, target, http.StatusSeeOther)
			return
		}
		if err != nil {
			d.internalError(w, r, nil, err)
			return
		}
		if wait, ok := d.pageRate.Take(v.token.ID, v.now); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)))
			d.renderError(w, r, v, http.StatusTooManyRequests, "Too many requests",
				"This token's sessions asked for pages faster than the dashboard allows. Try again in "+retryText(wait)+".")
			return
		}
		page(w, r, v)
	}
}

// safeNext reports whether next is a path of this site to return to after
// the login: never another host ("//evil", "/\evil"), a scheme or a control
// character.
func safeNext(next string) bool {
	if next == "" || len(next) > 2048 || next[0] != '/' || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\") {
		return false
	}
	for _, c := range next {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	u, err := url.Parse(next)
	return err == nil && u.Scheme == "" && u.Host == "" && u.User == nil
}

// secureRequest reports whether the browser reached us over TLS: directly,
// or through a trusted proxy (Config.TrustedProxies) whose
// X-Forwarded-Proto says https. Only the last entry of that header is read,
// the one the proxy that connected to us wrote; from any other peer the
// header is ignored. (A forged header would only make the forger's own
// browser keep its cookies for HTTPS, but the dashboard should not let any
// client decide how its cookies are set.)
func (d *dashboard) secureRequest(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	return d.proxies.Forwarded(r) && strings.EqualFold(lastForwarded(r, "X-Forwarded-Proto"), "https")
}

// lastForwarded is the last entry of r's header name (the values of all its
// lines, comma-separated), trimmed: the entry the proxy that connected to us
// wrote. It is "" when the header is missing. Read it only from a trusted
// proxy.
func lastForwarded(r *http.Request, name string) string {
	values := r.Header.Values(name)
	if len(values) == 0 {
		return ""
	}
	last := values[len(values)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.TrimSpace(last)
}

// browserHost is the host (and port, if any) the browser addressed: the
// request's Host, or, from a trusted proxy that sends it, the last entry of
// X-Forwarded-Host, since a proxy may pass its own upstream address as Host
// (nginx does by default).
func (d *dashboard) browserHost(r *http.Request) string {
	if d.proxies.Forwarded(r) {
		if host := lastForwarded(r, "X-Forwarded-Host"); host != "" {
			return host
		}
	}
	return r.Host
}

// hostPrefix marks a cookie the browser accepts only when it is Secure, has
// Path=/ and no Domain.
const hostPrefix = "__Host-"

// cookieName is the name of the cookie base on r's scheme.
func (d *dashboard) cookieName(r *http.Request, base string) string {
	if d.secureRequest(r) {
		return hostPrefix + base
	}
	return base
}

// setCookie sets the cookie base for path (over HTTPS, for every path, as
// the __Host- prefix asks); maxAge 0 makes it last the browser's session,
// a negative maxAge clears it.
func (d *dashboard) setCookie(w http.ResponseWriter, r *http.Request, base, value, path string, maxAge time.Duration) {
	secure := d.secureRequest(r)
	if secure {
		path = "/"
	}
	c := &http.Cookie{
		Name: d.cookieName(r, base), Value: value, Path: path, MaxAge: int(maxAge / time.Second),
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode,
	}
	if maxAge < 0 {
		c.Value, c.MaxAge = "", -1
	}
	http.SetCookie(w, c)
}

func (d *dashboard) clearCookie(w http.ResponseWriter, r *http.Request, base, path string) {
	d.setCookie(w, r, base, "", path, -1)
}

// sameOrigin rejects a form posted from another site, as far as the browser
// tells: Sec-Fetch-Site, else Origin. Neither is always sent (our
// Referrer-Policy makes a browser send "Origin: null" even for our own
// forms), so the form's secret decides in the end. An Origin matches only
// with the same scheme (https when secureRequest says so, else http), host
// and port, a missing port being the scheme's default: http://host is not
// the origin of a dashboard served at https://host, nor is host:8443 that
// of host:443. The host is the one the browser addressed (browserHost).
func (d *dashboard) sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin" || site == "none"
	}
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "null" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	scheme := "http"
	if d.secureRequest(r) {
		scheme = "https"
	}
	ours := &url.URL{Host: d.browserHost(r)}
	return strings.EqualFold(u.Scheme, scheme) && u.Hostname() != "" &&
		strings.EqualFold(u.Hostname(), ours.Hostname()) && portOr(u, scheme) == portOr(ours, scheme)
}

// portOr is u's port, or the default port of scheme when u names none.
func portOr(u *url.URL, scheme string) string {
	if p := u.Port(); p != "" {
		return p
	}
	if scheme == "https" {
		return "443"
	}
	return "80"
}

func equalSecret(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// loginData is the body of the login page.
type loginData struct {
	CSRF  string
	Next  string
	Error string
}

// loginSecret returns the double-submit secret of the login form: the one
// the browser holds if it is well formed, else a new one set in a cookie.
func (d *dashboard) loginSecret(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(d.cookieName(r, LoginCookie)); err == nil {
		if _, ok := keyOf(c.Value); ok {
			return c.Value
		}
	}
	v := randomToken()
	d.setCookie(w, r, LoginCookie, v, "/login", DefaultSessionLifetime)
	return v
}

func (d *dashboard) loginForm(w http.ResponseWriter, r *http.Request) {
	next := r.URL.Query().Get("next")
	if !safeNext(next) {
		next = ""
	}
	switch v, err := d.authenticate(r.Context(), r); {
	case err == nil && v != nil:
		http.Redirect(w, r, cmp.Or(next, "/"), http.StatusSeeOther)
		return
	case errors.Is(err, errNoSession):
		// A dead id, dropped as on every page: kept, each visit of this
		// page would look it up again and spend the address's LoginLimit.
		if _, cerr := r.Cookie(d.cookieName(r, SessionCookie)); cerr == nil {
			d.clearCookie(w, r, SessionCookie, "/")
		}
	}
	d.renderLogin(w, r, http.StatusOK, loginData{CSRF: d.loginSecret(w, r), Next: next})
}

func (d *dashboard) renderLogin(w http.ResponseWriter, r *http.Request, status int, data loginData) {
	d.render(w, r, status, "login", page{Title: "Log in", Body: data})
}

// login checks a token and starts a session for it. Every refusal of the
// token itself reads the same, so the page tells nothing about tokens, and
// a client past its LoginLimit is answered 429 before its token is looked at.
func (d *dashboard) login(w http.ResponseWriter, r *http.Request) {
	if !d.parseForm(w, r) {
		return
	}
	next := r.PostForm.Get("next")
	if !safeNext(next) {
		next = ""
	}
	c, err := r.Cookie(d.cookieName(r, LoginCookie))
	if !d.sameOrigin(r) || err != nil || !equalSecret(r.PostForm.Get("csrf"), c.Value) {
		d.log.Info("web.login_refused", "reason", "csrf")
		// A fresh form: the secret may simply have expired.
		v := randomToken()
		d.setCookie(w, r, LoginCookie, v, "/login", DefaultSessionLifetime)
		d.renderLogin(w, r, http.StatusForbidden, loginData{CSRF: v, Next: next,
			Error: "This form expired or came from another site. Please try again."})
		return
	}
	// Checked before the token is looked at: a client past its limit learns
	// nothing of any token it does not hold, not even a right one (only a
	// token found valid lately gets through, see ratelimit.Failures).
	// Tokens are stored as the SHA-256 of their value, as the API stores them.
	value := strings.TrimSpace(r.PostForm.Get("token"))
	sum := sha256.Sum256([]byte(value))
	attempt, wait, ok := d.failures.Try(d.proxies.Client(r), sum[:], d.now())
	if !ok {
		d.log.Info("web.login_refused", "reason", "rate_limited")
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)))
		d.renderLogin(w, r, http.StatusTooManyRequests, loginData{CSRF: c.Value, Next: next,
			Error: "Too many failed logins from your address. Try again in " + retryText(wait) + "."})
		return
	}
	refuse := func(reason string) {
		attempt.Failed()
		d.log.Info("web.login_refused", "reason", reason)
		d.renderLogin(w, r, http.StatusUnauthorized, loginData{CSRF: c.Value, Next: next,
			Error: "This token is not valid, or it was revoked."})
	}
	if !strings.HasPrefix(value, "vjt_") || len(value) > 256 {
		refuse("malformed")
		return
	}
	tok, err := d.store.TokenByHash(r.Context(), sum[:])
	switch {
	case vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND:
		refuse("unknown")
		return
	case err != nil:
		attempt.Undecided()
		d.internalError(w, r, nil, fmt.Errorf("looking up a token: %w", err))
		return
	case tok.RevokedAt != nil:
		refuse("revoked")
		return
	}
	attempt.Succeeded()
	// A new id at every login: an id planted before the login is worthless.
	if old, err := r.Cookie(d.cookieName(r, SessionCookie)); err == nil {
		if err := d.sessions.delete(r.Context(), old.Value); err != nil {
			d.internalError(w, r, nil, fmt.Errorf("ending the previous session: %w", err))
			return
		}
	}
	id, err := d.sessions.create(r.Context(), tok.ID, tok.ProjectID, d.now())
	if err != nil {
		d.internalError(w, r, nil, fmt.Errorf("starting a session: %w", err))
		return
	}
	d.setCookie(w, r, SessionCookie, id, "/", 0)
	d.clearCookie(w, r, LoginCookie, "/login")
	d.log.Info("web.login", "token_id", tok.ID, "project", tok.ProjectID)
	http.Redirect(w, r, cmp.Or(next, "/"), http.StatusSeeOther)
}

// parseForm reads the body of a login or logout form, of maxFormBytes at
// most, into r.PostForm. When it cannot, it answers the request and returns
// false: 413 for a body over the limit, 400 for one that is no form.
func (d *dashboard) parseForm(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	err := r.ParseForm()
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		d.renderError(w, r, nil, http.StatusRequestEntityTooLarge, "Form too large",
			fmt.Sprintf("The form is larger than the %d KiB the dashboard accepts: check what was pasted into it.", maxFormBytes>>10))
		return false
	case err != nil:
		d.renderError(w, r, nil, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return false
	}
	return true
}

// retryText says how long d is, for a person.
func retryText(d time.Duration) string {
	if d < time.Minute {
		return strconv.Itoa(int(d/time.Second)) + " s"
	}
	return strconv.Itoa(int((d+time.Minute-1)/time.Minute)) + " min"
}

// logout ends the session, when the form carries the session's secret.
func (d *dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if !d.parseForm(w, r) {
		return
	}
	c, err := r.Cookie(d.cookieName(r, SessionCookie))
	if err != nil {
		http.Redirect(w, r, "/login", http.StatusSeeOther)
		return
	}
	now := d.now()
	attempt, err := d.trySession(r, c.Value, now)
	var limited *clientLimitedError
	if errors.As(err, &limited) {
		d.tooManyFailures(w, r, limited.retryAfter)
		return
	}
	sess, ok, err := d.sessions.get(r.Context(), c.Value, now)
	if err != nil {
		attempt.Undecided()
		d.internalError(w, r, nil, fmt.Errorf("reading the session: %w", err))
		return
	}
	if !ok {
		attempt.Failed()
		d.clearCookie(w, r, SessionCookie, "/")
		http.Redirect(w, r, "/login", http.StatusSeeOther)
		return
	}
	attempt.Succeeded()
	if !d.sameOrigin(r) || !equalSecret(r.PostForm.Get("csrf"), sess.csrf) {
		d.log.Info("web.logout_refused", "reason", "csrf", "token_id", sess.tokenID)
		d.renderError(w, r, nil, http.StatusForbidden, "Form expired",
			"This form expired or came from another site. Go back, reload the page and try again.")
		return
	}
	if err := d.sessions.delete(r.Context(), c.Value); err != nil {
		d.internalError(w, r, nil, fmt.Errorf("ending the session: %w", err))
		return
	}
	d.clearCookie(w, r, SessionCookie, "/")
	d.log.Info("web.logout", "token_id", sess.tokenID, "project", sess.projectID)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// page is what the layout renders.
type page struct {
	Title   string
	Viewer  *viewerData // nil when nobody is logged in (or not known)
	Refresh bool        // reload every 10 s
	Body    any
}

// viewerData is what the layout shows of the operator.
type viewerData struct {
	Project   string
	TokenName string
	Role      string
	CSRF      string
}

func viewerOf(v *viewer) *viewerData {
	if v == nil {
		return nil
	}
	return &viewerData{Project: display.EscapeKeepingLayout(cmp.Or(v.project.Name, v.project.ID)), TokenName: display.EscapeKeepingLayout(v.token.Name),
		Role: string(v.token.Role), CSRF: v.csrf}
}

// render executes a page into a buffer first, so a failing template gives a
// clean 500 rather than half a page.
func (d *dashboard) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	var buf bytes.Buffer
	if err := d.pages[name].ExecuteTemplate(&buf, "layout", layoutData{page: p, CSS: cssPath}); err != nil {
		d.log.Error("web.render_failed", "page", name, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

type layoutData struct {
	page
	CSS string
}

// errorData is the body of the error page.
type errorData struct {
	Status  int
	Heading string
	Message string
}

func (d *dashboard) renderError(w http.ResponseWriter, r *http.Request, v *viewer, status int, heading, msg string) {
	d.render(w, r, status, "error", page{Title: heading, Viewer: viewerOf(v),
		Body: errorData{Status: status, Heading: heading, Message: msg}})
}

func (d *dashboard) internalError(w http.ResponseWriter, r *http.Request, v *viewer, err error) {
	// The route pattern, not the URL: a URL may hold ids and cursors.
	d.log.Error("web.internal_error", "route", r.Pattern, "error", err)
	if vibejobs.ErrorKind(err) == vibejobs.EUNAVAILABLE {
		// The database does not answer, or takes no writes (a failover):
		// 503, as the API answers, not a fault of the dashboard's, with
		// the API's Retry-After: a failover or a restart takes seconds.
		w.Header().Set("Retry-After", unavailableRetryAfter)
		d.renderError(w, r, v, http.StatusServiceUnavailable, "Database unavailable",
			"The dashboard cannot reach its database for now. Try again in a moment.")
		return
	}
	d.renderError(w, r, v, http.StatusInternalServerError, "Something went wrong",
		"The dashboard could not answer. Try again in a moment.")
}

// fail answers a store error of a page: not found and invalid input are the
// operator's to see, anything else is logged and shown as an internal error.
func (d *dashboard) fail(w http.ResponseWriter, r *http.Request, v *viewer, what string, err error) {
	switch vibejobs.ErrorKind(err) {
	case vibejobs.ENOTFOUND:
		d.notFound(w, r, v, what)
	case vibejobs.EINVALID:
		d.renderError(w, r, v, http.StatusBadRequest, "Bad request",
			"This link is not valid (any more). Start again from the first page.")
	default:
		d.internalError(w, r, v, err)
	}
}

// notFound reads the same for an id that does not exist and for one of
// another project.
func (d *dashboard) notFound(w http.ResponseWriter, r *http.Request, v *viewer, what string) {
	d.renderError(w, r, v, http.StatusNotFound, "Not found",
		"There is no "+what+" with this id in this project.")
}
