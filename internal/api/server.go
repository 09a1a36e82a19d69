// Package api is the management API of vibejobs: JSON over HTTP under /v1,
// bearer tokens scoped to a project, Idempotency-Key on every creating or
// changing POST, per-token rate limits, a limit of failed authentications
// per client address, and strict input decoding. It is the only place where
// error kinds become HTTP status codes.
package api

import (
	"bytes"
	"cmp"
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/ratelimit"
)

// Defaults of Config.
const (
	DefaultMaxJobsPerProject = 10000
	DefaultMaxBodyBytes      = 64 << 10
	DefaultRatePerSecond     = 100
	DefaultRateBurst         = 200
)

// Sealer encrypts job secrets at rest and opens what it sealed. It seals the
// stored answers of Idempotency-Key records too, because the answer that
// created a job (or minted a token) carries the secret in clear.
// *secretbox.Keyring implements it.
type Sealer interface {
	Seal(secret, jobID string) (vibejobs.SealedSecret, error)
	Open(s vibejobs.SealedSecret, jobID string) (string, error)
}

// URLValidator checks a job's target URL against the egress policy.
// *egress.Policy implements it. An error that carries a code, a field and a
// message (*egress.URLError) becomes a 400 with that code.
type URLValidator interface {
	ValidateURL(raw string) (*url.URL, error)
}

// RateLimit is a token bucket per API token: PerSecond requests refill the
// bucket, which holds at most Burst. Zero values take the defaults (100/s,
// burst 200); a negative PerSecond turns the limit off.
type RateLimit struct {
	PerSecond float64
	Burst     int
}

// Config holds what a Server needs. Store and Sealer are required.
type Config struct {
	Store  vibejobs.Store
	Sealer Sealer
	// URLs checks target URLs; nil means the default egress policy (no
	// private, loopback or link-local destination).
	URLs   URLValidator
	Now    func() time.Time // time.Now when nil
	Rand   io.Reader        // crypto/rand.Reader when nil; ids, secrets and tokens
	Logger *slog.Logger     // slog.Default() when nil
	// Wake is called after a job was created or changed, a manual run was
	// created, or a subscription was created or given what may unstick it
	// (a URL, filters, a secret), so the scheduler, the dispatcher and the
	// subscription deliverer look at once.
	Wake func()
	// JobChanged is called with a job's id once a change to its URL,
	// secret, timeout or retry policy, a pause or a schedule change, or its
	// deletion, has committed, so the dispatcher withdraws its claims not
	// yet sent (see dispatcher.Dispatcher.JobChanged).
	JobChanged func(jobID string)
	// RunCreated is called once the creation of a manual run has
	// committed (the runs-created metric; the scheduler counts its own).
	RunCreated func()
	// OccurrencesSkipped is called with the occurrences a pause or a
	// schedule change skipped, once it has committed: those due by then
	// that the scheduler, behind, had not planned (the skipped
	// occurrences metric; the scheduler counts those catch-up skips).
	OccurrencesSkipped func(n int64)
	// Ready is checked by /readyz besides Store.Ping.
	Ready func(ctx context.Context) error
	// Stopping, when set and true, makes /readyz answer 503 stopping, the
	// one reason it gives, without asking Store or Ready: the server is
	// stopping and a load balancer should send requests elsewhere. Every
	// other route answers as before until the server closes its listener.
	// Those answers are logged at debug, as passing probes are: a probe
	// comes every few seconds of a stop that can last a job's timeout, and
	// the caller logs the stop itself, once.
	Stopping func() bool
	// Metrics, when set, is served at GET /metrics without a token: it must
	// name no project. InstallationMetrics, when set, is served there
	// instead to a request with the installation administrator's token (a
	// token that is not valid is refused; a project's token gets Metrics).
	Metrics             http.Handler
	InstallationMetrics http.Handler
	// Extra, when set, answers every path outside the API (a dashboard).
	Extra http.Handler
	// MaxJobsPerProject bounds a project's jobs (0: DefaultMaxJobsPerProject);
	// creating one more answers 409 too_many_jobs, a conflict with the
	// project's state that deleting jobs resolves.
	MaxJobsPerProject int
	RateLimit         RateLimit
	// FailedAuthLimit bounds, per client address, the requests whose
	// well-formed token is unknown or revoked: past it, a request with a
	// token answers 429 rate_limited with Retry-After before the token is
	// looked up (see ratelimit.Failures for the tokens let through all the
	// same). Zero values take ratelimit's defaults.
	FailedAuthLimit ratelimit.FailureLimit
	// TrustedProxies name the client behind a reverse proxy for
	// FailedAuthLimit (see ratelimit.Proxies.Client); none by default.
	TrustedProxies ratelimit.Proxies
	MaxBodyBytes   int64 // 0: DefaultMaxBodyBytes
	// RotationGrace is how long a subscription's replaced secret keeps
	// signing requests after rotate-secret (0: vibejobs.DefaultRotationGrace).
	RotationGrace time.Duration
}

