package display_test

import (
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/vibejobs/vibejobs/internal/display"
)

func TestEscape(t *testing.T) {
	for _, c := range []struct{ in, want, layout string }{
		{"plain name", "plain name", "plain name"},
		{"Bericht für مرحبا 日本", "Bericht für مرحبا 日本", "Bericht für مرحبا 日本"},
		{"report\u202egpj.exe", `report\u202egpj.exe`, `report\u202egpj.exe`},
		{"UTC\x1b[2J\a", `UTC\x1b[2J\a`, `UTC\x1b[2J\a`},
		{"a\tb\nc\rd", `a\tb\nc\rd`, "a\tb\nc\rd"},
		{"vt\vff\fdel\x7f", `vt\vff\fdel\x7f`, `vt\vff\fdel\x7f`},
		{"nel\u0085csi\u009bls\u2028ps\u2029", `nel\u0085csi\u009bls\u2028ps\u2029`, `nel\u0085csi\u009bls\u2028ps\u2029`},
		{"zw\u200bbom\ufeffshy\u00adtag\U000e0041", `zw\u200bbom\ufeffshy\u00adtag\U000e0041`, `zw\u200bbom\ufeffshy\u00adtag\U000e0041`},
		{"bad\xff\xc3utf8", `bad\xff\xc3utf8`, `bad\xff\xc3utf8`},
		{"private\ue000", `private\ue000`, `private\ue000`},
	} {
		if got := display.Escape(c.in); got != c.want {
			t.Errorf("Escape(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := display.EscapeKeepingLayout(c.in); got != c.layout {
			t.Errorf("EscapeKeepingLayout(%q) = %q, want %q", c.in, got, c.layout)
		}
	}
}

// FuzzEscape: whatever the input, the result is valid UTF-8 of graphic
// characters only (with tab, newline and carriage return when the layout
// is kept), and escaping it again changes nothing.
func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "name", "report\u202egpj.exe", "\x1b]0;x\a", "a\tb\n", "\xff\xfe", "日本\u200b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, layout := range []bool{false, true} {
			esc := display.Escape
			if layout {
				esc = display.EscapeKeepingLayout
			}
			out := esc(s)
			if !utf8.ValidString(out) {
				t.Fatalf("layout %v: %q is not valid UTF-8", layout, out)
			}
			for _, r := range out {
				if !strconv.IsGraphic(r) && !(layout && (r == '\t' || r == '\n' || r == '\r')) {
					t.Fatalf("layout %v: %q holds %U", layout, out, r)
				}
			}
			if again := esc(out); again != out {
				t.Fatalf("layout %v: escaping %q again gave %q", layout, out, again)
			}
		}
	})
}
