package egress_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/egress"
)

// okServer answers 200 with a short body and counts requests.
func okServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestPostDeliversAndKeepsSnippet(t *testing.T) {
	var got struct {
		method, ua, ct, idem string
		body                 []byte
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.ua, got.ct, got.idem = r.Method, r.UserAgent(), r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key")
		got.body, _ = io.ReadAll(r.Body)
		io.WriteString(w, strings.Repeat("x", 1500))
	}))
	defer srv.Close()
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...), UserAgent: "vibejobs-test/1"})

	header := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"run_1:1"}}
	res := c.Post(context.Background(), srv.URL+"/hook", header, []byte(`{"a":1}`), 5*time.Second)
	if res.StatusCode != 200 || res.ErrorCode != "" || res.Err != nil {
		t.Fatalf("result %+v", res)
	}
	if len(res.Snippet) != egress.SnippetSize || res.RetryAfter != 0 {
		t.Errorf("snippet %d bytes, retry-after %v", len(res.Snippet), res.RetryAfter)
	}
	if got.method != http.MethodPost || got.ua != "vibejobs-test/1" || got.ct != "application/json" || got.idem != "run_1:1" || string(got.body) != `{"a":1}` {
		t.Errorf("server saw %+v", got)
	}
	if len(header) != 2 {
		t.Errorf("caller's header was changed: %v", header)
	}
	if d := g.Dialed(); len(d) != 1 {
		t.Errorf("dialed %v", d)
	}
}

// A literal host is dialed as the address it spells, whatever the spelling.
func TestPostNormalisesLiteralHosts(t *testing.T) {
	srv, hits := okServer(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	_, port, _ := net.SplitHostPort(addr)
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	for _, host := range []string{"0x7f.1", "2130706433", "0177.0.0.1", "127.1", "127.0.0.1.", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]"} {
		res := c.Post(context.Background(), "http://"+host+":"+port+"/", nil, nil, 5*time.Second)
		if res.ErrorCode != "" {
			t.Errorf("%s: %+v", host, res)
		}
	}
	if hits.Load() != 7 {
		t.Errorf("server saw %d requests", hits.Load())
	}
	for _, d := range g.Dialed() {
		if ap := netip.MustParseAddrPort(d); ap.Addr().Unmap() != netip.MustParseAddr("127.0.0.1") || ap.Port() != srv.Listener.Addr().(*net.TCPAddr).AddrPort().Port() {
			t.Errorf("dialed %s", d)
		}
	}
}

