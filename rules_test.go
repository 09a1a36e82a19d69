package vibejobs_test

import (
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

func TestBackoffDefaults(t *testing.T) {
	p := vibejobs.DefaultRetryPolicy()
	want := []time.Duration{30 * time.Second, 5 * time.Minute, 50 * time.Minute, time.Hour}
	for i, w := range want {
		if got := p.Backoff(i + 1); got != w {
			t.Errorf("Backoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	p = vibejobs.RetryPolicy{MaxAttempts: 4, MinBackoff: 2 * time.Hour / 3, MaxBackoff: 24 * time.Hour}
	if got := p.Backoff(3); got != 24*time.Hour {
		t.Errorf("capped backoff = %v", got)
	}
}

func TestJitterBounds(t *testing.T) {
	d := 30 * time.Second
	if got := vibejobs.Jitter(d, 0); got != 24*time.Second {
		t.Errorf("low = %v", got)
	}
	if got := vibejobs.Jitter(d, 0.5); got != d {
		t.Errorf("mid = %v", got)
	}
	if got := vibejobs.Jitter(d, 0.9999999); got <= 35*time.Second || got > 36*time.Second {
		t.Errorf("high = %v", got)
	}
}

func TestNextStepClassification(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	deadline := now.Add(90 * time.Hour)
	p := vibejobs.DefaultRetryPolicy()
	at := func(d time.Duration) *time.Time { x := now.Add(d); return &x }
	cases := []struct {
		name string
		n    int
		res  vibejobs.AttemptResult
		want vibejobs.Step
	}{
		{"200", 1, vibejobs.AttemptResult{StatusCode: 200}, vibejobs.Step{State: vibejobs.RunSucceeded}},
		{"204", 3, vibejobs.AttemptResult{StatusCode: 204}, vibejobs.Step{State: vibejobs.RunSucceeded}},
		{"299", 4, vibejobs.AttemptResult{StatusCode: 299}, vibejobs.Step{State: vibejobs.RunSucceeded}},
		{"301 redirect", 1, vibejobs.AttemptResult{StatusCode: 301, ErrorCode: "redirect"}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(30 * time.Second)}},
		{"401", 1, vibejobs.AttemptResult{StatusCode: 401, ErrorCode: "http_4xx"}, vibejobs.Step{State: vibejobs.RunFailed, FailureReason: "app_rejected"}},
		{"403 last", 4, vibejobs.AttemptResult{StatusCode: 403, ErrorCode: "http_4xx"}, vibejobs.Step{State: vibejobs.RunFailed, FailureReason: "app_rejected"}},
		{"404", 2, vibejobs.AttemptResult{StatusCode: 404, ErrorCode: "http_4xx"}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(5 * time.Minute)}},
		{"429 retry-after", 1, vibejobs.AttemptResult{StatusCode: 429, ErrorCode: "http_4xx", RetryAfter: 2 * time.Hour}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(2 * time.Hour)}},
		{"429 short retry-after", 1, vibejobs.AttemptResult{StatusCode: 429, ErrorCode: "http_4xx", RetryAfter: time.Second}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(30 * time.Second)}},
		{"500", 3, vibejobs.AttemptResult{StatusCode: 500, ErrorCode: "http_5xx"}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(50 * time.Minute)}},
		{"500 exhausted", 4, vibejobs.AttemptResult{StatusCode: 500, ErrorCode: "http_5xx"}, vibejobs.Step{State: vibejobs.RunFailed, FailureReason: "attempts_exhausted"}},
		{"timeout", 1, vibejobs.AttemptResult{ErrorCode: "timeout"}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(30 * time.Second)}},
		{"refused", 1, vibejobs.AttemptResult{ErrorCode: "network"}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(30 * time.Second)}},
		{"blocked", 1, vibejobs.AttemptResult{ErrorCode: "blocked"}, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: at(30 * time.Second)}},
		{"retry-after past deadline", 1, vibejobs.AttemptResult{StatusCode: 503, ErrorCode: "http_5xx", RetryAfter: 91 * time.Hour}, vibejobs.Step{State: vibejobs.RunFailed, FailureReason: "deadline_exceeded"}},
	}
	for _, c := range cases {
		got := vibejobs.NextStep(p, c.n, c.res, deadline, now, 0.5)
		if got.State != c.want.State || got.FailureReason != c.want.FailureReason ||
			(got.NextAttemptAt == nil) != (c.want.NextAttemptAt == nil) ||
			(got.NextAttemptAt != nil && !got.NextAttemptAt.Equal(*c.want.NextAttemptAt)) {
			t.Errorf("%s: got %+v (next %v), want %+v (next %v)", c.name, got, got.NextAttemptAt, c.want, c.want.NextAttemptAt)
		}
	}
	// A one-attempt policy fails on the first retryable answer.
	one := vibejobs.RetryPolicy{MaxAttempts: 1, MinBackoff: time.Second, MaxBackoff: time.Hour}
	if got := vibejobs.NextStep(one, 1, vibejobs.AttemptResult{StatusCode: 500}, deadline, now, 0); got.FailureReason != "attempts_exhausted" {
		t.Errorf("maxAttempts 1: %+v", got)
	}
}

func TestIsLate(t *testing.T) {
	s := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if vibejobs.IsLate(s, s.Add(60*time.Second)) {
		t.Error("exactly 60 s is not late")
	}
	if !vibejobs.IsLate(s, s.Add(60*time.Second+time.Millisecond)) {
		t.Error("60.001 s is late")
	}
}

func TestNewIDSortsAndUsesSafeAlphabet(t *testing.T) {
	a := vibejobs.NewID("job_", time.UnixMilli(1000), nil)
	b := vibejobs.NewID("job_", time.UnixMilli(1001), nil)
	if !(a < b) {
		t.Fatalf("%s !< %s", a, b)
	}
	if len(a) != 4+28 {
		t.Fatalf("len %d", len(a))
	}
	for _, c := range a[4:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			t.Fatalf("bad char %q in %s", c, a)
		}
	}
}
