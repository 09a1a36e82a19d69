// Package display makes text that others wrote (job, project and token
// names, schedules, URLs, failure reasons, response snippets) safe to show
// to an operator: every character that would not show as itself, such as
// a control character that drives a terminal or a bidirectional override
// that makes one name render as another, is spelt out as a Go escape.
package display

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Escape returns s with every character that is not graphic
// (strconv.IsGraphic: letters, marks, numbers, punctuation, symbols and
// spaces) written as its Go escape: control characters, tab and line breaks
// included (\x1b, \t, \u0085), format characters such as bidirectional
// embeddings, overrides, isolates and zero-width characters (\u202e,
// \u200b), the line and paragraph separators, tag characters (\U000e0041),
// private-use and unassigned code points. Each byte of invalid UTF-8 becomes
// \xNN. So the result is valid UTF-8 of graphic characters only, one line,
// and Escape(Escape(s)) == Escape(s). A backslash is left as is: text that
// already holds "\u202e" reads like text that held the character.
func Escape(s string) string { return escape(s, false) }

// EscapeKeepingLayout is Escape, but keeps tab, newline and carriage
// return: for text shown where they lay out rather than act, such as an
// HTML page.
func EscapeKeepingLayout(s string) string { return escape(s, true) }

func escape(s string, layout bool) string {
	i := 0
	for i < len(s) && (s[i] >= 0x20 && s[i] < 0x7f || layout && isLayout(s[i])) {
		i++
	}
	if i == len(s) {
		return s // printable ASCII: the common case
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case strconv.IsGraphic(r) || layout && r < utf8.RuneSelf && isLayout(byte(r)):
			b.WriteString(s[i : i+size])
		default:
			q := strconv.QuoteRuneToGraphic(r) // '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

func isLayout(c byte) bool { return c == '\t' || c == '\n' || c == '\r' }
