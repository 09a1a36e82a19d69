package main

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// TestEditOnAnotherReplicaReachesHeldClaim: a job whose URL another replica
// changes while this one holds its run, claimed ahead, has the run sent to
// the new URL: the change reaches the dispatcher through PostgreSQL's
// notifications (the edit here bypasses this process's API).
func TestEditOnAnotherReplicaReachesHeldClaim(t *testing.T) {
	url, other := pgReplicaURL(t, "")
	var toOld, toNew atomic.Int64
	counting := func(n *atomic.Int64) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
		t.Cleanup(srv.Close)
		return srv
	}
	oldURL, newURL := counting(&toOld).URL+"/hook", counting(&toNew).URL+"/hook"

	ctx := context.Background()
	job, run := heldRun(t, url, other, oldURL, time.Second)
	state := func() vibejobs.RunState {
		r, err := other.GetRun(ctx, job.ProjectID, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		return r.State
	}
	job.URL = newURL
	mustUpdatePG(t, other, func(tx vibejobs.Tx) error { return tx.UpdateJob(ctx, job) })
	for deadline := time.Now().Add(10 * time.Second); state() != vibejobs.RunSucceeded; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("run still %s", state())
		}
	}
	if toOld.Load() != 0 || toNew.Load() != 1 {
		t.Fatalf("sent %d to the old URL and %d to the new one; want the one attempt at the new URL", toOld.Load(), toNew.Load())
	}
}

// heldRun starts a server on the PostgreSQL database url that claims runs
// up to ahead before their time, gives it one job to target, and plans the
// job's run due in twice ahead; it returns once the server holds the run,
// claimed and waiting for its time, as other, another replica's store,
// sees it.
func heldRun(t *testing.T, url string, other *postgres.Store, target string, ahead time.Duration) (*vibejobs.Job, *vibejobs.Run) {
	t.Helper()
	ctx := context.Background()
	m, _, _, cleanup, err := startBenchMain(ctx, url, 8, func(m *Main) { m.Config.ClaimAhead = ahead })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	far := time.Date(time.Now().Year()+1, 1, 1, 0, 0, 0, 0, time.UTC)
	var job *vibejobs.Job
	if err := createJobs(ctx, m, 1, func(_ int, j *vibejobs.Job) {
		j.Schedule, j.URL, j.NextRunAt = "0 0 1 1 *", target, &far
		job = j
	}); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(2 * ahead).UTC().Truncate(time.Millisecond)
	run := vibejobs.NewRun(vibejobs.NewID("run_", time.Now(), rand.Reader), job, vibejobs.TriggerSchedule, due, time.Now())
	next := far
	if _, _, err := m.store.ApplyRunPlans(ctx, []vibejobs.RunPlan{{JobID: job.ID, Anchor: job.ScheduleAnchor, From: far, Next: &next,
		Runs: []*vibejobs.Run{run}}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := other.GetRun(ctx, job.ProjectID, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State == vibejobs.RunDelivering {
			return job, run
		}
		if time.Now().After(due) {
			t.Fatal("the run was not claimed ahead of its time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustUpdatePG(t *testing.T, s *postgres.Store, fn func(tx vibejobs.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

// TestPauseOnAnotherReplicaWithdrawsHeldRun: a job paused through another
// replica while this one holds its run, claimed ahead of its time, has the
// run withdrawn: the pause marks it and notifies, this replica gives it back
// unsent, and it is deleted, never sent.
func TestPauseOnAnotherReplicaWithdrawsHeldRun(t *testing.T) {
	url, other := pgReplicaURL(t, "")
	var received atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { received.Add(1) }))
	t.Cleanup(srv.Close)

	ctx := context.Background()
	job, run := heldRun(t, url, other, srv.URL+"/hook", 2*time.Second)
	state := func() (vibejobs.RunState, bool) {
		r, err := other.GetRun(ctx, job.ProjectID, run.ID)
		if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return r.State, true
	}
	pausedAt := time.Now()
	job.Enabled, job.State, job.NextRunAt = false, vibejobs.JobPaused, nil
	mustUpdatePG(t, other, func(tx vibejobs.Tx) error {
		if err := tx.UpdateJob(ctx, job); err != nil {
			return err
		}
		_, err := tx.DeleteFutureRuns(ctx, job.ID, pausedAt)
		return err
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s, ok := state()
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the withdrawn run is still there, %s", s)
		}
	}
	if n := received.Load(); n != 0 {
		t.Fatalf("the withdrawn run was sent %d time(s)", n)
	}
}
