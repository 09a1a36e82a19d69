package egress

import (
	"fmt"
	"net/netip"
	"strings"
)

// Policy decides which addresses may be reached. It is immutable after
// NewPolicy and safe for concurrent use.
//
// An address is allowed when it, and every IPv4 address embedded in it, is
// either inside a CIDR of the allow list or outside every range forbidden by
// default. The allow list therefore overrides the default block only for the
// addresses inside it: opening 2002::/16 does not open 6to4 forms of private
// IPv4 addresses, and opening 10.0.0.0/8 opens ::ffff:10.0.0.1 (the same
// destination spelled as IPv6) but not 2002:a00:1:: (a relay to it).
//
// The unspecified addresses 0.0.0.0 and :: are never allowed, whatever the allow
// list says: connecting to them reaches the local host, not a remote one.
type Policy struct {
	allow []netip.Prefix
}

// Forbidden by default: every IPv4 range of the IANA special-purpose registry
// that is not globally reachable, plus multicast and the old class E space.
var forbiddenIPv4 = mustPrefixes(
	"0.0.0.0/8",          // "this network", unspecified
	"10.0.0.0/8",         // private
	"100.64.0.0/10",      // shared address space (carrier-grade NAT)
	"127.0.0.0/8",        // loopback
	"169.254.0.0/16",     // link-local, cloud metadata 169.254.169.254
	"172.16.0.0/12",      // private
	"192.0.0.0/24",       // IETF protocol assignments
	"192.0.2.0/24",       // documentation TEST-NET-1
	"192.88.99.0/24",     // deprecated 6to4 relay anycast
	"192.168.0.0/16",     // private
	"198.18.0.0/15",      // benchmarking
	"198.51.100.0/24",    // documentation TEST-NET-2
	"203.0.113.0/24",     // documentation TEST-NET-3
	"224.0.0.0/4",        // multicast
	"240.0.0.0/4",        // reserved, includes broadcast 255.255.255.255
	"255.255.255.255/32", // broadcast (inside 240.0.0.0/4; named for the reader)
)

// globalUnicastIPv6 is the only IPv6 space IANA has allocated for global
// unicast. Everything outside it is forbidden by default, which covers the
// named ranges below that lie outside it and whatever gets defined there later.
var globalUnicastIPv6 = netip.MustParsePrefix("2000::/3")

// Forbidden by default inside and outside 2000::/3. The ones outside are listed
// so that the list reads as the spec does and the table test can name them.
var forbiddenIPv6 = mustPrefixes(
	"::/128",          // unspecified
	"::1/128",         // loopback
	"::/96",           // IPv4-compatible (deprecated)
	"::ffff:0:0/96",   // IPv4-mapped
	"::ffff:0:0:0/96", // IPv4-translated (SIIT)
	"64:ff9b::/96",    // NAT64 well-known prefix
	"64:ff9b:1::/48",  // NAT64 local use
	"100::/64",        // discard-only
	"2001::/32",       // Teredo
	"2001:2::/48",     // benchmarking
	"2001:10::/28",    // ORCHID (deprecated)
	"2001:db8::/32",   // documentation
	"2002::/16",       // 6to4
	"3fff::/20",       // documentation
	"5f00::/16",       // SRv6 SIDs
	"fc00::/7",        // unique local
	"fe80::/10",       // link-local
	"fec0::/10",       // site-local (deprecated)
	"ff00::/8",        // multicast
)

// ietfProtocolIPv6 is IANA's 2001::/23, IETF protocol assignments: not
// globally reachable, like its IPv4 counterpart 192.0.0.0/24, apart from
// the sub-blocks the registry marks globally reachable
// (globalIETFProtocolIPv6). Its forbidden sub-blocks (Teredo, benchmarking,
// ORCHID) are in forbiddenIPv6 too; an address in none of the registry's
// sub-blocks (2001:5::1) is forbidden as the /23 is.
var (
	ietfProtocolIPv6       = netip.MustParsePrefix("2001::/23")
	globalIETFProtocolIPv6 = mustPrefixes(
		"2001:1::1/128",   // Port Control Protocol anycast
		"2001:1::2/128",   // TURN anycast
		"2001:1::3/128",   // DNS-SD service registration protocol anycast
		"2001:3::/32",     // AMT
		"2001:4:112::/48", // AS112-v6
		"2001:20::/28",    // ORCHIDv2
		"2001:30::/28",    // drone remote ID entity tags
	)
)

