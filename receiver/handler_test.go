package receiver_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
	"github.com/vibejobs/vibejobs/receiver"
)

// memStore is an in-memory receiver.Store for handler tests.
type memStore struct {
	mu     sync.Mutex
	runs   map[string][]byte
	calls  atomic.Int32
	err    error
	status int
	// before, when set, runs as Accept is entered, with Accept's context.
	before func(ctx context.Context)
	ctxErr error // ctx.Err() seen after before
}

// Accept commits nothing under a done context, as a database driver would.
func (m *memStore) Accept(ctx context.Context, runID string, payload []byte) (int, []byte, error) {
	m.calls.Add(1)
	if m.before != nil {
		m.before(ctx)
	}
	m.mu.Lock()
	m.ctxErr = ctx.Err()
	m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	if m.err != nil {
		return 0, nil, m.err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runs == nil {
		m.runs = map[string][]byte{}
	}
	if _, ok := m.runs[runID]; !ok {
		m.runs[runID] = bytes.Clone(payload)
	}
	return cmpOr(m.status, receiver.AcceptedStatus), []byte(receiver.AcceptedBody), nil
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// testServer runs h behind a real net/http server and reports each return of
// ServeHTTP on done.
type testServer struct {
	*httptest.Server
	done chan struct{}
}

func startServer(t *testing.T, h http.Handler, configure func(*http.Server)) *testServer {
	t.Helper()
	ts := &testServer{done: make(chan struct{}, 100)}
	ts.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ts.done <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	if configure != nil {
		configure(ts.Config)
	}
	ts.Start()
	t.Cleanup(ts.Close)
	return ts
}

func (ts *testServer) addr() string { return strings.TrimPrefix(ts.URL, "http://") }

// waitReturn fails unless ServeHTTP returned within d.
func (ts *testServer) waitReturn(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-ts.done:
	case <-time.After(d):
		t.Fatalf("handler still running after %v", d)
	}
}

func newTestHandler(t *testing.T, store receiver.Store, mutate func(*receiver.Config)) *receiver.Handler {
	t.Helper()
	cfg := receiver.Config{
		Verifier: mustVerifier(t, receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT)),
		Logger:   slog.New(slog.DiscardHandler),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := receiver.NewHandler(cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// rawRequest writes a POST with exactly the given header lines over a new TCP
// connection, so that repeated lines reach the server as separate lines.
func rawRequest(t *testing.T, addr string, lines []string, body []byte) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n", addr, len(body))
	for _, l := range lines {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body)
	if _, err := conn.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func signedLines(body string) []string {
	return []string{
		"Content-Type: application/json",
		"X-Vibe-Caller-Kind: schedule",
		"Vibe-Signature: " + contract.Sign(vectorSecret, vectorT, []byte(body)),
	}
}

// Go's server keeps one r.Header entry per physical line of a header after
// canonicalising the name: the property the handler's line count rests on.
func TestNetHTTPKeepsOnePhysicalLinePerHeaderValue(t *testing.T) {
	got := make(chan [2]int, 1)
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- [2]int{len(r.Header["Vibe-Signature"]), len(r.Header["X-Vibe-Caller-Kind"])}
	}), nil)
	resp := rawRequest(t, ts.addr(), []string{
		"vibe-signature: a", "VIBE-SIGNATURE: b",
		"X-Vibe-Caller-Kind: schedule", "x-vibe-caller-kind: schedule", "X-VIBE-CALLER-KIND: schedule",
	}, nil)
	resp.Body.Close()
	if n := <-got; n != [2]int{2, 3} {
		t.Fatalf("header entries = %v, want [2 3]", n)
	}
}

func TestHandlerDuplicateHeaderLines(t *testing.T) {
	store := &memStore{}
	ts := startServer(t, newTestHandler(t, store, nil), nil)
	sig := "Vibe-Signature: " + vectorHeader
	cases := []struct {
		name  string
		lines []string
		want  int
	}{
		{"single lines", []string{"X-Vibe-Caller-Kind: schedule", sig}, 202},
		{"optional whitespace is not part of the value", []string{"X-Vibe-Caller-Kind:   schedule  ", "Vibe-Signature:\t" + vectorHeader + " "}, 202},
		{"signature twice", []string{"X-Vibe-Caller-Kind: schedule", sig, sig}, 401},
		{"signature twice, other case", []string{"X-Vibe-Caller-Kind: schedule", sig, "vibe-signature: " + vectorHeader}, 401},
		{"signature twice, one empty", []string{"X-Vibe-Caller-Kind: schedule", sig, "Vibe-Signature:"}, 401},
		{"caller twice", []string{"X-Vibe-Caller-Kind: schedule", "X-Vibe-Caller-Kind: schedule", sig}, 401},
		{"caller twice, other case", []string{"x-vibe-caller-kind: schedule", "X-VIBE-CALLER-KIND: schedule", sig}, 401},
		{"caller missing", []string{sig}, 401},
		{"signature missing", []string{"X-Vibe-Caller-Kind: schedule"}, 401},
		{"both joined on one line", []string{"X-Vibe-Caller-Kind: schedule", "Vibe-Signature: " + vectorHeader + "," + vectorHeader}, 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := rawRequest(t, ts.addr(), append([]string{"Content-Type: application/json"}, c.lines...), []byte(vectorBody))
			body := readBody(t, resp)
			if resp.StatusCode != c.want {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, body, c.want)
			}
		})
	}
}

