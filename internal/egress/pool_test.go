package egress_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/egress"
)

// rawServer is a loopback HTTP/1.1 server written by hand, to answer in ways
// net/http's server never does. serve gets each request read from a
// connection (numbered from 1 over the whole server) and writes the raw
// answer; it returns false to close the connection without another read.
type rawServer struct {
	url      string
	requests atomic.Int64
	conns    atomic.Int64
}

func newRawServer(t *testing.T, serve func(w *bufio.Writer, req *http.Request, n int64) bool) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{url: "http://" + ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			wg.Go(func() {
				defer conn.Close()
				br, bw := bufio.NewReader(conn), bufio.NewWriter(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					more := serve(bw, req, s.requests.Add(1))
					if bw.Flush() != nil || !more {
						return
					}
				}
			})
		}
	})
	return s
}

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// A connection the server closed while it sat in the pool is found when it
// is reused, and the request goes out again on a new connection: the
// attempt succeeds, and the server handled it once.
func TestClosedIdleConnectionIsRedialed(t *testing.T) {
	srv := newRawServer(t, func(w *bufio.Writer, _ *http.Request, _ int64) bool {
		w.WriteString(okAnswer)
		return false // keep-alive promised, then closed
	})
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	for i := range 3 {
		if res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second); res.ErrorCode != "" || string(res.Snippet) != "ok" {
			t.Fatalf("post %d: %+v", i, res)
		}
	}
	if n := srv.requests.Load(); n != 3 {
		t.Errorf("server handled %d requests, want 3", n)
	}
	if n := g.dials.Load(); n != 3 {
		t.Errorf("%d dials, want 3 (each pooled connection was found closed)", n)
	}
}

// The request is sent again only once, and only when nothing of an answer
// came back on a connection that had carried a request before.
func TestResendIsOnceAndOnlyBeforeAnAnswer(t *testing.T) {
	t.Run("fresh connection closed", func(t *testing.T) {
		srv := newRawServer(t, func(w *bufio.Writer, _ *http.Request, n int64) bool {
			if n == 1 {
				w.WriteString(okAnswer)
				return true
			}
			return false // read, then closed unanswered
		})
		c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
		if res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second); res.ErrorCode != "" {
			t.Fatalf("first: %+v", res)
		}
		// Request 2 is on the pooled connection, closed unanswered: it goes
		// out again (3) on a new connection, which is closed too: no third
		// try.
		res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second)
		if res.ErrorCode != egress.CodeNetwork || res.StatusCode != 0 {
			t.Fatalf("result %+v", res)
		}
		if n := srv.requests.Load(); n != 3 {
			t.Errorf("server read %d requests, want 3", n)
		}
		if n := g.dials.Load(); n != 2 {
			t.Errorf("%d dials, want 2", n)
		}
	})
	t.Run("new connection closed", func(t *testing.T) {
		// A new connection cannot have been closed while idle: the server
		// closed it on this request, which it may have acted on.
		srv := newRawServer(t, func(*bufio.Writer, *http.Request, int64) bool { return false })
		c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
		if res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second); res.ErrorCode != egress.CodeNetwork {
			t.Fatalf("result %+v", res)
		}
		if n, d := srv.requests.Load(), g.dials.Load(); n != 1 || d != 1 {
			t.Errorf("server read %d requests over %d connections, want 1 and 1", n, d)
		}
	})
	t.Run("part of an answer", func(t *testing.T) {
		srv := newRawServer(t, func(w *bufio.Writer, _ *http.Request, n int64) bool {
			if n == 1 {
				w.WriteString(okAnswer)
				return true
			}
			w.WriteString("HTTP/1.1 200 O")
			return false
		})
		c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
		if res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second); res.ErrorCode != "" {
			t.Fatalf("first: %+v", res)
		}
		res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second)
		if res.ErrorCode != egress.CodeNetwork {
			t.Fatalf("result %+v", res)
		}
		if n := srv.requests.Load(); n != 2 {
			t.Errorf("server read %d requests, want 2 (no resend after an answer began)", n)
		}
		if n := g.dials.Load(); n != 1 {
			t.Errorf("%d dials, want 1", n)
		}
	})
}

