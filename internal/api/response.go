package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// response is a complete answer held in memory, so that the same bytes can be
// written now and stored for an Idempotency-Key replay later.
type response struct {
	status int
	// header holds the headers that belong to the answer itself (Content-Type,
	// Location, Retry-After); they are stored with an idempotency record.
	header map[string]string
	body   []byte
}

func jsonResponse(status int, v any) *response {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value passed here is built by this package from plain
		// types; a failure is a programming error.
		panic("api: encoding response: " + err.Error())
	}
	b = append(escapeControls(b), '\n')
	return &response{status: status, header: map[string]string{"Content-Type": "application/json"}, body: b}
}

// escapeControls rewrites the controls encoding/json leaves raw, DEL and
// the C1 controls (U+0080–U+009F), as \u escapes: the same JSON value, but
// one a terminal shows as text. Answers carry a receiver's bytes (response
// snippets), read with curl or the CLI's --json, and terminals such as VTE,
// screen and mosh take a UTF-8 U+009B as CSI and U+009D as OSC, as they
// take ESC [ and ESC ] (which encoding/json escapes, with the other C0
// controls). b must be valid UTF-8, as json.Marshal's output is: a 0xC2 byte
// is then always the first of U+0080–U+00BF.
func escapeControls(b []byte) []byte {
	if bytes.IndexByte(b, 0xc2) < 0 && bytes.IndexByte(b, 0x7f) < 0 {
		return b
	}
	const hex = "0123456789abcdef"
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == 0x7f:
		case c == 0xc2 && i+1 < len(b) && b[i+1] >= 0x80 && b[i+1] <= 0x9f:
			i++
			c = b[i]
		default:
			out = append(out, c)
			continue
		}
		out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
	}
	return out
}

func emptyResponse(status int) *response { return &response{status: status} }

func (r *response) with(name, value string) *response {
	if r.header == nil {
		r.header = map[string]string{}
	}
	r.header[name] = value
	return r
}

// write writes r. Every answer says Cache-Control: no-store: a job's
// creation and a secret's rotation show the secret once, and every other
// answer holds a tenant's data, which no browser or proxy should keep. And
// X-Content-Type-Options: nosniff: a browser led to an answer holding
// text a user chose (a job's name) renders it only as its declared type.
func (r *response) write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.header {
		h.Set(k, v)
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if r.body != nil {
		h.Set("Content-Length", strconv.Itoa(len(r.body)))
	}
	w.WriteHeader(r.status)
	if len(r.body) > 0 {
		w.Write(r.body)
	}
}

// timeLayout is how every instant is shown: RFC 3339, UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z"

// apiTime marshals as timeLayout.
type apiTime time.Time

func (t apiTime) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(timeLayout)+2)
	b = append(b, '"')
	b = time.Time(t).UTC().AppendFormat(b, timeLayout)
	return append(b, '"'), nil
}

func timePtr(t *time.Time) *apiTime {
	if t == nil || t.IsZero() {
		return nil
	}
	a := apiTime(*t)
	return &a
}

// formatDuration writes d as a Go duration string without zero tails:
// "30s", "5m", "1h", "1h30m", "1.5s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
