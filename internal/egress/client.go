package egress

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
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
// HTTP/1.1 connections per destination (see pool.go), every one of them opened
// to an address the policy allowed. It is safe for concurrent use.
type Client struct {
	policy     *Policy
	resolver   Resolver
	userAgent  string
	dial       func(ctx context.Context, network, addr string) (net.Conn, error)
	tlsConfig  *tls.Config
	maxPerHost int
	now        func() time.Time // the clock of idle expiry; tests replace it

	// pools holds a *hostPool per HostKey.
	pools sync.Map

	// targets holds what Post needs of each URL it was given (*target), by raw
	// URL, targetCount about how many (see target).
	targets     sync.Map
	targetCount atomic.Int64
}

// maxCachedURLs bounds Client.targets.
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
		maxPerHost: cfg.MaxConnsPerHost,
		now:        time.Now,
	}
	if c.resolver == nil {
		c.resolver = net.DefaultResolver
	}
	if c.dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second, ControlContext: c.checkSocket}
		c.dial = d.DialContext
	}
	if c.maxPerHost <= 0 {
		c.maxPerHost = DefaultMaxConnsPerHost
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

// attempt is the state of one Post that its errors are classified by.
type attempt struct {
	phase int32
}

// Phases of an attempt, named in the message of a timeout.
const (
	phaseWaiting int32 = iota // for a connection of the pool, or for the answer
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
// attempt — waiting for a connection, resolution, connect, TLS, sending and the
// response headers — is bounded by timeout (DefaultTimeout if ≤ 0), and so is
// reading the body: at most MaxResponseRead bytes are read, the first
// SnippetSize kept. A connection whose body was not read to its end within
// that is closed rather than drained, so a never-ending or 1 GB answer costs
// the caller nothing.
//
// Post reads header and never changes it; the caller must not change it
// during the call. Host, Content-Length, Transfer-Encoding and Trailer in
// header, in any case, are ignored (Post writes its own); a User-Agent is
// added unless header has one (in any case). A header name or value that cannot be sent (a control character, a
// line break) ends the attempt with CodeNetwork before anything is sent.
//
// rawURL is validated again (ValidateURL); a URL the policy refuses ends with
// CodeBlocked. A name is resolved only when a new connection is needed; every
// pooled connection was opened to an address checked when it was dialed.
//
// When a pooled connection turns out to have been closed by the server (the
// write fails, or the connection ends before any byte of an answer), the
// request is sent once more on a new connection within the same budget. The
// server may have read the first copy before it closed: it then gets the
// attempt twice, with one signature time, and one answer is recorded; receivers
// dedupe by run id and the request carries Idempotency-Key. Without this, a
// server closing an idle connection just as it is reused would fail an attempt
// that it never saw.
//
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
	t, err := c.target(rawURL)
	if err != nil {
		return Result{ErrorCode: CodeBlocked, Err: fmt.Errorf("egress: %w", err)}
	}
	if !sendableHeader(header) {
		return Result{ErrorCode: CodeNetwork, Err: errors.New("egress: building the request failed: a header field cannot be sent")}
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var att attempt
	// The context bounding dials and the wait for a connection is made only
	// when one is needed: a pooled connection is bounded by its deadline.
	var (
		bounded context.Context
		cancel  context.CancelFunc
	)
	boundedCtx := func() context.Context {
		if bounded == nil {
			bounded, cancel = context.WithDeadline(ctx, deadline)
		}
		return bounded
	}
	defer func() {
		if cancel != nil {
			cancel()
		}
	}()

	p, pc, wait := c.take(t.key)
	if pc != nil && c.now().Sub(pc.idleSince) >= probeAfter && peerClosed(pc.conn) {
		// Closed by the server while idle (its keep-alive timeout): its place
		// serves a new connection.
		pc.conn.Close()
		pc = nil
	}
	if wait != nil {
		select {
		case pc = <-wait:
		case <-boundedCtx().Done():
			p.cancelWait(wait)
			return c.failure(ctx, &att, deadline, bounded.Err())
		}
	}
	for retried := false; ; retried = true {
		if pc == nil {
			if pc, err = c.dialConn(boundedCtx(), &att, t); err != nil {
				p.put(nil, false)
				return c.failure(ctx, &att, deadline, err)
			}
		}
		res, keep, err := c.exchange(ctx, pc, t, header, body, deadline)
		if err == nil {
			p.put(pc, keep)
			return res
		}
		// The place stays reserved for the new connection.
		pc.conn.Close()
		if !retried && pc.reused && pc.cr.got == 0 && closedByPeer(err) && ctx.Err() == nil && time.Now().Before(deadline) {
			pc = nil
			continue
		}
		p.put(nil, false)
		return c.failure(ctx, &att, deadline, err)
	}
}

// exchange writes the request on pc and reads its answer. keep tells whether
// pc may carry another request. An error means no final answer arrived, and pc
// must be closed.
func (c *Client) exchange(ctx context.Context, pc *pconn, t *target, header http.Header, body []byte, deadline time.Time) (res Result, keep bool, err error) {
	if err := pc.conn.SetDeadline(deadline); err != nil {
		return Result{}, false, err
	}
	if ctx.Done() != nil {
		// A canceled caller ends the attempt at once: the deadline moves to the
		// past. If that may have run, the connection is not reused.
		stop := context.AfterFunc(ctx, func() { pc.conn.SetDeadline(time.Unix(1, 0)) })
		defer func() {
			if !stop() {
				keep = false
			}
		}()
	}
	pc.cr.got = 0
	if err := c.writeRequest(pc.bw, t, header, body); err != nil {
		return Result{}, false, err
	}
	var resp *http.Response
	for n1xx := 0; ; n1xx++ {
		pc.cr.limit = maxHeadBytes
		resp, err = http.ReadResponse(pc.br, nil)
		pc.cr.limit = math.MaxInt64
		if err != nil {
			return Result{}, false, err
		}
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == 101 {
			break
		}
		if n1xx == max1xx {
			return Result{}, false, errors.New("egress: too many 1xx answers")
		}
	}
	res = Result{StatusCode: resp.StatusCode, ErrorCode: statusCode(resp.StatusCode)}
	if resp.StatusCode >= 200 {
		// A final 1xx (101) hands over the raw connection: it is closed unread.
		var ended bool
		res.Snippet, ended = readHead(resp.Body)
		keep = ended && !resp.Close && pc.br.Buffered() == 0
	}
	if res.ErrorCode != "" {
		res.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		res.Err = statusError(resp.StatusCode)
	}
	return res, keep, nil
}

// writeRequest writes the request: its line and Host field, kept with the
// target, the caller's fields, a User-Agent unless the caller set one, and
// the body with its length.
func (c *Client) writeRequest(bw *bufio.Writer, t *target, header http.Header, body []byte) error {
	bw.Write(t.head)
	if !hasField(header, "User-Agent") {
		bw.WriteString("User-Agent: ")
		bw.WriteString(c.userAgent)
		bw.WriteString("\r\n")
	}
	for name, values := range header {
		if ownField(name) {
			continue
		}
		for _, v := range values {
			bw.WriteString(name)
			bw.WriteString(": ")
			bw.WriteString(strings.TrimSpace(v))
			bw.WriteString("\r\n")
		}
	}
	var n [20]byte
	bw.WriteString("Content-Length: ")
	bw.Write(strconv.AppendInt(n[:0], int64(len(body)), 10))
	bw.WriteString("\r\n\r\n")
	bw.Write(body)
	return bw.Flush()
}

// ownField reports whether Post writes the header field itself, ignoring the
// caller's, as net/http does. Field names are case-insensitive, and header
// may be a map built by hand, not through Header.Set.
func ownField(name string) bool {
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
		return true
	}
	return false
}

// hasField reports whether header has a field named name (canonical), in
// any case.
func hasField(header http.Header, name string) bool {
	if _, ok := header[name]; ok {
		return true
	}
	for k := range header {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// sendableHeader reports whether every name in header is an HTTP token and no
// value holds a control character other than a tab (RFC 9110 section 5.5),
// so that nothing a caller passes can split the request.
func sendableHeader(header http.Header) bool {
	for name, values := range header {
		if name == "" {
			return false
		}
		for i := 0; i < len(name); i++ {
			if !tokenByte(name[i]) {
				return false
			}
		}
		for _, v := range values {
			for i := 0; i < len(v); i++ {
				if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
					return false
				}
			}
		}
	}
	return true
}

func tokenByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}

// closedByPeer reports whether err is a connection the server had closed: a
// reused connection failing so, before any byte of an answer, never carried
// the request to a handler that answered it.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// target is what Post needs of a URL, worked out once: a job posts to one URL
// at every run, and parsing and checking it each time was about 3 % of the
// process's CPU in a burst. It is never changed once made.
type target struct {
	key        string // HostKey: the pool
	addr       string // host:port to resolve and dial
	serverName string // TLS server name; "" for http
	head       []byte // "POST <request-uri> HTTP/1.1\r\nHost: <host>\r\n"
}

// target returns the target of raw, from those kept for URLs it accepted
// before. The policy never changes, so a kept answer stays right. At most
// about maxCachedURLs are kept; the cache is emptied when it is full.
func (c *Client) target(raw string) (*target, error) {
	if v, ok := c.targets.Load(raw); ok {
		return v.(*target), nil
	}
	u, err := c.policy.ValidateURL(raw)
	if err != nil {
		return nil, err
	}
	t := newTarget(u)
	if c.targetCount.Add(1) > maxCachedURLs {
		c.targets.Clear()
		c.targetCount.Store(1)
	}
	c.targets.Store(raw, t)
	return t, nil
}

func newTarget(u *url.URL) *target {
	t := &target{key: HostKey(u.String())}
	t.addr = t.key[strings.Index(t.key, "://")+3:]
	if u.Scheme == "https" {
		host := u.Hostname()
		if ip, err := netip.ParseAddr(host); err == nil {
			host = ip.WithZone("").String()
		}
		t.serverName = host
	}
	// The Host field carries no IPv6 zone (RFC 9110 section 7.2).
	host := u.Host
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i] + host[strings.Index(host, "]"):]
	}
	uri := u.RequestURI()
	t.head = []byte("POST " + uri + " HTTP/1.1\r\nHost: " + host + "\r\n")
	return t
}