// Server is the management API. Its Handler is safe for concurrent use.
type Server struct {
	store      vibejobs.Store
	sealer     Sealer
	urls       URLValidator
	now        func() time.Time
	rand       io.Reader
	log        *slog.Logger
	wake       func()
	changed    func(jobID string)
	runCreated func()
	skipped    func(n int64)
	ready      func(ctx context.Context) error
	stopping   func() bool
	metrics    http.Handler
	// installationMetrics: see Config.InstallationMetrics.
	installationMetrics http.Handler
	extra               http.Handler
	maxJobs             int
	maxBody             int64
	// rotationGrace: see Config.RotationGrace.
	rotationGrace time.Duration
	limiter       *limiter
	authFailures  *ratelimit.Failures // nil when off
	proxies       ratelimit.Proxies
	mux           *http.ServeMux
	routes        []route
	openapi       []byte
	// unreleased holds the claims of failed requests whose release failed
	// too (the database was down); see idempotent.
	unreleased unreleasedKeys
	// noIdempotency runs creating POSTs without Idempotency-Key handling;
	// set only by benchmarks (export_test.go) to measure the layer's cost.
	noIdempotency bool
}

// New returns a Server for cfg. It panics when Store or Sealer is missing.
func New(cfg Config) *Server {
	if cfg.Store == nil || cfg.Sealer == nil {
		panic("api: Config.Store and Config.Sealer are required")
	}
	s := &Server{
		store:               cfg.Store,
		sealer:              cfg.Sealer,
		urls:                cfg.URLs,
		now:                 cfg.Now,
		rand:                &lockedReader{r: cmp.Or[io.Reader](cfg.Rand, cryptoRand)},
		log:                 cmp.Or(cfg.Logger, slog.Default()),
		wake:                cfg.Wake,
		changed:             cfg.JobChanged,
		runCreated:          cfg.RunCreated,
		skipped:             cfg.OccurrencesSkipped,
		ready:               cfg.Ready,
		stopping:            cfg.Stopping,
		metrics:             cfg.Metrics,
		installationMetrics: cfg.InstallationMetrics,
		extra:               cfg.Extra,
		maxJobs:             cmp.Or(cfg.MaxJobsPerProject, DefaultMaxJobsPerProject),
		maxBody:             cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes),
		openapi:             openapiDocument,
		authFailures:        cfg.FailedAuthLimit.NewFailures(),
		proxies:             cfg.TrustedProxies,

		rotationGrace: cmp.Or(cfg.RotationGrace, vibejobs.DefaultRotationGrace),
	}
	if cfg.Now == nil {
		s.now = time.Now
	}
	if cfg.Wake == nil {
		s.wake = func() {}
	}
	if cfg.JobChanged == nil {
		s.changed = func(string) {}
	}
	if cfg.RunCreated == nil {
		s.runCreated = func() {}
	}
	if cfg.OccurrencesSkipped == nil {
		s.skipped = func(int64) {}
	}
	rl := cfg.RateLimit
	if rl.PerSecond >= 0 {
		s.limiter = newLimiter(cmp.Or(rl.PerSecond, DefaultRatePerSecond), cmp.Or(rl.Burst, DefaultRateBurst))
	}
	s.routes = s.routeTable()
	s.mux = http.NewServeMux()
	for _, rt := range s.routes {
		s.mux.Handle(rt.method+" "+rt.path, s.routeHandler(rt))
	}
	return s
}