// Interim answers are skipped, up to a bound; the head of an answer is
// bounded too.
func TestInterimAnswersAndHeadLimit(t *testing.T) {
	answers := map[string]struct {
		raw     string
		code    string
		snippet string
		errText string
	}{
		"103 and 100 before the answer": {
			"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n" + okAnswer, "", "ok", ""},
		"six interim answers": {
			strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 6) + okAnswer, egress.CodeNetwork, "", "request failed"},
		"head over 64 KiB": {
			"HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\nContent-Length: 2\r\n\r\nok", egress.CodeNetwork, "", "64 KiB"},
		"garbled status line": {
			"HTTP/1.1 two hundred\r\n\r\n", egress.CodeNetwork, "", "request failed"},
	}
	for name, a := range answers {
		t.Run(name, func(t *testing.T) {
			srv := newRawServer(t, func(w *bufio.Writer, _ *http.Request, _ int64) bool {
				w.WriteString(a.raw)
				return true
			})
			c, _ := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
			res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second)
			if res.ErrorCode != a.code || string(res.Snippet) != a.snippet {
				t.Fatalf("result %+v", res)
			}
			if a.errText != "" && !strings.Contains(res.Err.Error(), a.errText) {
				t.Errorf("error %q, want it to say %q", res.Err, a.errText)
			}
			checkNoDestination(t, res, hostPort(t, srv.url)...)
		})
	}
}

// A connection is reused only when its answer ended cleanly: not after
// "Connection: close", not with bytes after the answer, not when the body was
// longer than what is read of it.
func TestConnectionReusedOnlyAfterACleanAnswer(t *testing.T) {
	answers := map[string]struct {
		raw   string
		reuse bool
	}{
		"content length":    {okAnswer, true},
		"chunked":           {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", true},
		"no body":           {"HTTP/1.1 204 No Content\r\n\r\n", true},
		"connection close":  {"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", false},
		"bytes after":       {okAnswer + "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforge", false},
		"body too long":     {"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + strings.Repeat("x", 5000), false},
		"HTTP/1.0":          {"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
		"ends at the close": {"HTTP/1.1 200 OK\r\n\r\nok", false},
	}
	for name, a := range answers {
		t.Run(name, func(t *testing.T) {
			srv := newRawServer(t, func(w *bufio.Writer, _ *http.Request, _ int64) bool {
				w.WriteString(a.raw)
				return strings.Contains(a.raw, "Content-Length") || strings.Contains(a.raw, "chunked") || strings.Contains(a.raw, "204")
			})
			c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
			for i := range 2 {
				res := c.Post(context.Background(), srv.url, nil, nil, 5*time.Second)
				if res.ErrorCode != "" {
					t.Fatalf("post %d: %+v (%q)", i, res, res.Snippet)
				}
			}
			want := int64(2)
			if a.reuse {
				want = 1
			}
			if n := g.dials.Load(); n != want {
				t.Errorf("%d dials for 2 requests, want %d", n, want)
			}
		})
	}
}

// The caller's header cannot split the request, and the fields Post writes
// itself cannot be overridden.
func TestHeaderIsSentSafely(t *testing.T) {
	var mu sync.Mutex
	var seen []*http.Request
	srv := newRawServer(t, func(w *bufio.Writer, req *http.Request, _ int64) bool {
		mu.Lock()
		seen = append(seen, req)
		mu.Unlock()
		w.WriteString(okAnswer)
		return true
	})
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...)})
	for _, h := range []http.Header{
		{"X-Evil": {"a\r\nX-Injected: 1"}},
		{"X-Evil": {"a\nb"}},
		{"X-Nul": {"a\x00b"}},
		{"Bad Name": {"x"}},
		{"": {"x"}},
		{"X-Del": {"a\x7fb"}},
	} {
		res := c.Post(context.Background(), srv.url, h, []byte("body"), 5*time.Second)
		if res.ErrorCode != egress.CodeNetwork || res.StatusCode != 0 {
			t.Errorf("%q: %+v", h, res)
		}
	}
	if g.dials.Load() != 0 || srv.requests.Load() != 0 {
		t.Fatalf("a refused header was sent: %d dials, %d requests", g.dials.Load(), srv.requests.Load())
	}
	h := http.Header{
		"Host":              {"evil.test"},
		"Content-Length":    {"1"},
		"Transfer-Encoding": {"chunked"},
		"X-Tab":             {"a\tb"},
		"X-Two":             {"1", "2"},
	}
	if res := c.Post(context.Background(), srv.url+"/p?q=1", h, []byte("body"), 5*time.Second); res.ErrorCode != "" {
		t.Fatalf("result %+v", res)
	}
	req := seen[0]
	if req.Host != strings.TrimPrefix(srv.url, "http://") || req.ContentLength != 4 || len(req.TransferEncoding) != 0 ||
		req.Header.Get("X-Tab") != "a\tb" || strings.Join(req.Header["X-Two"], ",") != "1,2" || req.RequestURI != "/p?q=1" ||
		req.Method != http.MethodPost || req.UserAgent() != egress.DefaultUserAgent {
		t.Errorf("server saw %s %s host %q length %d TE %v header %v", req.Method, req.RequestURI, req.Host, req.ContentLength, req.TransferEncoding, req.Header)
	}

	// Field names are case-insensitive: a header map built by hand, not
	// through Header.Set, neither overrides Post's fields nor doubles them.
	h = http.Header{
		"host":              {"evil.test"},
		"content-length":    {"1"},
		"transfer-encoding": {"chunked"},
		"TRAILER":           {"X-Late"},
		"user-agent":        {"app/1"},
	}
	if res := c.Post(context.Background(), srv.url, h, []byte("body"), 5*time.Second); res.ErrorCode != "" {
		t.Fatalf("lower-case names: result %+v", res)
	}
	mu.Lock()
	req = seen[len(seen)-1]
	mu.Unlock()
	if len(seen) != 2 || req.Host != strings.TrimPrefix(srv.url, "http://") || req.ContentLength != 4 ||
		len(req.TransferEncoding) != 0 || len(req.Header["Trailer"]) != 0 || strings.Join(req.Header["User-Agent"], ",") != "app/1" {
		t.Errorf("lower-case names: server saw host %q length %d TE %v header %v", req.Host, req.ContentLength, req.TransferEncoding, req.Header)
	}
}

