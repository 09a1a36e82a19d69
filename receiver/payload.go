package receiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/vibejobs/vibejobs/contract"
)

// PayloadError says why a body is not a contract delivery body. Field is the
// JSON key concerned ("" for the document as a whole). It never holds a value
// from the body, not even an unknown key.
type PayloadError struct {
	Field  string
	Reason string
}

func (e *PayloadError) Error() string {
	if e.Field == "" {
		return "receiver: invalid payload: " + e.Reason
	}
	return "receiver: invalid payload: " + e.Field + ": " + e.Reason
}

func payloadErr(field, reason string) error { return &PayloadError{Field: field, Reason: reason} }

// The keys of a delivery body, in contract order.
var payloadKeys = [...]string{"type", "jobId", "runId", "scheduledFor", "attempt", "late", "trigger"}

// ValidatePayload parses body as a delivery body and checks it strictly against
// the contract's schema: a single JSON object with exactly the keys type, jobId,
// runId, scheduledFor, attempt, late and trigger, each once; type
// "scheduled_job.run"; ids per contract.ValidID with the prefixes "job_" and
// "run_"; scheduledFor as YYYY-MM-DDTHH:MM:SS.mmmZ; attempt an integer 1–4; late
// a boolean; trigger "schedule" or "manual". Because the platform signs the
// exact bytes it generates, the body must also be in the contract's canonical
// form (key order, no whitespace, no escapes): on success
// contract.Body(p) equals body. Errors are *PayloadError.
func ValidatePayload(body []byte) (contract.Payload, error) {
	if p, ok := parseCanonical(body); ok {
		return p, nil
	}
	return validateStrict(body)
}

// parseCanonical reads a body in exactly the contract's canonical form; it is
// the fast path of every genuine delivery. Any deviation returns false and
// validateStrict, the authority, says what is wrong.
func parseCanonical(b []byte) (p contract.Payload, ok bool) {
	rest := b
	lit := func(s string) bool {
		if !bytes.HasPrefix(rest, []byte(s)) {
			return false
		}
		rest = rest[len(s):]
		return true
	}
	// str reads up to the next quote; ids and the time contain no escapes.
	str := func() (string, bool) {
		i := bytes.IndexByte(rest, '"')
		if i < 0 {
			return "", false
		}
		s := string(rest[:i])
		rest = rest[i:]
		return s, true
	}
	if !lit(`{"type":"` + contract.BodyType + `","jobId":"`) {
		return p, false
	}
	if p.JobID, ok = str(); !ok || !contract.ValidID(p.JobID, "job_") || !lit(`","runId":"`) {
		return p, false
	}
	if p.RunID, ok = str(); !ok || !contract.ValidID(p.RunID, "run_") || !lit(`","scheduledFor":"`) {
		return p, false
	}
	at, ok := str()
	if !ok {
		return p, false
	}
	if p.ScheduledFor, ok = parseScheduledFor(at); !ok || !lit(`","attempt":`) || len(rest) == 0 {
		return p, false
	}
	if c := rest[0]; c < '1' || c > '0'+contract.MaxAttempt {
		return p, false
	}
	p.Attempt = int(rest[0] - '0')
	rest = rest[1:]
	switch {
	case lit(`,"late":true`):
		p.Late = true
	case lit(`,"late":false`):
	default:
		return p, false
	}
	switch {
	case lit(`,"trigger":"schedule"}`):
		p.Trigger = contract.TriggerSchedule
	case lit(`,"trigger":"manual"}`):
		p.Trigger = contract.TriggerManual
	default:
		return p, false
	}
	return p, len(rest) == 0
}

// validateStrict checks body token by token and names the first problem.
func validateStrict(body []byte) (contract.Payload, error) {
	var p contract.Payload
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return p, payloadErr("", "not a JSON object")
	}
	var seen [len(payloadKeys)]bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return p, payloadErr("", "malformed JSON")
		}
		key, _ := tok.(string)
		i := keyIndex(key)
		if i < 0 {
			return p, payloadErr("", "unknown key")
		}
		if seen[i] {
			return p, payloadErr(key, "duplicate key")
		}
		seen[i] = true
		tok, err = dec.Token()
		if err != nil {
			return p, payloadErr(key, "malformed JSON")
		}
		if err := setPayloadField(&p, key, tok); err != nil {
			return p, err
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return p, payloadErr("", "malformed JSON")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return p, payloadErr("", "data after the object")
	}
	for i, ok := range seen {
		if !ok {
			return p, payloadErr(payloadKeys[i], "missing key")
		}
	}
	if !bytes.Equal(contract.AppendBody(make([]byte, 0, len(body)), p), body) {
		return p, payloadErr("", "not in the contract's canonical form (key order, whitespace or escapes)")
	}
	return p, nil
}

func keyIndex(key string) int {
	for i, k := range payloadKeys {
		if k == key {
			return i
		}
	}
	return -1
}

func setPayloadField(p *contract.Payload, key string, tok json.Token) error {
	switch key {
	case "type":
		if s, ok := tok.(string); !ok || s != contract.BodyType {
			return payloadErr(key, `not "`+contract.BodyType+`"`)
		}
	case "jobId":
		s, ok := tok.(string)
		if !ok || !contract.ValidID(s, "job_") {
			return payloadErr(key, "not a job id")
		}
		p.JobID = s
	case "runId":
		s, ok := tok.(string)
		if !ok || !contract.ValidID(s, "run_") {
			return payloadErr(key, "not a run id")
		}
		p.RunID = s
	case "scheduledFor":
		s, ok := tok.(string)
		if !ok {
			return payloadErr(key, "not a string")
		}
		t, ok := parseScheduledFor(s)
		if !ok {
			return payloadErr(key, "not YYYY-MM-DDTHH:MM:SS.mmmZ")
		}
		p.ScheduledFor = t
	case "attempt":
		n, ok := tok.(json.Number)
		if !ok || len(n) != 1 || n[0] < '1' || n[0] > '0'+contract.MaxAttempt {
			return payloadErr(key, "not an integer from 1 to 4")
		}
		p.Attempt = int(n[0] - '0')
	case "late":
		b, ok := tok.(bool)
		if !ok {
			return payloadErr(key, "not a boolean")
		}
		p.Late = b
	case "trigger":
		s, ok := tok.(string)
		if !ok || s != contract.TriggerSchedule && s != contract.TriggerManual {
			return payloadErr(key, `not "schedule" or "manual"`)
		}
		p.Trigger = s
	}
	return nil
}

// parseScheduledFor accepts exactly the layout YYYY-MM-DDTHH:MM:SS.mmmZ with a
// valid date and time. time.Parse alone is more lenient (one-digit hours), so
// the value must also format back to itself.
func parseScheduledFor(s string) (time.Time, bool) {
	if len(s) != len(contract.ScheduledForLayout) {
		return time.Time{}, false
	}
	t, err := time.Parse(contract.ScheduledForLayout, s)
	if err != nil || t.Format(contract.ScheduledForLayout) != s {
		return time.Time{}, false
	}
	return t, true
}
