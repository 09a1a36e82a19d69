package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vibejobs/vibejobs"
)

// wantRun checks the queue fields of a run.
func (f *fixture) wantRun(what, id string, state vibejobs.RunState, attempt int, next *time.Time) *vibejobs.Run {
	f.t.Helper()
	got := f.getRun(projectA, id)
	if got.State != state || got.Attempt != attempt {
		f.t.Fatalf("%s: state %s attempt %d, want %s attempt %d", what, got.State, got.Attempt, state, attempt)
	}
	if next != nil {
		wantEqual(f.t, what+": NextAttemptAt", got.NextAttemptAt, next)
	}
	return got
}

func attemptNumbers(r *vibejobs.Run) string {
	var b strings.Builder
	for i, a := range r.Attempts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d", a.Number)
		if a.ErrorCode != "" {
			b.WriteString(":" + a.ErrorCode)
		}
	}
	return b.String()
}

func (f *fixture) wantAttempts(what string, r *vibejobs.Run, want string) {
	f.t.Helper()
	if got := attemptNumbers(r); got != want {
		f.t.Fatalf("%s: attempts %q, want %q", what, got, want)
	}
}

// wantEnded fails the test unless r ended in state for reason at at, with
// no next attempt.
func (f *fixture) wantEnded(what string, r *vibejobs.Run, state vibejobs.RunState, reason string, at time.Time) {
	f.t.Helper()
	if r.State != state || r.FailureReason != reason || r.FinishedAt == nil || !r.FinishedAt.Equal(at) || r.NextAttemptAt != nil {
		f.t.Errorf("%s: state %s reason %q finished %v next %v; want %s %s at %s",
			what, r.State, r.FailureReason, r.FinishedAt, r.NextAttemptAt, state, reason, at)
	}
}

func testClaimOrderAndLimit(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) {
		j.Retry = vibejobs.RetryPolicy{MaxAttempts: 3, MinBackoff: 2 * time.Second, MaxBackoff: time.Minute}
		j.Timeout = 7 * time.Second
	})
	a := f.run(j, T0.Add(-time.Minute))
	b := f.run(j, T0.Add(-3*time.Minute))
	c := f.run(j, T0.Add(-2*time.Minute))
	d := f.run(j, T0.Add(time.Millisecond))
	e := f.run(j, T0)

	cs := f.claimIDs("w1", T0, 2, b, c)
	cl := cs[0]
	if cl.URL != j.URL || cl.Timeout != j.Timeout {
		t.Errorf("claim: url %q timeout %s, want %q %s", cl.URL, cl.Timeout, j.URL, j.Timeout)
	}
	wantEqual(t, "claim secret", cl.Secret, j.Secret)
	wantEqual(t, "claim retry", cl.Retry, j.Retry)
	want := *b
	want.State, want.Attempt = vibejobs.RunDelivering, 1
	want.Late = true // three minutes after scheduledFor
	if cl.Run.State != want.State || cl.Run.Attempt != 1 || !cl.Run.Late ||
		cl.Run.JobID != j.ID || cl.Run.ProjectID != projectA || cl.Run.Trigger != vibejobs.TriggerManual ||
		!cl.Run.ScheduledFor.Equal(b.ScheduledFor) || !cl.Run.DeadlineAt.Equal(b.DeadlineAt) || !cl.Run.CreatedAt.Equal(b.CreatedAt) {
		t.Errorf("claimed run: %+v, want %+v", cl.Run, want)
	}
	f.wantRun("claimed run", b.ID, vibejobs.RunDelivering, 1, nil)

	f.claimIDs("w2", T0, 10, a, e)
	f.claimIDs("w3", T0, 10)
	f.claimIDs("w3", T0.Add(time.Millisecond), 10, d)
	if cs := f.claim("w3", T0, 0); len(cs) != 0 {
		t.Errorf("claim with limit 0: %d runs", len(cs))
	}
}

func testClaimDeadline(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	expired := f.run(j, T0.Add(-vibejobs.DeliveryLifetime-time.Millisecond), dueAt(T0.Add(-time.Hour)))
	edge := f.run(j, T0.Add(-vibejobs.DeliveryLifetime), dueAt(T0.Add(-time.Hour)))
	f.claimIDs("w1", T0, 10, edge)
	f.wantRun("run past its deadline", expired.ID, vibejobs.RunScheduled, 0, nil)
}

func testClaimUsesCurrentJobSettings(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	r := f.run(j, T0)
	u := f.getJob(projectA, j.ID)
	u.URL = "https://moved.example.test/new"
	u.Timeout = 20 * time.Second
	u.Retry = vibejobs.RetryPolicy{MaxAttempts: 2, MinBackoff: 5 * time.Second, MaxBackoff: 10 * time.Minute}
	u.Secret = vibejobs.SealedSecret{KeyID: "key2", Ciphertext: []byte("rotated")}
	f.update(func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, u) })

	c := f.claimIDs("w1", T0, 1, r)[0]
	if c.URL != u.URL || c.Timeout != u.Timeout {
		t.Errorf("claim: url %q timeout %s, want %q %s", c.URL, c.Timeout, u.URL, u.Timeout)
	}
	wantEqual(t, "claim secret", c.Secret, u.Secret)
	wantEqual(t, "claim retry", c.Retry, u.Retry)

	// The lease follows the timeout at claim: now + 20 s + margin.
	lease := T0.Add(20*time.Second + Margin)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, lease, 10); err != nil || n != 0 {
		t.Fatalf("RecoverExpiredLeases at the lease's end = %d, %v; want 0", n, err)
	}
	if n, err := f.s.RecoverExpiredLeases(f.ctx, lease.Add(time.Millisecond), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases after the lease = %d, %v; want 1", n, err)
	}
}

