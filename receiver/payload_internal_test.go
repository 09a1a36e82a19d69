package receiver

import (
	"testing"

	"github.com/vibejobs/vibejobs/contract"
)

// FuzzCanonicalMatchesStrict: the fast path accepts exactly what the strict
// validator accepts, with the same result.
func FuzzCanonicalMatchesStrict(f *testing.F) {
	f.Add([]byte(`{"type":"scheduled_job.run","jobId":"job_vector","runId":"run_vector","scheduledFor":"2026-10-09T09:00:00.000Z","attempt":1,"late":false,"trigger":"schedule"}`))
	f.Add([]byte(`{"type":"scheduled_job.run","jobId":"job_a","runId":"run_b","scheduledFor":"2026-02-29T24:00:00.000Z","attempt":4,"late":true,"trigger":"manual"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, fok := parseCanonical(body)
		strict, err := validateStrict(body)
		if fok != (err == nil) {
			t.Fatalf("fast path %v, strict %v for %q", fok, err, body)
		}
		if fok && (fast != strict || string(contract.Body(fast)) != string(body)) {
			t.Fatalf("fast %+v, strict %+v for %q", fast, strict, body)
		}
	})
}