// Handler returns the HTTP handler of the whole API.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// access is what a route asks of the caller's token.
type access int

const (
	accessPublic       access = iota // no token
	accessRead                       // any role
	accessWrite                      // admin or write
	accessAdmin                      // admin (tokens of its own project)
	accessInstallation               // the installation administrator
)

// route is one entry of the API. A POST route has an effect, run in one
// transaction together with its Idempotency-Key record; other routes have a
// serve function.
type route struct {
	method, path string
	access       access
	serve        func(ctx context.Context, c *call) (*response, error)
	effect       func(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error)
	raw          http.Handler // served as is (metrics)
	// maxBody bounds the request body, if larger than the server's
	// MaxBodyBytes.
	maxBody int64
	// rawInstallation is served instead of raw to the installation
	// administrator's token.
	rawInstallation http.Handler
	// query names the query parameters the route reads. A /v1/ route that
	// needs a token refuses any other (invalid_query), as a body refuses
	// an unknown field: a misspelt filter would otherwise list everything,
	// and a made-up option would be ignored.
	query []string
	// ignoreQuery serves the route as if its request had no query, however
	// malformed: a probe (a load balancer, an orchestrator) may add one of
	// its own, and must not read a 400 as the platform being down; a
	// static document reads none, and a cache buster must not break it.
	ignoreQuery bool
}

func (s *Server) routeTable() []route {
	rs := []route{
		{method: "GET", path: "/healthz", access: accessPublic, serve: s.healthz, ignoreQuery: true},
		{method: "GET", path: "/readyz", access: accessPublic, serve: s.readyz, ignoreQuery: true},
		{method: "GET", path: "/v1/openapi.json", access: accessPublic, serve: s.openapiJSON, ignoreQuery: true},

		{method: "POST", path: "/v1/jobs", access: accessWrite, effect: s.createJob},
		{method: "POST", path: "/v1/jobs/batch", access: accessWrite, effect: s.createJobs, maxBody: MaxBatchBodyBytes},
		{method: "GET", path: "/v1/jobs", access: accessRead, serve: s.listJobs, query: []string{"limit", "cursor"}},
		{method: "GET", path: "/v1/jobs/{id}", access: accessRead, serve: s.getJob},
		{method: "PATCH", path: "/v1/jobs/{id}", access: accessWrite, serve: s.patchJob},
		{method: "DELETE", path: "/v1/jobs/{id}", access: accessWrite, serve: s.deleteJob},
		{method: "POST", path: "/v1/jobs/{id}/pause", access: accessWrite, effect: s.pauseJob},
		{method: "POST", path: "/v1/jobs/{id}/resume", access: accessWrite, effect: s.resumeJob},
		{method: "POST", path: "/v1/jobs/{id}/rotate-secret", access: accessWrite, effect: s.rotateSecret},
		{method: "POST", path: "/v1/jobs/{id}/runs", access: accessWrite, effect: s.triggerRun},
		{method: "GET", path: "/v1/jobs/{id}/runs", access: accessRead, serve: s.listJobRuns,
			query: []string{"state", "limit", "cursor"}},
		{method: "GET", path: "/v1/jobs/{id}/next", access: accessRead, serve: s.nextFireTimes, query: []string{"count"}},
		{method: "GET", path: "/v1/runs", access: accessRead, serve: s.listRuns,
			query: []string{"jobId", "state", "limit", "cursor"}},
		{method: "GET", path: "/v1/runs/{id}", access: accessRead, serve: s.getRun},

		{method: "GET", path: "/v1/events", access: accessRead, serve: s.listEvents,
			query: []string{"after", "limit", "type", "jobId"}},
		{method: "POST", path: "/v1/subscriptions", access: accessWrite, effect: s.createSubscription},
		{method: "GET", path: "/v1/subscriptions", access: accessRead, serve: s.listSubscriptions},
		{method: "GET", path: "/v1/subscriptions/{id}", access: accessRead, serve: s.getSubscription},
		{method: "PATCH", path: "/v1/subscriptions/{id}", access: accessWrite, serve: s.patchSubscription},
		{method: "DELETE", path: "/v1/subscriptions/{id}", access: accessWrite, serve: s.deleteSubscription},
		{method: "POST", path: "/v1/subscriptions/{id}/rotate-secret", access: accessWrite, effect: s.rotateSubscriptionSecret},
		{method: "POST", path: "/v1/subscriptions/{id}/reset", access: accessWrite, effect: s.resetSubscription},

		{method: "POST", path: "/v1/projects", access: accessInstallation, effect: s.createProject},
		{method: "GET", path: "/v1/projects", access: accessInstallation, serve: s.listProjects,
			query: []string{"limit", "cursor"}},
		{method: "GET", path: "/v1/projects/{id}", access: accessAdmin, serve: s.getProject},
		{method: "POST", path: "/v1/projects/{id}/tokens", access: accessAdmin, effect: s.createToken},
		{method: "GET", path: "/v1/projects/{id}/tokens", access: accessAdmin, serve: s.listTokens,
			query: []string{"limit", "cursor"}},
		{method: "DELETE", path: "/v1/tokens/{id}", access: accessAdmin, serve: s.revokeToken},
		{method: "GET", path: "/v1/token", access: accessRead, serve: s.getCallerToken},
	}
	if s.metrics != nil {
		rs = append(rs, route{method: "GET", path: "/metrics", access: accessPublic, raw: s.metrics,
			rawInstallation: s.installationMetrics})
	}
	return rs
}