// TestMappedLiteralWithZoneIsDelivered: an IPv4-mapped literal with a zone
// ("[::ffff:127.0.0.1%25eth0]") passed ValidateURL, so the API stored it,
// but the kernel dials it over IPv4, the socket-level check then saw
// "127.0.0.1%eth0:port", which is no address, and every attempt ended
// "blocked". The zone means nothing over IPv4: the normal form drops it.
// The real dialer is used (the test guard skips the socket check); the
// address is loopback.
func TestMappedLiteralWithZoneIsDelivered(t *testing.T) {
	srv, hits := okServer(t)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	policy := mustPolicy(t, "127.0.0.0/8")
	c, err := egress.NewClient(egress.Config{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	raw := "http://[::ffff:127.0.0.1%25eth0]:" + port + "/hook"
	u, err := policy.ValidateURL(raw)
	if err != nil {
		t.Fatalf("ValidateURL: %v", err)
	}
	if want := "[::ffff:127.0.0.1]:" + port; u.Host != want {
		t.Errorf("normal form host %q, want %q", u.Host, want)
	}
	if k, want := egress.HostKey(raw), egress.HostKey("http://[::ffff:127.0.0.1]:"+port+"/"); k != want {
		t.Errorf("HostKey = %q, want %q as without the zone", k, want)
	}
	for _, target := range []string{raw, u.String()} {
		if res := c.Post(context.Background(), target, nil, nil, 5*time.Second); res.ErrorCode != "" {
			t.Errorf("accepted URL, delivery: %+v", res)
		}
	}
	if hits.Load() != 2 {
		t.Errorf("server saw %d requests, want 2", hits.Load())
	}
}

// A final 1xx hands over the raw connection; it must not hold the caller.
func TestSwitchingProtocolsIsNotRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n")
		buf.Flush()
		io.Copy(io.Discard, conn) // until the client closes
	}))
	defer srv.Close()
	c, _ := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	start := time.Now()
	res := c.Post(context.Background(), srv.URL, nil, nil, 5*time.Second)
	if res.StatusCode != 101 || res.ErrorCode != egress.CodeHTTP5xx || len(res.Snippet) != 0 {
		t.Errorf("result %+v", res)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestPostClassifiesStatus(t *testing.T) {
	now := time.Now()
	cases := []struct {
		status     int
		retryAfter string
		code       string
		wantRA     time.Duration
		tolerance  time.Duration
	}{
		{200, "", "", 0, 0},
		{201, "", "", 0, 0},
		{204, "120", "", 0, 0}, // Retry-After on a 2xx means nothing
		{299, "", "", 0, 0},
		{301, "", egress.CodeRedirect, 0, 0},
		{302, "", egress.CodeRedirect, 0, 0},
		{304, "", egress.CodeRedirect, 0, 0},
		{307, "5", egress.CodeRedirect, 5 * time.Second, 0},
		{308, "", egress.CodeRedirect, 0, 0},
		{400, "", egress.CodeHTTP4xx, 0, 0},
		{401, "", egress.CodeHTTP4xx, 0, 0},
		{403, "", egress.CodeHTTP4xx, 0, 0},
		{404, "", egress.CodeHTTP4xx, 0, 0},
		{429, "120", egress.CodeHTTP4xx, 120 * time.Second, 0},
		{429, " 0 ", egress.CodeHTTP4xx, 0, 0},
		{429, "-5", egress.CodeHTTP4xx, 0, 0},
		{429, "1.5", egress.CodeHTTP4xx, 0, 0},
		{429, "soon", egress.CodeHTTP4xx, 0, 0},
		{429, "99999999999999999999999", egress.CodeHTTP4xx, egress.MaxRetryAfter, 0},
		{429, "31536000", egress.CodeHTTP4xx, egress.MaxRetryAfter, 0},
		{499, "", egress.CodeHTTP4xx, 0, 0},
		{500, "", egress.CodeHTTP5xx, 0, 0},
		{502, "", egress.CodeHTTP5xx, 0, 0},
		{503, now.Add(time.Hour).UTC().Format(http.TimeFormat), egress.CodeHTTP5xx, time.Hour, 5 * time.Second},
		{503, now.Add(time.Hour).UTC().Format(time.RFC850), egress.CodeHTTP5xx, time.Hour, 5 * time.Second},
		{503, now.Add(-time.Hour).UTC().Format(http.TimeFormat), egress.CodeHTTP5xx, 0, 0},
		{599, "", egress.CodeHTTP5xx, 0, 0},
		{600, "", egress.CodeHTTP5xx, 0, 0},
		{999, "", egress.CodeHTTP5xx, 0, 0},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		if ra := r.Header.Get("X-Retry-After"); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		if status >= 300 && status < 400 {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(status)
		io.WriteString(w, "answer")
	}))
	defer srv.Close()
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	for _, tc := range cases {
		header := http.Header{}
		if tc.retryAfter != "" {
			header.Set("X-Retry-After", tc.retryAfter)
		}
		res := c.Post(context.Background(), srv.URL+"/?status="+strconv.Itoa(tc.status), header, nil, 5*time.Second)
		if res.StatusCode != tc.status || res.ErrorCode != tc.code {
			t.Errorf("%d: status %d code %q, want code %q (%v)", tc.status, res.StatusCode, res.ErrorCode, tc.code, res.Err)
		}
		if d := res.RetryAfter - tc.wantRA; d < -tc.tolerance || d > tc.tolerance {
			t.Errorf("%d Retry-After %q: %v, want %v", tc.status, tc.retryAfter, res.RetryAfter, tc.wantRA)
		}
		if (res.Err == nil) != (tc.code == "") {
			t.Errorf("%d: err %v", tc.status, res.Err)
		}
		if tc.status != 304 && tc.status != 204 && string(res.Snippet) != "answer" {
			t.Errorf("%d: snippet %q", tc.status, res.Snippet)
		}
		checkNoDestination(t, res, hostPort(t, srv.URL)...)
	}
	if n := g.dials.Load(); n != 1 {
		t.Errorf("%d dials for %d sequential requests, want 1 (keep-alive)", n, len(cases))
	}
}

