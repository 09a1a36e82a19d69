package egress

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxConnsPerHost = 64
	DefaultUserAgent       = "vibejobs"
)

// Resolver looks up the addresses of a host name. *net.Resolver implements it.
// Client.Post abandons a lookup that outlives the attempt budget, so an
// implementation that ignores ctx delays nothing but its own goroutine.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config of a Client. The zero value is usable: default policy, system roots,
// system resolver.
type Config struct {
	// Policy decides what may be reached; nil means NewPolicy(nil), which opens
	// nothing.
	Policy *Policy
	// CAFile is a PEM bundle added to the system roots (VIBEJOBS_CA_FILE).
	CAFile string
	// Resolver resolves host names; nil means net.DefaultResolver (the system
	// resolver, which honours /etc/hosts).
	Resolver Resolver
	// UserAgent is sent unless the caller's header has one; default DefaultUserAgent.
	UserAgent string
	// MaxConnsPerHost bounds the connections, busy and idle, to one host:port;
	// default DefaultMaxConnsPerHost.
	MaxConnsPerHost int
	// DialContext, when set, replaces the final TCP dial to an address the
	// policy has already allowed; addr is always "ip:port". Tests wrap it. The
	// socket-level check (net.Dialer.ControlContext) is part of the default dial
	// only.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Client sends the platform's outgoing requests. It keeps a pool of keep-alive
// connections per host:port, every one of them opened to an address the policy
// allowed. It is safe for concurrent use.
type Client struct {
	policy    *Policy
	resolver  Resolver
	userAgent string
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	tlsConfig *tls.Config
	transport *http.Transport

	// urls holds ValidateURL's answers (*url.URL) by raw URL, urlCount
	// about how many (see validURL).
	urls     sync.Map
	urlCount atomic.Int64
}

// maxCachedURLs bounds Client.urls.
const maxCachedURLs = 4096

// NewClient returns a client for cfg. It fails only when CAFile cannot be read
// or holds no certificate.
func NewClient(cfg Config) (*Client, error) {
	policy := cfg.Policy
	if policy == nil {
		policy, _ = NewPolicy(nil)
	}
	roots, err := loadRoots(cfg.CAFile)
	if err != nil {
		return nil, err
	}
	c := &Client{
		policy:    policy,
		resolver:  cfg.Resolver,
		userAgent: cmp.Or(cfg.UserAgent, DefaultUserAgent),
		dial:      cfg.DialContext,
		tlsConfig: &tls.Config{
			RootCAs:    roots,
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
		},
	}
	if c.resolver == nil {
		c.resolver = net.DefaultResolver
	}
	if c.dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second, ControlContext: c.checkSocket}
		c.dial = d.DialContext
	}
	perHost := cfg.MaxConnsPerHost
	if perHost <= 0 {
		perHost = DefaultMaxConnsPerHost
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	c.transport = &http.Transport{
		Proxy:                  nil, // proxy settings in the environment are ignored
		DialContext:            c.dialPlain,
		DialTLSContext:         c.dialTLS,
		Protocols:              protocols,
		MaxConnsPerHost:        perHost,
		MaxIdleConnsPerHost:    perHost,
		IdleConnTimeout:        90 * time.Second,
		DisableCompression:     true, // the snippet is the body as sent, and no decompression bomb
		MaxResponseHeaderBytes: 64 << 10,
	}
	return c, nil
}

// loadRoots returns nil (the system roots) without a CA file, else the system
// roots plus every certificate of the file.
func loadRoots(caFile string) (*x509.CertPool, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("egress: reading CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("egress: CA file holds no PEM certificate")
	}
	return pool, nil
}

// CloseIdleConnections closes the pooled connections not in use, and abandons
// dials no request waits for any more.
func (c *Client) CloseIdleConnections() {
	c.transport.CloseIdleConnections()
}

// attempt travels in the request context to the dial. The transport dials with
// a context detached from the request's cancellation (a dial may serve a later
// request), so the budget reaches the dial as a value.
type attempt struct {
	deadline time.Time
	phase    atomic.Int32
}

type attemptKey struct{}

// attemptContext carries the attempt as a context value in one allocation.
type attemptContext struct {
	context.Context
	att attempt
}

func (c *attemptContext) Value(key any) any {
	if key == (attemptKey{}) {
		return &c.att
	}
	return c.Context.Value(key)
}

// Phases of the dial, named in the message of a timeout.
const (
	phaseWaiting int32 = iota // no dial of its own: a pooled connection or a queue
	phaseResolving
	phaseConnecting
	phaseTLS
)