// Eight dispatchers claim at once: every run is claimed exactly once.
func testClaimConcurrent(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	const n = 300
	f.update(func(tx vibejobs.Tx) error {
		for i := range n {
			r := f.newRun(j, T0.Add(-time.Hour+time.Duration(i)*time.Millisecond))
			if err := tx.CreateRun(f.ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		claims = map[string]string{}
	)
	for w := range 8 {
		owner := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for range n {
				cs, err := f.s.ClaimDueRuns(f.ctx, owner, T0, 7, Margin)
				if err != nil {
					t.Errorf("ClaimDueRuns: %v", err)
					return
				}
				if len(cs) == 0 {
					return
				}
				if len(cs) > 7 {
					t.Errorf("ClaimDueRuns with limit 7 claimed %d", len(cs))
				}
				mu.Lock()
				for _, c := range cs {
					if prev, ok := claims[c.Run.ID]; ok {
						t.Errorf("run %s claimed by %s and %s", c.Run.ID, prev, owner)
					}
					claims[c.Run.ID] = owner
					if c.Run.Attempt != 1 {
						t.Errorf("run %s claimed at attempt %d", c.Run.ID, c.Run.Attempt)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(claims) != n {
		t.Fatalf("%d runs claimed, want %d", len(claims), n)
	}
	runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{State: vibejobs.RunDelivering}, vibejobs.Page{Limit: 100})
	if err != nil || len(runs) != 100 {
		t.Fatalf("ListRuns delivering: %d, %v", len(runs), err)
	}
}

// testClaimRecordConcurrent: dispatchers claim, record and give back at
// once, each run going round the queue attempt after attempt: no claim ever
// takes a run another claim still holds, no outcome of a held claim is
// dropped, and lease recovery running beside them finds no lease to take.
func testClaimRecordConcurrent(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	const n = 100 // one page
	f.update(func(tx vibejobs.Tx) error {
		for i := range n {
			if err := tx.CreateRun(f.ctx, f.newRun(j, T0.Add(-time.Hour+time.Duration(i)*time.Millisecond))); err != nil {
				return err
			}
		}
		return nil
	})
	// Each call takes the next microsecond: claims, outcomes and releases
	// follow one clock, and a run given back or retrying is due again at
	// once.
	var tick atomic.Int64
	now := func() time.Time { return T0.Add(time.Duration(tick.Add(1)) * time.Microsecond) }
	var (
		mu       sync.Mutex
		held     = map[string]string{} // run: its claim's owner
		finished int
	)
	maxAttempts := j.Retry.MaxAttempts
	var wg sync.WaitGroup
	for w := range 6 {
		owner := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for round := 0; ; round++ {
				mu.Lock()
				done := finished == n
				mu.Unlock()
				if done || t.Failed() {
					return
				}
				if round > 50*n {
					t.Errorf("%s: the runs did not finish in %d rounds (%d finished)", owner, round, finished)
					return
				}
				cs, err := f.s.ClaimDueRuns(f.ctx, owner, now(), 3, Margin)
				if err != nil {
					t.Errorf("ClaimDueRuns: %v", err)
					return
				}
				mu.Lock()
				for _, c := range cs {
					if prev, ok := held[c.Run.ID]; ok {
						t.Errorf("run %s claimed by %s while %s holds it", c.Run.ID, owner, prev)
					}
					held[c.Run.ID] = owner
				}
				mu.Unlock()
				for i, c := range cs {
					// Given back before any other process may claim it.
					mu.Lock()
					delete(held, c.Run.ID)
					mu.Unlock()
					at := now()
					switch {
					case c.Run.Attempt == maxAttempts:
						if err := f.s.RecordOutcomes(f.ctx, owner, []vibejobs.Outcome{succeeded(c, at, at)}); err != nil {
							t.Errorf("RecordOutcomes: %v", err)
						}
						mu.Lock()
						finished++
						mu.Unlock()
					case (round+i)%3 == 0:
						if err := f.s.ReleaseClaims(f.ctx, owner, []*vibejobs.Claim{c}, at, at); err != nil {
							t.Errorf("ReleaseClaims: %v", err)
						}
					default:
						if err := f.s.RecordOutcomes(f.ctx, owner, []vibejobs.Outcome{retrying(c, at, at, at)}); err != nil {
							t.Errorf("RecordOutcomes: %v", err)
						}
					}
				}
			}
		})
	}
	wg.Go(func() {
		for {
			mu.Lock()
			done := finished == n
			mu.Unlock()
			if done || t.Failed() {
				return
			}
			if k, err := f.s.RecoverExpiredLeases(f.ctx, now(), 10); err != nil || k != 0 {
				t.Errorf("RecoverExpiredLeases before any lease ended = %d, %v; want 0", k, err)
				return
			}
		}
	})
	wg.Wait()
	if t.Failed() {
		return
	}
	runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{State: vibejobs.RunSucceeded}, vibejobs.Page{Limit: n})
	if err != nil || len(runs) != n {
		t.Fatalf("ListRuns succeeded: %d runs, %v; want %d", len(runs), err, n)
	}
	for _, r := range runs {
		got := f.getRun(projectA, r.ID)
		var numbers []int
		for _, a := range got.Attempts {
			numbers = append(numbers, a.Number)
		}
		if want := []int{1, 2, 3, 4}[:maxAttempts]; !slices.Equal(numbers, want) {
			t.Errorf("run %s: attempts %v, want %v (an outcome dropped or recorded twice)", r.ID, numbers, want)
		}
	}
}

// testClaimCarriesDueTime: a claim tells when its run was due (its
// NextAttemptAt, which the claim clears), not when it was claimed: the
// scheduledFor of a first attempt, the next attempt time of a retry.
func testClaimCarriesDueTime(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	r := f.run(j, T0)

	c1 := f.claimIDs("w1", T0.Add(5*time.Second), 1, r)[0]
	if !c1.DueAt.Equal(T0) {
		t.Fatalf("first attempt claimed 5 s late: DueAt %v, want its scheduledFor %v", c1.DueAt, T0)
	}
	next := T0.Add(time.Minute)
	f.record("w1", retrying(c1, T0.Add(5*time.Second), T0.Add(6*time.Second), next))
	c2 := f.claimIDs("w1", next.Add(time.Minute), 1, r)[0]
	if c2.Run.Attempt != 2 || !c2.DueAt.Equal(next) {
		t.Fatalf("retry claimed a minute late: attempt %d, DueAt %v; want 2, %v", c2.Run.Attempt, c2.DueAt, next)
	}
}

func testAttemptNumberingAcrossRetries(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) { j.Retry.MaxAttempts = 3 })
	r := f.run(j, T0)

	c1 := f.claimIDs("w1", T0, 1, r)[0]
	if c1.Run.Attempt != 1 || c1.LateDecided {
		t.Fatalf("first claim: attempt %d, late decided before %v; want 1, false", c1.Run.Attempt, c1.LateDecided)
	}
	f.record("w1", retrying(c1, T0, T0.Add(time.Second), T0.Add(30*time.Second)))
	got := f.wantRun("after a retryable answer", r.ID, vibejobs.RunRetrying, 1, ptr(T0.Add(30*time.Second)))
	if got.FinishedAt != nil {
		t.Errorf("retrying run has FinishedAt %v", got.FinishedAt)
	}
	f.wantAttempts("after a retryable answer", got, "1:http_5xx")

	f.claimIDs("w1", T0.Add(30*time.Second-time.Millisecond), 1)
	c2 := f.claimIDs("w2", T0.Add(30*time.Second), 1, r)[0]
	if c2.Run.Attempt != 2 || !c2.LateDecided {
		t.Fatalf("second claim: attempt %d, late decided before %v; want 2, true", c2.Run.Attempt, c2.LateDecided)
	}
	f.record("w2", retrying(c2, T0.Add(30*time.Second), T0.Add(31*time.Second), T0.Add(6*time.Minute)))
	c3 := f.claimIDs("w1", T0.Add(6*time.Minute), 1, r)[0]
	if c3.Run.Attempt != 3 {
		t.Fatalf("third claim: attempt %d", c3.Run.Attempt)
	}
	end := T0.Add(6*time.Minute + 2*time.Second)
	f.record("w1", failed(c3, T0.Add(6*time.Minute), end, 500, vibejobs.ReasonAttemptsExhausted))
	got = f.wantRun("after the last attempt", r.ID, vibejobs.RunFailed, 3, nil)
	if got.FailureReason != vibejobs.ReasonAttemptsExhausted || got.FinishedAt == nil || !got.FinishedAt.Equal(end) || got.NextAttemptAt != nil {
		t.Errorf("failed run: reason %q finished %v next %v; want attempts_exhausted at %s, no next",
			got.FailureReason, got.FinishedAt, got.NextAttemptAt, end)
	}
	f.wantAttempts("after the last attempt", got, "1:http_5xx 2:http_5xx 3:http_5xx")
}

func testLateDecidedOnce(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	onTime := f.run(j, T0)
	late := f.run(j, T0.Add(-2*time.Minute), dueAt(T0.Add(3*time.Hour)))
	edge := f.run(j, T0.Add(5*time.Hour))

	// Exactly 60 s after scheduledFor is not late; the flag stays on a late retry.
	c := f.claimIDs("w1", T0.Add(vibejobs.LateThreshold), 1, onTime)[0]
	if c.Run.Late {
		t.Errorf("first attempt 60 s after scheduledFor: late")
	}
	f.record("w1", retrying(c, c.Run.ScheduledFor, T0.Add(61*time.Second), T0.Add(2*time.Hour)))
	c = f.claimIDs("w1", T0.Add(2*time.Hour), 1, onTime)[0]
	if c.Run.Attempt != 2 || c.Run.Late {
		t.Errorf("second attempt two hours later: attempt %d late %v, want 2 false", c.Run.Attempt, c.Run.Late)
	}
	f.record("w1", succeeded(c, T0.Add(2*time.Hour), T0.Add(2*time.Hour+time.Second)))
	if f.getRun(projectA, onTime.ID).Late {
		t.Errorf("stored run: late")
	}

	c = f.claimIDs("w1", T0.Add(3*time.Hour), 1, late)[0]
	if !c.Run.Late {
		t.Errorf("first attempt three hours after scheduledFor: not late")
	}
	// Readers see what the attempt in flight sent.
	if got := f.getRun(projectA, late.ID); got.State != vibejobs.RunDelivering || !got.Late {
		t.Errorf("run during its late first attempt: %s, late %v; want delivering, late", got.State, got.Late)
	}
	f.record("w1", retrying(c, T0.Add(3*time.Hour), T0.Add(3*time.Hour+time.Second), T0.Add(3*time.Hour+2*time.Second)))
	c = f.claimIDs("w1", T0.Add(3*time.Hour+2*time.Second), 1, late)[0]
	if c.Run.Attempt != 2 || !c.Run.Late {
		t.Errorf("retry of a late run: attempt %d late %v, want 2 true", c.Run.Attempt, c.Run.Late)
	}
	if !f.getRun(projectA, late.ID).Late {
		t.Errorf("stored late run: not late")
	}

	c = f.claimIDs("w1", T0.Add(5*time.Hour+vibejobs.LateThreshold+time.Millisecond), 1, edge)[0]
	if !c.Run.Late {
		t.Errorf("first attempt 60.001 s after scheduledFor: not late")
	}
}

func testRecordOutcomes(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	a := f.run(j, T0.Add(-3*time.Minute))
	b := f.run(j, T0.Add(-2*time.Minute))
	c := f.run(j, T0.Add(-time.Minute))
	cs := f.claimIDs("w1", T0, 3, a, b, c)

	long := strings.Repeat("x", 2000)
	multi := strings.Repeat("y", vibejobs.SnippetBytes-1) + "é…"
	oa := succeeded(cs[0], T0, T0.Add(250*time.Millisecond))
	oa.Attempt.ResponseSnippet = long
	ob := failed(cs[1], T0, T0.Add(300*time.Millisecond), 401, vibejobs.ReasonAppRejected)
	ob.Attempt.ResponseSnippet = multi
	oc := outcome(cs[2], T0, T0.Add(10*time.Second), 0, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: ptr(T0.Add(40 * time.Second))})
	oc.Attempt.SignatureTimestamp = T0.Unix() + 1
	f.record("w1", oa, ob, oc)

	got := f.wantRun("succeeded run", a.ID, vibejobs.RunSucceeded, 1, nil)
	if got.FinishedAt == nil || !got.FinishedAt.Equal(oa.Attempt.FinishedAt) || got.FailureReason != "" || got.NextAttemptAt != nil {
		t.Errorf("succeeded run: finished %v reason %q next %v", got.FinishedAt, got.FailureReason, got.NextAttemptAt)
	}
	want := oa.Attempt
	want.ResponseSnippet = long[:vibejobs.SnippetBytes]
	wantEqual(t, "attempt of the succeeded run", got.Attempts, []vibejobs.Attempt{want})

	got = f.wantRun("rejected run", b.ID, vibejobs.RunFailed, 1, nil)
	if got.FinishedAt == nil || !got.FinishedAt.Equal(ob.Attempt.FinishedAt) || got.FailureReason != vibejobs.ReasonAppRejected {
		t.Errorf("rejected run: finished %v reason %q", got.FinishedAt, got.FailureReason)
	}
	if len(got.Attempts) != 1 {
		t.Fatalf("rejected run: %d attempts", len(got.Attempts))
	}
	s := got.Attempts[0].ResponseSnippet
	if len(s) > vibejobs.SnippetBytes || len(s) < vibejobs.SnippetBytes-utf8.UTFMax || !strings.HasPrefix(multi, s) || !utf8.ValidString(s) {
		t.Errorf("snippet cut inside a character: %d bytes, valid UTF-8 %v", len(s), utf8.ValidString(s))
	}
	want = ob.Attempt
	want.ResponseSnippet = s
	wantEqual(t, "attempt of the rejected run", got.Attempts, []vibejobs.Attempt{want})

	got = f.wantRun("retrying run", c.ID, vibejobs.RunRetrying, 1, ptr(T0.Add(40*time.Second)))
	if got.FinishedAt != nil || got.FailureReason != "" {
		t.Errorf("retrying run: finished %v reason %q", got.FinishedAt, got.FailureReason)
	}
	wantEqual(t, "attempt of the retrying run", got.Attempts, []vibejobs.Attempt{oc.Attempt})

	if err := f.s.RecordOutcomes(f.ctx, "w1", nil); err != nil {
		t.Errorf("RecordOutcomes of nothing: %v", err)
	}
}