// call is one authenticated request on its way through a route.
type call struct {
	r     *http.Request
	token *vibejobs.Token // nil on public routes
	now   time.Time       // the request's time, in milliseconds, UTC
	body  []byte
	info  *logInfo
	wake  bool // call Wake once the effect committed
	// runCreated: a manual run was created; RunCreated is called once the
	// effect committed.
	runCreated bool
	// skipped counts the occurrences the effect skipped:
	// OccurrencesSkipped is called with them once it committed.
	skipped int64
	// changedJob names a job whose delivery settings changed or that was
	// deleted: JobChanged is called with it once the effect committed.
	changedJob string
}

func (c *call) projectID() string { return c.token.ProjectID }

// dropEffects forgets what an effect noted for after its commit (wake,
// runCreated, skipped, changedJob): at the start of each attempt of a
// transaction the store may run again, and when nothing of it committed.
func (c *call) dropEffects() {
	c.wake, c.runCreated, c.skipped, c.changedJob = false, false, 0, ""
}

// logInfo collects what the request log line says about a request.
type logInfo struct {
	route, project, tokenID, job, run string
	err                               error // an internal error, logged, never shown
	// stopping: /readyz answered stopping, logged at debug (see
	// Config.Stopping).
	stopping bool
}

type logInfoKey struct{}

// loggedID is id as the request log may name it: id itself when it has
// the shape of an id of ours with prefix, else "". A path segment or a
// filter holds whatever the client put there, and the log must take
// neither a job secret or token pasted in the wrong place nor a megabyte
// of text.
func loggedID(id, prefix string) string {
	if contract.ValidID(id, prefix) {
		return id
	}
	return ""
}

// loggedMethod is method as the request log may name it: one of HTTP's
// methods, else "other". A method is whatever token the client sent, up to
// the header limit: a secret given to curl -X, or a megabyte of text.
func loggedMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method
	}
	return "other"
}

