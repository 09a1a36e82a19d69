package web

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// visible returns s as a page may show it: every character that renders as
// nothing, or changes how the text around it renders, is spelt out as a Go
// escape (\u202e, \U000e0041), so that one name cannot pass for another.
// That is the format characters (bidirectional embeddings, overrides,
// isolates and marks, zero-width characters, the BOM, the soft hyphen, tag
// characters), the line and paragraph separators, and the control
// characters but tab, newline and carriage return. Invalid UTF-8 becomes
// U+FFFD. html/template escapes markup, not these; visible is for text
// that others wrote: names, URLs, response snippets.
func visible(s string) string {
	i := strings.IndexFunc(s, hidden)
	if i < 0 && utf8.ValidString(s) {
		return s
	}
	if i < 0 {
		i = 0
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for _, r := range strings.ToValidUTF8(s[i:], string(utf8.RuneError)) {
		if !hidden(r) {
			b.WriteRune(r)
			continue
		}
		if r <= 0xffff {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	return b.String()
}

func hidden(r rune) bool {
	switch {
	case r == '\t' || r == '\n' || r == '\r':
		return false
	case r < 0x80:
		return r < 0x20 || r == 0x7f
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
}
