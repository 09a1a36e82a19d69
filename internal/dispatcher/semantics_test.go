package dispatcher_test

import (
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/egress"
)

// TestRetriesUntilAttemptsExhausted pins SEMANTICS.md section 2 end to end:
// a retryable answer is retried after 30 s, 5 min and 50 min (jitter fixed
// at its middle), each attempt numbered 1 to 4 on the wire, and the fourth
// failure fails the run, attempts_exhausted, with no attempt due after it.
func TestRetriesUntilAttemptsExhausted(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/hook")
	e.sender.answer[j.URL] = []egress.Result{
		{StatusCode: 500, ErrorCode: egress.CodeHTTP5xx},
		{ErrorCode: egress.CodeTimeout},
		{StatusCode: 404, ErrorCode: egress.CodeHTTP4xx},
		{StatusCode: 302, ErrorCode: egress.CodeRedirect},
	}
	r := e.run(t, j, "run_a", e.clock.Now())
	e.start(t, 8)

	delays := []time.Duration{30 * time.Second, 5 * time.Minute, 50 * time.Minute}
	for n := 1; n <= 4; n++ {
		x := e.sender.next(t)
		if x.payload["attempt"] != float64(n) {
			t.Fatalf("attempt %d sent as %v", n, x.payload["attempt"])
		}
		if n == 4 {
			break
		}
		got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunRetrying && r.Attempt == n })
		if want := e.clock.Now().Add(delays[n-1]); got.NextAttemptAt == nil || !got.NextAttemptAt.Equal(want) {
			t.Fatalf("after attempt %d: next attempt at %v, want %v", n, got.NextAttemptAt, want)
		}
		e.clock.Add(delays[n-1] - time.Millisecond)
		e.wantNothingSent(t, "a retry before its time")
		e.clock.Add(time.Millisecond)
	}
	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
	if got.State != vibejobs.RunFailed || got.FailureReason != vibejobs.ReasonAttemptsExhausted || len(got.Attempts) != 4 || got.NextAttemptAt != nil {
		t.Fatalf("run %s (%s) with %d attempts", got.State, got.FailureReason, len(got.Attempts))
	}
	for i, code := range []string{"http_5xx", "timeout", "http_4xx", "redirect"} {
		if a := got.Attempts[i]; a.Number != i+1 || a.ErrorCode != code {
			t.Errorf("attempt %d recorded as number %d, %q; want %q", i+1, a.Number, a.ErrorCode, code)
		}
	}
}

// TestUnauthorizedAndForbiddenFailAtOnce: 401 and 403 fail the run at once,
// app_rejected, on any attempt, and are never retried.
func TestUnauthorizedAndForbiddenFailAtOnce(t *testing.T) {
	for _, status := range []int{401, 403} {
		e := newEnv(t)
		j := e.job(t, "job_a", "https://a.example/hook")
		e.sender.answer[j.URL] = []egress.Result{
			{StatusCode: 503, ErrorCode: egress.CodeHTTP5xx},
			{StatusCode: status, ErrorCode: egress.CodeHTTP4xx},
		}
		r := e.run(t, j, "run_a", e.clock.Now())
		e.start(t, 8)
		e.sender.next(t)
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunRetrying })
		e.clock.Add(30 * time.Second)
		e.sender.next(t)
		got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
		if got.State != vibejobs.RunFailed || got.FailureReason != vibejobs.ReasonAppRejected || got.NextAttemptAt != nil {
			t.Fatalf("%d: run %s (%s), next %v", status, got.State, got.FailureReason, got.NextAttemptAt)
		}
		if len(got.Attempts) != 2 {
			t.Fatalf("%d: %d attempts", status, len(got.Attempts))
		}
	}
}

// TestNoRetryStartsAfterTheDeadline: a run whose next attempt would start
// after scheduledFor + 96 h fails, deadline_exceeded, instead of retrying.
func TestNoRetryStartsAfterTheDeadline(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/hook")
	e.sender.answer[j.URL] = []egress.Result{{StatusCode: 500, ErrorCode: egress.CodeHTTP5xx}}
	// Caught up 95 h 59 min 40 s late: the 30 s backoff ends after its deadline.
	r := e.run(t, j, "run_a", e.clock.Now().Add(-(96*time.Hour - 20*time.Second)))
	e.start(t, 8)
	if x := e.sender.next(t); x.payload["late"] != true {
		t.Fatalf("late = %v", x.payload["late"])
	}
	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
	if got.State != vibejobs.RunFailed || got.FailureReason != vibejobs.ReasonDeadlineExceeded || len(got.Attempts) != 1 {
		t.Fatalf("run %s (%s) with %d attempts", got.State, got.FailureReason, len(got.Attempts))
	}
}