// No attempt starts after the run's deadline: a retrying step due after it
// (at NextAttemptAt, or at the attempt's end when nil) fails the run
// instead, so that no run waits past its deadline (FailExpiredRuns relies
// on it). A deleted job's run is cancelled all the same.
func testRecordRetryAfterDeadline(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	gone := f.job(projectA)
	at := T0.Add(-vibejobs.DeliveryLifetime + 10*time.Second)
	deadline := at.Add(vibejobs.DeliveryLifetime) // T0+10s
	edge, after, now, deleted := f.run(j, at), f.run(j, at), f.run(j, at), f.run(gone, at)
	cs := f.claimIDs("w1", T0, 4, edge, after, now, deleted)
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, gone.ID, T0) })
	retryNow := outcome(cs[2], T0, deadline.Add(time.Second), 0, vibejobs.Step{State: vibejobs.RunRetrying})
	f.record("w1",
		retrying(cs[0], T0, T0.Add(time.Second), deadline),
		retrying(cs[1], T0, T0.Add(time.Second), deadline.Add(time.Millisecond)),
		retryNow,
		retrying(cs[3], T0, T0.Add(time.Second), deadline.Add(time.Millisecond)))

	f.wantRun("retry at the deadline", edge.ID, vibejobs.RunRetrying, 1, &deadline)
	for _, c := range []struct {
		what, id string
		finished time.Time
		attempts string
	}{
		{"retry after the deadline", after.ID, T0.Add(time.Second), "1:http_5xx"},
		{"retry at once, after the deadline", now.ID, deadline.Add(time.Second), "1:timeout"},
	} {
		got := f.wantRun(c.what, c.id, vibejobs.RunFailed, 1, nil)
		if got.FailureReason != vibejobs.ReasonDeadlineExceeded || got.FinishedAt == nil || !got.FinishedAt.Equal(c.finished) {
			t.Errorf("%s: reason %q finished %v; want deadline_exceeded at %s", c.what, got.FailureReason, got.FinishedAt, c.finished)
		}
		f.wantAttempts(c.what, got, c.attempts)
	}
	if got := f.wantRun("retry of a deleted job's run", deleted.ID, vibejobs.RunCancelled, 1, nil); got.FailureReason != vibejobs.ReasonJobDeleted {
		t.Errorf("retry of a deleted job's run: reason %q, want job_deleted", got.FailureReason)
	}
	var failed []string
	for _, e := range f.events(projectA, 0) {
		if e.Type == vibejobs.EventRunFailed {
			failed = append(failed, eventLine(e))
		}
	}
	wantEqual(t, "run.failed events", failed, []string{
		"run.failed " + after.ID + " 1 failed deadline_exceeded http_5xx",
		"run.failed " + now.ID + " 1 failed deadline_exceeded timeout",
	})
}

func testRecordOutcomesDropped(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	a := f.run(j, T0.Add(-2*time.Minute))
	b := f.run(j, T0.Add(-time.Minute))
	cs := f.claimIDs("w1", T0, 2, a, b)
	ca, cb := cs[0], cs[1]

	f.record("w2", succeeded(ca, T0, T0.Add(time.Second)))
	got := f.wantRun("outcome of another owner", a.ID, vibejobs.RunDelivering, 1, nil)
	f.wantAttempts("outcome of another owner", got, "")

	wrong := succeeded(ca, T0, T0.Add(time.Second))
	wrong.Attempt.Number = 2
	f.record("w1", wrong)
	got = f.wantRun("outcome of another attempt number", a.ID, vibejobs.RunDelivering, 1, nil)
	f.wantAttempts("outcome of another attempt number", got, "")

	missing := succeeded(ca, T0, T0.Add(time.Second))
	missing.RunID = "run_missing"
	f.record("w1", missing, succeeded(cb, T0, T0.Add(time.Second)))
	f.wantRun("valid outcome beside a dropped one", b.ID, vibejobs.RunSucceeded, 1, nil)

	f.record("w1", failed(cb, T0, T0.Add(2*time.Second), 500, vibejobs.ReasonAttemptsExhausted))
	got = f.wantRun("second outcome of a finished run", b.ID, vibejobs.RunSucceeded, 1, nil)
	f.wantAttempts("second outcome of a finished run", got, "1")

	// After its lease was recovered, the old owner's outcome is dropped.
	if n, err := f.s.RecoverExpiredLeases(f.ctx, T0.Add(time.Minute), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	f.record("w1", succeeded(ca, T0, T0.Add(61*time.Second)))
	got = f.wantRun("outcome after the lease was recovered", a.ID, vibejobs.RunScheduled, 1, nil)
	f.wantAttempts("outcome after the lease was recovered", got, "1:interrupted")

	// Nor once the same owner claimed the run again (the same attempt
	// number, resent): the old claim's outcome arrives late, say after the
	// database was away for longer than the lease. It must not end the new
	// claim, whose own outcome is then recorded.
	again := f.claimIDs("w1", T0.Add(2*time.Minute), 1, a)[0]
	if again.Run.Attempt != ca.Run.Attempt || again.ClaimedAt.Equal(ca.ClaimedAt) {
		t.Fatalf("redelivery claim: attempt %d claimed at %s; want attempt %d, a new claim time",
			again.Run.Attempt, again.ClaimedAt, ca.Run.Attempt)
	}
	next := T0.Add(time.Hour)
	f.record("w1", retrying(ca, T0, T0.Add(62*time.Second), next))
	got = f.wantRun("outcome of the owner's earlier claim", a.ID, vibejobs.RunDelivering, 1, nil)
	f.wantAttempts("outcome of the owner's earlier claim", got, "1:interrupted")
	f.record("w1", succeeded(again, T0.Add(2*time.Minute), T0.Add(2*time.Minute+time.Second)))
	got = f.wantRun("outcome of the owner's new claim", a.ID, vibejobs.RunSucceeded, 1, nil)
	f.wantAttempts("outcome of the owner's new claim", got, "1:interrupted 1")

	// Both outcomes in one call, in either order (and one repeated): the
	// new claim's is recorded, once.
	for i, stale := range []bool{true, false} {
		at := T0.Add(time.Duration(3+i) * time.Hour)
		r := f.run(j, at)
		old := f.claimIDs("w1", at, 1, r)[0]
		if n, err := f.s.RecoverExpiredLeases(f.ctx, at.Add(time.Minute), 10); err != nil || n != 1 {
			t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
		}
		again := f.claimIDs("w1", at.Add(2*time.Minute), 1, r)[0]
		done := succeeded(again, at.Add(2*time.Minute), at.Add(2*time.Minute+time.Second))
		late := retrying(old, at, at.Add(62*time.Second), at.Add(time.Hour))
		if stale {
			f.record("w1", late, done)
		} else {
			f.record("w1", done, late, done)
		}
		got = f.wantRun("both claims' outcomes in one call", r.ID, vibejobs.RunSucceeded, 1, nil)
		f.wantAttempts("both claims' outcomes in one call", got, "1:interrupted 1")
	}
}

func testRecoverExpiredLeases(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) { j.Timeout = 10 * time.Second })
	r := f.run(j, T0)
	if c := f.claimIDs("w1", T0, 1, r)[0]; c.LateDecided {
		t.Fatal("first claim: late decided before it")
	}

	lease := T0.Add(10*time.Second + Margin)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, lease, 10); err != nil || n != 0 {
		t.Fatalf("RecoverExpiredLeases at the lease's end = %d, %v; want 0", n, err)
	}
	now := lease.Add(time.Millisecond)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, now, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	got := f.wantRun("recovered first attempt", r.ID, vibejobs.RunScheduled, 1, &now)
	if got.FinishedAt != nil || got.Late {
		t.Errorf("recovered run: finished %v late %v", got.FinishedAt, got.Late)
	}
	wantEqual(t, "interrupted attempt", got.Attempts, []vibejobs.Attempt{{
		Number: 1, StartedAt: T0, FinishedAt: now, ErrorCode: vibejobs.ErrorCodeInterrupted,
	}})
	if n, err := f.s.RecoverExpiredLeases(f.ctx, now.Add(time.Hour), 10); err != nil || n != 0 {
		t.Fatalf("RecoverExpiredLeases again = %d, %v; want 0", n, err)
	}

	// Sent again under the same number; late is not decided again.
	c := f.claimIDs("w2", T0.Add(2*time.Minute), 1, r)[0]
	if c.Run.Attempt != 1 || c.Run.Late || !c.LateDecided {
		t.Fatalf("redelivery: attempt %d late %v, late decided before %v; want 1 false true", c.Run.Attempt, c.Run.Late, c.LateDecided)
	}
	f.record("w2", succeeded(c, T0.Add(2*time.Minute), T0.Add(2*time.Minute+time.Second)))
	got = f.wantRun("redelivered run", r.ID, vibejobs.RunSucceeded, 1, nil)
	f.wantAttempts("redelivered run", got, "1:interrupted 1")
}

