package egress_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/egress"
)

const (
	ok         = ""
	invalid    = egress.CodeInvalidURL
	notAllowed = egress.CodeURLNotAllowed
)

type urlCase struct {
	raw      string
	code     string // ok, invalid or notAllowed
	wantHost string // u.Host when accepted, if not ""
}

// Every spelling of a forbidden address, refused by the default policy.
var forbiddenSpellings = []string{
	"https://127.0.0.1/", "https://2130706433/", "https://0177.0.0.1/", "https://0x7f.1/",
	"https://0x7f000001/", "https://0X7F.0.0.1/", "https://127.1/", "https://127.0.1/",
	"https://0177.1/", "https://017700000001/", "https://127.0.0.1./", "https://127.000.000.001/",
	"https://[::1]/", "https://[0:0:0:0:0:0:0:1]/",
	"https://[::ffff:127.0.0.1]/", "https://[::ffff:7f00:1]/", "https://[0:0:0:0:0:ffff:127.0.0.1]/",
	"https://[::127.0.0.1]/", "https://[fe80::1%25eth0]/", "https://[fe80::a9fe:a9fe%25en0]:8443/",
	"https://169.254.169.254/latest/meta-data/", "https://2852039166/", "https://0xa9.0xfe.0xa9.0xfe/",
	"https://0251.0376.0251.0376/", "https://0xa9fea9fe/", "https://169.254.43518/",
	"https://[64:ff9b::a9fe:a9fe]/", "https://[64:ff9b::169.254.169.254]/", "https://[2002:a9fe:a9fe::]/",
	"https://[2001:0:4136:e378:8000:63bf:5601:5601]/", "https://[::ffff:a9fe:a9fe]/",
	"https://10.1/", "https://10.0.0.1:8443/", "https://0xa.1/", "https://012.0.0.1/",
	"https://0/", "https://0x0/", "https://0.0.0.0/", "https://[::]/", "https://[::ffff:0.0.0.0]/",
	"https://192.168.1.1/", "https://172.16.0.1/", "https://100.64.0.1/", "https://198.18.0.1/",
	"https://192.0.0.8/", "https://192.0.2.1/", "https://224.0.0.1/", "https://255.255.255.255/",
	"https://4294967295/", "https://240.0.0.1/", "https://[fc00::1]/", "https://[fd00::1]/",
	"https://[fec0::1]/", "https://[ff02::1]/", "https://[2001:db8::1]/", "https://[3fff::1]/",
	"https://[100::1]/", "https://[64:ff9b:1::a00:1]/", "HTTPS://127.0.0.1/",
	"https://localhost/", "https://LocalHost./", "https://api.localhost/",
	"http://127.0.0.1/", "http://[::1]:8080/", "http://localhost:3000/",
}

