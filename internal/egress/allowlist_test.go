package egress_test

// These tests never open a connection: the dial hook records the address it
// is asked for and refuses.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/vibejobs/vibejobs/internal/egress"
)

// recordingDial records every address Post asks to dial and never dials.
type recordingDial struct {
	mu    sync.Mutex
	addrs []string
}

func (r *recordingDial) DialContext(_ context.Context, _, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.addrs = append(r.addrs, addr)
	r.mu.Unlock()
	return nil, errors.New("dial refused by the test")
}

func (r *recordingDial) Addrs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.addrs...)
}

func recordingClient(t *testing.T, p *egress.Policy, answers map[string][]string) (*egress.Client, *recordingDial) {
	t.Helper()
	rec := &recordingDial{}
	c, err := egress.NewClient(egress.Config{Policy: p, Resolver: staticResolver(t, answers), DialContext: rec.DialContext})
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

// TestAllowListMappedPrefix: an allow-list entry written as an IPv4-mapped
// address with a prefix below /96 ("::ffff:10.0.0.0/8", meant as
// 10.0.0.0/8) is refused: it was taken and masked to ::/8, which opened the
// IPv6 loopback ::1 and nothing of 10.0.0.0/8.
func TestAllowListMappedPrefix(t *testing.T) {
	if p := mustPolicy(t, "::ffff:0:0/96"); p.Allowed(netip.MustParseAddr("::1")) {
		t.Error("::ffff:0:0/96 opens ::1")
	}
	entry := "::ffff:10.0.0.0/8"
	if _, err := egress.ParseAllowList(entry); err == nil {
		t.Errorf("ParseAllowList(%q): no error; want one (an IPv4-mapped address with a prefix length below 96 is not an IPv4 CIDR)", entry)
	}
	p, err := egress.NewPolicy([]string{entry})
	if err != nil {
		return // refused: the expected behaviour
	}
	t.Errorf("NewPolicy(%q): no error", entry)
	if p.Allowed(netip.MustParseAddr("::1")) {
		t.Errorf("NewPolicy(%q) allows ::1 (IPv6 loopback)", entry)
	}
	if _, err := p.ValidateURL("https://[::1]:6379/"); err == nil {
		t.Errorf("NewPolicy(%q): ValidateURL accepts https://[::1]:6379/", entry)
	}
	c, rec := recordingClient(t, p, nil)
	res := c.Post(context.Background(), "https://[::1]:6379/", nil, nil, 0)
	if res.ErrorCode != egress.CodeBlocked || len(rec.Addrs()) != 0 {
		t.Errorf("Post to https://[::1]:6379/: code %q, dialed %q; want blocked and no dial", res.ErrorCode, rec.Addrs())
	}
}

// TestCleartextOnlyToOpenedAddresses: http is accepted only to addresses
// the allow list opens, and to the name "localhost" when loopback is
// opened; at connect time every address of an http destination must be
// opened too. Checked only against Allowed, a "localhost" that resolved to a
// public address got the request in cleartext.
func TestCleartextOnlyToOpenedAddresses(t *testing.T) {
	p := mustPolicy(t, "127.0.0.0/8", "::1")
	c, rec := recordingClient(t, p, map[string][]string{"localhost": {"8.8.8.8"}})
	res := c.Post(context.Background(), "http://localhost:8080/hook", nil, []byte("{}"), 0)
	if got := rec.Addrs(); len(got) != 0 {
		t.Errorf("http://localhost resolving to a public address: Post asked to dial %q in cleartext (code %q); want blocked, no dial", got, res.ErrorCode)
	}
	if res.ErrorCode != egress.CodeBlocked {
		t.Errorf("code %q, want %q", res.ErrorCode, egress.CodeBlocked)
	}
}
