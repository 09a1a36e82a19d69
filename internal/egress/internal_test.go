package egress

import (
	"context"
	"errors"
	"net"
	"strconv"
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
	for _, addr := range []string{"10.0.0.1:80", "169.254.169.254:80", "[::1]:80", "[::ffff:10.0.0.1]:80", "[fe80::1%eth0]:80", "garbage", "example.com:80"} {
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

// Proxy settings in the environment are never consulted, and certificates
// are verified (TestRedirectIsNotFollowed covers redirects).
func TestTransportIgnoresProxy(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1")
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
	c, err := NewClient(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c.transport.Proxy != nil {
		t.Error("transport has a Proxy function")
	}
	if c.tlsConfig.InsecureSkipVerify {
		t.Error("certificate verification is off")
	}
}

// validURL answers as ValidateURL does, from its cache too, and every call
// gets a URL of its own: a caller changing one does not change what the
// next delivery to that URL is sent to.
func TestValidURLCachesOwnCopies(t *testing.T) {
	p, err := NewPolicy([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	const raw = "http://0x7f.1:8080/hook?a=b c"
	want, err := p.ValidateURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		u, err := c.validURL(raw)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if u.String() != want.String() {
			t.Fatalf("call %d: %s, want %s", i, u, want)
		}
		u.Host, u.Path = "example.com", "/other"
	}
	for i := range 2 {
		if _, err := c.validURL("http://10.0.0.1/"); err == nil {
			t.Fatalf("call %d: a URL the policy refuses was accepted", i)
		}
	}
	// Full, the cache is emptied and still answers.
	for i := range maxCachedURLs + 10 {
		if _, err := c.validURL("http://127.0.0.1/" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.urlCount.Load(); n > maxCachedURLs {
		t.Errorf("%d URLs kept, want at most %d", n, maxCachedURLs)
	}
	if u, err := c.validURL(raw); err != nil || u.String() != want.String() {
		t.Errorf("after the cache was emptied: %v, %v; want %s", u, err, want)
	}
}