func TestValidateURLDefaultPolicy(t *testing.T) {
	p := mustPolicy(t)
	cases := []urlCase{
		{"https://example.test/hook", ok, "example.test"},
		{"https://example.test:8443/x?y=1&z=%20", ok, "example.test:8443"},
		{"HTTPS://Example.TEST/Path", ok, "example.test"},
		{"https://example.test./", ok, "example.test."},
		{"https://exa_mple.internal/", ok, ""},
		{"https://8.8.8.8/", ok, "8.8.8.8"},
		{"https://134744072/", ok, "8.8.8.8"},
		{"https://0x8.0x8.0x8.0x8/", ok, "8.8.8.8"},
		{"https://[2606:4700:4700::1111]:443/", ok, "[2606:4700:4700::1111]:443"},
		{"https://[2606:4700:4700:0:0:0:0:1111]/", ok, "[2606:4700:4700::1111]"},
		{"https://example.test:/", ok, "example.test"},
		{"https://example.test:0443/", ok, "example.test:443"},
		{"https://example.test:65535/", ok, ""},
		{"https://xn--exmple-cua.test/", ok, ""},
		{"https://1.2.3.example/", ok, ""},
		{"https://" + strings.Repeat("a", 2048-len("https://.com")) + ".com", invalid, ""}, // labels too long
		{"http://example.test/", notAllowed, ""},
		{"http://8.8.8.8/", notAllowed, ""},
		{"ftp://example.test/", invalid, ""},
		{"file:///etc/passwd", invalid, ""},
		{"gopher://example.test/", invalid, ""},
		{"javascript:alert(1)", invalid, ""},
		{"https:example.test", invalid, ""},
		{"//example.test/", invalid, ""},
		{"example.test", invalid, ""},
		{"", invalid, ""},
		{"https://", invalid, ""},
		{"https:///path", invalid, ""},
		{"https://:443/", invalid, ""},
		{"https://user:pass@example.test/", invalid, ""},
		{"https://user@example.test/", invalid, ""},
		{"https://@example.test/", invalid, ""},
		{"https://127.0.0.1\\@example.test/", invalid, ""},
		{"https://example.test/#frag", invalid, ""},
		{"https://example.test/#", invalid, ""},
		{"https://example.test:0/", invalid, ""},
		{"https://example.test:65536/", invalid, ""},
		{"https://example.test:99999999999999999999/", invalid, ""},
		{"https://example.test:-1/", invalid, ""},
		{"https://exämple.com/", invalid, ""},
		{"https://ex ample.com/", invalid, ""},
		{"https://-example.test/", invalid, ""},
		{"https://a..b/", invalid, ""},
		{"https://example.test%2f@x/", invalid, ""},
		{"https://1.2.3.4.5/", invalid, ""},
		{"https://256.1.1.1/", invalid, ""},
		{"https://1.2.3.256/", invalid, ""},
		{"https://1.2.65536/", invalid, ""},
		{"https://08.1.1.1/", invalid, ""},
		{"https://example.08/", invalid, ""},
		{"https://example.123/", invalid, ""},
		{"https://99999999999/", invalid, ""},
		{"https://4294967296/", invalid, ""},
		{"https://0x100000000/", invalid, ""},
		{"https://1.0x1000000/", invalid, ""},
		{"https://0x7f.0x/", notAllowed, ""}, // 127.0.0.0
		{"https://0xg/", ok, "0xg"},          // not a number: a name
		{"https://1.2.3.0x1g/", ok, ""},
		{"https://[127.0.0.1]/", invalid, ""},
		{"https://[example.test]/", invalid, ""},
		{"https://[fe80::1%eth0]/", invalid, ""},
		{" https://example.test/", invalid, ""},
		{"https://example.test/\n", invalid, ""},
		{"https://%31%32%37.0.0.1/", invalid, ""}, // browsers decode it; Go's parser refuses it
		{"https://exa%6dple.com/", invalid, ""},
	}
	for _, raw := range forbiddenSpellings {
		cases = append(cases, urlCase{raw, notAllowed, ""})
	}
	runURLCases(t, p, cases)
}

// TestValidateURLInternationalizedName: an internationalized host name is
// refused (its ASCII form is accepted, above), with a message that says what
// to write instead, however the URL spells it.
func TestValidateURLInternationalizedName(t *testing.T) {
	p := mustPolicy(t)
	for _, raw := range []string{"https://exämple.com/", "https://ex%C3%A4mple.com/hook", "https://EXÄMPLE.com/"} {
		_, err := p.ValidateURL(raw)
		var ue *egress.URLError
		if !errors.As(err, &ue) || ue.Code != egress.CodeInvalidURL || !strings.Contains(ue.Message, "xn--") {
			t.Errorf("ValidateURL(%q) = %v; want invalid_url naming the xn-- form", raw, err)
		}
	}
	_, err := p.ValidateURL("https://ex ample.com/")
	if err == nil || strings.Contains(err.Error(), "xn--") {
		t.Errorf("ValidateURL of an ASCII name with a space = %v; want a refusal without the xn-- advice", err)
	}
}

func TestValidateURLLength(t *testing.T) {
	p := mustPolicy(t)
	base := "https://example.test/"
	exact := base + strings.Repeat("a", egress.MaxURLLength-len(base))
	runURLCases(t, p, []urlCase{
		{exact, ok, "example.test"},
		{exact + "a", invalid, ""},
		{base + strings.Repeat("a", 1<<20), invalid, ""},
	})
}