// serveHTTP is the outermost handler: it logs every request, turns a panic
// into a logged 500 and answers unknown routes and methods with JSON errors.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	info := &logInfo{}
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("api: panic serving request", "method", loggedMethod(r.Method), "route", info.route,
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if !sw.wroteHeader {
				internalResponse().write(sw)
			}
		}
		s.logRequest(r, info, sw.status, time.Since(start))
	}()
	r = r.WithContext(context.WithValue(r.Context(), logInfoKey{}, info))

	if p, c := r.URL.EscapedPath(), cleanPath(r.URL.EscapedPath()); c != p && (isAPIPath(p) || isAPIPath(c)) {
		// The mux would redirect to the clean path with a 307 in HTML, which
		// a client follows with its method, body and Idempotency-Key to a
		// route it did not name. An API path is taken only as written.
		info.route = "not_found"
		errorResponse(&vibejobs.Error{Kind: vibejobs.ENOTFOUND, Code: "not_found",
			Message: "no such route: the path has an empty, . or .. segment"}).write(sw)
		return
	}
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		s.mux.ServeHTTP(sw, r)
		return
	}
	// The mux would answer 404 or 405 in plain text: answer in JSON instead,
	// or hand paths outside the API to Extra.
	cw := &captureWriter{header: http.Header{}}
	h.ServeHTTP(cw, r)
	switch cw.status {
	case http.StatusMethodNotAllowed:
		info.route = "method_not_allowed"
		// A fixed message: the method is whatever token the client sent
		// (see loggedMethod), not for the answer to repeat. Allow says
		// what would do.
		resp := errorResponse(&vibejobs.Error{Kind: kindMethodNotAllowed, Code: "method_not_allowed",
			Message: "this method is not allowed here; the Allow header lists those that are"})
		if allow := cw.header.Get("Allow"); allow != "" {
			resp.with("Allow", allow)
		}
		resp.write(sw)
	default:
		if s.extra != nil && !isAPIPath(r.URL.Path) {
			info.route = "extra"
			s.extra.ServeHTTP(sw, r)
			return
		}
		info.route = "not_found"
		errorResponse(&vibejobs.Error{Kind: vibejobs.ENOTFOUND, Code: "not_found", Message: "no such route"}).write(sw)
	}
}

// cleanPath is p as http.ServeMux cleans it before matching: rooted,
// without empty, . or .. segments, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

func isAPIPath(p string) bool {
	return p == "/v1" || strings.HasPrefix(p, "/v1/") || p == "/healthz" || p == "/readyz" || p == "/metrics"
}

func (s *Server) logRequest(r *http.Request, info *logInfo, status int, d time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	attrs := []slog.Attr{
		slog.String("method", loggedMethod(r.Method)),
		slog.String("route", info.route),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000),
	}
	for _, a := range [...]struct{ k, v string }{{"project", info.project}, {"token_id", info.tokenID}, {"job", info.job}, {"run", info.run}} {
		if a.v != "" {
			attrs = append(attrs, slog.String(a.k, a.v))
		}
	}
	level := slog.LevelInfo
	if (info.route == "GET /healthz" || info.route == "GET /readyz" || info.route == "GET /metrics") && status < 300 || info.stopping {
		level = slog.LevelDebug // probes every few seconds
	}
	if info.err != nil {
		level = slog.LevelError
		attrs = append(attrs, slog.String("error", info.err.Error()))
	}
	s.log.LogAttrs(r.Context(), level, "api request", attrs...)
}

// routeHandler wraps one route: token, rate limit, role, body, then the
// route's own work.
func (s *Server) routeHandler(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := r.Context().Value(logInfoKey{}).(*logInfo)
		if info == nil {
			info = &logInfo{}
		}
		info.route = rt.method + " " + rt.path
		if rt.raw != nil {
			s.serveRaw(w, r, rt, info)
			return
		}
		s.serveRoute(r, rt, info).write(w)
	})
}

// serveRaw serves a route's raw handler, or its rawInstallation to a
// request with the installation administrator's token. A request with a
// token that is not valid is refused, as on every route.
func (s *Server) serveRaw(w http.ResponseWriter, r *http.Request, rt route, info *logInfo) {
	h := rt.raw
	if rt.rawInstallation != nil && len(r.Header.Values("Authorization")) > 0 {
		tok, err := s.authenticate(r.Context(), r)
		if err != nil {
			c := &call{r: r, now: s.now().UTC(), info: info}
			s.refuseAuth(c, err).write(w)
			return
		}
		info.project, info.tokenID = tok.ProjectID, tok.ID
		if authorize(tok, accessInstallation) == nil {
			h = rt.rawInstallation
		}
	}
	h.ServeHTTP(w, r)
}