func TestRedirectIsNotFollowed(t *testing.T) {
	target, targetHits := okServer(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/stolen", http.StatusFound)
	}))
	defer srv.Close()
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	res := c.Post(context.Background(), srv.URL, nil, []byte("{}"), 5*time.Second)
	if res.ErrorCode != egress.CodeRedirect || res.StatusCode != http.StatusFound {
		t.Fatalf("result %+v", res)
	}
	if n := targetHits.Load(); n != 0 {
		t.Errorf("redirect target saw %d requests", n)
	}
	if d := g.Dialed(); len(d) != 1 || d[0] != strings.TrimPrefix(srv.URL, "http://") {
		t.Errorf("dialed %v", d)
	}
	checkNoDestination(t, res, append(hostPort(t, srv.URL), hostPort(t, target.URL)...)...)
}

func TestMixedAnswerIsBlockedAndNeverDialed(t *testing.T) {
	srv, hits := okServer(t)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	answers := map[string][]string{
		"mixed.test":    {"127.0.0.1", "10.0.0.1"},
		"metadata.test": {"127.0.0.1", "169.254.169.254"},
		"mapped.test":   {"::ffff:127.0.0.1", "::ffff:192.168.0.1"},
		"nat64.test":    {"127.0.0.1", "64:ff9b::a9fe:a9fe"},
		"only.test":     {"10.1.2.3"},
		"v6.test":       {"::1", "fd00::1"},
	}
	c, g := mustClient(t, egress.Config{
		Policy:   mustPolicy(t, loopbackOpen...),
		Resolver: staticResolver(t, answers),
	})
	for name := range answers {
		res := c.Post(context.Background(), "https://"+name+":"+port+"/", nil, nil, 5*time.Second)
		if res.ErrorCode != egress.CodeBlocked || res.StatusCode != 0 {
			t.Errorf("%s: %+v", name, res)
		}
		checkNoDestination(t, res, name, port, "127.0.0.1", "10.0.0.1", "169.254", "192.168", "fd00")
	}
	if d := g.Dialed(); len(d) != 0 {
		t.Errorf("dialed %v", d)
	}
	if hits.Load() != 0 {
		t.Error("server saw a request")
	}
}

func TestForbiddenURLIsBlockedBeforeResolving(t *testing.T) {
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t)}) // resolver fails the test if asked
	for _, raw := range []string{
		"http://10.0.0.1/", "https://169.254.169.254/latest/meta-data/", "https://0xa9fea9fe/",
		"https://[::ffff:169.254.169.254]/", "https://localhost:8080/", "http://example.test/",
		"ftp://example.test/", "https://user:pw@example.test/", "not a url",
	} {
		res := c.Post(context.Background(), raw, nil, nil, time.Second)
		if res.ErrorCode != egress.CodeBlocked {
			t.Errorf("%s: %+v", raw, res)
		}
		checkNoDestination(t, res, raw, "169.254", "10.0.0.1", "example.test", "8080")
	}
	if d := g.Dialed(); len(d) != 0 {
		t.Errorf("dialed %v", d)
	}
}