// Beyond MaxConnsPerHost a caller waits for a connection within its budget;
// one that gives up, timed out or canceled, takes nothing with it.
func TestFullPoolWaitsWithinBudget(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	c, g := mustClient(t, egress.Config{Policy: mustPolicy(t, loopbackOpen...), MaxConnsPerHost: 1})

	slow := make(chan egress.Result, 1)
	go func() { slow <- c.Post(context.Background(), srv.URL+"/slow", nil, nil, 10*time.Second) }()
	<-arrived // the only connection is busy

	start := time.Now()
	res := c.Post(context.Background(), srv.URL, nil, nil, 200*time.Millisecond)
	if res.ErrorCode != egress.CodeTimeout || !strings.Contains(res.Err.Error(), "before the response headers") {
		t.Errorf("waiting past the budget: %+v", res)
	}
	if d := time.Since(start); d < 190*time.Millisecond {
		t.Errorf("gave up after %v, budget 200ms", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan egress.Result, 1)
	go func() { done <- c.Post(ctx, srv.URL, nil, nil, 10*time.Second) }()
	cancel()
	if res := <-done; res.ErrorCode != egress.CodeInterrupted || !errors.Is(res.Err, context.Canceled) {
		t.Errorf("canceled while waiting: %+v", res)
	}

	// A waiter gets the connection when it is free.
	waiting := make(chan egress.Result, 1)
	go func() { waiting <- c.Post(context.Background(), srv.URL, nil, nil, 10*time.Second) }()
	close(release)
	for _, ch := range []chan egress.Result{slow, waiting} {
		if res := <-ch; res.ErrorCode != "" {
			t.Errorf("result %+v", res)
		}
	}
	// The callers that gave up left the place they waited for: the pool
	// still has its one connection, and it serves.
	if res := c.Post(context.Background(), srv.URL, nil, nil, 5*time.Second); res.ErrorCode != "" {
		t.Errorf("after: %+v", res)
	}
	if n, open := g.dials.Load(), g.maxOpen.Load(); n != 1 || open != 1 {
		t.Errorf("%d dials, %d open at once; want 1 and 1", n, open)
	}
}
