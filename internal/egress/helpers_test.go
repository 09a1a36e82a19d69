package egress_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/egress"
)

// loopbackGuard is the only way a test client reaches the network. Any address
// that is not loopback fails the test and is never dialed, so a bug in the
// package cannot send traffic out of the machine.
type loopbackGuard struct {
	t         testing.TB
	mu        sync.Mutex
	dialed    []string
	dials     atomic.Int64
	bytesRead atomic.Int64
	open      atomic.Int64 // connections dialed and not yet closed
	maxOpen   atomic.Int64
}

func (g *loopbackGuard) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		g.t.Errorf("test guard: refused to dial non-loopback address %q", addr)
		return nil, errors.New("test guard: non-loopback dial refused")
	}
	g.mu.Lock()
	g.dialed = append(g.dialed, addr)
	g.mu.Unlock()
	g.dials.Add(1)
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	n := g.open.Add(1)
	for m := g.maxOpen.Load(); n > m && !g.maxOpen.CompareAndSwap(m, n); m = g.maxOpen.Load() {
	}
	return &countingConn{Conn: conn, g: g}, nil
}

func (g *loopbackGuard) Dialed() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.dialed...)
}

type countingConn struct {
	net.Conn
	g     *loopbackGuard
	close sync.Once
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.g.bytesRead.Add(int64(n))
	return n, err
}

func (c *countingConn) Close() error {
	c.close.Do(func() { c.g.open.Add(-1) })
	return c.Conn.Close()
}

// resolverFunc is a stub resolver.
type resolverFunc func(ctx context.Context, network, host string) ([]netip.Addr, error)

func (f resolverFunc) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return f(ctx, network, host)
}

// staticResolver answers every name in the map, and fails the test for any
// other name: tests never consult the real resolver.
func staticResolver(t testing.TB, answers map[string][]string) resolverFunc {
	return func(_ context.Context, _, host string) ([]netip.Addr, error) {
		list, ok := answers[host]
		if !ok {
			t.Errorf("stub resolver: unexpected lookup of %q", host)
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		out := make([]netip.Addr, len(list))
		for i, s := range list {
			out[i] = netip.MustParseAddr(s)
		}
		return out, nil
	}
}

var loopbackOpen = []string{"127.0.0.0/8", "::1"}

func mustPolicy(t testing.TB, allow ...string) *egress.Policy {
	t.Helper()
	p, err := egress.NewPolicy(allow)
	if err != nil {
		t.Fatalf("NewPolicy(%q): %v", allow, err)
	}
	return p
}

// mustClient builds a client whose every dial goes through a loopbackGuard. The
// resolver defaults to one that fails the test on any lookup.
func mustClient(t testing.TB, cfg egress.Config) (*egress.Client, *loopbackGuard) {
	t.Helper()
	g := &loopbackGuard{t: t}
	cfg.DialContext = g.DialContext
	if cfg.Resolver == nil {
		cfg.Resolver = staticResolver(t, nil)
	}
	c, err := egress.NewClient(cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c, g
}

// checkNoDestination fails if the result's error names any of the given
// strings (URL, host, address, port).
func checkNoDestination(t *testing.T, res egress.Result, secrets ...string) {
	t.Helper()
	if res.Err == nil {
		return
	}
	msg := res.Err.Error()
	for _, s := range secrets {
		if s != "" && strings.Contains(msg, s) {
			t.Errorf("error %q names the destination (%q)", msg, s)
		}
	}
}

// hostPort splits an httptest URL into what must never appear in an error.
func hostPort(t *testing.T, rawURL string) []string {
	t.Helper()
	rest := rawURL[strings.Index(rawURL, "://")+3:]
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		t.Fatalf("split %q: %v", rest, err)
	}
	return []string{rawURL, rest, host, ":" + port}
}

// testPKI is a CA and a server certificate it signed for localhost, 127.0.0.1
// and ::1.
type testPKI struct {
	caFile string
	server tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vibejobs egress test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return testPKI{
		caFile: caFile,
		server: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey},
	}
}
