package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/vibejobs/vibejobs"
)

// member is one member of a JSON object, its value still encoded.
type member struct {
	key   string
	value json.RawMessage
}

// object is a decoded JSON object whose members are checked one by one, so
// every error can name the field it concerns: an unknown member, a repeated
// member, null where a value is required and a value of the wrong type are
// all refused.
type object struct {
	prefix  string // "retry." for a nested object
	members []member
}

// decodeObject parses data as exactly one JSON object (surrounding whitespace
// allowed, nothing else). field names the object in errors; "" for the body.
func decodeObject(data []byte, field string) (*object, *vibejobs.Error) {
	if field == "" {
		// encoding/json would take both, each as U+FFFD: a URL with a
		// stray byte stored as another URL.
		if !utf8.Valid(data) {
			return nil, invalid("invalid_json", "", "the request body is not UTF-8 text")
		}
		if loneSurrogate(data) {
			return nil, invalid("invalid_json", "", `the request body holds a \u escape of half a surrogate pair, which names no character`)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	notObject := func() *vibejobs.Error {
		if field == "" {
			return invalid("invalid_json", "", "the request body must be one JSON object")
		}
		return invalid("invalid_json", field, "must be a JSON object")
	}
	tok, err := dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) && field == "" {
			return nil, invalid("invalid_json", "", "the request body is empty; it must be one JSON object")
		}
		return nil, syntaxError(err, field)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, notObject()
	}
	o := &object{}
	if field != "" {
		o.prefix = field + "."
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxError(err, field)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, syntaxError(nil, field)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, syntaxError(err, fieldName(o.prefix+key))
		}
		if seen[key] {
			return nil, invalid("invalid_json", fieldName(o.prefix+key), "the field appears more than once")
		}
		seen[key] = true
		o.members = append(o.members, member{key: key, value: raw})
	}
	if tok, err := dec.Token(); err != nil {
		return nil, syntaxError(err, field)
	} else if d, ok := tok.(json.Delim); !ok || d != '}' {
		return nil, syntaxError(nil, field)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, syntaxError(err, field)
		}
		return nil, invalid("invalid_json", "", "the request body holds data after its JSON object")
	}
	return o, nil
}

func syntaxError(err error, field string) *vibejobs.Error {
	msg := "the request body is not valid JSON"
	var se *json.SyntaxError
	if errors.As(err, &se) {
		msg += " (at byte " + strconv.FormatInt(se.Offset, 10) + ")"
	} else if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		msg = "the request body ends in the middle of its JSON value"
	}
	return invalid("invalid_json", field, msg)
}

// only refuses any member whose key is not in known: unknown_field names it.
func (o *object) only(known ...string) *vibejobs.Error {
	for _, m := range o.members {
		ok := false
		for _, k := range known {
			if m.key == k {
				ok = true
				break
			}
		}
		if !ok {
			return invalid("unknown_field", fieldName(o.prefix+m.key), "unknown field")
		}
	}
	return nil
}

func (o *object) get(key string) (json.RawMessage, bool) {
	for _, m := range o.members {
		if m.key == key {
			return m.value, true
		}
	}
	return nil, false
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

func (o *object) wrongType(key, want string) *vibejobs.Error {
	return invalid("invalid_json", o.prefix+key, "must be "+want)
}

// str returns the string member key: nil when absent.
func (o *object) str(key string) (*string, *vibejobs.Error) {
	raw, ok := o.get(key)
	if !ok {
		return nil, nil
	}
	if isNull(raw) {
		return nil, invalid("invalid_json", o.prefix+key, "must not be null")
	}
	if len(raw) == 0 || raw[0] != '"' {
		return nil, o.wrongType(key, "a string")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, o.wrongType(key, "a string")
	}
	return &s, nil
}

// boolean returns the boolean member key: nil when absent.
func (o *object) boolean(key string) (*bool, *vibejobs.Error) {
	raw, ok := o.get(key)
	if !ok {
		return nil, nil
	}
	switch string(raw) {
	case "true":
		v := true
		return &v, nil
	case "false":
		v := false
		return &v, nil
	case "null":
		return nil, invalid("invalid_json", o.prefix+key, "must not be null")
	}
	return nil, o.wrongType(key, "true or false")
}

// integer returns the integer member key: nil when absent. A fraction, an
// exponent or a value beyond ±2^31 is refused.
func (o *object) integer(key string) (*int, *vibejobs.Error) {
	raw, ok := o.get(key)
	if !ok {
		return nil, nil
	}
	if isNull(raw) {
		return nil, invalid("invalid_json", o.prefix+key, "must not be null")
	}
	var n int32
	if err := json.Unmarshal(raw, &n); err != nil {
		// A whole number past int32 is refused too, and told so: "must be
		// an integer" would puzzle whoever sent 99999999999.
		return nil, o.wrongType(key, "an integer from -2147483648 to 2147483647")
	}
	v := int(n)
	return &v, nil
}

// nested returns the object member key: nil when absent.
func (o *object) nested(key string) (*object, *vibejobs.Error) {
	raw, ok := o.get(key)
	if !ok {
		return nil, nil
	}
	if isNull(raw) {
		return nil, invalid("invalid_json", o.prefix+key, "must not be null")
	}
	return decodeObject(raw, o.prefix+key)
}

// decodeEmpty accepts an empty body or an empty JSON object: the body of a
// POST that carries no input.
func decodeEmpty(data []byte) *vibejobs.Error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	o, e := decodeObject(data, "")
	if e != nil {
		return e
	}
	return o.only()
}

// fieldName bounds a field name taken from the request before it is echoed.
func fieldName(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	for i := max; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i] + "…"
		}
	}
	return s[:max] + "…"
}

// loneSurrogate reports whether JSON text data holds a \u escape of a
// UTF-16 surrogate that is not one half of a pair (a high one followed by
// a low one), which encoding/json decodes as U+FFFD.
func loneSurrogate(data []byte) bool {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		if !ok {
			i++ // any other escape: skip the escaped byte, a backslash too
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := hex4(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		default:
			i += 5
		}
	}
	return false
}
