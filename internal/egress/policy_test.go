package egress_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/egress"
)

// Every range forbidden by default, as the spec lists them.
var forbiddenV4 = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"255.255.255.255/32",
}

var forbiddenV6 = []string{
	"::/128", "::1/128", "::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96",
	"64:ff9b:1::/48", "100::/64", "2001::/32", "2001:2::/48", "2001:10::/28",
	"2001:db8::/32", "2002::/16", "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10",
	"fec0::/10", "ff00::/8",
}

// firstMiddleLast returns the first, a middle and the last address of a prefix.
func firstMiddleLast(p netip.Prefix) []netip.Addr {
	p = p.Masked()
	first := p.Addr()
	b := first.AsSlice()
	last := slices.Clone(b)
	middle := slices.Clone(b)
	bits := p.Bits()
	for i := bits; i < len(b)*8; i++ {
		last[i/8] |= 1 << (7 - i%8)
	}
	if bits < len(b)*8 {
		middle[bits/8] |= 1 << (7 - bits%8) // the upper half's first address
		for i := len(b) - 1; i > bits/8; i-- {
			middle[i] |= 0x5a // and some bits below it
		}
	}
	m, _ := netip.AddrFromSlice(middle)
	l, _ := netip.AddrFromSlice(last)
	if !p.Contains(m) {
		m = first
	}
	return []netip.Addr{first, m, l}
}

// wrappers returns the IPv6 forms that carry v4, by name.
func wrappers(v4 netip.Addr) map[string]netip.Addr {
	b := v4.As4()
	inv := [4]byte{^b[0], ^b[1], ^b[2], ^b[3]}
	mk := func(f string, args ...any) netip.Addr { return netip.MustParseAddr(fmt.Sprintf(f, args...)) }
	return map[string]netip.Addr{
		"mapped":     netip.AddrFrom16(v4.As16()),
		"compatible": mk("::%x:%x", uint16(b[0])<<8|uint16(b[1]), uint16(b[2])<<8|uint16(b[3])),
		"translated": mk("::ffff:0:%x:%x", uint16(b[0])<<8|uint16(b[1]), uint16(b[2])<<8|uint16(b[3])),
		"nat64":      mk("64:ff9b::%x:%x", uint16(b[0])<<8|uint16(b[1]), uint16(b[2])<<8|uint16(b[3])),
		"nat64local": mk("64:ff9b:1::%x:%x", uint16(b[0])<<8|uint16(b[1]), uint16(b[2])<<8|uint16(b[3])),
		"6to4":       mk("2002:%x:%x::1", uint16(b[0])<<8|uint16(b[1]), uint16(b[2])<<8|uint16(b[3])),
		// Teredo: server 65.54.227.120 (public), client v4 inverted in the last 32 bits.
		"teredo": mk("2001:0:4136:e378:8000:63bf:%x:%x", uint16(inv[0])<<8|uint16(inv[1]), uint16(inv[2])<<8|uint16(inv[3])),
	}
}

// wrapperPrefixesOpen opens every IPv4-carrying IPv6 prefix, so that only the
// embedded IPv4 address decides.
var wrapperPrefixesOpen = []string{"::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32"}

func TestAllowedForbidsEveryDefaultRange(t *testing.T) {
	def := mustPolicy(t)
	wrapOpen := mustPolicy(t, wrapperPrefixesOpen...)
	for _, cidr := range forbiddenV4 {
		for _, a := range firstMiddleLast(netip.MustParsePrefix(cidr)) {
			if def.Allowed(a) {
				t.Errorf("%s (%s): allowed by default", a, cidr)
			}
			for form, w := range wrappers(a) {
				if def.Allowed(w) {
					t.Errorf("%s (%s form of %s in %s): allowed by default", w, form, a, cidr)
				}
				// ::0.0.0.1 is ::1, the IPv6 loopback, which ::/96 opens.
				if form == "compatible" && w == netip.IPv6Loopback() {
					continue
				}
				if wrapOpen.Allowed(w) {
					t.Errorf("%s (%s form of %s in %s): allowed when the IPv6 prefix is opened", w, form, a, cidr)
				}
			}
		}
	}
	for _, cidr := range forbiddenV6 {
		for _, a := range firstMiddleLast(netip.MustParsePrefix(cidr)) {
			if def.Allowed(a) {
				t.Errorf("%s (%s): allowed by default", a, cidr)
			}
			if z := a.WithZone("eth0"); def.Allowed(z) {
				t.Errorf("%s (%s): allowed with a zone", z, cidr)
			}
		}
	}
	if def.Allowed(netip.Addr{}) {
		t.Error("the zero Addr is allowed")
	}
}