// The name resolves once per connection, and the connection goes to the
// address that was checked, whatever the resolver says afterwards. 127.0.0.2
// stands for an internal address: only 127.0.0.1 is opened (and ::1, which
// the name localhost needs; the resolver never answers it).
func TestAnswerChangeCannotRedirectConnection(t *testing.T) {
	checked, checkedHits := okServer(t)
	checkedAddr := strings.TrimPrefix(checked.URL, "http://")
	_, port, _ := net.SplitHostPort(checkedAddr)
	var otherHits atomic.Int64
	if ln, err := net.Listen("tcp", "127.0.0.2:"+port); err == nil {
		other := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { otherHits.Add(1) }))
		other.Listener = ln
		other.Start()
		defer other.Close()
	} else {
		t.Logf("no listener on the second address (%v): relying on the dial log", err)
	}

	var lookups atomic.Int64
	resolver := resolverFunc(func(_ context.Context, _, host string) ([]netip.Addr, error) {
		if host != "localhost" {
			t.Errorf("lookup of %q", host)
		}
		if lookups.Add(1) == 1 {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return []netip.Addr{netip.MustParseAddr("127.0.0.2")}, nil
	})
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, "127.0.0.1", "::1"), Resolver: resolver})
	url := "http://localhost:" + port + "/"

	for i := range 3 { // the first opens a connection, the others reuse it
		if res := c.Post(context.Background(), url, nil, nil, 5*time.Second); res.ErrorCode != "" {
			t.Fatalf("post %d: %+v", i, res)
		}
	}
	if n := lookups.Load(); n != 1 {
		t.Errorf("%d lookups for one connection, want 1", n)
	}
	if d := g.Dialed(); len(d) != 1 || d[0] != checkedAddr {
		t.Errorf("dialed %v, want only %s", d, checkedAddr)
	}

	// A new connection resolves again and is checked again: the new answer is
	// refused, not dialed.
	c.CloseIdleConnections()
	res := c.Post(context.Background(), url, nil, nil, 5*time.Second)
	if res.ErrorCode != egress.CodeBlocked {
		t.Fatalf("after the answer changed: %+v", res)
	}
	checkNoDestination(t, res, "localhost", "127.0.0.2", port)
	if d := g.Dialed(); len(d) != 1 {
		t.Errorf("dialed %v", d)
	}
	if checkedHits.Load() != 3 || otherHits.Load() != 0 {
		t.Errorf("checked server saw %d, other %d", checkedHits.Load(), otherHits.Load())
	}
}

func TestSlowResolverTimesOutAtBudget(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	resolvers := map[string]resolverFunc{
		"honours ctx": func(ctx context.Context, _, _ string) ([]netip.Addr, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		"ignores ctx": func(context.Context, string, string) ([]netip.Addr, error) {
			<-release
			return nil, errors.New("released")
		},
	}
	for name, r := range resolvers {
		t.Run(name, func(t *testing.T) {
			c, g := mustClient(t, egress.Config{Resolver: r})
			const budget = 300 * time.Millisecond
			start := time.Now()
			res := c.Post(context.Background(), "https://slow-dns.test/", nil, nil, budget)
			elapsed := time.Since(start)
			if res.ErrorCode != egress.CodeTimeout {
				t.Fatalf("result %+v", res)
			}
			if elapsed < budget-10*time.Millisecond || elapsed > budget+2*time.Second {
				t.Errorf("returned after %v, budget %v", elapsed, budget)
			}
			if !strings.Contains(res.Err.Error(), "resolving") {
				t.Errorf("error %q does not say it was resolving", res.Err)
			}
			checkNoDestination(t, res, "slow-dns")
			if len(g.Dialed()) != 0 {
				t.Errorf("dialed %v", g.Dialed())
			}
		})
	}
}

func TestSlowServerTimesOutAtBudget(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first: handlers return, then Close
	c, _ := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	const budget = 300 * time.Millisecond
	start := time.Now()
	res := c.Post(context.Background(), srv.URL, nil, []byte("{}"), budget)
	elapsed := time.Since(start)
	if res.ErrorCode != egress.CodeTimeout || res.StatusCode != 0 {
		t.Fatalf("result %+v", res)
	}
	if elapsed < budget-10*time.Millisecond || elapsed > budget+2*time.Second {
		t.Errorf("returned after %v, budget %v", elapsed, budget)
	}
	checkNoDestination(t, res, hostPort(t, srv.URL)...)
}

func TestCallerCancelIsInterrupted(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	c, _ := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	res := c.Post(ctx, srv.URL, nil, nil, 10*time.Second)
	if res.ErrorCode != egress.CodeInterrupted || !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("result %+v", res)
	}
	if res := c.Post(ctx, srv.URL, nil, nil, 10*time.Second); res.ErrorCode != egress.CodeInterrupted {
		t.Fatalf("already canceled: %+v", res)
	}
}