func testRecoverExpiredLeasesRetrying(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) { j.Timeout = 10 * time.Second })
	r := f.run(j, T0)
	c := f.claimIDs("w1", T0, 1, r)[0]
	f.record("w1", retrying(c, T0, T0.Add(time.Second), T0.Add(time.Minute)))
	f.claimIDs("w1", T0.Add(time.Minute), 1, r)

	now := T0.Add(time.Minute + 10*time.Second + Margin + time.Millisecond)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, now, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	got := f.wantRun("recovered second attempt", r.ID, vibejobs.RunRetrying, 2, &now)
	f.wantAttempts("recovered second attempt", got, "1:http_5xx 2:interrupted")

	c = f.claimIDs("w2", now, 1, r)[0]
	if c.Run.Attempt != 2 {
		t.Fatalf("redelivery of attempt 2: attempt %d", c.Run.Attempt)
	}
	f.record("w2", retrying(c, now, now.Add(time.Second), now.Add(time.Minute)))
	c = f.claimIDs("w2", now.Add(time.Minute), 1, r)[0]
	if c.Run.Attempt != 3 {
		t.Fatalf("attempt after a redelivered one: %d, want 3", c.Run.Attempt)
	}
	f.wantAttempts("after redelivery", f.getRun(projectA, r.ID), "1:http_5xx 2:interrupted 2:http_5xx")
}

func testRecoverExpiredLeasesEnds(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) { j.Timeout = 10 * time.Second })
	k := f.job(projectA, func(j *vibejobs.Job) { j.Timeout = 10 * time.Second })
	expiring := f.run(j, T0.Add(-vibejobs.DeliveryLifetime+10*time.Second), dueAt(T0))
	orphan := f.run(k, T0, dueAt(T0.Add(-time.Second)))
	f.claimIDs("w1", T0, 2, orphan, expiring)
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, k.ID, T0.Add(time.Second)) })

	now := T0.Add(16 * time.Second)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, now, 10); err != nil || n != 2 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 2", n, err)
	}
	got := f.getRun(projectA, expiring.ID)
	f.wantEnded("recovered run past its deadline", got, vibejobs.RunFailed, vibejobs.ReasonDeadlineExceeded, now)
	f.wantAttempts("recovered run past its deadline", got, "1:interrupted")
	got = f.getRun(projectA, orphan.ID)
	f.wantEnded("recovered run of a deleted job", got, vibejobs.RunCancelled, vibejobs.ReasonJobDeleted, now)
	f.wantAttempts("recovered run of a deleted job", got, "1:interrupted")
	f.claimIDs("w2", now, 10)
}

func testRecoverExpiredLeasesLimit(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	for i := range 3 {
		f.run(j, T0.Add(-time.Duration(i+1)*time.Second))
	}
	if cs := f.claim("w1", T0, 10); len(cs) != 3 {
		t.Fatalf("claimed %d, want 3", len(cs))
	}
	for _, want := range []int{2, 1, 0} {
		if n, err := f.s.RecoverExpiredLeases(f.ctx, T0.Add(time.Minute), 2); err != nil || n != want {
			t.Fatalf("RecoverExpiredLeases with limit 2 = %d, %v; want %d", n, err, want)
		}
	}
}

func testReleaseClaims(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	a := f.run(j, T0, dueAt(T0.Add(-3*time.Second)))
	b := f.run(j, T0, dueAt(T0.Add(-2*time.Second)))
	c := f.run(j, T0, dueAt(T0.Add(-time.Second)))
	cs := f.claimIDs("w1", T0, 3, a, b, c)

	rel := T0.Add(time.Second)
	if err := f.s.ReleaseClaims(f.ctx, "w1", cs[:2], rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	// Due again at once, in their place in line: at the due times the
	// claims took them at. Attempt is the number of the latest attempt
	// started: none was.
	for _, r := range []*vibejobs.Run{a, b} {
		got := f.wantRun("released run", r.ID, vibejobs.RunScheduled, 0, r.NextAttemptAt)
		f.wantAttempts("released run", got, "")
	}
	// Another owner's release, or a release of a run no longer held, changes nothing.
	if err := f.s.ReleaseClaims(f.ctx, "w2", cs[2:], rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.wantRun("run released by another owner", c.ID, vibejobs.RunDelivering, 1, nil)
	if err := f.s.ReleaseClaims(f.ctx, "w1", cs[:1], T0.Add(5*time.Second), T0.Add(5*time.Second)); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.wantRun("run released twice", a.ID, vibejobs.RunScheduled, 0, a.NextAttemptAt)
	if err := f.s.ReleaseClaims(f.ctx, "w1", nil, rel, rel); err != nil {
		t.Fatalf("ReleaseClaims of nothing: %v", err)
	}
	// The released claim cannot record an outcome.
	f.record("w1", succeeded(cs[0], T0, T0.Add(time.Second)))
	f.wantRun("outcome of a released claim", a.ID, vibejobs.RunScheduled, 0, a.NextAttemptAt)

	// Claimed again under the same number; late is decided by this first send.
	again := f.claim("w3", T0.Add(2*time.Minute), 10)
	ids := claimedIDs(again)
	slices.Sort(ids)
	if want := []string{a.ID, b.ID}; !slices.Equal(ids, want) {
		t.Fatalf("claim after release: %v, want %v", ids, want)
	}
	for _, cl := range again {
		if cl.Run.Attempt != 1 || !cl.Run.Late || cl.LateDecided {
			t.Errorf("released first attempt claimed again: attempt %d late %v, late decided before %v; want 1 true false",
				cl.Run.Attempt, cl.Run.Late, cl.LateDecided)
		}
	}

	// A released retry goes back to the number of its last attempt, and
	// its next claim sends the one it did not send; it keeps its late flag.
	d := f.run(j, T0.Add(time.Hour))
	cd := f.claimIDs("w1", T0.Add(time.Hour), 1, d)[0]
	f.record("w1", retrying(cd, T0.Add(time.Hour), T0.Add(time.Hour+time.Second), T0.Add(time.Hour+time.Minute)))
	cd = f.claimIDs("w1", T0.Add(time.Hour+time.Minute), 1, d)[0]
	rel = T0.Add(time.Hour + 2*time.Minute)
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{cd}, rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	got := f.wantRun("released retry", d.ID, vibejobs.RunRetrying, 1, ptr(T0.Add(time.Hour+time.Minute)))
	f.wantAttempts("released retry", got, "1:http_5xx")
	cd = f.claimIDs("w2", rel, 1, d)[0]
	if cd.Run.Attempt != 2 || cd.Run.Late {
		t.Errorf("released retry claimed again: attempt %d late %v, want 2 false", cd.Run.Attempt, cd.Run.Late)
	}
}

// testReleaseOfARedelivery: a released redelivery (its attempt went out,
// was interrupted, and must go again under its number) keeps that number,
// and its next claim sends it again.
func testReleaseOfARedelivery(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	e := f.run(j, T0.Add(2*time.Hour))
	f.claimIDs("w1", T0.Add(2*time.Hour), 1, e)
	recovered := T0.Add(2*time.Hour + time.Minute)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, recovered, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	ce := f.claimIDs("w1", recovered, 1, e)[0]
	if ce.Run.Attempt != 1 {
		t.Fatalf("redelivery claimed as attempt %d, want 1", ce.Run.Attempt)
	}
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{ce}, recovered, recovered); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	got := f.wantRun("released redelivery", e.ID, vibejobs.RunScheduled, 1, ptr(recovered))
	f.wantAttempts("released redelivery", got, "1:interrupted")
	if ce = f.claimIDs("w2", recovered, 1, e)[0]; ce.Run.Attempt != 1 {
		t.Errorf("released redelivery claimed again as attempt %d, want 1", ce.Run.Attempt)
	}
}

// testReleaseWithALaterDue: a claim given back to wait (as the dispatcher
// gives back one whose secret it cannot open) is claimable again from due,
// not before; but the release happens at now, so a run of a job deleted
// meanwhile is cancelled at now, its event occurring then. Released with
// now set to the due time, the store recorded such a run as finished, and
// its run.cancelled event as occurring, 30 s in the future.
func testReleaseWithALaterDue(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	k := f.job(projectA)
	live := f.run(j, T0, dueAt(T0.Add(-2*time.Second)))
	gone := f.run(k, T0, dueAt(T0.Add(-time.Second)))
	cs := f.claimIDs("w1", T0, 2, live, gone)
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, k.ID, T0) })
	head := f.head(projectA)

	now := T0.Add(time.Second)
	due := now.Add(30 * time.Second)
	if err := f.s.ReleaseClaims(f.ctx, "w1", cs, now, due); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	got := f.getRun(projectA, gone.ID)
	f.wantEnded("released claim of a deleted job, due later", got, vibejobs.RunCancelled, vibejobs.ReasonJobDeleted, now)
	events := f.events(projectA, head)
	wantEqual(t, "events of the release", eventLines(events), []string{"run.cancelled " + gone.ID + " 0 cancelled job_deleted"})
	if len(events) == 1 && !events[0].OccurredAt.Equal(now) {
		t.Errorf("run.cancelled at %s, want %s", events[0].OccurredAt, now)
	}

	got = f.wantRun("live run released with a later due", live.ID, vibejobs.RunScheduled, 0, &due)
	f.wantAttempts("live run released with a later due", got, "")
	if next, ok, err := f.s.NextDueAt(f.ctx); err != nil || !ok || !next.Equal(due) {
		t.Errorf("NextDueAt = %s %v %v, want %s", next, ok, err, due)
	}
	f.claimIDs("w2", now, 10)
	f.claimIDs("w2", due.Add(-time.Millisecond), 10)
	again := f.claimIDs("w2", due, 10, live)[0]
	if again.Run.Attempt != 1 {
		t.Errorf("claimed again as attempt %d, want 1", again.Run.Attempt)
	}
}