// TestValidateURLNormalForm: a query byte that may not appear raw in a
// request line is percent-encoded (a receiving server refuses the request
// before any handler sees it), valid escapes are kept, and a URL that
// encoding makes longer than MaxURLLength is refused: every delivery would
// refuse it.
func TestValidateURLNormalForm(t *testing.T) {
	p := mustPolicy(t)
	for raw, want := range map[string]string{
		"https://example.test/hook?team=a b":       "https://example.test/hook?team=a%20b",
		"https://example.test/?q=%zz&r=%4":         "https://example.test/?q=%25zz&r=%254",
		"https://example.test/?q=é&x=\"<>{}|^`\\":  "https://example.test/?q=%C3%A9&x=%22%3C%3E%7B%7D%7C%5E%60%5C",
		"https://example.test/p?a=%41&b=c/d?e:f@g": "https://example.test/p?a=%41&b=c/d?e:f@g",
		"https://example.test/é?":                  "https://example.test/%C3%A9?",
	} {
		u, err := p.ValidateURL(raw)
		if err != nil || u.String() != want {
			t.Errorf("ValidateURL(%q) = %v, %v; want %s", raw, u, err, want)
			continue
		}
		if again, err := p.ValidateURL(u.String()); err != nil || again.String() != want {
			t.Errorf("ValidateURL of the normal form %s = %v, %v", want, again, err)
		}
	}
	long := "https://example.test/" + strings.Repeat("é", 600)
	if len(long) > egress.MaxURLLength {
		t.Fatalf("the test URL is %d bytes", len(long))
	}
	for _, raw := range []string{long, "https://example.test/?" + strings.Repeat("é", 600)} {
		var ue *egress.URLError
		if u, err := p.ValidateURL(raw); !errors.As(err, &ue) || ue.Code != egress.CodeInvalidURL {
			t.Errorf("ValidateURL of %d bytes, longer than %d once encoded = %v, %v; want invalid_url", len(raw), egress.MaxURLLength, u, err)
		}
	}
}

func TestValidateURLLoopbackOpened(t *testing.T) {
	p := mustPolicy(t, loopbackOpen...)
	runURLCases(t, p, []urlCase{
		{"http://127.0.0.1:8080/hook", ok, "127.0.0.1:8080"},
		{"http://0x7f.1/", ok, "127.0.0.1"},
		{"http://2130706433:80/", ok, "127.0.0.1:80"},
		{"http://0177.0.0.1/", ok, "127.0.0.1"},
		{"http://127.1/", ok, "127.0.0.1"},
		{"http://127.0.0.1./", ok, "127.0.0.1"},
		{"http://127.255.255.254/", ok, ""},
		{"http://[::1]:80/", ok, "[::1]:80"},
		{"http://[0::1]/", ok, "[::1]"},
		{"http://[::ffff:127.0.0.1]/", ok, "[::ffff:127.0.0.1]"},
		{"http://localhost:3000/", ok, "localhost:3000"},
		{"http://LOCALHOST./", ok, "localhost."},
		{"https://localhost/", ok, ""},
		{"https://api.localhost/", ok, ""},
		{"https://127.0.0.1/", ok, ""},
		{"http://api.localhost/", notAllowed, ""},
		{"http://example.test/", notAllowed, ""},
		{"http://8.8.8.8/", notAllowed, ""},
		{"http://10.0.0.1/", notAllowed, ""},
		{"http://[::127.0.0.1]/", notAllowed, ""}, // IPv4-compatible: not the IPv4 address itself
		{"http://[64:ff9b::7f00:1]/", notAllowed, ""},
		{"http://0.0.0.0/", notAllowed, ""},
		{"http://[::]/", notAllowed, ""},
		{"https://169.254.169.254/", notAllowed, ""},
		{"http://user@127.0.0.1/", invalid, ""},
		{"http://127.0.0.1/#x", invalid, ""},
	})
}

