package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// heldRuns opens a store with one job whose runs, one per instant of dues,
// are planned and the first claimed ahead of its time by "a".
func heldRuns(t *testing.T, dues ...time.Time) (s *postgres.Store, prj string, j *vibejobs.Job, c *vibejobs.Claim) {
	t.Helper()
	s = open(t, "")
	prj = newProject(t, s)
	j = newJobs(t, s, prj, 1)[0]
	if _, _, err := s.ApplyRunPlans(context.Background(), []vibejobs.RunPlan{planFor(j, dues...)}, t0); err != nil {
		t.Fatal(err)
	}
	claims, err := s.ClaimDueRuns(context.Background(), "a", dues[0], 1, time.Second)
	if err != nil || len(claims) != 1 {
		t.Fatalf("claim = %v %v", claims, err)
	}
	return s, prj, j, claims[0]
}

// pause disables j in tx, as the API's pause does before it withdraws the
// job's future runs.
func pause(ctx context.Context, tx vibejobs.Tx, j *vibejobs.Job) error {
	p := *j
	p.Enabled, p.State, p.NextRunAt = false, vibejobs.JobPaused, nil
	return tx.UpdateJob(ctx, &p)
}

// pauseInTwoSteps pauses j through s in a transaction that updates the
// job, then waits for the returned resume to be called before it withdraws
// the job's future runs (DeleteFutureRuns) and commits; paused gets the
// transaction's result. It returns once the job is updated (its row locked
// until the commit).
func pauseInTwoSteps(t *testing.T, s *postgres.Store, j *vibejobs.Job) (resume func(), paused <-chan error) {
	t.Helper()
	ctx := context.Background()
	updated, proceed := make(chan struct{}, 1), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, func(tx vibejobs.Tx) error {
			if err := pause(ctx, tx, j); err != nil {
				return err
			}
			select {
			case updated <- struct{}{}:
			default:
			}
			<-proceed
			_, err := tx.DeleteFutureRuns(ctx, j.ID, t0)
			return err
		})
	}()
	var once sync.Once
	resume = func() { once.Do(func() { close(proceed) }) }
	t.Cleanup(resume)
	waitSignal(t, updated, "the pause never updated its job")
	return resume, done
}

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
	due := t0.Add(time.Second)
	s, _, j, c := heldRuns(t, due)
	claims := []*vibejobs.Claim{c}

	// The pause updates its job, and stops before withdrawing its runs.
	resume, paused := pauseInTwoSteps(t, s, j)
	released := make(chan error, 1)
	go func() { released <- s.ReleaseClaims(ctx, "a", claims, due, due) }()
	waitForLockWait(t, s, "WITH held AS", "the release never waited for the job being paused")
	resume()
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