// testReleaseDueAfterItsDeadline: a run released with a due after its
// deadline is due at its deadline instead (at now, if that passed), so that
// FailExpiredRuns, which looks only among the runs due by its time, ends it
// once the deadline passes, not once due comes.
func testReleaseDueAfterItsDeadline(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	life := vibejobs.DeliveryLifetime
	// Deadline T0+10s, released at T0 to be due at T0+30s.
	soon := f.run(j, T0.Add(-life+10*time.Second), dueAt(T0.Add(-2*time.Second)))
	// Deadline T0−1s, past when released at T0.
	past := f.run(j, T0.Add(-life-time.Second), dueAt(T0.Add(-2*time.Second)))
	cs := f.claimIDs("w1", T0.Add(-2*time.Second), 10, soon, past)
	if err := f.s.ReleaseClaims(f.ctx, "w1", cs, T0, T0.Add(30*time.Second)); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.wantRun("released with a due after its deadline", soon.ID, vibejobs.RunScheduled, 0, ptr(T0.Add(10*time.Second)))
	f.wantRun("released after its deadline", past.ID, vibejobs.RunScheduled, 0, ptr(T0))

	if n, err := f.s.FailExpiredRuns(f.ctx, T0.Add(10*time.Second+time.Millisecond), 10); err != nil || n != 2 {
		t.Fatalf("FailExpiredRuns after both deadlines, before the due asked = %d, %v; want 2", n, err)
	}
	for _, r := range []*vibejobs.Run{soon, past} {
		if got := f.getRun(projectA, r.ID); got.State != vibejobs.RunFailed || got.FailureReason != vibejobs.ReasonDeadlineExceeded {
			t.Errorf("run released past its deadline: %s %q, want failed deadline_exceeded", got.State, got.FailureReason)
		}
	}
}

// testReleaseKeepsLateOfASentFirstAttempt: a first attempt that was sent
// (and interrupted) keeps its late flag through a release of its
// redelivery: the app has seen it once already.
func testReleaseKeepsLateOfASentFirstAttempt(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	e := f.run(j, T0)
	f.claimIDs("w1", T0, 1, e)
	recovered := T0.Add(time.Minute)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, recovered, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	ce := f.claimIDs("w2", recovered, 1, e)
	if err := f.s.ReleaseClaims(f.ctx, "w2", ce, recovered, recovered); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	got := f.wantRun("released redelivery of a first attempt", e.ID, vibejobs.RunScheduled, 1, &recovered)
	f.wantAttempts("released redelivery of a first attempt", got, "1:interrupted")
	c := f.claimIDs("w3", recovered.Add(5*time.Minute), 1, e)[0]
	if c.Run.Attempt != 1 || c.Run.Late || !c.LateDecided {
		t.Errorf("released redelivery of a first attempt sent on time, claimed again: attempt %d late %v, late decided before %v; want 1 false true",
			c.Run.Attempt, c.Run.Late, c.LateDecided)
	}
}

func testNextDueAt(t *testing.T, f *fixture) {
	f.projects()
	if _, ok, err := f.s.NextDueAt(f.ctx); err != nil || ok {
		t.Fatalf("NextDueAt of an empty queue: ok %v, %v", ok, err)
	}
	j := f.job(projectA)
	f.claimOne(j, "w1")
	f.finishedRun(j, T0.Add(-9*time.Hour))
	f.retryingRun(j, T0.Add(30*time.Second))
	f.run(j, T0.Add(5*time.Minute))
	f.run(j, T0.Add(time.Minute))
	// Past its deadline by the store's clock (T0): never claimable, not due.
	f.run(j, T0.Add(-vibejobs.DeliveryLifetime-time.Millisecond), dueAt(T0.Add(-time.Hour)))
	next, ok, err := f.s.NextDueAt(f.ctx)
	if err != nil || !ok || !next.Equal(T0.Add(30*time.Second)) {
		t.Fatalf("NextDueAt = %s %v %v, want %s", next, ok, err, T0.Add(30*time.Second))
	}
	f.claim("w1", T0.Add(30*time.Second), 10)
	next, ok, err = f.s.NextDueAt(f.ctx)
	if err != nil || !ok || !next.Equal(T0.Add(time.Minute)) {
		t.Fatalf("NextDueAt after a claim = %s %v %v, want %s", next, ok, err, T0.Add(time.Minute))
	}
}

func testQueueStats(t *testing.T, f *fixture) {
	f.projects()
	st, err := f.s.QueueStats(f.ctx, T0)
	if err != nil || st.Due != 0 || st.OldestDueAge != 0 {
		t.Fatalf("QueueStats of an empty queue = %+v, %v", st, err)
	}
	j := f.job(projectA)
	f.claimOne(j, "w1")
	f.finishedRun(j, T0.Add(-9*time.Hour))
	f.run(j, T0.Add(-30*time.Second))
	f.run(j, T0.Add(-10*time.Second))
	f.run(j, T0)
	f.run(j, T0.Add(time.Minute))
	f.run(j, T0.Add(-vibejobs.DeliveryLifetime-time.Hour)) // past its deadline: not claimable
	st, err = f.s.QueueStats(f.ctx, T0)
	if err != nil || st.Due != 3 || st.OldestDueAge != 30*time.Second {
		t.Fatalf("QueueStats = %+v, %v; want 3 due, oldest 30s", st, err)
	}
}

// testReleaseOfARecoveredClaim: a claim whose lease was recovered, its run
// claimed again by the same owner, releases nothing: the newer claim keeps
// its lease (released, its attempt would be sent, and the run claimed and
// sent again), and its outcome still counts.
func testReleaseOfARecoveredClaim(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	r := f.run(j, T0)
	old := f.claimIDs("w1", T0, 1, r)[0]
	recovered := T0.Add(time.Minute)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, recovered, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	again := f.claimIDs("w1", recovered, 1, r)[0]
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{old}, recovered.Add(time.Second), recovered.Add(time.Second)); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.wantRun("run claimed again after the release of its recovered claim", r.ID, vibejobs.RunDelivering, 1, nil)
	f.claimIDs("w2", recovered.Add(time.Second), 10)
	f.record("w1", succeeded(again, recovered, recovered.Add(time.Second)))
	got := f.wantRun("outcome of the newer claim", r.ID, vibejobs.RunSucceeded, 1, nil)
	f.wantAttempts("outcome of the newer claim", got, "1:interrupted 1")
}

func testFailExpiredRuns(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	life := vibejobs.DeliveryLifetime

	// Retrying, deadline T0−10s.
	e2 := f.run(j, T0.Add(-life-10*time.Second))
	c := f.claimIDs("w1", e2.ScheduledFor, 1, e2)[0]
	f.record("w1", retrying(c, e2.ScheduledFor, e2.ScheduledFor.Add(time.Second), T0.Add(-20*time.Second)))
	// Delivering, deadline T0−5s: left to lease recovery.
	d := f.run(j, T0.Add(-life-5*time.Second), dueAt(T0.Add(-6*time.Second)))
	f.claimIDs("w1", T0.Add(-6*time.Second), 1, d)
	// Claimed at its deadline, T0−30s, and put back after it: due then.
	rel := f.run(j, T0.Add(-life-30*time.Second))
	crel := f.claimIDs("w1", T0.Add(-30*time.Second), 1, rel)
	if err := f.s.ReleaseClaims(f.ctx, "w1", crel, T0.Add(-29*time.Second), T0.Add(-29*time.Second)); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	// Scheduled, deadline T0−1ms.
	e1 := f.run(j, T0.Add(-life-time.Millisecond))
	// Deadline exactly now: still claimable.
	edge := f.run(j, T0.Add(-life))
	future := f.run(j, T0)

	for _, want := range []int{1, 1, 1, 0} {
		limit := 1
		if want == 0 {
			limit = 10
		}
		if n, err := f.s.FailExpiredRuns(f.ctx, T0, limit); err != nil || n != want {
			t.Fatalf("FailExpiredRuns(limit %d) = %d, %v; want %d", limit, n, err, want)
		}
	}
	for _, r := range []*vibejobs.Run{e1, e2, rel} {
		got := f.getRun(projectA, r.ID)
		f.wantEnded("expired run", got, vibejobs.RunFailed, vibejobs.ReasonDeadlineExceeded, T0)
	}
	f.wantRun("delivering run past its deadline", d.ID, vibejobs.RunDelivering, 1, nil)
	f.wantRun("run at its deadline", edge.ID, vibejobs.RunScheduled, 0, nil)
	f.wantRun("future run", future.ID, vibejobs.RunScheduled, 0, nil)
}