// TestHandlerIgnoresTrailers: only header lines count. A chunked request's
// trailer is not a header line (Node's rawHeaders leaves trailers out too):
// a signature sent there does not authenticate the request, and one there
// next to the real header does not make it a second line.
func TestHandlerIgnoresTrailers(t *testing.T) {
	ts := startServer(t, newTestHandler(t, &memStore{}, nil), nil)
	sig := "Vibe-Signature: " + vectorHeader
	cases := []struct {
		name             string
		header, trailers []string
		want             int
	}{
		{"signature only in the trailer", []string{"X-Vibe-Caller-Kind: schedule", "Trailer: Vibe-Signature"}, []string{sig}, 401},
		{"caller only in the trailer", []string{sig, "Trailer: X-Vibe-Caller-Kind"}, []string{"X-Vibe-Caller-Kind: schedule"}, 401},
		{"signature in the header and the trailer", []string{"X-Vibe-Caller-Kind: schedule", sig, "Trailer: Vibe-Signature"}, []string{sig}, 202},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ts.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n%s\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n\r\n",
				strings.Join(c.header, "\r\n"), len(vectorBody), vectorBody, strings.Join(c.trailers, "\r\n"))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			if b := readBody(t, resp); resp.StatusCode != c.want {
				t.Fatalf("answered %d %s, want %d", resp.StatusCode, b, c.want)
			}
		})
	}
}

// TestHandlerHTTP2HeaderFields: over HTTP/2 a repeated field is a second
// line too.
func TestHandlerHTTP2HeaderFields(t *testing.T) {
	ts := httptest.NewUnstartedServer(newTestHandler(t, &memStore{}, nil))
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	for _, c := range []struct {
		name   string
		caller []string
		sig    []string
		want   int
	}{
		{"single fields", []string{"schedule"}, []string{vectorHeader}, 202},
		{"signature twice", []string{"schedule"}, []string{vectorHeader, vectorHeader}, 401},
		{"caller twice", []string{"schedule", "schedule"}, []string{vectorHeader}, 401},
	} {
		req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader(vectorBody))
		req.Header[contract.HeaderCallerKind] = c.caller
		req.Header.Set("Content-Type", contract.ContentType)
		req.Header[contract.HeaderSignature] = c.sig
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if b := readBody(t, resp); resp.ProtoMajor != 2 || resp.StatusCode != c.want {
			t.Errorf("%s: HTTP/%d %d %s, want HTTP/2 %d", c.name, resp.ProtoMajor, resp.StatusCode, b, c.want)
		}
	}
}