// TestPauseRacesTheOutcomeOfAHeldRun: a job is paused while the attempt of
// its run, claimed ahead of its time, is in flight (the API's clock read
// the pause's time just before the run's time). The pause marks the run,
// which has no attempt recorded yet; the outcome, arriving meanwhile, waits
// for the pause's lock on the run. It must then be recorded: the app has
// the delivery. Dropped, the run stayed leased until its lease was
// recovered (an interrupted attempt) and was sent again.
func TestPauseRacesTheOutcomeOfAHeldRun(t *testing.T) {
	ctx := context.Background()
	due := t0.Add(time.Second)
	s, prj, j, c := heldRuns(t, due)

	// The pause marks the run, and stops before committing.
	marked, commit := make(chan struct{}, 1), make(chan struct{})
	paused := make(chan error, 1)
	go func() {
		paused <- s.Update(ctx, func(tx vibejobs.Tx) error {
			if err := pause(ctx, tx, j); err != nil {
				return err
			}
			if _, err := tx.DeleteFutureRuns(ctx, j.ID, t0); err != nil {
				return err
			}
			select {
			case marked <- struct{}{}:
			default:
			}
			<-commit
			return nil
		})
	}()
	defer func() {
		select {
		case <-commit:
		default:
			close(commit)
		}
	}()
	waitSignal(t, marked, "the pause never marked the run")
	recorded := make(chan error, 1)
	go func() {
		recorded <- s.RecordOutcomes(ctx, "a", []vibejobs.Outcome{{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
			Attempt: vibejobs.Attempt{Number: 1, StartedAt: due, FinishedAt: due.Add(time.Millisecond), StatusCode: 200},
			Step:    vibejobs.Step{State: vibejobs.RunSucceeded}}})
	}()
	waitForLockWait(t, s, "WITH o AS", "the outcome never waited for the run being withdrawn")
	close(commit)
	if err := <-paused; err != nil {
		t.Fatalf("the pause: %v", err)
	}
	if err := <-recorded; err != nil {
		t.Fatalf("RecordOutcomes: %v", err)
	}
	r, err := s.GetRun(ctx, prj, c.Run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != vibejobs.RunSucceeded {
		t.Errorf("the run whose attempt went out while its job was paused: %s, want succeeded", r.State)
	}
}

// TestPauseRacesAClaim: DeleteFutureRuns marks the held runs in one
// statement and deletes the unheld ones in the next. A run claimed (ahead
// of its time) between the two was neither: unheld in the first
// statement's snapshot, held in the second's. Given back on the pause's
// notification, it went back to the queue and out while the job was
// paused. Here the first statement waits for another held run of the job,
// locked by a third session, while the claim commits.
func TestPauseRacesAClaim(t *testing.T) {
	ctx := context.Background()
	first, second := t0.Add(time.Second), t0.Add(2*time.Second)
	s, prj, j, c := heldRuns(t, first, second)
	held := []*vibejobs.Claim{c}
	locker, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if err := holdRun(locker, prj, held[0].Run.ID); err != nil {
		t.Fatal(err)
	}
	paused := make(chan error, 1)
	go func() {
		paused <- s.Update(ctx, func(tx vibejobs.Tx) error {
			if err := pause(ctx, tx, j); err != nil {
				return err
			}
			_, err := tx.DeleteFutureRuns(ctx, j.ID, t0)
			return err
		})
	}()
	for deadline := time.Now().Add(10 * time.Second); !lockWaiting(t, s, "WITH marked AS") && !lockWaiting(t, s, "SELECT 1 FROM runs"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pause never waited for the held run")
		}
	}
	// The second run is claimed, unless the pause holds it already.
	claimed, err := s.ClaimDueRuns(ctx, "a", second, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-paused; err != nil {
		t.Fatalf("the pause: %v", err)
	}
	// The holder gives back its held runs of the paused job.
	if err := s.ReleaseClaims(ctx, "a", append(held, claimed...), first, first); err != nil {
		t.Fatal(err)
	}
	if again, err := s.ClaimDueRuns(ctx, "b", second.Add(time.Second), 10, time.Second); err != nil || len(again) != 0 {
		t.Errorf("a run of the paused job was claimed again: %d claims, %v", len(again), err)
	}
}

// TestPauseRacesARetryingOutcome: a job is paused while the first attempt
// of its run, claimed ahead of its time, fails and is recorded as a retry.
// Recording a retry reads the job under a share lock (is it deleted?),
// which waits for the pause's update of the job. Had the outcome locked the
// run first, the pause, marking its held runs next, would wait for the
// outcome in turn: a deadlock, which PostgreSQL broke after a second by
// aborting the outcome. The outcome takes the job first, as the API does.
func TestPauseRacesARetryingOutcome(t *testing.T) {
	ctx := context.Background()
	due := t0.Add(time.Second)
	s, prj, j, c := heldRuns(t, due)

	// The pause updates its job, and stops before withdrawing its runs.
	resume, paused := pauseInTwoSteps(t, s, j)
	next := due.Add(time.Minute)
	recorded := make(chan error, 1)
	go func() {
		recorded <- s.RecordOutcomes(ctx, "a", []vibejobs.Outcome{{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
			Attempt: vibejobs.Attempt{Number: 1, StartedAt: due, FinishedAt: due.Add(time.Millisecond),
				StatusCode: 503, ErrorCode: "http_5xx"},
			Step: vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next}}})
	}()
	waitForLockWait(t, s, "WITH o AS", "the outcome never waited for the job being paused")
	resume()
	if err := <-paused; err != nil {
		t.Fatalf("the pause: %v", err)
	}
	if err := <-recorded; err != nil {
		t.Fatalf("RecordOutcomes: %v", err)
	}
	// The attempt went out: the run is the app's, and retries.
	r, err := s.GetRun(ctx, prj, c.Run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != vibejobs.RunRetrying || r.Attempt != 1 {
		t.Errorf("the run whose first attempt failed while its job was paused: %s after attempt %d, want retrying after 1", r.State, r.Attempt)
	}
}

// TestPauseRacesLeaseRecovery: a job is paused while a replica recovers the
// expired lease of its run, claimed ahead of its time by a process that
// died. Recovery reads the job under a share lock (is it deleted?), which
// waits for the pause's update of the job. Had recovery locked the run
// first, the pause, marking its held runs next, would wait for recovery in
// turn: a deadlock, which PostgreSQL broke after a second by aborting one of
// them. Recovery takes the job first, as the API does.
func TestPauseRacesLeaseRecovery(t *testing.T) {
	ctx := context.Background()
	due := t0.Add(time.Second)
	s, prj, j, c := heldRuns(t, due)
	expired := due.Add(c.Timeout + 2*time.Second)

	resume, paused := pauseInTwoSteps(t, s, j)
	type result struct {
		n   int
		err error
	}
	recovered := make(chan result, 1)
	go func() {
		n, err := s.RecoverExpiredLeases(ctx, expired, 10)
		recovered <- result{n, err}
	}()
	waitForLockWait(t, s, "WITH expired AS", "recovery never waited for the job being paused")
	resume()
	if err := <-paused; err != nil {
		t.Fatalf("the pause: %v", err)
	}
	if res := <-recovered; res.err != nil || res.n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want the one lease", res.n, res.err)
	}
	r, err := s.GetRun(ctx, prj, c.Run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Attempts) != 1 || r.Attempts[0].ErrorCode != vibejobs.ErrorCodeInterrupted {
		t.Errorf("the recovered run's attempts: %+v, want one interrupted", r.Attempts)
	}
}
