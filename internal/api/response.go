package api

import (
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
	b = append(b, '\n')
	return &response{status: status, header: map[string]string{"Content-Type": "application/json"}, body: b}
}

func emptyResponse(status int) *response { return &response{status: status} }

func (r *response) with(name, value string) *response {
	if r.header == nil {
		r.header = map[string]string{}
	}
	r.header[name] = value
	return r
}

func (r *response) write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.header {
		h.Set(k, v)
	}
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
