package egress

import (
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Codes of URLError.
const (
	CodeInvalidURL    = "invalid_url"     // not an absolute http(s) URL of the accepted form
	CodeURLNotAllowed = "url_not_allowed" // well formed, but the policy can never let it through
)

// URLError is a validation failure of a job or subscription URL. Code is
// CodeInvalidURL or CodeURLNotAllowed, Field is "url". Message is meant for the
// user and never echoes the URL or any part of it.
type URLError struct {
	Code    string
	Field   string
	Message string
}

func (e *URLError) Error() string { return e.Message }

func invalidURL(msg string) *URLError {
	return &URLError{Code: CodeInvalidURL, Field: "url", Message: msg}
}

func urlNotAllowed(msg string) *URLError {
	return &URLError{Code: CodeURLNotAllowed, Field: "url", Message: msg}
}

// ValidateURL checks a job or subscription URL when it is created or changed and
// returns it parsed, with an IP-literal host rewritten to its standard notation
// and a host name in lower case. Names are not resolved here: Client.Post checks
// what they resolve to whenever it opens a connection.
//
// Accepted: an absolute https URL, or http to a host the allow list opens (an IP
// literal inside an allowed CIDR, or "localhost" when both 127.0.0.1 and ::1
// are opened); a
// host; no user information; no fragment; a port in 1–65535; at most
// MaxURLLength bytes. A host whose last label is a number is an IPv4 address
// however it is spelled (2130706433, 0177.0.0.1, 0x7f.1, 127.1 — as browsers
// and inet_aton read them), and so is checked by the policy; bracketed IPv6
// literals may carry a zone (ignored by the check, and dropped from an
// IPv4-mapped address, which is dialed over IPv4) and IPv4 forms (checked both
// ways, see Policy.Allowed).
//
// A malformed URL is a *URLError with CodeInvalidURL; a URL that can never be
// delivered (http to a host the allow list does not open, a forbidden IP
// literal, a loopback name while loopback is not opened) one with
// CodeURLNotAllowed.
func (p *Policy) ValidateURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, invalidURL("url is required")
	}
	if len(raw) > MaxURLLength {
		return nil, invalidURL("url is longer than " + strconv.Itoa(MaxURLLength) + " characters")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, invalidURL("url is not a valid URL")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return nil, invalidURL("url must be an absolute https (or http) URL")
	}
	if u.Opaque != "" {
		return nil, invalidURL("url must be an absolute https (or http) URL")
	}
	if u.User != nil {
		return nil, invalidURL("url must not contain user information")
	}
	if strings.Contains(raw, "#") {
		return nil, invalidURL("url must not contain a fragment")
	}
	if u.Host == "" {
		return nil, invalidURL("url has no host")
	}
	port := u.Port()
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return nil, invalidURL("url port is out of range")
		}
		if port[0] == '0' {
			port = strconv.Itoa(n)
		}
	}

	bracketed := strings.HasPrefix(u.Host, "[")
	ip, name, msg := parseHost(u.Hostname(), bracketed)
	if msg != "" {
		return nil, invalidURL(msg)
	}
	if ip.IsValid() {
		if !validZone(ip.Zone()) {
			return nil, invalidURL("url has a malformed IPv6 zone")
		}
		if !p.Allowed(ip) {
			return nil, urlNotAllowed("url points to an address the egress policy forbids")
		}
		if u.Scheme == "http" && !p.opened(ip) {
			return nil, urlNotAllowed("url must use https: http is allowed only to addresses the allow list opens")
		}
		setHost(u, ip.String(), port)
		return normalForm(u)
	}
	if isLoopbackName(name) && !p.loopbackOpened() {
		return nil, urlNotAllowed("url points to localhost, which the egress policy forbids unless it opens both 127.0.0.1 and ::1 (localhost usually resolves to both); use a loopback address instead")
	}
	if u.Scheme == "http" && strings.TrimSuffix(name, ".") != "localhost" {
		return nil, urlNotAllowed("url must use https: http is allowed only to localhost and to addresses the allow list opens")
	}
	setHost(u, name, port)
	return normalForm(u)
}

// normalForm finishes the normal form of u: a query byte that may not appear
// raw in a request line (a space, a control or non-ASCII byte, a % that
// starts no escape, …) is percent-encoded, as the path's are, since a
// request carrying it raw is refused by the receiving server before any
// handler sees it. The URL must then still fit MaxURLLength: encoding can
// triple a byte, and a URL longer than that is refused at every delivery.
func normalForm(u *url.URL) (*url.URL, error) {
	u.RawQuery = encodeQuery(u.RawQuery)
	if len(u.String()) > MaxURLLength {
		return nil, invalidURL("url is longer than " + strconv.Itoa(MaxURLLength) + " characters once percent-encoded")
	}
	return u, nil
}

// encodeQuery percent-encodes the bytes of a raw query that RFC 3986 does
// not allow there, keeping every valid escape as it is.
func encodeQuery(q string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c == '%' && i+2 < len(q) && isHex(q[i+1]) && isHex(q[i+2]) || c != '%' && queryByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// queryByte reports whether c may appear raw in a query: an unreserved or
// sub-delim character, ':', '@', '/' or '?'.
func queryByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@/?", c) >= 0
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// HostKey names the destination of raw as Client.Post's connection pool
// does, and so as its MaxConnsPerHost counts it: the scheme and the host
// and port after ValidateURL's normalisation, with the scheme's default
// port filled in. Spellings of one destination (Example.COM and
// example.com:443; 127.0.0.1 and 0x7f.1) get one key. It checks nothing
// (ValidateURL does); a URL that does not parse gets "".
func HostKey(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return ""
	}
	port := u.Port()
	if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n)
	}
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	host := strings.ToLower(u.Hostname())
	if ip, name, msg := parseHost(u.Hostname(), strings.HasPrefix(u.Host, "[")); msg == "" {
		host = name
		if ip.IsValid() {
			host = ip.String()
		}
	}
	return u.Scheme + "://" + net.JoinHostPort(host, port)
}