func TestEndlessResponseIsCut(t *testing.T) {
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	handlers := map[string]http.HandlerFunc{
		"100 MB declared": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(100<<20))
			for written := 0; written < 100<<20; written += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		},
		"never ends": func(w http.ResponseWriter, r *http.Request) {
			for {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		},
		"1 GB declared, then silence": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(1<<30))
			w.Write(chunk[:8192])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		},
	}
	for name, h := range handlers {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(h)
			defer srv.Close()
			c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
			start := time.Now()
			res := c.Post(context.Background(), srv.URL, nil, nil, 10*time.Second)
			elapsed := time.Since(start)
			if res.ErrorCode != "" || res.StatusCode != 200 {
				t.Fatalf("result %+v", res)
			}
			if !bytes.Equal(res.Snippet, chunk[:egress.SnippetSize]) {
				t.Errorf("snippet %d bytes: %.32q…", len(res.Snippet), res.Snippet)
			}
			if elapsed > 3*time.Second {
				t.Errorf("Post took %v", elapsed)
			}
			// Headers, 4 KiB of body and what the transport's 4 KiB read buffer
			// fetched ahead: far from the 100 MB on offer.
			if n := g.bytesRead.Load(); n > 32<<10 {
				t.Errorf("read %d bytes from the connection", n)
			} else {
				t.Logf("read %d bytes from the connection in %v", n, elapsed)
			}
		})
	}
}

func TestConnectionRefusedIsNetwork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	res := c.Post(context.Background(), "http://"+addr+"/", nil, nil, 5*time.Second)
	if res.ErrorCode != egress.CodeNetwork || res.StatusCode != 0 {
		t.Fatalf("result %+v", res)
	}
	if !strings.Contains(res.Err.Error(), "refused") {
		t.Errorf("error %q", res.Err)
	}
	checkNoDestination(t, res, "127.0.0.1", addr, addr[strings.LastIndex(addr, ":"):])
	if d := g.Dialed(); len(d) != 1 || d[0] != addr {
		t.Errorf("dialed %v", d)
	}
}

func TestResetAfterRequestIsNetwork(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}
	}))
	defer srv.Close()
	c, _ := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	res := c.Post(context.Background(), srv.URL, nil, nil, 5*time.Second)
	if res.ErrorCode != egress.CodeNetwork {
		t.Fatalf("result %+v", res)
	}
	checkNoDestination(t, res, hostPort(t, srv.URL)...)
}

func TestDNSFailureIsDNS(t *testing.T) {
	resolver := resolverFunc(func(_ context.Context, _, host string) ([]netip.Addr, error) {
		switch host {
		case "nx.test":
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		case "servfail.test":
			return nil, &net.DNSError{Err: "server misbehaving", Name: host, Server: "10.0.0.53:53", IsTemporary: true}
		case "empty.test":
			return nil, nil
		}
		return nil, errors.New("lookup " + host + ": odd failure")
	})
	c, g := mustClient(t, egress.Config{Resolver: resolver})
	for _, host := range []string{"nx.test", "servfail.test", "empty.test", "odd.test"} {
		res := c.Post(context.Background(), "https://"+host+"/", nil, nil, 5*time.Second)
		if res.ErrorCode != egress.CodeDNS {
			t.Errorf("%s: %+v", host, res)
		}
		checkNoDestination(t, res, host, "10.0.0.53")
	}
	if d := g.Dialed(); len(d) != 0 {
		t.Errorf("dialed %v", d)
	}
}

