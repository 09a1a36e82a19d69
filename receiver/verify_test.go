package receiver_test

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
)

// The contract's public reference vector.
const (
	vectorSecret = "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	vectorT      = 1791536400
	vectorBody   = `{"type":"scheduled_job.run","jobId":"job_vector","runId":"run_vector","scheduledFor":"2026-10-09T09:00:00.000Z","attempt":1,"late":false,"trigger":"schedule"}`
	vectorHeader = "t=1791536400,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008"
	vectorMAC    = "47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008"
	otherSecret  = "vjs_ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8"
)

func fixedClock(unix int64) func() time.Time {
	return func() time.Time { return time.Unix(unix, 0) }
}

func mustVerifier(t testing.TB, s receiver.Secrets, now func() time.Time) *receiver.Verifier {
	t.Helper()
	v, err := receiver.NewVerifier(s, now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestReferenceVector(t *testing.T) {
	if len(vectorBody) != 158 {
		t.Fatalf("vector body is %d bytes, want 158", len(vectorBody))
	}
	v := mustVerifier(t, receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT))
	if err := v.Verify(vectorHeader, []byte(vectorBody)); err != nil {
		t.Fatalf("reference vector: %v", err)
	}
	p, err := receiver.ValidatePayload([]byte(vectorBody))
	if err != nil {
		t.Fatalf("reference body: %v", err)
	}
	if p.JobID != "job_vector" || p.RunID != "run_vector" || p.Attempt != 1 || p.Late || p.Trigger != "schedule" ||
		!p.ScheduledFor.Equal(time.Date(2026, 10, 9, 9, 0, 0, 0, time.UTC)) {
		t.Fatalf("reference payload = %+v", p)
	}
}

func TestVerifyRejectsAdversarialInput(t *testing.T) {
	body := vectorBody
	sign := func(secret string, ts int64, b string) string { return contract.Sign(secret, ts, []byte(b)) }
	h := vectorHeader
	mac := vectorMAC
	var (
		malformed = contract.ErrMalformedSignature
		stale     = contract.ErrStaleSignature
		bad       = contract.ErrBadSignature
	)
	cases := []struct {
		name   string
		header string
		body   string
		now    int64
		want   error // nil: must verify
	}{
		{"reference", h, body, vectorT, nil},
		{"freshness edge past", h, body, vectorT + 300, nil},
		{"freshness edge future", h, body, vectorT - 300, nil},
		{"t=0 at epoch", sign(vectorSecret, 0, body), body, 0, nil},
		{"empty header", "", body, vectorT, malformed},
		{"t only", "t=1791536400", body, vectorT, malformed},
		{"v1 only", "v1=" + mac, body, vectorT, malformed},
		{"fields swapped", "v1=" + mac + ",t=1791536400", body, vectorT, malformed},
		{"uppercase hex", "t=1791536400,v1=" + strings.ToUpper(mac), body, vectorT, malformed},
		{"one uppercase hex digit", "t=1791536400,v1=" + mac[:2] + "F" + mac[3:], body, vectorT, malformed},
		{"63 hex digits", "t=1791536400,v1=" + mac[:63], body, vectorT, malformed},
		{"65 hex digits", h + "0", body, vectorT, malformed},
		{"non-hex digit", "t=1791536400,v1=g" + mac[1:], body, vectorT, malformed},
		{"0x prefix", "t=1791536400,v1=0x" + mac[2:], body, vectorT, malformed},
		{"leading zero t", "t=01791536400,v1=" + mac, body, vectorT, malformed},
		{"negative t", "t=-1791536400,v1=" + mac, body, vectorT, malformed},
		{"plus sign t", "t=+1791536400,v1=" + mac, body, vectorT, malformed},
		{"fractional t", "t=1791536400.0,v1=" + mac, body, vectorT, malformed},
		{"17-digit t", "t=10000000000000000,v1=" + mac, body, vectorT, malformed},
		{"unsafe integer t", "t=9007199254740992,v1=" + mac, body, vectorT, malformed},
		{"arabic-indic digits", "t=١٧٩١٥٣٦٤٠٠,v1=" + mac, body, vectorT, malformed},
		{"empty t", "t=,v1=" + mac, body, vectorT, malformed},
		{"leading space", " " + h, body, vectorT, malformed},
		{"trailing space", h + " ", body, vectorT, malformed},
		{"space after comma", "t=1791536400, v1=" + mac, body, vectorT, malformed},
		{"space around equals", "t = 1791536400,v1=" + mac, body, vectorT, malformed},
		{"tab separator", "t=1791536400,\tv1=" + mac, body, vectorT, malformed},
		{"semicolon separator", "t=1791536400;v1=" + mac, body, vectorT, malformed},
		{"repeated v1", h + ",v1=" + mac, body, vectorT, malformed},
		{"repeated t", "t=1791536400,t=1791536400,v1=" + mac, body, vectorT, malformed},
		{"extra field", h + ",v0=" + mac, body, vectorT, malformed},
		{"other scheme", "t=1791536400,v0=" + mac, body, vectorT, malformed},
		{"uppercase keys", "T=1791536400,V1=" + mac, body, vectorT, malformed},
		{"NUL byte", "t=1791536400,v1=" + mac[:10] + "\x00" + mac[11:], body, vectorT, malformed},
		{"stale", h, body, vectorT + 301, stale},
		{"from the future", h, body, vectorT - 301, stale},
		{"t=0 now", sign(vectorSecret, 0, body), body, vectorT, stale},
		{"other secret", sign(otherSecret, vectorT, body), body, vectorT, bad},
		{"decoded-suffix key", sign(vectorSecret[4:], vectorT, body), body, vectorT, bad},
		{"mac of another t", "t=1791536401,v1=" + mac, body, vectorT, bad},
		{"body byte changed", h, strings.Replace(body, `"attempt":1`, `"attempt":2`, 1), vectorT, bad},
		{"body with trailing newline", h, body + "\n", vectorT, bad},
		{"body reserialized", h, strings.ReplaceAll(body, `":`, `": `), vectorT, bad},
		{"empty body", h, "", vectorT, bad},
		{"all-zero mac", "t=1791536400,v1=" + strings.Repeat("0", 64), body, vectorT, bad},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := mustVerifier(t, receiver.Secrets{Current: vectorSecret}, fixedClock(c.now))
			err := v.Verify(c.header, []byte(c.body))
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v", err, c.want)
			}
			if err != nil && (strings.Contains(err.Error(), mac) || strings.Contains(err.Error(), vectorSecret)) {
				t.Fatalf("error leaks request data: %v", err)
			}
		})
	}
}