var headBuffers = sync.Pool{New: func() any { return new([MaxResponseRead]byte) }}

// readHead reads at most MaxResponseRead bytes of body and returns a copy of
// the first SnippetSize, and whether the body ended within the limit (which
// leaves the connection reusable).
func readHead(body io.Reader) (snippet []byte, ended bool) {
	buf := headBuffers.Get().(*[MaxResponseRead]byte)
	defer headBuffers.Put(buf)
	n := 0
	for n < len(buf) {
		m, err := body.Read(buf[n:])
		n += m
		if err != nil {
			ended = err == io.EOF
			break
		}
	}
	if n == 0 {
		return nil, ended
	}
	return bytes.Clone(buf[:min(n, SnippetSize)]), ended
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

// dialConn opens a connection to t, with the TLS handshake for https. It does
// the handshake itself, so that a handshake failure is told apart from a
// connect failure. ServerName is the URL's host: SNI for a name, IP SAN
// verification for a literal.
func (c *Client) dialConn(ctx context.Context, att *attempt, t *target) (*pconn, error) {
	conn, err := c.connect(ctx, att, "tcp", t.addr, t.serverName == "")
	if err != nil {
		return nil, err
	}
	if t.serverName != "" {
		cfg := c.tlsConfig.Clone()
		cfg.ServerName = t.serverName
		tc := tls.Client(conn, cfg)
		att.phase = phaseTLS
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, tlsError(ctx, err)
		}
		conn = tc
	}
	att.phase = phaseWaiting
	return newPconn(conn), nil
}

