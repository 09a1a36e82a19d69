package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// TestPauseRacesTheReleaseOfAHeldRun: a job is paused through the API while
// the holder of its run, claimed ahead of its time, gives the run back (a
// settings change just before, a host slot's deadline, a shutdown). The
// release locks the run, then waits for the job the pause holds; the pause
// then marks the held run withdrawn and must not wait for the release in
// turn: a deadlock aborted one of them, and an aborted release is not
// retried (the dispatcher logs it and drops the claim), so the run stayed
// leased, marked, until its lease was recovered and it went out while the
// job was paused.
func TestPauseRacesTheReleaseOfAHeldRun(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	j := newJobs(t, s, prj, 1)[0]
	due := t0.Add(time.Second)
	if _, _, err := s.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, due)}, t0); err != nil {
		t.Fatal(err)
	}
	// Claimed ahead of its time.
	claims, err := s.ClaimDueRuns(ctx, "a", due, 1, time.Second)
	if err != nil || len(claims) != 1 {
		t.Fatalf("claim = %v %v", claims, err)
	}

	// The pause updates its job, and stops before withdrawing its runs.
	updated, resume := make(chan struct{}, 1), make(chan struct{})
	paused := make(chan error, 1)
	go func() {
		paused <- s.Update(ctx, func(tx vibejobs.Tx) error {
			p := *j
			p.Enabled, p.State, p.NextRunAt = false, vibejobs.JobPaused, nil
			if err := tx.UpdateJob(ctx, &p); err != nil {
				return err
			}
			select {
			case updated <- struct{}{}:
			default:
			}
			<-resume
			_, err := tx.DeleteFutureRuns(ctx, j.ID, t0)
			return err
		})
	}()
	defer func() {
		select {
		case <-resume:
		default:
			close(resume)
		}
	}()
	waitSignal(t, updated, "the pause never updated its job")
	released := make(chan error, 1)
	go func() { released <- s.ReleaseClaims(ctx, "a", claims, due) }()
	waitForLockWait(t, s, "WITH held AS", "the release never waited for the job being paused")
	close(resume)
	if err := <-released; err != nil {
		t.Errorf("ReleaseClaims: %v", err)
	}
	if err := <-paused; err != nil {
		t.Fatalf("the pause: %v", err)
	}

	// Whatever happened to the claim, the paused job's run never goes out.
	lease := due.Add(claims[0].Timeout + time.Second)
	if _, err := s.RecoverExpiredLeases(ctx, lease.Add(time.Second), 10); err != nil {
		t.Fatal(err)
	}
	if again, err := s.ClaimDueRuns(ctx, "b", lease.Add(time.Second), 10, time.Second); err != nil || len(again) != 0 {
		t.Errorf("the paused job's withdrawn run was claimed again: %d claims, %v", len(again), err)
	}
}
