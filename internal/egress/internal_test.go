package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The socket-level check refuses a forbidden address before connect(2). The
// address used is loopback, so even a broken check sends nothing off the
// machine.
func TestSocketCheckRefusesBeforeConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := NewClient(Config{}) // default policy: loopback forbidden; the real dialer
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := c.dial(ctx, "tcp", ln.Addr().String())
	if err == nil {
		conn.Close()
		t.Fatal("dial to a forbidden address succeeded")
	}
	if !errors.Is(err, errSocketBlocked) {
		t.Fatalf("error %v, want the socket check's", err)
	}
	if de := connectError(ctx, err); de.code != CodeBlocked {
		t.Errorf("classified %q", de.code)
	}
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
	if conn, err := ln.Accept(); err == nil {
		conn.Close()
		t.Error("the listener saw a connection")
	}

	// With loopback opened, the same dialer connects.
	open, _ := NewPolicy([]string{"127.0.0.0/8"})
	c, _ = NewClient(Config{Policy: open})
	conn, err = c.dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial with loopback opened: %v", err)
	}
	conn.Close()
}

func TestCheckSocketAddresses(t *testing.T) {
	c, _ := NewClient(Config{})
	for _, addr := range []string{"10.0.0.1:80", "169.254.169.254:80", "[::1]:80", "[::ffff:10.0.0.1]:80", "[fe80::1%eth0]:80", "garbage", "example.test:80"} {
		if err := c.checkSocket(context.Background(), "tcp", addr, nil); err == nil {
			t.Errorf("%s: allowed", addr)
		}
	}
	for _, addr := range []string{"8.8.8.8:443", "[2606:4700::1111]:443"} {
		if err := c.checkSocket(context.Background(), "tcp", addr, nil); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"":                               0,
		"0":                              0,
		"30":                             30 * time.Second,
		" 30 ":                           30 * time.Second,
		"+30":                            0,
		"3e1":                            0,
		"Mon, 30 Nov 2026 12:01:00 GMT":  time.Minute,
		"Monday, 30-Nov-26 12:01:00 GMT": time.Minute,
		"Mon Nov 30 12:01:00 2026":       time.Minute,
		"Mon, 30 Nov 2026 11:00:00 GMT":  0,
		"Mon, 30 Nov 2099 11:00:00 GMT":  MaxRetryAfter,
		"604801":                         MaxRetryAfter,
		"18446744073709551616":           MaxRetryAfter,
	}
	for in, want := range cases {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestParseRetryAfterRFC850Year: an rfc850-date has a two-digit year, which
// RFC 9110 section 5.6.7 reads as the year with those digits that is not
// more than 50 years ahead. net/http alone reads 69–99 as 1969–1999 and the
// rest as 2000–2068, whatever the date: a retry asked for in 2070 was taken
// as one asked for in 1970 (no wait at all), and from 2069 on every such
// date would be read a century early.
func TestParseRetryAfterRFC850Year(t *testing.T) {
	cases := []struct {
		now  time.Time
		in   string
		want time.Duration
	}{
		{time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), "Thursday, 01-Jan-70 00:00:00 GMT", MaxRetryAfter},
		{time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), "Monday, 30-Nov-26 12:01:00 GMT", time.Minute},
		{time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), "Friday, 01-Jan-77 00:00:00 GMT", 0},
		// 50 years ahead to the second is still ahead; one second more is past.
		{time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), "Monday, 30-Nov-76 12:00:00 GMT", MaxRetryAfter},
		{time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), "Monday, 30-Nov-76 12:00:01 GMT", 0},
		{time.Date(2080, 6, 1, 0, 0, 0, 0, time.UTC), "Saturday, 01-Jun-80 00:01:00 GMT", time.Minute},
		{time.Date(2099, 12, 31, 23, 59, 0, 0, time.UTC), "Friday, 01-Jan-00 00:00:00 GMT", time.Minute},
	}
	for _, tc := range cases {
		if got := parseRetryAfter(tc.in, tc.now); got != tc.want {
			t.Errorf("at %s, parseRetryAfter(%q) = %v, want %v", tc.now.Format(time.DateOnly), tc.in, got, tc.want)
		}
	}
}