// TestValidateURLOneLoopbackOpened: localhost usually resolves to both
// 127.0.0.1 and ::1, and an attempt is refused when any address of its name
// is forbidden; with only one opened, the API accepted the name and every
// delivery to it ended blocked. The name is refused up front instead, and the
// opened address itself still taken.
func TestValidateURLOneLoopbackOpened(t *testing.T) {
	for _, allow := range []string{"127.0.0.0/8", "127.0.0.1/32", "::1/128"} {
		p := mustPolicy(t, allow)
		runURLCases(t, p, []urlCase{
			{"http://localhost:3000/", notAllowed, ""},
			{"https://localhost/", notAllowed, ""},
			{"https://api.localhost/", notAllowed, ""},
		})
		if _, err := p.ValidateURL("http://localhost:3000/"); err == nil || !strings.Contains(err.Error(), "127.0.0.1 and ::1") {
			t.Errorf("allow %s: refusal of localhost: %v, want one naming both loopback addresses", allow, err)
		}
	}
	runURLCases(t, mustPolicy(t, "127.0.0.0/8"), []urlCase{{"http://127.0.0.1:3000/", ok, "127.0.0.1:3000"}})
	runURLCases(t, mustPolicy(t, "::1/128"), []urlCase{{"http://[::1]:3000/", ok, "[::1]:3000"}})
}

func TestValidateURLPrivateOpened(t *testing.T) {
	p := mustPolicy(t, "10.0.0.0/8", "fd00::/8")
	runURLCases(t, p, []urlCase{
		{"http://10.1.2.3:8080/", ok, "10.1.2.3:8080"},
		{"http://10.1/", ok, "10.0.0.1"},
		{"http://0xa000001/", ok, "10.0.0.1"},
		{"http://[fd12::1]/", ok, "[fd12::1]"},
		{"https://10.9.9.9/", ok, ""},
		{"http://[::ffff:10.0.0.1]/", ok, ""},
		{"http://11.0.0.1/", notAllowed, ""}, // public, but http needs the allow list
		{"http://192.168.0.1/", notAllowed, ""},
		{"http://localhost/", notAllowed, ""},
		{"https://localhost/", notAllowed, ""},
		{"http://[2002:a00:1::]/", notAllowed, ""},
	})
}

func runURLCases(t *testing.T, p *egress.Policy, cases []urlCase) {
	t.Helper()
	for _, c := range cases {
		u, err := p.ValidateURL(c.raw)
		name := c.raw
		if len(name) > 80 {
			name = name[:80] + "…"
		}
		if c.code == ok {
			if err != nil {
				t.Errorf("%q: %v", name, err)
				continue
			}
			if c.wantHost != "" && u.Host != c.wantHost {
				t.Errorf("%q: host %q, want %q", name, u.Host, c.wantHost)
			}
			continue
		}
		var ue *egress.URLError
		if !errors.As(err, &ue) {
			t.Errorf("%q: got %v (%v), want a URLError with code %s", name, u, err, c.code)
			continue
		}
		if ue.Code != c.code || ue.Field != "url" {
			t.Errorf("%q: code %q field %q (%s), want code %q field url", name, ue.Code, ue.Field, ue.Message, c.code)
		}
		if ue.Message == "" || strings.Contains(ue.Message, "://") || c.raw != "" && strings.Contains(ue.Message, c.raw) {
			t.Errorf("%q: message %q is empty or echoes the URL", name, ue.Message)
		}
	}
}