func TestAllowedPublicAddresses(t *testing.T) {
	def := mustPolicy(t)
	wrapOpen := mustPolicy(t, wrapperPrefixesOpen...)
	public4 := []string{
		"8.8.8.8", "1.1.1.1", "9.9.9.9", "93.184.215.14", "151.101.1.140",
		// neighbours of forbidden ranges
		"1.0.0.0", "9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0",
		"126.255.255.255", "128.0.0.0", "169.253.255.255", "169.255.0.0", "172.15.255.255",
		"172.32.0.0", "192.0.1.255", "192.0.3.0", "192.167.255.255", "192.169.0.0",
		"198.17.255.255", "198.20.0.0", "223.255.255.255",
	}
	for _, s := range public4 {
		a := netip.MustParseAddr(s)
		if !def.Allowed(a) {
			t.Errorf("%s: refused by default", a)
		}
		for form, w := range wrappers(a) {
			if def.Allowed(w) {
				t.Errorf("%s (%s form of %s): allowed by default", w, form, a)
			}
			if !wrapOpen.Allowed(w) {
				t.Errorf("%s (%s form of %s): refused with its IPv6 prefix opened", w, form, a)
			}
		}
	}
	public6 := []string{
		"2606:4700:4700::1111", "2001:4860:4860::8888", "2620:fe::fe", "2a00:1450:4001:80b::200e",
		"2003::1", "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db9::", "2001:1:0:0::1",
		// 2001::/23's globally reachable sub-blocks.
		"2001:1::2", "2001:1::3", "2001:3::1", "2001:3:ffff:ffff:ffff:ffff:ffff:ffff", "2001:4:112::1",
		"2001:4:112:ffff::1", "2001:20::1", "2001:2f:ffff::1", "2001:30::1", "2001:3f:ffff::1",
		"2001:200::1",
		"3ffe:ffff::1", "3fff:1000::",
	}
	for _, s := range public6 {
		if a := netip.MustParseAddr(s); !def.Allowed(a) {
			t.Errorf("%s: refused by default", a)
		}
	}
	for _, s := range []string{"1fff:ffff::1", "4000::1", "::2:1", "100:0:0:1::"} {
		if a := netip.MustParseAddr(s); def.Allowed(a) {
			t.Errorf("%s: outside 2000::/3, allowed by default", a)
		}
	}
	// 2001::/23 outside the sub-blocks IANA marks globally reachable.
	for _, s := range []string{"2001:1::", "2001:1::4", "2001:4::1", "2001:4:113::1", "2001:5::1",
		"2001:40::1", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff"} {
		if a := netip.MustParseAddr(s); def.Allowed(a) {
			t.Errorf("%s: in 2001::/23, IETF protocol assignments, allowed by default", a)
		}
	}
}