func testPruneRuns(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	k := f.job(projectB)
	day := 24 * time.Hour
	finish := func(job *vibejobs.Job, claimAt, finishedAt time.Time) *vibejobs.Run {
		c := f.claimAt(job, "w1", claimAt)
		f.record("w1", succeeded(c, claimAt, finishedAt))
		return c.Run
	}
	f1 := finish(j, T0.Add(-20*day), T0.Add(-10*day))
	f2 := finish(j, T0.Add(-19*day), T0.Add(-8*day))
	f3 := finish(j, T0.Add(-18*day), T0.Add(-day))
	atCutoff := finish(j, T0.Add(-17*day), T0.Add(-7*day))
	other := finish(k, T0.Add(-16*day), T0.Add(-10*day))
	oldDelivering := f.claimAt(j, "w1", T0.Add(-15*day)).Run
	expired := f.run(j, T0.Add(-30*day))
	if n, err := f.s.FailExpiredRuns(f.ctx, T0.Add(-25*day), 10); err != nil || n != 1 {
		t.Fatalf("FailExpiredRuns = %d, %v; want 1", n, err)
	}
	oldWaiting := f.run(j, T0.Add(-60*day))
	oldRetrying := f.retryingRun(j, T0.Add(time.Hour))

	cutoff := T0.Add(-7 * day)
	for _, want := range []int{1, 2, 0} {
		limit := 10
		if want == 1 {
			limit = 1
		}
		if n, err := f.s.PruneRuns(f.ctx, projectA, cutoff, limit); err != nil || n != want {
			t.Fatalf("PruneRuns(limit %d) = %d, %v; want %d", limit, n, err, want)
		}
	}
	for _, r := range []*vibejobs.Run{f1, f2, expired} {
		_, err := f.s.GetRun(f.ctx, projectA, r.ID)
		wantNotFound(t, "GetRun of a pruned run", err, "run")
	}
	for _, r := range []*vibejobs.Run{f3, atCutoff, oldDelivering, oldWaiting, oldRetrying} {
		f.getRun(projectA, r.ID)
	}
	if _, err := f.s.GetRun(f.ctx, projectB, other.ID); err != nil {
		t.Errorf("another project's run pruned: %v", err)
	}
}

// A deleted job is pruned once deleted before the cutoff and no run refers
// to it any more, and not before.
func testPruneDeletedJobs(t *testing.T, f *fixture) {
	f.projects()
	del := func(j *vibejobs.Job, at time.Time) {
		f.t.Helper()
		f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, j.ProjectID, j.ID, at) })
	}
	prune := func(projectID string, limit, want int) {
		t.Helper()
		if n, err := f.s.PruneDeletedJobs(f.ctx, projectID, T0, limit); err != nil || n != want {
			t.Fatalf("PruneDeletedJobs(%s, limit %d) = %d, %v; want %d", projectID, limit, n, err, want)
		}
	}
	gone1, gone2 := f.job(projectA), f.job(projectA)
	del(gone1, T0.Add(-48*time.Hour))
	del(gone2, T0.Add(-24*time.Hour))
	withRun := f.job(projectA)
	run := f.finishedRun(withRun, T0.Add(-9*time.Hour))
	del(withRun, T0.Add(-time.Hour))
	atCutoff, later := f.job(projectA), f.job(projectA)
	del(atCutoff, T0)
	del(later, T0.Add(time.Second))
	live := f.job(projectA)
	other := f.job(projectB)
	del(other, T0.Add(-48*time.Hour))

	prune(projectA, 1, 1)
	prune(projectA, 10, 1)
	prune(projectA, 10, 0)
	// Its last run pruned, the job goes too.
	if n, err := f.s.PruneRuns(f.ctx, projectA, T0, 10); err != nil || n != 1 {
		t.Fatalf("PruneRuns = %d, %v; want 1", n, err)
	}
	_, err := f.s.GetRun(f.ctx, projectA, run.ID)
	wantNotFound(t, "GetRun of the deleted job's pruned run", err, "run")
	prune(projectA, 10, 1)
	prune(projectA, 10, 0)
	f.getJob(projectA, live.ID)
	prune(projectB, 10, 1)
	prune(projectB, 10, 0)
	for _, j := range []*vibejobs.Job{gone1, gone2, withRun, atCutoff, later, other} {
		_, err := f.s.GetJob(f.ctx, j.ProjectID, j.ID)
		wantNotFound(t, "GetJob of a deleted job", err, "job")
	}
}

// testIdempotencyAnswers: CompletedIdempotencyKeys pages through the
// completed records of every project, expired ones included, in (project,
// key) order; SetIdempotencyAnswer replaces a completed record's answer and
// leaves a claim in progress, and a record taken over since, alone.
func testIdempotencyAnswers(t *testing.T, f *fixture) {
	f.projects()
	complete := func(rec *vibejobs.IdempotencyRecord, body string) *vibejobs.IdempotencyRecord {
		f.update(func(tx vibejobs.Tx) error {
			if err := tx.InsertIdempotencyKey(f.ctx, rec); err != nil {
				return err
			}
			rec.ResponseStatus, rec.ResponseHeaders, rec.ResponseBody = 201, map[string]string{"K": body}, []byte(body)
			return tx.CompleteIdempotencyKey(f.ctx, rec)
		})
		return rec
	}
	b1 := complete(f.idempotencyRecord(projectB, "k1", T0), "b1")
	a2 := complete(f.idempotencyRecord(projectA, "k2", T0.Add(-48*time.Hour)), "a2") // expired
	a1 := complete(f.idempotencyRecord(projectA, "k1", T0), "a1")
	inProgress := f.idempotencyRecord(projectA, "k0", T0)
	f.update(func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(f.ctx, inProgress) })

	var got []*vibejobs.IdempotencyRecord
	p, k := "", ""
	for range 4 {
		var page []*vibejobs.IdempotencyRecord
		f.update(func(tx vibejobs.Tx) error {
			var err error
			page, err = tx.CompletedIdempotencyKeys(f.ctx, p, k, 2)
			return err
		})
		if len(page) == 0 {
			break
		}
		got = append(got, page...)
		p, k = page[len(page)-1].ProjectID, page[len(page)-1].Key
	}
	wantEqual(t, "completed records, paged by two", got, []*vibejobs.IdempotencyRecord{a1, a2, b1})

	a1.ResponseHeaders, a1.ResponseBody = map[string]string{"K": "resealed"}, []byte("resealed")
	f.update(func(tx vibejobs.Tx) error { return tx.SetIdempotencyAnswer(f.ctx, a1) })
	stored, err := f.s.GetIdempotencyKey(f.ctx, projectA, "k1", T0)
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "record after SetIdempotencyAnswer", ageless(stored), a1)
	for what, rec := range map[string]*vibejobs.IdempotencyRecord{
		"of a claim in progress":       {ProjectID: projectA, Key: "k0", CreatedAt: inProgress.CreatedAt, ResponseBody: []byte("x")},
		"of another claim of the key":  {ProjectID: projectB, Key: "k1", CreatedAt: T0.Add(time.Second), ResponseBody: []byte("x")},
		"of a key that was never used": {ProjectID: projectB, Key: "nope", CreatedAt: T0, ResponseBody: []byte("x")},
	} {
		err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.SetIdempotencyAnswer(f.ctx, rec) })
		wantNotFound(t, "SetIdempotencyAnswer "+what, err, "idempotency_key")
	}
	if stored, _ := f.s.GetIdempotencyKey(f.ctx, projectB, "k1", T0); stored == nil || string(stored.ResponseBody) != "b1" {
		t.Errorf("a refused SetIdempotencyAnswer changed the record: %+v", stored)
	}
}

// ageless is rec without its Age, which each store measures with its own
// clock (vibejobs.IdempotencyRecord.Age): the stores' own tests check it.
func ageless(rec *vibejobs.IdempotencyRecord) *vibejobs.IdempotencyRecord {
	c := *rec
	c.Age = 0
	return &c
}

