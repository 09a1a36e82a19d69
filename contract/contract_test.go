package contract_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/contract"
)

const (
	vectorSecret = "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	vectorT      = 1791536400
	vectorBody   = `{"type":"scheduled_job.run","jobId":"job_vector","runId":"run_vector","scheduledFor":"2026-10-09T09:00:00.000Z","attempt":1,"late":false,"trigger":"schedule"}`
	vectorHeader = "t=1791536400,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008"
)

func TestReferenceVector(t *testing.T) {
	body := contract.Body(contract.Payload{
		JobID: "job_vector", RunID: "run_vector",
		ScheduledFor: time.Date(2026, 10, 9, 9, 0, 0, 0, time.UTC),
		Attempt:      1, Late: false, Trigger: contract.TriggerSchedule,
	})
	if string(body) != vectorBody {
		t.Fatalf("body:\n got %s\nwant %s", body, vectorBody)
	}
	if len(body) != 158 {
		t.Fatalf("body length %d, want 158", len(body))
	}
	if got := contract.Sign(vectorSecret, vectorT, body); got != vectorHeader {
		t.Fatalf("signature %s, want %s", got, vectorHeader)
	}
	if err := contract.Verify(vectorSecret, vectorHeader, body, vectorT); err != nil {
		t.Fatalf("verify: %v", err)
	}
}

func TestBodyEveryFieldCombination(t *testing.T) {
	zones := []*time.Location{time.UTC, time.FixedZone("x", -7*3600-30*60)}
	for _, loc := range zones {
		for attempt := 1; attempt <= 4; attempt++ {
			for _, late := range []bool{false, true} {
				for _, trig := range []string{"schedule", "manual"} {
					at := time.Date(2027, 1, 2, 3, 4, 5, 67_890_000, loc)
					got := string(contract.Body(contract.Payload{JobID: "job_a-B_9", RunID: "run_Z", ScheduledFor: at, Attempt: attempt, Late: late, Trigger: trig}))
					lateS := "false"
					if late {
						lateS = "true"
					}
					want := `{"type":"scheduled_job.run","jobId":"job_a-B_9","runId":"run_Z","scheduledFor":"` +
						at.UTC().Format("2006-01-02T15:04:05.000Z") + `","attempt":` + string(rune('0'+attempt)) +
						`,"late":` + lateS + `,"trigger":"` + trig + `"}`
					if got != want {
						t.Fatalf("got %s want %s", got, want)
					}
				}
			}
		}
	}
	// Whole seconds still carry three fraction digits; sub-millisecond is truncated.
	got := contract.Body(contract.Payload{JobID: "job_x", RunID: "run_y", ScheduledFor: time.Date(2026, 1, 1, 0, 0, 0, 999_999, time.UTC), Attempt: 1, Trigger: "schedule"})
	if !bytes.Contains(got, []byte(`"2026-01-01T00:00:00.000Z"`)) {
		t.Fatalf("fraction digits: %s", got)
	}
}

func TestSecretFormat(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		s, err := contract.NewSecret(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(s) != 47 || !contract.ValidSecret(s) {
			t.Fatalf("bad secret %q", s)
		}
		if seen[s] {
			t.Fatal("secret repeated")
		}
		seen[s] = true
	}
	s, _ := contract.NewSecret(bytes.NewReader(make([]byte, 32)))
	if s != "vjs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" {
		t.Fatalf("deterministic secret %q", s)
	}
	for _, bad := range []string{"", "vjs_", vectorSecret + "A", "xjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8", "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+"} {
		if contract.ValidSecret(bad) {
			t.Errorf("ValidSecret(%q) = true", bad)
		}
	}
}

func TestVerifyRejects(t *testing.T) {
	body := []byte(vectorBody)
	cases := map[string]string{
		"uppercase hex":   "t=1791536400,v1=47F5954D1810B796A982C0EB461A948F4E80D531212CAC1A4668321D24EA3008",
		"leading zero":    "t=01791536400,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
		"space":           "t=1791536400, v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
		"repeated v1":     vectorHeader + ",v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
		"repeated t":      "t=1791536400,t=1791536400,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
		"extra field":     vectorHeader + ",v0=abc",
		"reordered":       "v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008,t=1791536400",
		"short hex":       "t=1791536400,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea300",
		"17 digits":       "t=17915364000000000,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
		"unsafe integer":  "t=9007199254740992,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
		"empty":           "",
		"trailing space":  vectorHeader + " ",
		"negative":        "t=-1,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
		"wrong signature": "t=1791536400,v1=57f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008",
	}
	for name, h := range cases {
		if err := contract.Verify(vectorSecret, h, body, vectorT); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	if err := contract.Verify(vectorSecret, vectorHeader, body, vectorT+301); !errors.Is(err, contract.ErrStaleSignature) {
		t.Errorf("stale: %v", err)
	}
	if err := contract.Verify(vectorSecret, vectorHeader, body, vectorT-300); err != nil {
		t.Errorf("300 s early should verify: %v", err)
	}
	if err := contract.Verify(vectorSecret[:46], vectorHeader, body, vectorT); !errors.Is(err, contract.ErrBadSignature) {
		t.Errorf("other secret: %v", err)
	}
	if err := contract.VerifyAny([]string{"vjs_other", vectorSecret}, vectorHeader, body, vectorT); err != nil {
		t.Errorf("rotation: %v", err)
	}
}

func FuzzParseSignature(f *testing.F) {
	f.Add(vectorHeader)
	f.Add("t=0,v1=" + "00000000000000000000000000000000000000000000000000000000000000000")
	f.Fuzz(func(t *testing.T, h string) {
		ts, mac, err := contract.ParseSignature(h)
		if err != nil {
			return
		}
		// Whatever parses must re-render to the identical header.
		re := "t=" + itoa(ts) + ",v1=" + hexs(mac[:])
		if re != h {
			t.Fatalf("parsed %q re-renders as %q", h, re)
		}
	})
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

func hexs(b []byte) string {
	const d = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, d[c>>4], d[c&15])
	}
	return string(out)
}