func TestAllowedAllowList(t *testing.T) {
	cases := []struct {
		allow []string
		addr  string
		want  bool
	}{
		{[]string{"10.0.0.0/8"}, "10.1.2.3", true},
		{[]string{"10.0.0.0/8"}, "11.0.0.1", true},
		{[]string{"10.0.0.0/8"}, "192.168.0.1", false},
		{[]string{"10.0.0.0/8"}, "::ffff:10.1.2.3", true}, // the same destination spelled as IPv6
		{[]string{"10.0.0.0/8"}, "2002:a01:203::", false}, // a relay to it is not opened
		{[]string{"10.0.0.0/8"}, "64:ff9b::a01:203", false},
		{[]string{"10.0.0.0/8", "64:ff9b::/96"}, "64:ff9b::a01:203", true},
		{[]string{"10.0.0.0/8", "2002::/16"}, "2002:a01:203::", true},
		{[]string{"2002::/16"}, "2002:a01:203::", false},
		{[]string{"::ffff:0:0/96"}, "::ffff:10.1.2.3", false}, // only when the IPv4 is allowed
		{[]string{"::ffff:0:0/96"}, "::ffff:8.8.8.8", true},
		{[]string{"::ffff:10.0.0.0/104"}, "10.200.0.1", false}, // IPv4 is opened with IPv4 CIDRs
		{[]string{"::ffff:10.0.0.0/104"}, "::ffff:10.200.0.1", false},
		{[]string{"127.0.0.1"}, "127.0.0.1", true},
		{[]string{"127.0.0.1"}, "127.0.0.2", false},
		{[]string{"127.0.0.1"}, "::1", false},
		{[]string{"::1"}, "::1", true},
		{[]string{"::1"}, "127.0.0.1", false},
		{[]string{"169.254.169.254/32"}, "169.254.169.254", true},
		{[]string{"169.254.169.254/32"}, "169.254.169.253", false},
		{[]string{"fd00::/8"}, "fd12:3456::1", true},
		{[]string{"fd00::/8"}, "fc00::1", false},
		{[]string{"fe80::/10"}, "fe80::1%eth0", true},
		{[]string{"0.0.0.0/0"}, "10.0.0.1", true},
		{[]string{"0.0.0.0/0"}, "0.0.0.0", false}, // unspecified: never
		{[]string{"::/0"}, "::", false},
		{[]string{"::/0"}, "::ffff:0.0.0.0", false},
		{[]string{"2001::/32"}, "2001:0:4136:e378:8000:63bf:f7f7:f7f7", true},  // client 8.8.8.8
		{[]string{"2001::/32"}, "2001:0:4136:e378:8000:63bf:f5ff:fffe", false}, // client 10.0.0.1
		{[]string{"2001::/32"}, "2001:0:a00:1:8000:63bf:f7f7:f7f7", false},     // server 10.0.0.1
	}
	for _, c := range cases {
		p := mustPolicy(t, c.allow...)
		if got := p.Allowed(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("allow %q: Allowed(%s) = %v, want %v", c.allow, c.addr, got, c.want)
		}
	}
}

func TestNewPolicyRejects(t *testing.T) {
	tooMany := make([]string, egress.MaxAllowedCIDRs+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	for _, allow := range [][]string{
		tooMany, {"10.0.0.0/33"}, {"nonsense"}, {"fe80::1%eth0"}, {""}, {"10.0.0.0/8/8"}, {"::1/129"},
	} {
		if _, err := egress.NewPolicy(allow); err == nil {
			t.Errorf("NewPolicy(%.40q): no error", allow)
		}
	}
	if _, err := egress.NewPolicy(tooMany[:egress.MaxAllowedCIDRs]); err != nil {
		t.Errorf("NewPolicy with %d entries: %v", egress.MaxAllowedCIDRs, err)
	}
}

// TestNewPolicyRefusesHostBits: 10.1.2.3/8 was masked to 10.0.0.0/8,
// opening 16 million addresses for an entry that reads as one; it is
// refused, the message offering both readings.
func TestNewPolicyRefusesHostBits(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.3/8":          "give 10.0.0.0/8 for the whole range, or 10.1.2.3 alone",
		"192.168.1.1/24":      "give 192.168.1.0/24",
		"fd00::1/8":           "give fd00::/8",
		"::ffff:10.1.0.0/104": "give ::ffff:10.0.0.0/104",
	} {
		_, err := egress.NewPolicy([]string{in})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewPolicy(%q): %v, want an error saying %q", in, err, want)
		}
		if _, err := egress.ParseAllowList(in); err == nil {
			t.Errorf("ParseAllowList(%q): no error", in)
		}
	}
	for _, in := range []string{"10.0.0.0/8", "10.1.2.3/32", "10.1.2.3", "fd00::/8", "::1/128", "0.0.0.0/0"} {
		if _, err := egress.NewPolicy([]string{in}); err != nil {
			t.Errorf("NewPolicy(%q): %v", in, err)
		}
	}
}

func TestParseAllowList(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"   ", nil},
		{"10.0.0.0/8", []string{"10.0.0.0/8"}},
		{" 10.0.0.0/8 , ::1 ,", []string{"10.0.0.0/8", "::1"}},
		{"127.0.0.1,,fd00::/8", []string{"127.0.0.1", "fd00::/8"}},
	}
	for _, c := range cases {
		got, err := egress.ParseAllowList(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseAllowList(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	many := strings.Repeat("10.0.0.1,", egress.MaxAllowedCIDRs+1)
	for _, in := range []string{"10.0.0.0/8;192.168.0.0/16", "10.0.0.0/8 192.168.0.0/16", "localhost", many} {
		if got, err := egress.ParseAllowList(in); err == nil {
			t.Errorf("ParseAllowList(%.40q) = %q, want an error", in, got)
		}
	}
}