// Prefixes whose addresses carry an IPv4 address; see embeddedIPv4.
var (
	ipv4CompatiblePrefix = netip.MustParsePrefix("::/96")
	ipv4TranslatedPrefix = netip.MustParsePrefix("::ffff:0:0:0/96")
	nat64Prefix          = netip.MustParsePrefix("64:ff9b::/96")
	nat64LocalPrefix     = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFourPrefix      = netip.MustParsePrefix("2002::/16")
	teredoPrefix         = netip.MustParsePrefix("2001::/32")
	ipv6Loopback         = netip.IPv6Loopback()
	ipv6Unspecified      = netip.IPv6Unspecified()
	ipv4Loopback         = netip.AddrFrom4([4]byte{127, 0, 0, 1})
)

func mustPrefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, v := range s {
		out[i] = netip.MustParsePrefix(v)
	}
	return out
}

// NewPolicy returns a policy that opens the given CIDRs on top of the default
// block. A bare address stands for a /32 or /128. IPv4 destinations are opened
// with IPv4 CIDRs: an IPv4-mapped prefix such as ::ffff:10.0.0.0/104 opens only
// the mapped spellings, and those only where the IPv4 address is open too. More
// than MaxAllowedCIDRs entries, a zone, a CIDR with address bits set past its
// prefix length (10.1.2.3/8) or an unparsable entry is an error.
func NewPolicy(allow []string) (*Policy, error) {
	if len(allow) > MaxAllowedCIDRs {
		return nil, fmt.Errorf("egress allow list: %d entries, at most %d", len(allow), MaxAllowedCIDRs)
	}
	p := &Policy{allow: make([]netip.Prefix, 0, len(allow))}
	for _, s := range allow {
		prefix, err := parseAllowEntry(s)
		if err != nil {
			return nil, err
		}
		p.allow = append(p.allow, prefix)
	}
	return p, nil
}

func parseAllowEntry(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	var prefix netip.Prefix
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("egress allow list: %q is not a CIDR", s)
		}
		prefix = p
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("egress allow list: %q is not a CIDR or an IP address", s)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("egress allow list: %q has a zone", s)
		}
		prefix = netip.PrefixFrom(a, a.BitLen())
	}
	if prefix.Addr().Is4In6() && prefix.Bits() < 96 {
		// Below /96 an IPv4-mapped entry names no IPv4 range:
		// ::ffff:10.0.0.0/8, meant as 10.0.0.0/8, masked to ::/8, which
		// opened the IPv6 loopback instead.
		return netip.Prefix{}, fmt.Errorf("egress allow list: %q is an IPv4-mapped address with a prefix shorter than /96: give the IPv4 CIDR instead", s)
	}
	if m := prefix.Masked(); m != prefix {
		// 10.1.2.3/8 opened all of 10.0.0.0/8, a range 2^24 times wider
		// than the address the entry seems to name: which was meant is the
		// operator's to say.
		return netip.Prefix{}, fmt.Errorf("egress allow list: %q has address bits set past its /%d: give %s for the whole range, or %s alone for the one address",
			s, prefix.Bits(), m, prefix.Addr())
	}
	return prefix, nil
}

// ParseAllowList splits the value of VIBEJOBS_ALLOW_PRIVATE: CIDRs or bare IP
// addresses separated by commas, spaces around them ignored. An empty value,
// or empty items such as a trailing comma, open nothing. It returns an error for
// an entry NewPolicy would refuse, or for more than MaxAllowedCIDRs entries.
func ParseAllowList(s string) ([]string, error) {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if _, err := parseAllowEntry(item); err != nil {
			return nil, err
		}
		out = append(out, item)
	}
	if len(out) > MaxAllowedCIDRs {
		return nil, fmt.Errorf("egress allow list: %d entries, at most %d", len(out), MaxAllowedCIDRs)
	}
	return out, nil
}