// Proxy settings in the environment are never consulted, and certificates
// are verified (TestRedirectIsNotFollowed covers redirects).
func TestProxySettingsAreIgnored(t *testing.T) {
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	t.Setenv("HTTPS_PROXY", "http://"+proxy.Addr().String())
	t.Setenv("HTTP_PROXY", "http://"+proxy.Addr().String())
	t.Setenv("NO_PROXY", "")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "direct")
	}))
	defer srv.Close()
	open, _ := NewPolicy([]string{"127.0.0.0/8"})
	c, err := NewClient(Config{Policy: open})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	if c.tlsConfig.InsecureSkipVerify {
		t.Error("certificate verification is off")
	}
	res := c.Post(context.Background(), srv.URL, nil, nil, 5*time.Second)
	if res.ErrorCode != "" || string(res.Snippet) != "direct" {
		t.Fatalf("result %+v", res)
	}
	proxy.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
	if conn, err := proxy.Accept(); err == nil {
		conn.Close()
		t.Error("the proxy saw a connection")
	}
}

// target answers as ValidateURL does, from its cache too, and works out the
// request line, Host field, pool and TLS name once.
func TestTargetIsWorkedOutOnce(t *testing.T) {
	p, err := NewPolicy([]string{"127.0.0.0/8", "fe80::/10"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ raw, key, addr, serverName, head string }{
		{"http://0x7f.1:8080/hook?a=b c", "http://127.0.0.1:8080", "127.0.0.1:8080", "",
			"POST /hook?a=b%20c HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"},
		{"https://Example.TEST", "https://example.test:443", "example.test:443", "example.test",
			"POST / HTTP/1.1\r\nHost: example.test\r\n"},
		{"https://[fe80::1%25eth0]:8443/a%2Fb", "https://[fe80::1%eth0]:8443", "[fe80::1%eth0]:8443", "fe80::1",
			"POST /a%2Fb HTTP/1.1\r\nHost: [fe80::1]:8443\r\n"},
	}
	for _, tc := range cases {
		for i := range 2 { // made, then from the cache
			got, err := c.target(tc.raw)
			if err != nil {
				t.Fatalf("%s (call %d): %v", tc.raw, i, err)
			}
			if got.key != tc.key || got.addr != tc.addr || got.serverName != tc.serverName || string(got.head) != tc.head {
				t.Errorf("%s (call %d): %+v, head %q", tc.raw, i, got, got.head)
			}
		}
	}
	for i := range 2 {
		if _, err := c.target("http://10.0.0.1/"); err == nil {
			t.Fatalf("call %d: a URL the policy refuses was accepted", i)
		}
	}
	// Full, the cache is emptied and still answers.
	for i := range maxCachedURLs + 10 {
		if _, err := c.target("http://127.0.0.1/" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.targetCount.Load(); n > maxCachedURLs {
		t.Errorf("%d URLs kept, want at most %d", n, maxCachedURLs)
	}
	if got, err := c.target(cases[0].raw); err != nil || string(got.head) != cases[0].head {
		t.Errorf("after the cache was emptied: %v, %v", got, err)
	}
}

// An idle connection is closed after idleTimeout: found expired when the
// pool is next used, or by the pool's sweep; a pool left with nothing is
// dropped.
func TestIdleConnectionsExpire(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	var dials, open atomic.Int64
	c := loopbackClient(t, func(conn *net.TCPConn) net.Conn {
		dials.Add(1)
		open.Add(1)
		return &closeCounter{Conn: conn, open: &open}
	})
	clock := newFakeClock(c)
	post := func() {
		t.Helper()
		if res := c.Post(context.Background(), srv.URL, nil, nil, 5*time.Second); res.ErrorCode != "" {
			t.Fatalf("post: %+v", res)
		}
	}
	post()
	clock.advance(idleTimeout - time.Second)
	post()
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials before the timeout, want 1", n)
	}
	clock.advance(idleTimeout)
	post()
	if n, o := dials.Load(), open.Load(); n != 2 || o != 1 {
		t.Fatalf("after the timeout: %d dials, %d open; want 2 and 1", n, o)
	}

	key := HostKey(srv.URL)
	v, ok := c.pools.Load(key)
	if !ok {
		t.Fatal("no pool")
	}
	p := v.(*hostPool)
	p.sweepIdle() // early: keeps the connection
	if o := open.Load(); o != 1 {
		t.Fatalf("an early sweep closed a connection: %d open", o)
	}
	clock.advance(idleTimeout)
	p.sweepIdle()
	if o := open.Load(); o != 0 {
		t.Errorf("%d connections open after the sweep", o)
	}
	if _, ok := c.pools.Load(key); ok {
		t.Error("the empty pool was kept")
	}
	p.mu.Lock()
	if p.sweep != nil || !p.dead || p.open != 0 {
		t.Errorf("pool after the sweep: sweep %v, dead %v, open %d", p.sweep != nil, p.dead, p.open)
	}
	p.mu.Unlock()
	// The next attempt makes a new pool.
	post()
	c.CloseIdleConnections()
	if _, ok := c.pools.Load(key); ok || open.Load() != 0 {
		t.Errorf("after CloseIdleConnections: pool kept %v, %d open", ok, open.Load())
	}
}

type closeCounter struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *closeCounter) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// peerClosed tells an idle connection the server closed, or wrote to
// unasked, from a healthy one, and takes nothing from it.
func TestPeerClosed(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peerClosed looks into sockets on Linux only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (client, server net.Conn) {
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server, err = ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close(); server.Close() })
		return client, server
	}
	// until waits for the kernel to pass on what the server did.
	until := func(conn net.Conn, want bool) bool {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
			if peerClosed(conn) == want {
				return true
			}
		}
		return false
	}

	idle, _ := pair()
	if peerClosed(idle) {
		t.Error("a healthy idle connection counted as closed")
	}
	closed, server := pair()
	server.Close()
	if !until(closed, true) {
		t.Error("a connection the server closed counted as open")
	}
	spoken, server := pair()
	server.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n"))
	if !until(spoken, true) {
		t.Error("a connection with unasked bytes counted as usable")
	}
	var b [4]byte
	spoken.SetReadDeadline(time.Now().Add(time.Second))
	if n, _ := spoken.Read(b[:]); string(b[:n]) != "HTTP" {
		t.Errorf("the look took bytes: read %q", b[:n])
	}
	if peerClosed(&net.TCPConn{}) != true {
		t.Error("a socket it cannot look into counted as usable")
	}
}