var phaseText = [...]string{
	phaseWaiting:    "before the response headers arrived",
	phaseResolving:  "resolving the host name",
	phaseConnecting: "connecting",
	phaseTLS:        "in the TLS handshake",
}

// Post sends body to rawURL with the given header in one attempt. The whole
// attempt — resolution, connect, TLS, sending and the response headers — is
// bounded by timeout (DefaultTimeout if ≤ 0), and so is reading the body: at most
// MaxResponseRead bytes are read, the first SnippetSize kept. A connection whose
// body was not read to its end within that is closed rather than drained, so a
// never-ending or 1 GB answer costs the caller nothing.
//
// Post reads header and never changes it; the caller must not change it
// during the call.
//
// rawURL is validated again (ValidateURL); a URL the policy refuses ends with
// CodeBlocked. A name is resolved only when a new connection is needed; every
// pooled connection was opened to an address checked when it was dialed.
// Canceling ctx ends the attempt with CodeInterrupted (Err wraps
// context.Canceled); ctx's own deadline counts as the budget. Post never
// returns an error of its own: everything is in Result.
func (c *Client) Post(ctx context.Context, rawURL string, header http.Header, body []byte, timeout time.Duration) Result {
	switch err := ctx.Err(); {
	case errors.Is(err, context.Canceled):
		return Result{ErrorCode: CodeInterrupted, Err: errInterrupted}
	case err != nil:
		return Result{ErrorCode: CodeTimeout, Err: errors.New("egress: the caller's deadline had passed")}
	}
	u, err := c.validURL(rawURL)
	if err != nil {
		return Result{ErrorCode: CodeBlocked, Err: fmt.Errorf("egress: %w", err)}
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	actx := &attemptContext{Context: ctx}
	actx.att.deadline, _ = ctx.Deadline()
	ctx = actx
	att := &actx.att

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(body))
	if err != nil {
		return Result{ErrorCode: CodeNetwork, Err: errors.New("egress: building the request failed")}
	}
	// The request keeps its GetBody, and with the Idempotency-Key header
	// net/http counts it replayable: on a reused connection that breaks, it
	// sends the request again on its own, also when the receiver had read it
	// (it then got the attempt twice, with one signature time, and one is
	// recorded; receivers dedupe by run id). Without GetBody it would not
	// resend even a request the connection never carried, as when the
	// receiver closes an idle connection just as it is reused: that attempt
	// would fail and wait 30 s for its retry.
	req.URL = u
	req.Host = u.Host
	// net/http never writes to a request's header (it forks the request
	// first), so the caller's is used as it is: cloning it cost an
	// allocation per header, on every attempt.
	req.Header = header
	if _, ok := header["User-Agent"]; !ok {
		req.Header = header.Clone()
		if req.Header == nil {
			req.Header = make(http.Header)
		}
		req.Header.Set("User-Agent", c.userAgent)
	}

	// Straight to the transport: the client layer of net/http follows
	// redirects, which an attempt never does (a 3xx is its answer), and
	// cloned every request's header for them.
	resp, err := c.transport.RoundTrip(req)
	if err != nil {
		code, cause := classifyError(ctx, parent, att, err)
		return Result{ErrorCode: code, Err: cause}
	}
	res := Result{StatusCode: resp.StatusCode}
	if resp.StatusCode >= 200 {
		// A final 1xx (101) hands over the raw connection, which the attempt's
		// deadline no longer guards: it is closed unread.
		res.Snippet = readHead(resp.Body)
	}
	resp.Body.Close()
	res.ErrorCode = statusCode(resp.StatusCode)
	if res.ErrorCode != "" {
		res.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		res.Err = statusError(resp.StatusCode)
	}
	return res
}

// validURL returns ValidateURL's answer for raw, from the answers kept for
// URLs it accepted before: a job posts to one URL at every run, and parsing
// and checking it each time was about 3 % of the process's CPU in a burst.
// The policy never changes, so a kept answer stays right. At most about
// maxCachedURLs are kept; the cache is emptied when it is full. Each call
// returns a URL of its own.
func (c *Client) validURL(raw string) (*url.URL, error) {
	if v, ok := c.urls.Load(raw); ok {
		u := *v.(*url.URL)
		return &u, nil
	}
	u, err := c.policy.ValidateURL(raw)
	if err != nil {
		return nil, err
	}
	if c.urlCount.Add(1) > maxCachedURLs {
		c.urls.Clear()
		c.urlCount.Store(1)
	}
	kept := *u
	c.urls.Store(raw, &kept)
	return u, nil
}

var headBuffers = sync.Pool{New: func() any { return new([MaxResponseRead]byte) }}

