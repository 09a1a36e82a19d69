package receiver_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
)

func TestValidatePayloadAcceptsEveryContractBody(t *testing.T) {
	at := time.Date(2026, 2, 28, 23, 59, 59, 999e6, time.UTC)
	for _, attempt := range []int{1, 2, 3, 4} {
		for _, late := range []bool{false, true} {
			for _, trigger := range []string{"schedule", "manual"} {
				p := contract.Payload{JobID: "job_A-z_09", RunID: "run_" + strings.Repeat("x", 124), ScheduledFor: at, Attempt: attempt, Late: late, Trigger: trigger}
				body := contract.Body(p)
				got, err := receiver.ValidatePayload(body)
				if err != nil {
					t.Fatalf("%s: %v", body, err)
				}
				if got != p {
					t.Fatalf("ValidatePayload(%s) = %+v, want %+v", body, got, p)
				}
			}
		}
	}
}

func TestValidatePayloadRejects(t *testing.T) {
	v := vectorBody
	rep := func(old, new string) string { return strings.Replace(v, old, new, 1) }
	cases := []struct {
		name, body, field string
	}{
		{"empty", "", ""},
		{"null", "null", ""},
		{"array", "[" + v + "]", ""},
		{"string", `"x"`, ""},
		{"BOM", "\ufeff" + v, ""},
		{"truncated", v[:len(v)-1], ""},
		{"trailing garbage", v + "x", ""},
		{"second object", v + "{}", ""},
		{"trailing newline", v + "\n", ""},
		{"leading space", " " + v, ""},
		{"space after colon", rep(`"jobId":`, `"jobId": `), ""},
		{"keys reordered", `{"jobId":"job_vector","type":"scheduled_job.run","runId":"run_vector","scheduledFor":"2026-10-09T09:00:00.000Z","attempt":1,"late":false,"trigger":"schedule"}`, ""},
		{"escaped id", rep(`"job_vector"`, `"job_\u0076ector"`), ""},
		{"unknown key", rep(`{`, `{"extra":1,`), ""},
		{"key with other case", rep(`"jobId"`, `"JobId"`), ""},
		{"duplicate key", rep(`"late":false`, `"late":false,"late":false`), "late"},
		{"duplicate runId", rep(`"attempt"`, `"runId":"run_other","attempt"`), "runId"},
		{"missing trigger", rep(`,"trigger":"schedule"`, ``), "trigger"},
		{"missing type", rep(`"type":"scheduled_job.run",`, ``), "type"},
		{"type other", rep(`scheduled_job.run`, `scheduled_job.ran`), "type"},
		{"type null", rep(`"scheduled_job.run"`, `null`), "type"},
		{"job id prefix", rep(`job_vector`, `jb_vector`), "jobId"},
		{"job id bare prefix", rep(`job_vector`, `job_`), "jobId"},
		{"job id dot", rep(`job_vector`, `job_vec.tor`), "jobId"},
		{"job id unicode", rep(`job_vector`, `job_véctor`), "jobId"},
		{"job id number", rep(`"job_vector"`, `7`), "jobId"},
		{"job id too long", rep(`job_vector`, "job_"+strings.Repeat("v", 125)), "jobId"},
		{"run id with job prefix", rep(`run_vector`, `job_vector`), "runId"},
		{"run id space", rep(`run_vector`, `run vector`), "runId"},
		{"scheduledFor no millis", rep(`09:00:00.000Z`, `09:00:00Z`), "scheduledFor"},
		{"scheduledFor micros", rep(`09:00:00.000Z`, `09:00:00.000000Z`), "scheduledFor"},
		{"scheduledFor offset", rep(`09:00:00.000Z`, `09:00:00.000+00:00`), "scheduledFor"},
		{"scheduledFor lowercase z", rep(`09:00:00.000Z`, `09:00:00.000z`), "scheduledFor"},
		{"scheduledFor space", rep(`2026-10-09T09`, `2026-10-09 09`), "scheduledFor"},
		{"scheduledFor one-digit hour", rep(`2026-10-09T09:00:00.000Z`, `2026-10-09T9:00:00.000Z `), "scheduledFor"},
		{"scheduledFor Feb 30", rep(`2026-10-09`, `2026-02-30`), "scheduledFor"},
		{"scheduledFor hour 24", rep(`T09:`, `T24:`), "scheduledFor"},
		{"scheduledFor leap second", rep(`09:00:00.000`, `23:59:60.000`), "scheduledFor"},
		{"scheduledFor number", rep(`"2026-10-09T09:00:00.000Z"`, `1791536400000`), "scheduledFor"},
		{"attempt 0", rep(`"attempt":1`, `"attempt":0`), "attempt"},
		{"attempt 5", rep(`"attempt":1`, `"attempt":5`), "attempt"},
		{"attempt -1", rep(`"attempt":1`, `"attempt":-1`), "attempt"},
		{"attempt 1.0", rep(`"attempt":1`, `"attempt":1.0`), "attempt"},
		{"attempt 1e0", rep(`"attempt":1`, `"attempt":1e0`), "attempt"},
		{"attempt string", rep(`"attempt":1`, `"attempt":"1"`), "attempt"},
		{"attempt huge", rep(`"attempt":1`, `"attempt":18446744073709551617`), "attempt"},
		{"late string", rep(`"late":false`, `"late":"false"`), "late"},
		{"late number", rep(`"late":false`, `"late":0`), "late"},
		{"late null", rep(`"late":false`, `"late":null`), "late"},
		{"trigger other", rep(`"trigger":"schedule"`, `"trigger":"api"`), "trigger"},
		{"trigger uppercase", rep(`"trigger":"schedule"`, `"trigger":"Schedule"`), "trigger"},
		{"trigger object", rep(`"trigger":"schedule"`, `"trigger":{}`), "trigger"},
		{"nested object", rep(`"late":false`, `"late":{"a":[1,2]}`), "late"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := receiver.ValidatePayload([]byte(c.body))
			pe, ok := errors.AsType[*receiver.PayloadError](err)
			if !ok {
				t.Fatalf("ValidatePayload = %v, want a *PayloadError", err)
			}
			if c.field != "" && pe.Field != c.field {
				t.Fatalf("field = %q, want %q (%v)", pe.Field, c.field, err)
			}
		})
	}
}

// FuzzValidatePayload: no panic, and whatever passes is exactly the contract's
// encoding of what was parsed.
func FuzzValidatePayload(f *testing.F) {
	f.Add([]byte(vectorBody))
	f.Add([]byte(strings.Replace(vectorBody, `"late":false`, `"late":false,"late":true`, 1)))
	f.Add([]byte(`{"type":"scheduled_job.run"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[1,{"a":"\u0000"}]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := receiver.ValidatePayload(body)
		if err != nil {
			if _, ok := errors.AsType[*receiver.PayloadError](err); !ok {
				t.Fatalf("error of type %T", err)
			}
			return
		}
		if enc := contract.Body(p); !bytes.Equal(enc, body) {
			t.Fatalf("accepted %q, which encodes back as %q", body, enc)
		}
		if !contract.ValidID(p.JobID, "job_") || !contract.ValidID(p.RunID, "run_") || p.Attempt < 1 || p.Attempt > 4 {
			t.Fatalf("accepted an invalid payload %+v", p)
		}
	})
}

func BenchmarkValidatePayload(b *testing.B) {
	body := []byte(vectorBody)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := receiver.ValidatePayload(body); err != nil {
			b.Fatal(err)
		}
	}
}