// checkText refuses a request whose path id or query holds text no stored
// value can equal: invalid UTF-8, or a NUL byte (PostgreSQL's text type
// refuses both, which would surface as an internal error). A path id answers
// 404 like any other id that names nothing; a query value, 400. A query
// that does not parse (a bad percent-escape, a ';' separator) answers 400
// too: URL.Query drops such a pair, so a cursor or filter would otherwise be
// ignored and the answer would be another list than the one asked for. The
// query of a route that ignores it (route.ignoreQuery) is not checked.
func checkText(r *http.Request, rt route) *vibejobs.Error {
	if id := r.PathValue("id"); badText(id) {
		resource, _, _ := strings.Cut(strings.TrimPrefix(rt.path, "/v1/"), "/")
		return vibejobs.ErrNotFound(strings.TrimSuffix(resource, "s"))
	}
	if rt.ignoreQuery {
		return nil
	}
	if field, ok := malformedQuery(r.URL.RawQuery); ok {
		return invalid("invalid_query", field, "the query must be well-formed: & between parameters, %XX escapes only")
	}
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		// Well-formed pairs, but more than url.ParseQuery takes (Go's
		// urlmaxqueryparams): URL.Query would come back empty, every
		// filter dropped.
		return invalid("invalid_query", "", "the query has too many parameters")
	}
	for name, values := range query {
		field := name
		if badText(name) {
			field = ""
		}
		for _, v := range values {
			if field == "" || badText(v) {
				return invalid("invalid_query", field, "query parameters must be UTF-8 text without NUL bytes")
			}
		}
		if rt.access != accessPublic && strings.HasPrefix(rt.path, "/v1/") && !slices.Contains(rt.query, name) {
			if len(rt.query) == 0 {
				return invalid("invalid_query", field, fmt.Sprintf("unknown query parameter %q: this operation takes none", name))
			}
			return invalid("invalid_query", field, fmt.Sprintf("unknown query parameter %q: this operation takes %s",
				name, strings.Join(rt.query, ", ")))
		}
	}
	return nil
}

func badText(s string) bool { return !vibejobs.StorableText(s) }

// malformedQuery reports whether url.ParseQuery would drop a pair of
// rawQuery, and names that pair's parameter when its name reads as text
// ("" otherwise).
func malformedQuery(rawQuery string) (field string, bad bool) {
	for _, pair := range strings.Split(rawQuery, "&") {
		if pair == "" {
			continue
		}
		rawName, rawValue, _ := strings.Cut(pair, "=")
		name, nerr := url.QueryUnescape(rawName)
		_, verr := url.QueryUnescape(rawValue)
		if nerr == nil && verr == nil && !strings.Contains(pair, ";") {
			continue
		}
		if nerr != nil || strings.Contains(name, ";") || badText(name) {
			return "", true
		}
		return name, true
	}
	return "", false
}

func (s *Server) serveRoute(r *http.Request, rt route, info *logInfo) *response {
	ctx := r.Context()
	c := &call{r: r, now: s.now().UTC().Truncate(time.Millisecond), info: info}
	if rt.access != accessPublic {
		tok, err := s.authenticate(ctx, r)
		if err != nil {
			return s.refuseAuth(c, err)
		}
		c.token = tok
		info.project, info.tokenID = tok.ProjectID, tok.ID
		if s.limiter != nil {
			if wait, ok := s.limiter.allow(tok.ID, c.now); !ok {
				return errorResponse(&vibejobs.Error{Kind: vibejobs.ERATELIMIT, Code: "rate_limited",
					Message: "too many requests for this token; retry later"}).
					with("Retry-After", strconv.Itoa(int(wait/time.Second)))
			}
		}
		if e := authorize(tok, rt.access); e != nil {
			return errorResponse(e)
		}
	}
	if e := checkText(r, rt); e != nil {
		return errorResponse(e)
	}
	if r.Method == http.MethodPost || r.Method == http.MethodPatch || r.Method == http.MethodPut {
		body, e := s.readBody(r, max(s.maxBody, rt.maxBody))
		if e != nil {
			return errorResponse(e)
		}
		c.body = body
	}
	if rt.effect != nil && !s.noIdempotency {
		return s.idempotent(ctx, c, rt.effect)
	}
	if rt.effect != nil {
		// Only benchmarks get here, to measure what the idempotency layer costs.
		var resp *response
		err := s.update(ctx, func(tx vibejobs.Tx) error {
			c.dropEffects()
			var err error
			resp, err = rt.effect(ctx, c, tx)
			return err
		})
		if err != nil {
			return s.fail(c, err)
		}
		s.committed(c)
		return resp
	}
	resp, err := rt.serve(ctx, c)
	if err != nil {
		return s.fail(c, err)
	}
	s.committed(c)
	return resp
}