// A pooled connection found closed before reuse is not written to: the
// request goes out once, on a new connection.
func TestClosedIdleConnectionIsNotWritten(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peerClosed looks into sockets on Linux only")
	}
	var requests atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		io.WriteString(w, "ok")
	}))
	srv.Config.SetKeepAlivesEnabled(true)
	srv.Start()
	defer srv.Close()
	var mu sync.Mutex
	var conns []*writeCounter
	c := loopbackClient(t, func(conn *net.TCPConn) net.Conn {
		wc := &writeCounter{TCPConn: conn}
		mu.Lock()
		conns = append(conns, wc)
		mu.Unlock()
		return wc
	})
	clock := newFakeClock(c)
	if res := c.Post(context.Background(), srv.URL, nil, nil, 5*time.Second); res.ErrorCode != "" {
		t.Fatalf("first: %+v", res)
	}
	srv.CloseClientConnections() // as a keep-alive timeout does
	for deadline := time.Now().Add(5 * time.Second); !peerClosed(conns[0].TCPConn); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("the client never saw the close")
		}
	}
	clock.advance(probeAfter)
	if res := c.Post(context.Background(), srv.URL, nil, nil, 5*time.Second); res.ErrorCode != "" {
		t.Fatalf("second: %+v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 2 || conns[0].writes.Load() != 1 || conns[1].writes.Load() != 1 || requests.Load() != 2 {
		t.Errorf("%d connections, writes %d then %d, %d requests; want 2, 1 and 1, 2",
			len(conns), conns[0].writes.Load(), conns[len(conns)-1].writes.Load(), requests.Load())
	}
}

type writeCounter struct {
	*net.TCPConn
	writes atomic.Int64
}

func (c *writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.TCPConn.Write(p)
}

// loopbackClient is a client with loopback opened whose every connection,
// to a loopback address only, passes through wrap.
func loopbackClient(t *testing.T, wrap func(*net.TCPConn) net.Conn) *Client {
	t.Helper()
	policy, _ := NewPolicy([]string{"127.0.0.0/8"})
	c, err := NewClient(Config{Policy: policy, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !netip.MustParseAddrPort(addr).Addr().IsLoopback() {
			t.Errorf("test dialer: refused to dial non-loopback %s", addr)
			return nil, errors.New("test dialer: non-loopback dial refused")
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(conn.(*net.TCPConn)), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// fakeClock is the clock of a client's idle expiry; it moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock(c *Client) *fakeClock {
	f := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	c.now = func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.now
	}
	return f
}

func (f *fakeClock) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}