func FuzzValidateURL(f *testing.F) {
	for _, s := range forbiddenSpellings {
		f.Add(s)
	}
	for _, s := range []string{
		"https://example.test/hook?x=1", "http://localhost:8080/", "http://127.0.0.1:9/",
		"https://[2606:4700::1111]/", "https://0x8.8.8.8/", "https://1.2.3.4.5/",
		"https://u:p@example.test/", "https://example.test/#f", "ftp://x/", "http://[::1]/",
		"https://exa%6dple.com/", "https://1e1/", "https://0x/", "https://0x.0x.0x.0x/",
	} {
		f.Add(s)
	}
	policies := []*egress.Policy{mustPolicy(f), mustPolicy(f, loopbackOpen...), mustPolicy(f, "0.0.0.0/0", "::/0")}
	f.Fuzz(func(t *testing.T, raw string) {
		for _, p := range policies {
			u, err := p.ValidateURL(raw)
			if err != nil {
				var ue *egress.URLError
				if !errors.As(err, &ue) || (ue.Code != invalid && ue.Code != notAllowed) || ue.Field != "url" {
					t.Fatalf("%q: error %v is not a URLError with a known code", raw, err)
				}
				if strings.Contains(raw, "://") && strings.Contains(ue.Message, raw) {
					t.Fatalf("%q: message %q echoes the URL", raw, ue.Message)
				}
				continue
			}
			if u == nil {
				t.Fatalf("%q: nil URL without error", raw)
			}
			if u.Scheme != "https" && u.Scheme != "http" {
				t.Fatalf("%q: accepted scheme %q", raw, u.Scheme)
			}
			if u.User != nil || u.Fragment != "" || strings.Contains(raw, "#") {
				t.Fatalf("%q: accepted user info or fragment", raw)
			}
			if len(raw) > egress.MaxURLLength {
				t.Fatalf("%q: accepted %d bytes", raw, len(raw))
			}
			host := u.Hostname()
			if host == "" {
				t.Fatalf("%q: accepted without host", raw)
			}
			if ip, err := netip.ParseAddr(host); err == nil {
				if !p.Allowed(ip) {
					t.Fatalf("%q: accepted forbidden literal %s", raw, ip)
				}
			} else {
				// A name must not be something another parser reads as a number.
				labels := strings.Split(strings.TrimSuffix(host, "."), ".")
				last := labels[len(labels)-1]
				if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") && strings.Trim(last[2:], "0123456789abcdef") == "" {
					t.Fatalf("%q: accepted numeric-looking name %q", raw, host)
				}
				if strings.ContainsAny(host, "%[]:\\@ ") || host != strings.ToLower(host) {
					t.Fatalf("%q: accepted odd host %q", raw, host)
				}
				if u.Scheme == "http" && strings.TrimSuffix(host, ".") != "localhost" {
					t.Fatalf("%q: accepted http to name %q", raw, host)
				}
			}
			// The normalised URL is accepted again, with the same host.
			again := u.String()
			if len(again) <= egress.MaxURLLength {
				u2, err := p.ValidateURL(again)
				if err != nil {
					t.Fatalf("%q: normalised %q refused: %v", raw, again, err)
				}
				if u2.Host != u.Host {
					t.Fatalf("%q: host %q then %q", raw, u.Host, u2.Host)
				}
			}
		}
	})
}

// TestHostKey: spellings of one destination share a key, as they share the
// client's connection pool (which counts MaxConnsPerHost per key); other
// destinations do not.
func TestHostKey(t *testing.T) {
	same := [][]string{
		{"https://example.test/a", "https://Example.TEST:443/b", "https://example.test:0443?x=1"},
		{"http://127.0.0.1:8080/a", "http://0x7f.0.0.1:8080/b", "http://2130706433:8080", "http://127.1:8080"},
		{"https://[::1]/", "https://[0:0::1]:443/x"},
		{"http://localhost/", "http://LOCALHOST:80/"},
	}
	keys := map[string]int{}
	for i, group := range same {
		for _, raw := range group {
			k := egress.HostKey(raw)
			if k == "" {
				t.Fatalf("HostKey(%q) is empty", raw)
			}
			if j, ok := keys[k]; ok && j != i {
				t.Errorf("HostKey(%q) = %q, the key of another destination", raw, k)
			}
			keys[k] = i
			if first := egress.HostKey(group[0]); k != first {
				t.Errorf("HostKey(%q) = %q, want %q as for %q", raw, k, first, group[0])
			}
		}
	}
	for _, pair := range [][2]string{
		{"https://example.test/", "https://example.test:8443/"},
		{"https://example.test/", "http://example.test:443/"},
		{"https://example.test/", "https://other.example/"},
	} {
		if a, b := egress.HostKey(pair[0]), egress.HostKey(pair[1]); a == b {
			t.Errorf("HostKey(%q) = HostKey(%q) = %q, want different keys", pair[0], pair[1], a)
		}
	}
	if k := egress.HostKey("http://[::1"); k != "" {
		t.Errorf("HostKey of a URL that does not parse = %q, want \"\"", k)
	}
}