func testIdempotency(t *testing.T, f *fixture) {
	f.projects()
	rec := f.idempotencyRecord(projectA, "key-1", T0)
	insert := func(r *vibejobs.IdempotencyRecord) error {
		return f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(f.ctx, r) })
	}
	get := func(now time.Time) (*vibejobs.IdempotencyRecord, error) {
		return f.s.GetIdempotencyKey(f.ctx, projectA, rec.Key, now)
	}
	if err := insert(rec); err != nil {
		t.Fatalf("InsertIdempotencyKey: %v", err)
	}
	got, err := get(T0.Add(time.Second))
	if err != nil {
		t.Fatalf("GetIdempotencyKey: %v", err)
	}
	// Whichever clock a store measures it with, a claim read just after
	// it was made, with the next second's now, is fresh: the API takes an
	// in-progress claim over at one minute.
	if got.Age < 0 || got.Age >= 30*time.Second {
		t.Errorf("Age of a claim read just after it was made = %v, want [0, 30s)", got.Age)
	}
	wantEqual(t, "record in progress", ageless(got), rec)

	wantError(t, "InsertIdempotencyKey of a live key", insert(f.idempotencyRecord(projectA, rec.Key, T0.Add(time.Minute))), vibejobs.ECONFLICT, "")

	done := *rec
	done.Done = true
	done.ResponseStatus = 201
	done.ResponseHeaders = map[string]string{"Content-Type": "application/json", "Location": "/v1/jobs/job_1"}
	done.ResponseBody = []byte(`{"id":"job_1"}`)
	f.update(func(tx vibejobs.Tx) error { return tx.CompleteIdempotencyKey(f.ctx, &done) })
	got, err = get(T0.Add(time.Minute))
	if err != nil {
		t.Fatalf("GetIdempotencyKey after completion: %v", err)
	}
	wantEqual(t, "completed record", ageless(got), &done)
	wantError(t, "InsertIdempotencyKey of a completed live key", insert(f.idempotencyRecord(projectA, rec.Key, T0.Add(time.Hour))), vibejobs.ECONFLICT, "")

	_, err = get(rec.ExpiresAt)
	wantNotFound(t, "GetIdempotencyKey at its expiry", err, "idempotency_key")

	// An expired record is replaced.
	fresh := f.idempotencyRecord(projectA, rec.Key, rec.ExpiresAt)
	if err := insert(fresh); err != nil {
		t.Fatalf("InsertIdempotencyKey over an expired record: %v", err)
	}
	got, err = get(rec.ExpiresAt)
	if err != nil {
		t.Fatalf("GetIdempotencyKey of the replacement: %v", err)
	}
	wantEqual(t, "replacement record", ageless(got), fresh)

	// The first request's claim, completion or release touches neither the
	// replacement nor another request's claim of the key.
	del := func(createdAt time.Time) error {
		return f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.DeleteIdempotencyKey(f.ctx, projectA, rec.Key, createdAt) })
	}
	wantNotFound(t, "DeleteIdempotencyKey of a replaced claim", del(rec.CreatedAt), "idempotency_key")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CompleteIdempotencyKey(f.ctx, &done) })
	wantNotFound(t, "CompleteIdempotencyKey of a replaced claim", err, "idempotency_key")
	if got, err := get(rec.ExpiresAt); err != nil {
		t.Fatalf("GetIdempotencyKey of the replacement after the old claim's attempts: %v", err)
	} else {
		wantEqual(t, "replacement record after the old claim's attempts", ageless(got), fresh)
	}
	// A completed record is not completed again.
	freshDone := *fresh
	freshDone.Done, freshDone.ResponseStatus = true, 201
	f.update(func(tx vibejobs.Tx) error { return tx.CompleteIdempotencyKey(f.ctx, &freshDone) })
	again := freshDone
	again.ResponseStatus = 500
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CompleteIdempotencyKey(f.ctx, &again) })
	wantNotFound(t, "CompleteIdempotencyKey of a completed record", err, "idempotency_key")
	if got, err := get(rec.ExpiresAt); err != nil || got.ResponseStatus != 201 {
		t.Errorf("record completed twice: %+v, %v; want status 201", got, err)
	}

	// Nor deleted: only a claim in progress is released.
	wantNotFound(t, "DeleteIdempotencyKey of a completed record", del(fresh.CreatedAt), "idempotency_key")
	if got, err := get(rec.ExpiresAt); err != nil || !got.Done || got.ResponseStatus != 201 {
		t.Errorf("completed record after a delete: %+v, %v; want it kept", got, err)
	}

	claim := f.idempotencyRecord(projectA, "key-3", T0)
	f.update(func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(f.ctx, claim) })
	delClaim := func() error {
		return f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
			return tx.DeleteIdempotencyKey(f.ctx, projectA, claim.Key, claim.CreatedAt)
		})
	}
	if err := delClaim(); err != nil {
		t.Fatalf("DeleteIdempotencyKey of a claim in progress: %v", err)
	}
	_, err = f.s.GetIdempotencyKey(f.ctx, projectA, claim.Key, T0)
	wantNotFound(t, "GetIdempotencyKey after delete", err, "idempotency_key")
	wantNotFound(t, "DeleteIdempotencyKey of a missing key", delClaim(), "idempotency_key")
	claimDone := *claim
	claimDone.Done, claimDone.ResponseStatus = true, 201
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CompleteIdempotencyKey(f.ctx, &claimDone) })
	wantNotFound(t, "CompleteIdempotencyKey of a missing key", err, "idempotency_key")

	// The key's record commits with the effect, or not at all.
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if err := tx.InsertIdempotencyKey(f.ctx, f.idempotencyRecord(projectA, "key-2", T0)); err != nil {
			return err
		}
		return errRollback
	})
	if err == nil {
		t.Fatal("Update: rollback error lost")
	}
	_, err = f.s.GetIdempotencyKey(f.ctx, projectA, "key-2", T0)
	wantNotFound(t, "key of a rolled back transaction", err, "idempotency_key")
}

func testPruneIdempotencyKeys(t *testing.T, f *fixture) {
	f.projects()
	at := func(key string, expires time.Time) {
		r := f.idempotencyRecord(projectA, key, expires.Add(-24*time.Hour))
		f.update(func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(f.ctx, r) })
	}
	at("old", T0.Add(-time.Hour))
	at("just-expired", T0.Add(-time.Millisecond))
	at("live", T0.Add(time.Hour))
	for _, want := range []int{1, 1, 0} {
		if n, err := f.s.PruneIdempotencyKeys(f.ctx, T0, 1); err != nil || n != want {
			t.Fatalf("PruneIdempotencyKeys(limit 1) = %d, %v; want %d", n, err, want)
		}
	}
	if _, err := f.s.GetIdempotencyKey(f.ctx, projectA, "live", T0); err != nil {
		t.Errorf("live key pruned: %v", err)
	}
}

// testRunsEnded: the store tells, after each commit, of exactly the runs it
// ended, by state and reason: from recorded outcomes (not a dropped one, nor
// a retry), a deleted job's runs cancelled by the deletion, by a retrying
// outcome and by a release, a lease recovered past the deadline, and expired
// runs failed; a rolled-back deletion tells nothing.
func testRunsEnded(t *testing.T, f *fixture) {
	notifier, ok := f.s.(vibejobs.RunsEndedNotifier)
	if !ok {
		t.Fatal("the store does not implement vibejobs.RunsEndedNotifier")
	}
	add, want := tally[vibejobs.RunsEnded](t)
	notifier.OnRunsEnded(add)
	succeededEnd := vibejobs.RunEnd{State: vibejobs.RunSucceeded}
	deleted := vibejobs.RunEnd{State: vibejobs.RunCancelled, Reason: vibejobs.ReasonJobDeleted}
	expired := vibejobs.RunEnd{State: vibejobs.RunFailed, Reason: vibejobs.ReasonDeadlineExceeded}

	f.projects()
	j := f.job(projectA)
	c1, c2, c3, c4 := f.claimOne(j, "w"), f.claimOne(j, "w"), f.claimOne(j, "w"), f.claimOne(j, "w")
	at := c1.Run.ScheduledFor
	f.record("w", succeeded(c1, at, at), failed(c2, at, at, 401, vibejobs.ReasonAppRejected),
		retrying(c3, at, at, at.Add(20*time.Hour)))
	want("recorded outcomes", vibejobs.RunsEnded{succeededEnd: 1,
		{State: vibejobs.RunFailed, Reason: vibejobs.ReasonAppRejected}: 1})
	f.record("intruder", succeeded(c4, at, at))
	want("an outcome that lost its lease", vibejobs.RunsEnded{})
	f.record("w", succeeded(c4, at, at))
	want("the outcome of the lease", vibejobs.RunsEnded{succeededEnd: 1})

	gone := f.job(projectA)
	f.run(gone, T0.Add(time.Hour))
	inFlight, held := f.claimOne(gone, "w"), f.claimOne(gone, "w")
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, gone.ID, T0) })
	want("deleting a job with a waiting run and two in flight", vibejobs.RunsEnded{deleted: 1})
	at = inFlight.Run.ScheduledFor
	f.record("w", retrying(inFlight, at, at, at.Add(time.Minute)))
	want("a retrying outcome of a deleted job's run", vibejobs.RunsEnded{deleted: 1})
	if err := f.s.ReleaseClaims(f.ctx, "w", []*vibejobs.Claim{held}, T0, T0); err != nil {
		t.Fatal(err)
	}
	want("releasing a deleted job's run", vibejobs.RunsEnded{deleted: 1})

	kept := f.job(projectA)
	f.run(kept, T0.Add(time.Hour))
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if err := tx.DeleteJob(f.ctx, projectA, kept.ID, T0); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update = %v, want the rollback", err)
	}
	want("a rolled-back deletion", vibejobs.RunsEnded{})

	f.claimOne(j, "w") // never recorded: its lease expires
	late := T0.Add(200 * time.Hour)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, late, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v", n, err)
	}
	want("a lease recovered past the run's deadline", vibejobs.RunsEnded{expired: 1})
	// c3's run waits for its retry and kept's for its time, both past
	// their deadlines by then.
	if n, err := f.s.FailExpiredRuns(f.ctx, late, 10); err != nil || n != 2 {
		t.Fatalf("FailExpiredRuns = %d, %v", n, err)
	}
	want("expired runs failed", vibejobs.RunsEnded{expired: 2})
}