// committed tells the rest of the process what c's committed effect
// changed.
func (s *Server) committed(c *call) {
	if c.wake {
		s.wake()
	}
	if c.runCreated {
		s.runCreated()
	}
	if c.skipped > 0 {
		s.skipped(c.skipped)
	}
	if c.changedJob != "" {
		s.changed(c.changedJob)
	}
}

// fail renders err: a user error as itself, a database that does not
// answer or takes no writes (a failover) as a logged 503, anything else as
// a logged 500. The 503 names no cause: the stores wrap theirs (a driver
// message, a file path) under the unavailable error.
func (s *Server) fail(c *call, err error) *response {
	if e := userError(err); e != nil {
		return errorResponse(e)
	}
	c.info.err = err
	if vibejobs.ErrorKind(err) == vibejobs.EUNAVAILABLE {
		return unavailableResponse()
	}
	return internalResponse()
}

// readBody reads r's body, of at most limit bytes.
func (s *Server) readBody(r *http.Request, limit int64) ([]byte, *vibejobs.Error) {
	tooLarge := &vibejobs.Error{Kind: vibejobs.ETOOLARGE, Code: "body_too_large",
		Message: "the request body is larger than " + strconv.FormatInt(limit, 10) + " bytes"}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	if r.Body == nil {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, invalid("invalid_json", "", "the request body could not be read")
	}
	if int64(len(b)) > limit {
		return nil, tooLarge
	}
	return b, nil
}

func (s *Server) healthz(ctx context.Context, c *call) (*response, error) {
	return jsonResponse(http.StatusOK, map[string]string{"status": "ok"}), nil
}

func (s *Server) readyz(ctx context.Context, c *call) (*response, error) {
	if s.stopping != nil && s.stopping() {
		// Said plainly, unlike not_ready: it tells nothing of the
		// database, and an operator watching a rollout wants to tell a
		// replica on its way out from a sick one.
		c.info.stopping = true
		return errorResponse(&vibejobs.Error{Kind: vibejobs.EUNAVAILABLE, Code: "stopping", Message: "the server is stopping"}), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := s.store.Ping(ctx)
	if err == nil && s.ready != nil {
		err = s.ready(ctx)
	}
	if err != nil {
		c.info.err = err
		// A passing state, as database_unavailable is: the same
		// Retry-After. A server stopping gives none; it is not coming back.
		return errorResponse(&vibejobs.Error{Kind: vibejobs.EUNAVAILABLE, Code: "not_ready", Message: "the platform is not ready"}).
			with("Retry-After", "2"), nil
	}
	return jsonResponse(http.StatusOK, map[string]string{"status": "ready"}), nil
}

func (s *Server) openapiJSON(ctx context.Context, c *call) (*response, error) {
	return &response{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"}, body: s.openapi}, nil
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// captureWriter records what the mux's own 404/405 handler would write.
type captureWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *captureWriter) Header() http.Header { return w.header }
func (w *captureWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *captureWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}

// lockedReader serialises reads of a random source that may not be safe for
// concurrent use (a seeded one in tests).
type lockedReader struct {
	mu sync.Mutex
	r  io.Reader
}

func (l *lockedReader) Read(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Read(p)
}

var errRollback = errors.New("api: roll back")

var cryptoRand io.Reader = cryptorand.Reader

// update runs fn in one store transaction. A panic in fn becomes an internal
// error (with its stack), so the transaction is rolled back at once rather
// than when the request's context ends: a panicking request must not hold the
// write connection while its Idempotency-Key is released.
func (s *Server) update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	return s.store.Update(ctx, func(tx vibejobs.Tx) (err error) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				err = fmt.Errorf("api: panic in a transaction: %v\n%s", p, debug.Stack())
			}
		}()
		return fn(tx)
	})
}