// Allowed reports whether ip may be connected to. It is pure: it neither
// resolves nor dials. A zone is ignored. For an IPv6 address that carries an
// IPv4 address (IPv4-mapped, IPv4-compatible, IPv4-translated, NAT64, 6to4, both
// addresses of Teredo), the IPv6 address and each IPv4 address must pass.
func (p *Policy) Allowed(ip netip.Addr) bool {
	if !ip.IsValid() {
		return false
	}
	ip = ip.WithZone("")
	if ip.Unmap().IsUnspecified() {
		return false
	}
	if !p.permitted(ip) {
		return false
	}
	embedded, n := embeddedIPv4(ip)
	for _, v4 := range embedded[:n] {
		if !p.permitted(v4) {
			return false
		}
	}
	return true
}

// permitted checks one address without looking inside it.
func (p *Policy) permitted(ip netip.Addr) bool {
	return p.opened(ip) || !forbiddenByDefault(ip)
}

// opened reports whether the allow list contains ip. An IPv4-mapped address is
// the IPv4 address spelled as IPv6 (the kernel connects to it over IPv4), so
// IPv4 CIDRs apply to it.
func (p *Policy) opened(ip netip.Addr) bool {
	ip = ip.WithZone("")
	unmapped := ip.Unmap()
	for _, prefix := range p.allow {
		if prefix.Contains(ip) || prefix.Contains(unmapped) {
			return true
		}
	}
	return false
}

// loopbackOpened reports whether a name that can only mean loopback
// ("localhost") may be used: both loopback addresses must be opened, since
// such a name usually resolves to both (/etc/hosts) and an attempt is
// refused when any address of its name is forbidden. With one opened, the
// name would pass here and every delivery to it end blocked.
func (p *Policy) loopbackOpened() bool {
	return p.Allowed(ipv4Loopback) && p.Allowed(ipv6Loopback)
}

func forbiddenByDefault(ip netip.Addr) bool {
	if ip.Is4() {
		for _, prefix := range forbiddenIPv4 {
			if prefix.Contains(ip) {
				return true
			}
		}
		return false
	}
	if !globalUnicastIPv6.Contains(ip) {
		return true
	}
	for _, prefix := range forbiddenIPv6 {
		if prefix.Contains(ip) {
			return true
		}
	}
	if ietfProtocolIPv6.Contains(ip) {
		for _, prefix := range globalIETFProtocolIPv6 {
			if prefix.Contains(ip) {
				return false
			}
		}
		return true
	}
	return false
}

// embeddedIPv4 returns the IPv4 addresses an IPv6 address carries, where a
// translator, a relay or the kernel would take them from. For 64:ff9b:1::/48 it
// assumes the /96 layout of RFC 6052 (the IPv4 address in the last 32 bits).
// :: and ::1 are the IPv6 unspecified and loopback addresses, not IPv4-compatible
// forms of 0.0.0.0 and 0.0.0.1.
func embeddedIPv4(ip netip.Addr) (out [2]netip.Addr, n int) {
	if !ip.Is6() {
		return out, 0
	}
	b := ip.As16()
	last32 := netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	switch {
	case ip.Is4In6():
		out[0], n = ip.Unmap(), 1
	case ipv4CompatiblePrefix.Contains(ip):
		if ip != ipv6Unspecified && ip != ipv6Loopback {
			out[0], n = last32, 1
		}
	case ipv4TranslatedPrefix.Contains(ip), nat64Prefix.Contains(ip), nat64LocalPrefix.Contains(ip):
		out[0], n = last32, 1
	case sixToFourPrefix.Contains(ip):
		out[0], n = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), 1
	case teredoPrefix.Contains(ip):
		server := netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]})
		client := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		out[0], out[1], n = server, client, 2
	}
	return out, n
}