// testAttemptsRecorded: the store tells, after each commit, of exactly the
// attempts it recorded from outcomes, by the state their run moved to and
// their error code: not an outcome dropped for a lost lease, a retrying
// step of a deleted job's run as cancelled, one past the run's deadline as
// failed, and not the interrupted attempts of recovered leases.
func testAttemptsRecorded(t *testing.T, f *fixture) {
	notifier, ok := f.s.(vibejobs.AttemptsRecordedNotifier)
	if !ok {
		t.Fatal("the store does not implement vibejobs.AttemptsRecordedNotifier")
	}
	add, want := tally[vibejobs.AttemptsRecorded](t)
	notifier.OnAttemptsRecorded(add)
	ok200 := vibejobs.AttemptOutcome{State: vibejobs.RunSucceeded}
	retried := vibejobs.AttemptOutcome{State: vibejobs.RunRetrying, ErrorCode: "http_5xx"}

	f.projects()
	j := f.job(projectA)
	c1, c2, c3, c4 := f.claimOne(j, "w"), f.claimOne(j, "w"), f.claimOne(j, "w"), f.claimOne(j, "w")
	c5, c6 := f.claimOne(j, "w"), f.claimOne(j, "w")
	at := c1.Run.ScheduledFor
	f.record("w", succeeded(c1, at, at), failed(c2, at, at, 401, vibejobs.ReasonAppRejected),
		retrying(c3, at, at, at.Add(20*time.Hour)), retrying(c5, at, at, at.Add(20*time.Hour)))
	want("recorded outcomes", vibejobs.AttemptsRecorded{ok200: 1, retried: 2,
		{State: vibejobs.RunFailed, ErrorCode: "http_4xx"}: 1})
	f.record("intruder", succeeded(c4, at, at))
	want("an outcome that lost its lease", vibejobs.AttemptsRecorded{})
	f.record("w", succeeded(c4, at, at))
	want("the outcome of the lease", vibejobs.AttemptsRecorded{ok200: 1})
	// A retry due after the run's deadline ends the run instead.
	f.record("w", retrying(c6, at, at, c6.Run.DeadlineAt.Add(time.Second)))
	want("a retry past the deadline", vibejobs.AttemptsRecorded{{State: vibejobs.RunFailed, ErrorCode: "http_5xx"}: 1})

	gone := f.job(projectA)
	inFlight := f.claimOne(gone, "w")
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, gone.ID, T0) })
	at = inFlight.Run.ScheduledFor
	f.record("w", retrying(inFlight, at, at, at.Add(time.Minute)))
	want("a retrying outcome of a deleted job's run", vibejobs.AttemptsRecorded{{State: vibejobs.RunCancelled, ErrorCode: "http_5xx"}: 1})

	f.claimOne(j, "w") // never recorded: its lease expires
	if n, err := f.s.RecoverExpiredLeases(f.ctx, T0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v", n, err)
	}
	want("a recovered lease", vibejobs.AttemptsRecorded{})
}

// tally sums the counts a store tells of (add, safe for concurrent use);
// want checks the sum since its last call, then starts a new one.
func tally[M ~map[K]int, K comparable](t *testing.T) (add func(M), want func(what string, w M)) {
	var mu sync.Mutex
	got := M{}
	add = func(m M) {
		mu.Lock()
		defer mu.Unlock()
		for k, v := range m {
			got[k] += v
		}
	}
	want = func(what string, w M) {
		t.Helper()
		mu.Lock()
		g := got
		got = M{}
		mu.Unlock()
		wantEqual(t, what, g, w)
	}
	return add, want
}

// testReleaseWhenAttemptsAreUsedUp: a job's maxAttempts lowered while its
// run retries leaves the run's next claim beyond the limit, and the
// dispatcher gives such a claim back unsent. Released, the run fails
// attempts_exhausted at the release with its run.failed event, shows the
// last attempt it sent (a recovered attempt too), and is claimed no more.
// A limit raised again before the release lets the claim go back to be
// sent under its number.
func testReleaseWhenAttemptsAreUsedUp(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	setMax := func(n int) {
		u := *f.getJob(projectA, j.ID)
		u.Retry.MaxAttempts = n
		f.update(func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, &u) })
	}
	// retryAt has claim c's attempt fail at at, to be tried again a minute on.
	retryAt := func(c *vibejobs.Claim, at time.Time) time.Time {
		next := at.Add(time.Minute)
		f.record("w1", retrying(c, at, at.Add(time.Second), next))
		return next
	}

	// Sent twice, then the limit goes down to 2.
	r := f.run(j, T0)
	at := retryAt(f.claimIDs("w1", T0, 1, r)[0], T0)
	at = retryAt(f.claimIDs("w1", at, 1, r)[0], at)
	setMax(2)
	c := f.claimIDs("w1", at, 1, r)[0]
	if c.Run.Attempt != 3 || c.Retry.MaxAttempts != 2 {
		t.Fatalf("claim after the limit went down: attempt %d of %d, want 3 of 2", c.Run.Attempt, c.Retry.MaxAttempts)
	}
	head := f.head(projectA)
	rel := at.Add(time.Second)
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{c}, rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	got := f.wantRun("run released with its attempts used up", r.ID, vibejobs.RunFailed, 2, nil)
	if got.FailureReason != vibejobs.ReasonAttemptsExhausted || got.FinishedAt == nil || !got.FinishedAt.Equal(rel) ||
		got.NextAttemptAt != nil {
		t.Errorf("run released with its attempts used up: reason %q finished %v next %v; want attempts_exhausted at %s, none next",
			got.FailureReason, got.FinishedAt, got.NextAttemptAt, rel)
	}
	f.wantAttempts("run released with its attempts used up", got, "1:http_5xx 2:http_5xx")
	events := f.events(projectA, head)
	wantEqual(t, "events of the release", eventLines(events), []string{"run.failed " + r.ID + " 2 failed attempts_exhausted"})
	if len(events) == 1 && !events[0].OccurredAt.Equal(rel) {
		t.Errorf("run.failed at %s, want %s", events[0].OccurredAt, rel)
	}
	f.claimIDs("w2", rel.Add(time.Hour), 10)

	// A recovered attempt counts: interrupted at attempt 2, claimed again
	// under that number once the limit is 1, the run ends at attempt 2.
	setMax(4)
	s := f.run(j, T0.Add(time.Hour))
	at = retryAt(f.claimIDs("w1", T0.Add(time.Hour), 1, s)[0], T0.Add(time.Hour))
	f.claimIDs("w1", at, 1, s)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, at.Add(time.Minute), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	setMax(1)
	c = f.claimIDs("w1", at.Add(time.Minute), 1, s)[0]
	if c.Run.Attempt != 2 {
		t.Fatalf("recovered run claimed again as attempt %d, want 2", c.Run.Attempt)
	}
	rel = at.Add(time.Minute + time.Second)
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{c}, rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	got = f.wantRun("recovered run released with its attempts used up", s.ID, vibejobs.RunFailed, 2, nil)
	f.wantAttempts("recovered run released with its attempts used up", got, "1:http_5xx 2:interrupted")

	// Raised again before the release: the run goes back to its last
	// attempt, 1, and attempt 2 is sent next.
	u := f.run(j, T0.Add(2*time.Hour))
	at = retryAt(f.claimIDs("w1", T0.Add(2*time.Hour), 1, u)[0], T0.Add(2*time.Hour))
	c = f.claimIDs("w1", at, 1, u)[0]
	setMax(4)
	rel = at.Add(time.Second)
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{c}, rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.wantRun("run released under a limit raised again", u.ID, vibejobs.RunRetrying, 1, &at)
	if again := f.claimIDs("w2", rel, 1, u)[0]; again.Run.Attempt != 2 {
		t.Errorf("claimed again as attempt %d, want 2", again.Run.Attempt)
	}
}

// testReleaseKeepsItsPlaceInLine: a claim given back to be due at once
// keeps its place in line: it is due at the time its claim took it at, so
// the runs due after that do not overtake it. Released as due at the
// release's time, claims waiting for a slow app's host were overtaken by
// the later occurrences still waiting, and caught-up runs went out of
// scheduledFor order.
func testReleaseKeepsItsPlaceInLine(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	a := f.run(j, T0.Add(-3*time.Minute), dueAt(T0.Add(-3*time.Minute)))
	b := f.run(j, T0.Add(-2*time.Minute), dueAt(T0.Add(-2*time.Minute)))
	c := f.run(j, T0.Add(-time.Minute), dueAt(T0.Add(-time.Minute)))
	cs := f.claimIDs("w1", T0, 2, a, b)
	rel := T0.Add(30 * time.Second)
	if err := f.s.ReleaseClaims(f.ctx, "w1", cs, rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.claimIDs("w2", rel, 10, a, b, c)
}