func TestRotation(t *testing.T) {
	now := time.Unix(vectorT, 0)
	clock := func() time.Time { return now }
	body := []byte(vectorBody)
	oldSig := contract.Sign(vectorSecret, vectorT, body)
	newSig := contract.Sign(otherSecret, vectorT, body)

	v := mustVerifier(t, receiver.Secrets{Current: vectorSecret}, clock)
	if err := v.Rotate(otherSecret, 0); err != nil {
		t.Fatal(err)
	}
	if got := v.Secrets(); got.Current != otherSecret || got.Previous != vectorSecret || !got.PreviousExpiresAt.Equal(now.Add(5*time.Minute)) {
		t.Fatalf("after Rotate: current=%t previous=%t expires=%v", got.Current == otherSecret, got.Previous == vectorSecret, got.PreviousExpiresAt)
	}
	for _, sig := range []string{oldSig, newSig} {
		if err := v.Verify(sig, body); err != nil {
			t.Fatalf("inside the window: %v", err)
		}
	}
	// At the expiry the previous secret is no longer accepted; the signature
	// itself is still fresh (t + 300).
	now = now.Add(5 * time.Minute)
	if err := v.Verify(contract.Sign(vectorSecret, now.Unix(), body), body); !errors.Is(err, contract.ErrBadSignature) {
		t.Fatalf("previous secret at its expiry: %v", err)
	}
	if err := v.Verify(contract.Sign(otherSecret, now.Unix(), body), body); err != nil {
		t.Fatalf("current secret: %v", err)
	}

	// Explicit secrets with an expiry one second ahead.
	if err := v.SetSecrets(receiver.Secrets{Current: vectorSecret, Previous: otherSecret, PreviousExpiresAt: now.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(contract.Sign(otherSecret, now.Unix(), body), body); err != nil {
		t.Fatalf("previous before expiry: %v", err)
	}
	// Invalid secrets are refused and the old ones stay.
	for _, s := range []receiver.Secrets{
		{Current: vectorSecret + "\n"},
		{Current: ""},
		{Current: vectorSecret, Previous: "secret"},
		{Current: "vjs_" + strings.Repeat("A", 42)},
	} {
		if err := v.SetSecrets(s); !errors.Is(err, receiver.ErrInvalidSecret) {
			t.Fatalf("SetSecrets(invalid) = %v", err)
		}
	}
	// A previous secret without its expiry would never be accepted: refused.
	if err := v.SetSecrets(receiver.Secrets{Current: vectorSecret, Previous: otherSecret}); !errors.Is(err, receiver.ErrPreviousWithoutExpiry) {
		t.Fatalf("SetSecrets(previous without expiry) = %v", err)
	}
	if v.Secrets().Current != vectorSecret {
		t.Fatal("a refused SetSecrets changed the secrets")
	}
	if _, err := receiver.NewVerifier(receiver.Secrets{Current: "nope"}, nil); !errors.Is(err, receiver.ErrInvalidSecret) {
		t.Fatalf("NewVerifier(invalid) = %v", err)
	}
}

// TestRotateConcurrent: two rotations at once apply one after the other;
// neither is lost. The first one is held inside Rotate (in its reading of
// the clock) until the second finished.
func TestRotateConcurrent(t *testing.T) {
	first, second := otherSecret, "vjs_"+strings.Repeat("A", 42)+"E"
	held, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	clock := func() time.Time {
		if calls.Add(1) == 1 {
			close(held)
			<-release
		}
		return time.Unix(vectorT, 0)
	}
	v := mustVerifier(t, receiver.Secrets{Current: vectorSecret}, clock)
	done := make(chan error, 1)
	go func() { done <- v.Rotate(first, 0) }()
	<-held
	if err := v.Rotate(second, 0); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := v.Secrets(); got.Current != first || got.Previous != second {
		t.Fatalf("after two rotations at once: current %q previous %q; want %q and %q (the second rotation kept)",
			got.Current, got.Previous, first, second)
	}
}

// TestRotateToTheCurrentSecret: rotating twice to the same secret (a
// reloaded config, a retried call) keeps the secret replaced by the first
// rotation for its window; dropping it would answer 401 to a delivery
// signed just before the platform rotated, which fails the run for good.
func TestRotateToTheCurrentSecret(t *testing.T) {
	now := time.Unix(vectorT, 0)
	v := mustVerifier(t, receiver.Secrets{Current: vectorSecret}, func() time.Time { return now })
	if err := v.Rotate(otherSecret, 0); err != nil {
		t.Fatal(err)
	}
	want := v.Secrets()
	now = now.Add(10 * time.Second)
	if err := v.Rotate(otherSecret, 0); err != nil {
		t.Fatal(err)
	}
	if got := v.Secrets(); got != want {
		t.Fatalf("secrets after rotating to the current one again: %+v, want %+v", got, want)
	}
	if err := v.Verify(vectorHeader, []byte(vectorBody)); err != nil {
		t.Fatalf("delivery signed with the replaced secret, inside its window: %v", err)
	}
}

func TestVerifyHeaders(t *testing.T) {
	v := mustVerifier(t, receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT))
	body := []byte(vectorBody)
	cases := []struct {
		name string
		h    http.Header
		want error
	}{
		{"ok", http.Header{"X-Vibe-Caller-Kind": {"schedule"}, "Vibe-Signature": {vectorHeader}}, nil},
		{"no caller", http.Header{"Vibe-Signature": {vectorHeader}}, receiver.ErrCallerKind},
		{"caller manual", http.Header{"X-Vibe-Caller-Kind": {"manual"}, "Vibe-Signature": {vectorHeader}}, receiver.ErrCallerKind},
		{"caller capitalized", http.Header{"X-Vibe-Caller-Kind": {"Schedule"}, "Vibe-Signature": {vectorHeader}}, receiver.ErrCallerKind},
		{"caller twice", http.Header{"X-Vibe-Caller-Kind": {"schedule", "schedule"}, "Vibe-Signature": {vectorHeader}}, receiver.ErrCallerKind},
		{"caller joined", http.Header{"X-Vibe-Caller-Kind": {"schedule, schedule"}, "Vibe-Signature": {vectorHeader}}, receiver.ErrCallerKind},
		{"no signature", http.Header{"X-Vibe-Caller-Kind": {"schedule"}}, receiver.ErrSignatureHeader},
		{"signature twice", http.Header{"X-Vibe-Caller-Kind": {"schedule"}, "Vibe-Signature": {vectorHeader, vectorHeader}}, receiver.ErrSignatureHeader},
		{"signature joined", http.Header{"X-Vibe-Caller-Kind": {"schedule"}, "Vibe-Signature": {vectorHeader + ", " + vectorHeader}}, contract.ErrMalformedSignature},
		// Header names are case-insensitive on the wire; a map built by hand
		// or converted from another framework need not hold canonical keys.
		{"lowercase names", http.Header{"x-vibe-caller-kind": {"schedule"}, "vibe-signature": {vectorHeader}}, nil},
		{"uppercase names", http.Header{"X-VIBE-CALLER-KIND": {"schedule"}, "VIBE-SIGNATURE": {vectorHeader}}, nil},
		// One line under each spelling is still two lines.
		{"signature under two spellings", http.Header{"X-Vibe-Caller-Kind": {"schedule"}, "Vibe-Signature": {vectorHeader}, "vibe-signature": {vectorHeader}}, receiver.ErrSignatureHeader},
		{"caller under two spellings", http.Header{"X-Vibe-Caller-Kind": {"schedule"}, "x-vibe-caller-kind": {"schedule"}, "Vibe-Signature": {vectorHeader}}, receiver.ErrCallerKind},
		// Only ASCII letters fold: U+212A (the Kelvin sign) folds to "k" in
		// Unicode but is not a header name character.
		{"caller name with a Kelvin sign", http.Header{"X-Vibe-Caller-\u212aind": {"schedule"}, "Vibe-Signature": {vectorHeader}}, receiver.ErrCallerKind},
		{"empty value list", http.Header{"X-Vibe-Caller-Kind": {"schedule"}, "Vibe-Signature": {}, "vibe-signature": {vectorHeader}}, nil},
	}
	for _, c := range cases {
		if err := v.VerifyHeaders(c.h, body); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: VerifyHeaders = %v, want %v", c.name, err, c.want)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	v := mustVerifier(b, receiver.Secrets{Current: vectorSecret}, fixedClock(vectorT))
	body := []byte(vectorBody)
	b.ReportAllocs()
	for b.Loop() {
		if err := v.Verify(vectorHeader, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyDuringRotation(b *testing.B) {
	// The worst case: the header is signed with the previous secret, so both
	// keys are tried.
	v := mustVerifier(b, receiver.Secrets{Current: otherSecret, Previous: vectorSecret, PreviousExpiresAt: time.Unix(vectorT+60, 0)}, fixedClock(vectorT))
	body := []byte(vectorBody)
	b.ReportAllocs()
	for b.Loop() {
		if err := v.Verify(vectorHeader, body); err != nil {
			b.Fatal(err)
		}
	}
}

// TestZeroVerifier: a Verifier declared as a value works. With no secret it
// refuses every signature; given its secrets (SetSecrets or Rotate) it
// verifies against time.Now, and a handler built on it answers. Its clock
// was a nil func: every delivery panicked, and the platform saw a reset
// connection on every attempt.
func TestZeroVerifier(t *testing.T) {
	body := []byte(vectorBody)
	var empty receiver.Verifier
	if err := empty.Verify(contract.Sign(vectorSecret, time.Now().Unix(), body), body); !errors.Is(err, contract.ErrBadSignature) {
		t.Errorf("zero Verifier, no secret: Verify = %v, want ErrBadSignature", err)
	}
	if got := empty.Secrets(); got != (receiver.Secrets{}) {
		t.Errorf("zero Verifier's secrets: %+v, want none", got)
	}

	var rotated receiver.Verifier
	if err := rotated.Rotate(otherSecret, 0); err != nil {
		t.Fatalf("Rotate on a zero Verifier: %v", err)
	}
	if got := rotated.Secrets(); got.Current != otherSecret || got.Previous != "" {
		t.Errorf("after Rotate on a zero Verifier: current=%t previous=%q", got.Current == otherSecret, got.Previous)
	}

	var v receiver.Verifier
	if err := v.SetSecrets(receiver.Secrets{Current: vectorSecret}); err != nil {
		t.Fatalf("SetSecrets: %v", err)
	}
	h, err := receiver.NewHandler(receiver.Config{Verifier: &v, Logger: slog.New(slog.DiscardHandler)}, &memStore{})
	if err != nil {
		t.Fatalf("NewHandler: %v", err)
	}
	for _, c := range []struct {
		ts   int64
		want int
	}{{time.Now().Unix(), http.StatusAccepted}, {time.Now().Unix() - 3600, http.StatusUnauthorized}} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(vectorBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Vibe-Caller-Kind", "schedule")
		r.Header.Set("Vibe-Signature", contract.Sign(vectorSecret, c.ts, body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("signed at %d: status %d, want %d", c.ts, w.Code, c.want)
		}
	}
}