func TestHandlerStatusCodes(t *testing.T) {
	post := func(body string) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
		req.Header.Set("Content-Type", contract.ContentType)
		req.Header.Set(contract.HeaderSignature, contract.Sign(vectorSecret, vectorT, []byte(body)))
		return req
	}
	invalid := strings.Replace(vectorBody, `"attempt":1`, `"attempt":5`, 1)
	cases := []struct {
		name   string
		store  *memStore
		cfg    func(*receiver.Config)
		req    func() *http.Request
		status int
		body   string
	}{
		{"accepted", &memStore{}, nil, func() *http.Request { return post(vectorBody) }, 202, `{"accepted":true}`},
		{"store's 2xx passed through", &memStore{status: 200}, nil, func() *http.Request { return post(vectorBody) }, 200, `{"accepted":true}`},
		{"GET", &memStore{}, nil, func() *http.Request { r := post(vectorBody); r.Method = http.MethodGet; return r }, 405, `{"error":"method_not_allowed"}`},
		{"bad signature", &memStore{}, nil, func() *http.Request {
			r := post(vectorBody)
			r.Header.Set(contract.HeaderSignature, contract.Sign(otherSecret, vectorT, []byte(vectorBody)))
			return r
		}, 401, `{"error":"unauthorized"}`},
		{"stale signature", &memStore{}, nil, func() *http.Request {
			r := post(vectorBody)
			r.Header.Set(contract.HeaderSignature, contract.Sign(vectorSecret, vectorT-301, []byte(vectorBody)))
			return r
		}, 401, `{"error":"unauthorized"}`},
		{"wrong caller", &memStore{}, nil, func() *http.Request {
			r := post(vectorBody)
			r.Header.Set(contract.HeaderCallerKind, "user")
			return r
		}, 401, `{"error":"unauthorized"}`},
		{"signed invalid payload", &memStore{}, nil, func() *http.Request { return post(invalid) }, 400, `{"error":"invalid_payload","field":"attempt"}`},
		{"signed non-JSON", &memStore{}, nil, func() *http.Request { return post("hello") }, 400, `{"error":"invalid_payload"}`},
		{"unexpected job", &memStore{}, func(c *receiver.Config) { c.JobIDs = []string{"job_digest"} }, func() *http.Request { return post(vectorBody) }, 400, `{"error":"unexpected_job","field":"jobId"}`},
		{"expected job", &memStore{}, func(c *receiver.Config) { c.JobIDs = []string{"job_digest", "job_vector"} }, func() *http.Request { return post(vectorBody) }, 202, `{"accepted":true}`},
		{"store error", &memStore{err: errors.New("connection refused")}, nil, func() *http.Request { return post(vectorBody) }, 503, `{"error":"unavailable"}`},
		{"stored response not 2xx", &memStore{status: 500}, nil, func() *http.Request { return post(vectorBody) }, 500, `{"error":"internal"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newTestHandler(t, c.store, c.cfg)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, c.req())
			if rec.Code != c.status || rec.Body.String() != c.body {
				t.Fatalf("got %d %s, want %d %s", rec.Code, rec.Body, c.status, c.body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
			if wantCalls := int32(0); c.status < 300 || c.status >= 500 {
				wantCalls = 1
				if got := c.store.calls.Load(); got != wantCalls {
					t.Fatalf("store called %d times", got)
				}
			} else if got := c.store.calls.Load(); got != wantCalls {
				t.Fatalf("store called %d times for a rejected delivery", got)
			}
		})
	}
	if _, err := receiver.NewHandler(receiver.Config{Verifier: mustVerifier(t, receiver.Secrets{Current: vectorSecret}, nil), JobIDs: []string{"digest"}}, &memStore{}); err == nil {
		t.Fatal("NewHandler accepted an invalid job id")
	}
	if _, err := receiver.NewHandler(receiver.Config{}, &memStore{}); err == nil {
		t.Fatal("NewHandler accepted a nil Verifier")
	}
}

// paddedBody returns a body of exactly n bytes, validly signed at vectorT:
// it passes the bound and the signature and fails only the schema.
func paddedBody(n int) []byte {
	return append([]byte(vectorBody), bytes.Repeat([]byte(" "), n-len(vectorBody))...)
}

// hideLength makes the client send the body chunked, without Content-Length.
type hideLength struct{ io.Reader }

func TestHandlerBodyBound(t *testing.T) {
	store := &memStore{}
	h := newTestHandler(t, store, nil)
	var sawChunked atomic.Bool
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawChunked.Store(r.ContentLength == -1 && len(r.TransferEncoding) == 1 && r.TransferEncoding[0] == "chunked")
		h.ServeHTTP(w, r)
	}), nil)
	send := func(body []byte, chunked bool) (int, string) {
		t.Helper()
		var r io.Reader = bytes.NewReader(body)
		if chunked {
			r = hideLength{r}
		}
		req, _ := http.NewRequest(http.MethodPost, ts.URL, r)
		req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
		req.Header.Set("Content-Type", contract.ContentType)
		req.Header.Set(contract.HeaderSignature, contract.Sign(vectorSecret, vectorT, body))
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if chunked != sawChunked.Load() {
			t.Fatalf("sent chunked=%v, server saw otherwise", chunked)
		}
		return resp.StatusCode, readBody(t, resp)
	}
	for _, chunked := range []bool{false, true} {
		if code, body := send(paddedBody(contract.MaxBodyBytes+1), chunked); code != 413 || body != `{"error":"body_too_large"}` {
			t.Errorf("64 KiB + 1 (chunked %v): %d %s", chunked, code, body)
		}
		if code, body := send(paddedBody(contract.MaxBodyBytes), chunked); code != 400 || body != `{"error":"invalid_payload"}` {
			t.Errorf("exactly 64 KiB (chunked %v): %d %s, want the schema's 400", chunked, code, body)
		}
		if code, _ := send([]byte(vectorBody), chunked); code != 202 {
			t.Errorf("reference body (chunked %v): %d", chunked, code)
		}
	}
	if n := store.calls.Load(); n != 2 {
		t.Fatalf("store called %d times, want 2", n)
	}
}

// TestHandlerAnnouncedOversizeAnsweredAtOnce: a Content-Length beyond the
// bound is answered 413 before a byte of the body is sent, and the
// connection is closed. net/http reads and discards an unread body of up to
// 256 KiB before it writes an answer on a connection it keeps: without the
// close, a client announcing 64 KiB + 1 would have to send the whole body,
// and one that waits for the answer first (or stalls) would get nothing. The
// test's client sends only the headers; the connection's deadline is a guard
// against a hang, not a timing assertion.
func TestHandlerAnnouncedOversizeAnsweredAtOnce(t *testing.T) {
	store := &memStore{}
	ts := startServer(t, newTestHandler(t, store, nil), nil)
	for _, announced := range []int{contract.MaxBodyBytes + 1, 200 << 10, 10 << 20} {
		t.Run(fmt.Sprint(announced), func(t *testing.T) {
			conn, err := net.Dial("tcp", ts.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n\r\n",
				announced, strings.Join(signedLines(vectorBody), "\r\n"))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer before the body was sent: %v", err)
			}
			if b := readBody(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge || b != `{"error":"body_too_large"}` {
				t.Fatalf("answered %d %s, want 413", resp.StatusCode, b)
			}
			if !resp.Close {
				t.Fatal("the connection stays open with the announced body unread")
			}
		})
	}
	if n := store.calls.Load(); n != 0 {
		t.Fatalf("store called %d times", n)
	}
}

// TestHandlerOversizeOverHTTP2KeepsTheConnection: on HTTP/2 a 413 ends only
// its stream; the other deliveries multiplexed on the connection go on (a
// Connection: close there would make net/http send GOAWAY).
func TestHandlerOversizeOverHTTP2KeepsTheConnection(t *testing.T) {
	ts := httptest.NewUnstartedServer(newTestHandler(t, &memStore{}, nil))
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	var conns atomic.Int32
	send := func(body []byte) int {
		t.Helper()
		trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
			if !ci.Reused {
				conns.Add(1)
			}
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, ts.URL, bytes.NewReader(body))
		req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
		req.Header.Set("Content-Type", contract.ContentType)
		req.Header.Set(contract.HeaderSignature, contract.Sign(vectorSecret, vectorT, body))
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if resp.ProtoMajor != 2 {
			t.Fatalf("served over HTTP/%d", resp.ProtoMajor)
		}
		return resp.StatusCode
	}
	if code := send(paddedBody(contract.MaxBodyBytes + 1)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d", code)
	}
	if code := send([]byte(vectorBody)); code != http.StatusAccepted {
		t.Fatalf("delivery after the 413: %d", code)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want the first one kept", n)
	}
}

// A body that trickles in is read whole and verified.
func TestHandlerSlowBody(t *testing.T) {
	ts := startServer(t, newTestHandler(t, &memStore{}, nil), nil)
	conn, err := net.Dial("tcp", ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	body := []byte(vectorBody)
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n\r\n", len(body), strings.Join(signedLines(vectorBody), "\r\n"))
	tick := time.NewTicker(15 * time.Millisecond) // the slowness under test
	defer tick.Stop()
	for chunk := range slices(body, 16) {
		<-tick.C
		if _, err := conn.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := readBody(t, resp); resp.StatusCode != 202 || b != receiver.AcceptedBody {
		t.Fatalf("slow body: %d %s", resp.StatusCode, b)
	}
}

func slices(b []byte, n int) func(func([]byte) bool) {
	return func(yield func([]byte) bool) {
		for len(b) > 0 {
			k := min(n, len(b))
			if !yield(b[:k]) {
				return
			}
			b = b[k:]
		}
	}
}

// A client that stops sending the body is cut off by the server's ReadTimeout
// or by Config.BodyReadTimeout; the handler returns and never reaches the
// store. The rejection is logged without the read error's text, a
// *net.OpError naming the receiver's own address (the job URL's host and
// port) and the peer's.
func TestHandlerStalledBody(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  func(*receiver.Config)
		srv  func(*http.Server)
	}{
		{"server ReadTimeout", nil, func(s *http.Server) { s.ReadTimeout = 300 * time.Millisecond }},
		{"Config.BodyReadTimeout", func(c *receiver.Config) { c.BodyReadTimeout = 300 * time.Millisecond }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &memStore{}
			var logs syncbuf.Buffer
			ts := startServer(t, newTestHandler(t, store, func(cfg *receiver.Config) {
				if c.cfg != nil {
					c.cfg(cfg)
				}
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			}), c.srv)
			conn, err := net.Dial("tcp", ts.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n\r\n%s",
				len(vectorBody), strings.Join(signedLines(vectorBody), "\r\n"), vectorBody[:50])
			// The client now waits for an answer that can only come from a timeout.
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err == nil {
				if b := readBody(t, resp); resp.StatusCode != http.StatusRequestTimeout {
					t.Fatalf("stalled body answered %d %s", resp.StatusCode, b)
				}
			} else if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				t.Fatalf("no answer and no close: %v", err)
			}
			ts.waitReturn(t, 5*time.Second)
			if store.calls.Load() != 0 {
				t.Fatal("a partial body reached the store")
			}
			if out := logs.String(); !strings.Contains(out, "delivery rejected") || strings.Contains(out, ts.addr()) {
				t.Errorf("log of the stalled body, want a rejection without the receiver's address %s:\n%s", ts.addr(), out)
			}
		})
	}
}

func TestHandlerClientDisconnects(t *testing.T) {
	t.Run("during the body", func(t *testing.T) {
		store := &memStore{}
		ts := startServer(t, newTestHandler(t, store, nil), nil)
		conn, err := net.Dial("tcp", ts.addr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n\r\n%s",
			len(vectorBody), strings.Join(signedLines(vectorBody), "\r\n"), vectorBody[:50])
		conn.Close()
		ts.waitReturn(t, 5*time.Second)
		if store.calls.Load() != 0 {
			t.Fatal("a partial body reached the store")
		}
	})
	// A delivery that was verified and handed to the store is committed even
	// though the client leaves (and net/http cancels the request's context)
	// while the store works: the platform's retry then finds the receipt.
	t.Run("during acceptance", func(t *testing.T) {
		entered, release := make(chan struct{}, 1), make(chan struct{})
		store := &memStore{before: func(context.Context) { entered <- struct{}{}; <-release }}
		reqCtx := make(chan context.Context, 1)
		h := newTestHandler(t, store, nil)
		ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reqCtx <- r.Context()
			h.ServeHTTP(w, r)
		}), nil)
		conn, err := net.Dial("tcp", ts.addr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n\r\n%s",
			len(vectorBody), strings.Join(signedLines(vectorBody), "\r\n"), vectorBody)
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatal("the store was not reached")
		}
		conn.Close()
		select {
		case <-(<-reqCtx).Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the server did not cancel the request's context after the client left")
		}
		close(release)
		ts.waitReturn(t, 5*time.Second)
		assertCommitted(t, store, "run_vector")
	})
}

func assertCommitted(t *testing.T, store *memStore, runID string) {
	t.Helper()
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.ctxErr != nil {
		t.Fatalf("the store's context was done: %v", store.ctxErr)
	}
	if _, ok := store.runs[runID]; !ok {
		t.Fatal("the verified delivery was not committed")
	}
}

// An app that wraps the handler in http.TimeoutHandler (or any middleware
// with a deadline) cancels the request's context when the deadline passes. A
// delivery already handed to the store must still commit: the platform's
// retry of the timed-out attempt then finds the receipt instead of new work
// that was rolled back.
func TestHandlerAcceptOutlivesTimeoutHandler(t *testing.T) {
	reqCtx := make(chan context.Context, 1)
	store := &memStore{before: func(context.Context) { <-(<-reqCtx).Done() }}
	h := newTestHandler(t, store, nil)
	returned := make(chan struct{})
	th := http.TimeoutHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		reqCtx <- r.Context()
		h.ServeHTTP(w, r)
	}), time.Millisecond, "timeout")
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(vectorBody))
	req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
	req.Header.Set("Content-Type", contract.ContentType)
	req.Header.Set(contract.HeaderSignature, vectorHeader)
	th.ServeHTTP(httptest.NewRecorder(), req)
	<-returned
	assertCommitted(t, store, "run_vector")
}

// The store's context is detached from the request's cancellation but keeps
// its values and is bounded by Config.AcceptTimeout.
func TestHandlerAcceptContext(t *testing.T) {
	type key struct{}
	for _, c := range []struct {
		name    string
		timeout time.Duration
		want    time.Duration
	}{
		{"default", 0, receiver.DefaultAcceptTimeout},
		{"configured", time.Hour, time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "trace"))
			defer cancel()
			var deadline time.Time
			var hasDeadline bool
			var value any
			// cancel as the store is entered: the client left, or a server or
			// handler timeout fired, after the delivery was verified.
			store := &memStore{before: func(ctx context.Context) {
				cancel()
				deadline, hasDeadline = ctx.Deadline()
				value = ctx.Value(key{})
			}}
			h := newTestHandler(t, store, func(cfg *receiver.Config) { cfg.AcceptTimeout = c.timeout })
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(vectorBody))
			req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
			req.Header.Set("Content-Type", contract.ContentType)
			req.Header.Set(contract.HeaderSignature, vectorHeader)
			start := time.Now()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusAccepted {
				t.Fatalf("got %d %s, want 202", rec.Code, rec.Body)
			}
			assertCommitted(t, store, "run_vector")
			if !hasDeadline || deadline.Before(start.Add(c.want)) || deadline.After(time.Now().Add(c.want)) {
				t.Fatalf("store's deadline %v (set: %v), want %v after the call", deadline, hasDeadline, c.want)
			}
			if value != "trace" {
				t.Fatalf("store's context lost the request's values: %v", value)
			}
		})
	}
	if _, err := receiver.NewHandler(receiver.Config{Verifier: mustVerifier(t, receiver.Secrets{Current: vectorSecret}, nil), AcceptTimeout: -1}, &memStore{}); err == nil {
		t.Fatal("NewHandler accepted a negative AcceptTimeout")
	}
}

// TestHandlerRefusesNegativeBodyReadTimeout: a negative BodyReadTimeout (a
// duration computed the wrong way round) is refused like a negative
// AcceptTimeout, not taken for no bound at all.
func TestHandlerRefusesNegativeBodyReadTimeout(t *testing.T) {
	cfg := receiver.Config{Verifier: mustVerifier(t, receiver.Secrets{Current: vectorSecret}, nil), BodyReadTimeout: -time.Second}
	if _, err := receiver.NewHandler(cfg, &memStore{}); err == nil {
		t.Error("NewHandler accepted a negative BodyReadTimeout")
	}
	if _, err := receiver.NewMiddleware(cfg, http.NotFoundHandler()); err == nil {
		t.Error("NewMiddleware accepted a negative BodyReadTimeout")
	}
}

// Whatever happens, the logs hold neither the secret, nor the signature, nor
// the body.
func TestHandlerNeverLogsSecretSignatureOrBody(t *testing.T) {
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, store := range []*memStore{{}, {err: errors.New("db down")}} {
		h := newTestHandler(t, store, func(c *receiver.Config) { c.Logger = logger; c.JobIDs = []string{"job_other"} })
		h2 := newTestHandler(t, store, func(c *receiver.Config) { c.Logger = logger })
		for _, req := range []struct {
			sig, body string
		}{
			{vectorHeader, vectorBody},
			{vectorHeader, vectorBody + " "},
			{contract.Sign(vectorSecret, vectorT, []byte(vectorBody+" ")), vectorBody + " "},
			{"t=1,v1=" + vectorMAC, vectorBody},
		} {
			for _, hh := range []*receiver.Handler{h, h2} {
				r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(req.body))
				r.Header.Set(contract.HeaderCallerKind, "schedule")
				r.Header.Set("Content-Type", contract.ContentType)
				r.Header.Set(contract.HeaderSignature, req.sig)
				hh.ServeHTTP(httptest.NewRecorder(), r)
			}
		}
	}
	out := logs.String()
	if !strings.Contains(out, `"run_id":"run_vector"`) {
		t.Fatalf("expected the run id in the logs:\n%s", out)
	}
	for _, secret := range []string{vectorSecret, vectorSecret[4:], vectorMAC, vectorMAC[:16], vectorBody, `"scheduledFor"`, "2026-10-09T09:00:00.000Z", "scheduled_job.run"} {
		if strings.Contains(out, secret) {
			t.Fatalf("logs contain %q:\n%s", secret, out)
		}
	}
}

func TestMiddlewarePassesTheVerifiedRequest(t *testing.T) {
	var gotBody string
	var gotPayload contract.Payload
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		gotPayload, _ = receiver.PayloadFromContext(r.Context())
		w.WriteHeader(http.StatusNoContent)
	})
	mw, err := receiver.NewMiddleware(receiver.Config{
		Verifier: mustVerifier(t, receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT)),
		Logger:   slog.New(slog.DiscardHandler),
	}, next)
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, mw, nil)
	resp := rawRequest(t, ts.addr(), signedLines(vectorBody), []byte(vectorBody))
	readBody(t, resp)
	if resp.StatusCode != http.StatusNoContent || gotBody != vectorBody || gotPayload.RunID != "run_vector" {
		t.Fatalf("next saw status %d body %q payload %+v", resp.StatusCode, gotBody, gotPayload)
	}
	resp = rawRequest(t, ts.addr(), []string{"Content-Type: application/json", "X-Vibe-Caller-Kind: schedule", "Vibe-Signature: t=1,v1=" + vectorMAC}, []byte(vectorBody))
	if readBody(t, resp); resp.StatusCode != 401 {
		t.Fatalf("unsigned request reached %d", resp.StatusCode)
	}
}

func BenchmarkHandlerInMemory(b *testing.B) {
	v, _ := receiver.NewVerifier(receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT))
	h, _ := receiver.NewHandler(receiver.Config{Verifier: v, Logger: slog.New(slog.DiscardHandler)}, &memStore{})
	body := []byte(vectorBody)
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header.Set(contract.HeaderCallerKind, "schedule")
		r.Header.Set("Content-Type", contract.ContentType)
		r.Header.Set(contract.HeaderSignature, vectorHeader)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 202 {
			b.Fatal(w.Code)
		}
	}
}

// TestHandlerWithoutSecretAnswersUnavailable: a handler whose Verifier holds
// no secret yet (a zero Verifier that the app gives its secret with
// SetSecrets once it has loaded it) cannot judge any signature. Its answer
// must let the platform retry: 401 would fail the run for good, app_rejected,
// for want of a secret the app was about to load. The same delivery is
// accepted once the secret is in.
func TestHandlerWithoutSecretAnswersUnavailable(t *testing.T) {
	var v receiver.Verifier
	store := &memStore{}
	var logs syncbuf.Buffer
	h, err := receiver.NewHandler(receiver.Config{Verifier: &v, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, store)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(vectorBody)
	deliver := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
		r.Header.Set("Content-Type", contract.ContentType)
		r.Header.Set(contract.HeaderSignature, contract.Sign(vectorSecret, time.Now().Unix(), body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := deliver(); w.Code != http.StatusServiceUnavailable || w.Body.String() != `{"error":"unavailable"}` {
		t.Fatalf("no secret loaded: %d %s, want 503 {\"error\":\"unavailable\"}", w.Code, w.Body)
	}
	if n := store.calls.Load(); n != 0 {
		t.Fatalf("store called %d times without a verified delivery", n)
	}
	if out := logs.String(); !strings.Contains(out, "no secret") || strings.Contains(out, vectorBody) {
		t.Fatalf("log of the unverifiable delivery:\n%s", out)
	}
	if err := v.SetSecrets(receiver.Secrets{Current: vectorSecret}); err != nil {
		t.Fatal(err)
	}
	if w := deliver(); w.Code != http.StatusAccepted {
		t.Fatalf("after SetSecrets: %d %s, want 202", w.Code, w.Body)
	}
}

// A request built for a direct call (http.NewRequest with a nil body, as
// adapters from other servers and tests do) has a nil Body, which net/http's
// server never hands over: it is an empty body, answered like any other,
// not a nil-pointer panic.
func TestHandlerNilBody(t *testing.T) {
	for _, mw := range []bool{false, true} {
		store := &memStore{}
		var h http.Handler = newTestHandler(t, store, nil)
		if mw {
			m, err := receiver.NewMiddleware(receiver.Config{Verifier: mustVerifier(t, receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT)), Logger: slog.New(slog.DiscardHandler)},
				http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("next called for an empty body") }))
			if err != nil {
				t.Fatal(err)
			}
			h = m
		}
		req, err := http.NewRequest(http.MethodPost, "/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
		req.Header.Set("Content-Type", contract.ContentType)
		req.Header.Set(contract.HeaderSignature, contract.Sign(vectorSecret, vectorT, nil))
		rec := httptest.NewRecorder()
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("middleware %v: panic on a nil Body: %v", mw, p)
				}
			}()
			h.ServeHTTP(rec, req)
		}()
		if rec.Code != http.StatusBadRequest || rec.Body.String() != `{"error":"invalid_payload"}` {
			t.Fatalf("middleware %v: %d %s, want 400 invalid_payload", mw, rec.Code, rec.Body)
		}
		if store.calls.Load() != 0 {
			t.Fatal("store called for an empty body")
		}
	}
}

// TestHandlerContentType: the platform sends Content-Type: application/json.
// The media type is compared without regard to ASCII case and may carry
// parameters (RFC 9110 §8.3.1), a charset only if utf-8; anything else, a
// missing header or a repeated one is answered 415, retried by the
// platform, before the body is read or anything is verified or stored.
func TestHandlerContentType(t *testing.T) {
	cases := []struct {
		name  string
		lines []string // Content-Type lines
		want  int
	}{
		{"the contract's", []string{"Content-Type: application/json"}, 202},
		{"charset utf-8", []string{"Content-Type: application/json; charset=utf-8"}, 202},
		{"any ASCII case", []string{"content-type: Application/JSON; Charset=UTF-8"}, 202},
		{"quoted charset, no space", []string{`Content-Type: application/json;charset="utf-8"`}, 202},
		{"space before the semicolon", []string{"Content-Type: application/json ; charset=utf-8"}, 202},
		{"another parameter", []string{"Content-Type: application/json; profile=x"}, 202},
		{"missing", nil, 415},
		{"empty", []string{"Content-Type:"}, 415},
		{"text/plain", []string{"Content-Type: text/plain"}, 415},
		{"form", []string{"Content-Type: application/x-www-form-urlencoded"}, 415},
		{"octet-stream", []string{"Content-Type: application/octet-stream"}, 415},
		{"a +json type", []string{"Content-Type: application/vnd.api+json"}, 415},
		{"a longer subtype", []string{"Content-Type: application/json-seq"}, 415},
		{"another charset", []string{"Content-Type: application/json; charset=iso-8859-1"}, 415},
		{"malformed parameter", []string{"Content-Type: application/json; charset"}, 415},
		{"a list", []string{"Content-Type: application/json, text/plain"}, 415},
		{"twice", []string{"Content-Type: application/json", "Content-Type: application/json"}, 415},
		{"twice, other case", []string{"Content-Type: application/json", "content-type: application/json"}, 415},
	}
	store := &memStore{}
	var logs syncbuf.Buffer
	ts := startServer(t, newTestHandler(t, store, func(c *receiver.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }), nil)
	accepted, refused := 0, 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lines := append(c.lines[:len(c.lines):len(c.lines)], signedLines(vectorBody)[1:]...)
			resp := rawRequest(t, ts.addr(), lines, []byte(vectorBody))
			body := readBody(t, resp)
			if resp.StatusCode != c.want {
				t.Fatalf("answered %d %s, want %d", resp.StatusCode, body, c.want)
			}
			if c.want == 202 {
				accepted++
			} else if refused++; body != `{"error":"unsupported_media_type"}` {
				t.Fatalf("body %s", body)
			}
			if n := int(store.calls.Load()); n != accepted {
				t.Fatalf("store called %d times after %d deliveries with a JSON Content-Type", n, accepted)
			}
		})
	}
	// Only when a refusal ran: -run may have picked accepted cases alone.
	if out := logs.String(); refused > 0 && (!strings.Contains(out, "reason=unsupported_media_type") || strings.Contains(out, "text/plain")) {
		t.Errorf("logs, want the refusal without the header's value:\n%s", out)
	}

	// The answer does not wait for the body: the client announces one and
	// sends none, and the connection is not kept for the unread rest.
	conn, err := net.Dial("tcp", ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second)) // a guard against a hang
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n%s\r\n\r\n",
		len(vectorBody), strings.Join(signedLines(vectorBody)[1:], "\r\n"))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	if b := readBody(t, resp); resp.StatusCode != http.StatusUnsupportedMediaType || !resp.Close {
		t.Fatalf("answered %d %s (close %v), want 415 and the connection closed", resp.StatusCode, b, resp.Close)
	}

	// The middleware refuses alike and never calls next.
	middlewareRefuses(t, []byte(vectorBody), map[string]string{"Content-Type": "text/plain"})
}

// middlewareRefuses checks that the middleware answers a signed delivery of
// body with headers (set over the contract's) 415, without calling next.
func middlewareRefuses(t *testing.T, body []byte, headers map[string]string) {
	t.Helper()
	mw, err := receiver.NewMiddleware(receiver.Config{
		Verifier: mustVerifier(t, receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT)),
		Logger:   slog.New(slog.DiscardHandler),
	}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Errorf("next called for a delivery with %v", headers) }))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set("Content-Type", contract.ContentType)
	req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
	req.Header.Set(contract.HeaderSignature, vectorHeader)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	mw.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnsupportedMediaType {
		t.Fatalf("middleware answered %d %s to a delivery with %v, want 415", rec.Code, rec.Body, headers)
	}
}

// TestHandlerContentEncoding: the platform sends the body as it is, and signs
// those bytes. A body in another content coding (a proxy that gzips requests)
// no longer verifies, and a 401 would make the platform fail the run for good;
// it is answered 415 with Accept-Encoding: identity (RFC 7694), which the
// platform retries, before the body is read or anything is stored.
// identity alone changes nothing and is accepted.
func TestHandlerContentEncoding(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(vectorBody))
	zw.Close()
	cases := []struct {
		name  string
		lines []string // Content-Encoding lines
		body  []byte
		want  int
	}{
		{"none", nil, []byte(vectorBody), 202},
		{"identity", []string{"Content-Encoding: identity"}, []byte(vectorBody), 202},
		{"identity, any case", []string{"content-encoding: IDENTITY"}, []byte(vectorBody), 202},
		{"gzip, body compressed", []string{"Content-Encoding: gzip"}, gz.Bytes(), 415},
		{"gzip, body as signed", []string{"Content-Encoding: gzip"}, []byte(vectorBody), 415},
		{"deflate", []string{"Content-Encoding: deflate"}, []byte(vectorBody), 415},
		{"br, other case", []string{"CONTENT-ENCODING: br"}, []byte(vectorBody), 415},
		{"a list", []string{"Content-Encoding: identity, gzip"}, []byte(vectorBody), 415},
		{"identity then gzip, two lines", []string{"Content-Encoding: identity", "Content-Encoding: gzip"}, []byte(vectorBody), 415},
		{"unknown coding", []string{"Content-Encoding: x-custom"}, []byte(vectorBody), 415},
	}
	store := &memStore{}
	ts := startServer(t, newTestHandler(t, store, nil), nil)
	accepted := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lines := append(c.lines[:len(c.lines):len(c.lines)], signedLines(vectorBody)...)
			resp := rawRequest(t, ts.addr(), lines, c.body)
			body := readBody(t, resp)
			if resp.StatusCode != c.want {
				t.Fatalf("answered %d %s, want %d", resp.StatusCode, body, c.want)
			}
			if c.want == 202 {
				accepted++
			} else {
				if body != `{"error":"unsupported_media_type"}` {
					t.Fatalf("body %s", body)
				}
				if ae := resp.Header.Get("Accept-Encoding"); ae != "identity" {
					t.Fatalf("Accept-Encoding %q, want identity", ae)
				}
			}
			if n := int(store.calls.Load()); n != accepted {
				t.Fatalf("store called %d times after %d deliveries without a coding", n, accepted)
			}
		})
	}

	// The middleware refuses alike and never calls next.
	middlewareRefuses(t, gz.Bytes(), map[string]string{"Content-Encoding": "gzip"})
}

// hideConn is a middleware's ResponseWriter wrapper without Unwrap: through
// it, http.ResponseController cannot reach the connection.
type hideConn struct{ http.ResponseWriter }

// TestHandlerWarnsWhenBodyReadTimeoutCannotBeSet: behind a wrapper without
// Unwrap the handler cannot set the read deadline BodyReadTimeout asks
// for. It says so, once, rather than leave the operator believing slow
// bodies are bounded, and still answers the delivery.
func TestHandlerWarnsWhenBodyReadTimeoutCannotBeSet(t *testing.T) {
	var logs bytes.Buffer
	store := &memStore{}
	h := newTestHandler(t, store, func(cfg *receiver.Config) {
		cfg.BodyReadTimeout = time.Second
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(vectorBody))
		req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
		req.Header.Set("Content-Type", contract.ContentType)
		req.Header.Set(contract.HeaderSignature, vectorHeader)
		rec := httptest.NewRecorder()
		h.ServeHTTP(hideConn{rec}, req)
		if rec.Code/100 != 2 {
			t.Fatalf("delivery behind the wrapper: %d %s", rec.Code, rec.Body)
		}
	}
	if n := strings.Count(logs.String(), "BodyReadTimeout not applied"); n != 1 {
		t.Errorf("warnings that BodyReadTimeout was not applied: %d, want 1; log:\n%s", n, logs.String())
	}
}

// readSpy is a request body that records whether it was read.
type readSpy struct {
	r    io.Reader
	read atomic.Bool
}

func (s *readSpy) Read(p []byte) (int, error) {
	s.read.Store(true)
	return s.r.Read(p)
}

// TestHandlerNotMadeByItsConstructors: a Handler made without NewHandler or
// NewMiddleware (a zero Handler, a nil *Handler) has no Verifier, no store
// and no next handler. It answers every request, a validly signed delivery
// included, 500 {"error":"handler_not_configured"}, which the platform
// retries (a 401 or 403 would fail the run for good), without reading the
// body, and logs why through slog.Default(); it does not panic, which
// net/http would turn into a dropped connection per delivery.
func TestHandlerNotMadeByItsConstructors(t *testing.T) {
	var logs syncbuf.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	var zero receiver.Handler
	handlers := map[string]*receiver.Handler{"zero": &zero, "new(Handler)": new(receiver.Handler), "nil": nil}
	requests := map[string]func(io.Reader) *http.Request{
		"signed delivery": func(body io.Reader) *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/", body)
			r.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
			r.Header.Set("Content-Type", contract.ContentType)
			r.Header.Set(contract.HeaderSignature, contract.Sign(vectorSecret, time.Now().Unix(), []byte(vectorBody)))
			return r
		},
		"GET":          func(body io.Reader) *http.Request { return httptest.NewRequest(http.MethodGet, "/", body) },
		"no signature": func(body io.Reader) *http.Request { return httptest.NewRequest(http.MethodPost, "/", body) },
		"nil body (direct call)": func(io.Reader) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set("Content-Type", contract.ContentType)
			return r
		},
	}
	for hname, h := range handlers {
		for rname, req := range requests {
			body := &readSpy{r: strings.NewReader(vectorBody)}
			rec := httptest.NewRecorder()
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("%s handler, %s: panicked: %v", hname, rname, p)
					}
				}()
				h.ServeHTTP(rec, req(body))
			}()
			if rec.Code != http.StatusInternalServerError || rec.Body.String() != `{"error":"handler_not_configured"}` {
				t.Errorf("%s handler, %s: %d %s, want 500 {\"error\":\"handler_not_configured\"}", hname, rname, rec.Code, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s handler, %s: Content-Type %q", hname, rname, ct)
			}
			if body.read.Load() {
				t.Errorf("%s handler, %s: the body was read", hname, rname)
			}
			if c := rec.Header().Get("Connection"); c != "close" {
				t.Errorf("%s handler, %s: Connection %q, want close: the body is left unread", hname, rname, c)
			}
		}
	}
	out := logs.String()
	if !strings.Contains(out, "handler_not_configured") || !strings.Contains(out, "NewHandler") {
		t.Errorf("the default logger did not say why:\n%s", out)
	}
	if strings.Contains(out, vectorBody) || strings.Contains(out, "v1=") {
		t.Errorf("the log holds the body or the signature:\n%s", out)
	}
}