// readHead reads at most MaxResponseRead bytes of body and returns a copy of
// the first SnippetSize. A body that ends within the limit leaves the
// connection reusable; the caller's Close then shuts any longer one.
func readHead(body io.Reader) []byte {
	buf := headBuffers.Get().(*[MaxResponseRead]byte)
	defer headBuffers.Put(buf)
	n := 0
	for n < len(buf) {
		m, err := body.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	if n == 0 {
		return nil
	}
	return bytes.Clone(buf[:min(n, SnippetSize)])
}

// dialError is a failure of resolving, checking, connecting or the TLS
// handshake, already classified. Its message never names the destination.
type dialError struct {
	code string
	msg  string
}

func (e *dialError) Error() string { return e.msg }

var (
	errBlockedAddress = &dialError{CodeBlocked, "egress: the host resolves to an address the egress policy forbids"}
	errNoAddress      = &dialError{CodeDNS, "egress: the host name has no address"}
	errInterrupted    = fmt.Errorf("egress: attempt interrupted: %w", context.Canceled)
	// errSocketBlocked is returned by the socket-level check; it should never
	// fire, since only checked addresses are dialed.
	errSocketBlocked = errors.New("egress: socket address forbidden")
)

func (c *Client) dialPlain(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel, att := dialContext(ctx)
	defer cancel()
	return c.connect(ctx, att, network, addr)
}

// dialTLS connects and then does the handshake itself, so that a handshake
// failure is told apart from a connect failure. ServerName is the URL's host:
// SNI for a name, IP SAN verification for a literal.
func (c *Client) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel, att := dialContext(ctx)
	defer cancel()
	raw, err := c.connect(ctx, att, network, addr)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.WithZone("").String()
	}
	cfg := c.tlsConfig.Clone()
	cfg.ServerName = host
	conn := tls.Client(raw, cfg)
	setPhase(att, phaseTLS)
	if err := conn.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, tlsError(ctx, err)
	}
	setPhase(att, phaseWaiting)
	return conn, nil
}

// dialContext bounds a dial by the budget of the attempt that started it.
func dialContext(ctx context.Context) (context.Context, context.CancelFunc, *attempt) {
	att, _ := ctx.Value(attemptKey{}).(*attempt)
	if att == nil {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, cancel, nil
	}
	ctx, cancel := context.WithDeadline(ctx, att.deadline)
	return ctx, cancel, att
}

func setPhase(att *attempt, p int32) {
	if att != nil {
		att.phase.Store(p)
	}
}

// connect resolves host once, refuses if any address is forbidden, and then
// dials the checked addresses in order, never the name.
func (c *Client) connect(ctx context.Context, att *attempt, network, addr string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &dialError{CodeBlocked, "egress: malformed destination"}
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, &dialError{CodeBlocked, "egress: malformed destination port"}
	}
	setPhase(att, phaseResolving)
	addrs, err := c.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if !c.policy.Allowed(a) {
			return nil, errBlockedAddress
		}
	}
	setPhase(att, phaseConnecting)
	var firstErr error
	for i, a := range addrs {
		dctx, cancel := context.WithDeadline(ctx, partialDeadline(ctx, len(addrs)-i))
		conn, err := c.dial(dctx, network, netip.AddrPortFrom(a, uint16(port)).String())
		cancel()
		if err == nil {
			setPhase(att, phaseWaiting)
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, connectError(ctx, firstErr)
}

// partialDeadline gives each of the remaining addresses a fair share of the
// budget (at least 2 s, as net.Dialer does), so one black-holed address does not
// use it all.
func partialDeadline(ctx context.Context, remaining int) time.Time {
	deadline, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(30 * time.Second)
	}
	left := time.Until(deadline)
	share := left / time.Duration(remaining)
	if share < 2*time.Second {
		share = min(2*time.Second, left)
	}
	return time.Now().Add(share)
}

// resolve returns the addresses of host: the literal itself, or the resolver's
// answer with IPv4-mapped forms unmapped (resolvers return IPv4 answers either
// way). The lookup runs under the attempt's deadline and is abandoned when the
// deadline passes, even if the resolver does not honour ctx.
func (c *Client) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	type answer struct {
		addrs []netip.Addr
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		addrs, err := c.resolver.LookupNetIP(ctx, "ip", host)
		done <- answer{addrs, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		return nil, &dialError{CodeTimeout, "egress: timed out resolving the host name"}
	}
	if a.err != nil {
		if ctx.Err() != nil {
			return nil, &dialError{CodeTimeout, "egress: timed out resolving the host name"}
		}
		return nil, dnsError(a.err)
	}
	if len(a.addrs) == 0 {
		return nil, errNoAddress
	}
	out := make([]netip.Addr, len(a.addrs))
	for i, ip := range a.addrs {
		out[i] = ip.Unmap()
	}
	return out, nil
}