// setHost sets u.Host to host and port, without allocating when it already
// reads so (the common case).
func setHost(u *url.URL, host, port string) {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	} else if port == "" && u.Host == host ||
		port != "" && len(u.Host) == len(host)+1+len(port) && strings.HasPrefix(u.Host, host) &&
			u.Host[len(host)] == ':' && strings.HasSuffix(u.Host, port) {
		return
	}
	if port != "" {
		host += ":" + port
	}
	u.Host = host
}

// validZone reports whether an IPv6 zone is empty or made of unreserved URL
// characters only, so the normalised URL parses back to the same host.
func validZone(z string) bool {
	for i := 0; i < len(z); i++ {
		c := z[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '~' || c == '-') {
			return false
		}
	}
	return true
}

// isLoopbackName reports whether name can only mean a loopback address
// (RFC 6761: localhost and every name under it).
func isLoopbackName(name string) bool {
	name = strings.TrimSuffix(name, ".")
	return name == "localhost" || strings.HasSuffix(name, ".localhost")
}

// parseHost tells an IP literal from a host name. It returns the address, or
// the name in lower case, or a message saying why the host is malformed.
//
// A host that a URL parser or inet_aton would read as an IPv4 address must be
// read as one here too: otherwise "0x7f.1" would pass as a name and reach
// loopback through a resolver that parses numbers.
func parseHost(host string, bracketed bool) (ip netip.Addr, name string, msg string) {
	if bracketed {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return netip.Addr{}, "", "url host is not a valid IPv6 address"
		}
		if a.Is4In6() {
			// Dialed over IPv4, where a zone means nothing; kept, it
			// reached the socket check as "a.b.c.d%zone", no address.
			a = a.WithZone("")
		}
		return a, "", ""
	}
	host = strings.ToLower(host)
	if a, isNumeric, ok := parseIPv4Host(host); isNumeric {
		if !ok {
			return netip.Addr{}, "", "url host is not a valid IPv4 address"
		}
		return a, "", ""
	}
	if !validHostName(host) {
		if strings.ContainsFunc(host, func(r rune) bool { return r >= utf8.RuneSelf }) {
			// An internationalized name: it has an ASCII spelling that
			// resolves alike, which the owner can give instead.
			return netip.Addr{}, "", "url host is not a valid host name: write an internationalized name in its ASCII (xn--) form"
		}
		return netip.Addr{}, "", "url host is not a valid host name"
	}
	return netip.Addr{}, host, ""
}

// validHostName accepts LDH names (letters, digits, hyphen, and the underscore
// found in real internal names) with an optional trailing dot. Anything else,
// including non-ASCII (use the punycode form), is refused so that no other
// parser can read the host differently.
func validHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// parseIPv4Host follows the WHATWG URL Standard's IPv4 parser, which accepts
// what inet_aton accepts: one to four parts, each decimal, octal (leading 0) or
// hexadecimal (0x), the last part filling the remaining bytes. isNumeric reports
// whether the host must be read as an IPv4 address at all (its last label is a
// number); ok whether it is a valid one.
func parseIPv4Host(h string) (addr netip.Addr, isNumeric, ok bool) {
	if len(h) > 1 && h[len(h)-1] == '.' {
		h = h[:len(h)-1]
	}
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return netip.Addr{}, false, false
	}
	// A last label like "08", "99999999999" or "0x100000000" is numeric too: the
	// host is then a malformed address, not a name.
	hex := len(last) >= 2 && (last[:2] == "0x" || last[:2] == "0X")
	if !allDigits(last) && !(hex && allHexDigits(last[2:])) {
		return netip.Addr{}, false, false
	}
	n := strings.Count(h, ".") + 1
	if n > 4 {
		return netip.Addr{}, true, false
	}
	var value uint64
	for i := 0; i < n; i++ {
		part := h
		if j := strings.IndexByte(h, '.'); j >= 0 {
			part, h = h[:j], h[j+1:]
		}
		v, valid := parseIPv4Number(part)
		if !valid {
			return netip.Addr{}, true, false
		}
		if i < n-1 {
			if v > 255 {
				return netip.Addr{}, true, false
			}
			value |= v << (8 * (3 - i))
			continue
		}
		if v >= 1<<(8*(5-n)) {
			return netip.Addr{}, true, false
		}
		value |= v
	}
	v := uint32(value)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true, true
}

// parseIPv4Number parses one part of an IPv4 host. Values above 2^32−1 are
// invalid in every position, so parsing stops there and cannot overflow.
func parseIPv4Number(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	base := uint64(10)
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		d := digitValue(s[i])
		if d >= base {
			return 0, false
		}
		n = n*base + d
		if n > 1<<32-1 {
			return 0, false
		}
	}
	return n, true
}

func digitValue(c byte) uint64 {
	switch {
	case '0' <= c && c <= '9':
		return uint64(c - '0')
	case 'a' <= c && c <= 'f':
		return uint64(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return uint64(c-'A') + 10
	}
	return 99
}

func allHexDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if digitValue(s[i]) >= 16 {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