// connect resolves host once, refuses if any address is forbidden, or for
// cleartext (http) not opened by the allow list, and then dials the checked
// addresses in order, never the name. ValidateURL lets http through to the
// name localhost when loopback is opened; a resolver answering it with
// another address must not get a cleartext request there.
func (c *Client) connect(ctx context.Context, att *attempt, network, addr string, cleartext bool) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &dialError{CodeBlocked, "egress: malformed destination"}
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, &dialError{CodeBlocked, "egress: malformed destination port"}
	}
	att.phase = phaseResolving
	addrs, err := c.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if !c.policy.Allowed(a) || cleartext && !c.policy.opened(a) {
			return nil, errBlockedAddress
		}
	}
	att.phase = phaseConnecting
	var firstErr error
	for i, a := range addrs {
		dctx, cancel := context.WithDeadline(ctx, partialDeadline(ctx, len(addrs)-i))
		conn, err := c.dial(dctx, network, netip.AddrPortFrom(a, uint16(port)).String())
		cancel()
		if err == nil {
			att.phase = phaseWaiting
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

// failure turns a failed attempt into a Result whose cause names neither
// the URL nor an address (net and url errors name both).
func (c *Client) failure(caller context.Context, att *attempt, deadline time.Time, err error) Result {
	if errors.Is(caller.Err(), context.Canceled) {
		return Result{ErrorCode: CodeInterrupted, Err: errInterrupted}
	}
	var de *dialError
	if errors.As(err, &de) {
		return Result{ErrorCode: de.code, Err: errors.New(de.msg)}
	}
	if isTimeout(err) || !time.Now().Before(deadline) {
		return Result{ErrorCode: CodeTimeout, Err: errors.New("egress: timed out " + phaseText[att.phase])}
	}
	if errors.Is(err, errHeadTooLarge) {
		return Result{ErrorCode: CodeNetwork, Err: errHeadTooLarge}
	}
	return Result{ErrorCode: CodeNetwork, Err: errors.New("egress: request failed: " + errnoText(err))}
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
// (RFC 9110 section 10.2.3) in any of its three formats, an rfc850-date's
// two-digit year read as section 5.6.7 says, relative to now. Past dates and
// invalid values give 0; long ones are capped at MaxRetryAfter.
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
	if strings.IndexByte(v, '-') >= 0 {
		// Of the three formats only the rfc850-date has a '-'.
		t = rfc850Year(t, now)
	}
	d := t.Sub(now)
	if d <= 0 {
		return 0
	}
	return min(d, MaxRetryAfter)
}

// rfc850Year dates t, parsed from an rfc850-date, as RFC 9110 section 5.6.7
// says: its two-digit year is the latest year with those digits that does
// not put t more than 50 years after now. net/http reads 69–99 as 19xx and
// 00–68 as 20xx whatever now is, so "01-Jan-70" asked for a wait until 2070
// and was read as a date long past.
func rfc850Year(t, now time.Time) time.Time {
	limit := now.AddDate(50, 0, 0)
	y := limit.Year() - (limit.Year()-t.Year()%100)%100
	t = time.Date(y, t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), t.Location())
	if t.After(limit) {
		t = t.AddDate(-100, 0, 0)
	}
	return t
}