// checkSocket is the second line: it runs after the socket is created and
// before it connects, on the address the kernel will connect to.
func (c *Client) checkSocket(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !c.policy.Allowed(ap.Addr().Unmap()) {
		return errSocketBlocked
	}
	return nil
}

func dnsError(err error) *dialError {
	var de *net.DNSError
	if errors.As(err, &de) {
		switch {
		case de.IsNotFound:
			return &dialError{CodeDNS, "egress: no such host"}
		case de.IsTimeout:
			return &dialError{CodeDNS, "egress: the name server did not answer in time"}
		case de.IsTemporary:
			return &dialError{CodeDNS, "egress: temporary failure in name resolution"}
		}
	}
	return &dialError{CodeDNS, "egress: name resolution failed"}
}

func connectError(ctx context.Context, err error) *dialError {
	switch {
	case errors.Is(err, errSocketBlocked):
		return errBlockedAddress
	case ctx.Err() != nil || isTimeout(err):
		return &dialError{CodeTimeout, "egress: timed out connecting"}
	}
	return &dialError{CodeNetwork, "egress: connect failed: " + errnoText(err)}
}

func tlsError(ctx context.Context, err error) *dialError {
	if ctx.Err() != nil || isTimeout(err) {
		return &dialError{CodeTimeout, "egress: timed out in the TLS handshake"}
	}
	var (
		hostErr      x509.HostnameError
		authErr      x509.UnknownAuthorityError
		invalidErr   x509.CertificateInvalidError
		verifyErr    *tls.CertificateVerificationError
		alertErr     tls.AlertError
		recordErr    tls.RecordHeaderError
		insecureErr  x509.InsecureAlgorithmError
		constrainErr x509.ConstraintViolationError
	)
	switch {
	case errors.As(err, &hostErr):
		return &dialError{CodeTLS, "egress: TLS: the certificate is not valid for the host"}
	case errors.As(err, &authErr):
		return &dialError{CodeTLS, "egress: TLS: certificate signed by an unknown authority"}
	case errors.As(err, &invalidErr):
		return &dialError{CodeTLS, "egress: TLS: the certificate is expired or invalid"}
	case errors.As(err, &insecureErr), errors.As(err, &constrainErr), errors.As(err, &verifyErr):
		return &dialError{CodeTLS, "egress: TLS: the certificate was not accepted"}
	case errors.As(err, &alertErr):
		return &dialError{CodeTLS, "egress: TLS: the server refused the handshake (" + alertErr.Error() + ")"}
	case errors.As(err, &recordErr):
		return &dialError{CodeTLS, "egress: TLS: the server does not speak TLS"}
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return &dialError{CodeNetwork, "egress: connection reset during the TLS handshake"}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &dialError{CodeTLS, "egress: TLS: the server closed the connection during the handshake"}
	}
	return &dialError{CodeTLS, "egress: TLS handshake failed"}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// errnoText names a connection failure without the address that net errors
// carry.
func errnoText(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "host unreachable"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network unreachable"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	}
	return "network error"
}

// classifyError turns a failed round trip into a code and a cause that names
// neither the URL nor an address (net and url errors name both).
func classifyError(ctx, parent context.Context, att *attempt, err error) (string, error) {
	var de *dialError
	if errors.As(err, &de) {
		return de.code, errors.New(de.msg)
	}
	if ctx.Err() != nil || isTimeout(err) {
		if errors.Is(parent.Err(), context.Canceled) {
			return CodeInterrupted, errInterrupted
		}
		return CodeTimeout, errors.New("egress: timed out " + phaseText[att.phase.Load()])
	}
	return CodeNetwork, errors.New("egress: request failed: " + errnoText(err))
}

// statusCode classifies an answer. A 1xx that ends the exchange or a status
// above 599 is a broken server, counted with 5xx.
func statusCode(status int) string {
	switch {
	case status >= 200 && status <= 299:
		return ""
	case status >= 300 && status <= 399:
		return CodeRedirect
	case status >= 400 && status <= 499:
		return CodeHTTP4xx
	}
	return CodeHTTP5xx
}

func statusError(status int) error {
	if status >= 300 && status <= 399 {
		return fmt.Errorf("egress: redirect (HTTP %d) not followed", status)
	}
	return fmt.Errorf("egress: HTTP %d", status)
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (RFC 9110 section 10.2.3), relative to now. Past dates and invalid values
// give 0; long ones are capped at MaxRetryAfter.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if allDigits(v) {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > uint64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		return time.Duration(n) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	d := t.Sub(now)
	if d <= 0 {
		return 0
	}
	return min(d, MaxRetryAfter)
}