func TestTLS(t *testing.T) {
	pki := newTestPKI(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "secure "+r.TLS.ServerName)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.server}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
	srv.StartTLS()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "https://"))
	resolver := staticResolver(t, map[string][]string{
		"localhost":  {"127.0.0.1"},
		"wrong.test": {"127.0.0.1"},
	})
	plain, _ := okServer(t)
	plainAddr := strings.TrimPrefix(plain.URL, "http://")

	cases := []struct {
		name, caFile, url, code, snippet, errText string
	}{
		{"CA file, IP literal", pki.caFile, "https://127.0.0.1:" + port + "/", "", "secure ", ""},
		{"CA file, name and SNI", pki.caFile, "https://localhost:" + port + "/", "", "secure localhost", ""},
		{"system roots only", "", "https://127.0.0.1:" + port + "/", egress.CodeTLS, "", "unknown authority"},
		{"system roots only, name", "", "https://localhost:" + port + "/", egress.CodeTLS, "", "unknown authority"},
		{"wrong host name", pki.caFile, "https://wrong.test:" + port + "/", egress.CodeTLS, "", "not valid for the host"},
		{"not a TLS server", pki.caFile, "https://" + plainAddr + "/", egress.CodeTLS, "", "does not speak TLS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...), CAFile: tc.caFile, Resolver: resolver})
			res := c.Post(context.Background(), tc.url, nil, nil, 5*time.Second)
			if res.ErrorCode != tc.code || string(res.Snippet) != tc.snippet {
				t.Fatalf("result %+v (%q)", res, res.Snippet)
			}
			if tc.code != "" && (res.StatusCode != 0 || !strings.Contains(res.Err.Error(), tc.errText)) {
				t.Errorf("status %d, error %q, want it to say %q", res.StatusCode, res.Err, tc.errText)
			}
			checkNoDestination(t, res, tc.url, "localhost", "wrong.test", "127.0.0.1", port)
			if tc.code == "" {
				// The TLS connection is kept and carries the next attempt.
				if again := c.Post(context.Background(), tc.url, nil, nil, 5*time.Second); again.ErrorCode != "" || string(again.Snippet) != tc.snippet {
					t.Errorf("second attempt: %+v", again)
				}
			}
			if len(g.Dialed()) != 1 {
				t.Errorf("dialed %v", g.Dialed())
			}
		})
	}
}

func TestNewClientCAFileErrors(t *testing.T) {
	dir := t.TempDir()
	noCert := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(noCert, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(dir, "missing.pem"), noCert, dir} {
		if _, err := egress.NewClient(egress.Config{CAFile: f}); err == nil {
			t.Errorf("CAFile %s: no error", f)
		}
	}
}

// A burst to one host reuses a bounded pool of keep-alive connections.
func TestBurstReusesConnections(t *testing.T) {
	srv, hits := okServer(t)
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...), MaxConnsPerHost: 16})
	total, workers := 20000, 64
	if testing.Short() || raceEnabled {
		total = 2000
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	next := make(chan struct{}, total)
	for range total {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range next {
				if res := c.Post(context.Background(), srv.URL, nil, []byte(`{}`), 10*time.Second); res.ErrorCode != "" {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d POSTs in %v over %d connections", total, time.Since(start), g.dials.Load())
	if failed.Load() != 0 || hits.Load() != int64(total) {
		t.Errorf("%d failed, server saw %d", failed.Load(), hits.Load())
	}
	if n := g.maxOpen.Load(); n > 16 {
		t.Errorf("%d connections open at once, want at most 16", n)
	}
	// net/http drops a connection now and then when its write loop reports
	// late under load; reuse must still be the rule.
	if n := g.dials.Load(); n > 64 {
		t.Errorf("%d connections for %d requests: keep-alive is not working", n, total)
	}
}
