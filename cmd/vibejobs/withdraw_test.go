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

// heldClaim is a server on PostgreSQL (claim-ahead 1 s) holding the run of
// job, claimed ahead of its time and due at due; other is a Store of another
// replica on the same database. toOld counts the requests to the job's URL,
// toNew those to newURL.
type heldClaim struct {
	other        *postgres.Store
	job          *vibejobs.Job
	run          *vibejobs.Run
	newURL       string
	toOld, toNew atomic.Int64
}

func holdClaim(t *testing.T) *heldClaim {
	url, other := pgReplicaURL(t, "")
	h := &heldClaim{other: other}
	counting := func(n *atomic.Int64) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
		t.Cleanup(srv.Close)
		return srv
	}
	oldURL := counting(&h.toOld).URL + "/hook"
	h.newURL = counting(&h.toNew).URL + "/hook"

	ctx := context.Background()
	m, _, _, cleanup, err := startBenchMain(ctx, url, 8, func(m *Main) { m.Config.ClaimAhead = time.Second })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	far := time.Date(time.Now().Year()+1, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := createJobs(ctx, m, 1, func(_ int, j *vibejobs.Job) {
		j.Schedule, j.URL, j.NextRunAt = "0 0 1 1 *", oldURL, &far
		h.job = j
	}); err != nil {
		t.Fatal(err)
	}
	// Due in 1.5 s: claimed 1 s ahead, then held.
	due := time.Now().Add(1500 * time.Millisecond).UTC().Truncate(time.Millisecond)
	h.run = vibejobs.NewRun(vibejobs.NewID("run_", time.Now(), rand.Reader), h.job, vibejobs.TriggerSchedule, due, time.Now())
	next := far
	if _, _, err := m.store.ApplyRunPlans(ctx, []vibejobs.RunPlan{{JobID: h.job.ID, Anchor: h.job.ScheduleAnchor, From: far, Next: &next,
		Runs: []*vibejobs.Run{h.run}}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for h.state(t) != vibejobs.RunDelivering {
		if time.Now().After(due) {
			t.Fatal("the run was not claimed ahead of its time")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return h
}

// state is the run's state, "" once it is gone.
func (h *heldClaim) state(t *testing.T) vibejobs.RunState {
	r, err := h.other.GetRun(context.Background(), h.job.ProjectID, h.run.ID)
	if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return r.State
}

// TestEditOnAnotherReplicaReachesHeldClaim: a job whose URL another replica
// changes while this one holds its run, claimed ahead, has the run sent to
// the new URL: the change reaches the dispatcher through PostgreSQL's
// notifications (the edit here bypasses this process's API).
func TestEditOnAnotherReplicaReachesHeldClaim(t *testing.T) {
	h := holdClaim(t)
	h.job.URL = h.newURL
	mustUpdatePG(t, h.other, func(tx vibejobs.Tx) error { return tx.UpdateJob(context.Background(), h.job) })
	for deadline := time.Now().Add(10 * time.Second); h.state(t) != vibejobs.RunSucceeded; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("run still %s", h.state(t))
		}
	}
	if h.toOld.Load() != 0 || h.toNew.Load() != 1 {
		t.Fatalf("sent %d to the old URL and %d to the new one; want the one attempt at the new URL", h.toOld.Load(), h.toNew.Load())
	}
}

// TestPauseOnAnotherReplicaWithdrawsHeldClaim: a job paused on another
// replica while this one holds its run, claimed ahead, does not have the
// run sent: the pause's notification makes the holder give the run back
// unsent, and the store deletes it, its occurrence withdrawn (occurrences
// while paused are skipped for good). The run was sent at its time.
func TestPauseOnAnotherReplicaWithdrawsHeldClaim(t *testing.T) {
	h := holdClaim(t)
	ctx := context.Background()
	now := time.Now()
	h.job.Enabled, h.job.State, h.job.NextRunAt, h.job.UpdatedAt = false, vibejobs.JobPaused, nil, now
	mustUpdatePG(t, h.other, func(tx vibejobs.Tx) error { // what the API's pause does
		if err := tx.UpdateJob(ctx, h.job); err != nil {
			return err
		}
		_, err := tx.DeleteFutureRuns(ctx, h.job.ID, now)
		return err
	})
	// The holder hears of the pause, gives the run back unsent, and it
	// goes: its occurrence was withdrawn.
	for deadline := time.Now().Add(5 * time.Second); h.state(t) != ""; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the held run survived the pause: %s", h.state(t))
		}
	}
	// Nothing can show that a request will never come: wait past the
	// run's time, by more than a claim-ahead window.
	time.Sleep(time.Until(h.run.ScheduledFor.Add(time.Second)))
	if n := h.toOld.Load(); n != 0 {
		t.Fatalf("the run of the job paused before its time was sent %d times", n)
	}
}

func mustUpdatePG(t *testing.T, s *postgres.Store, fn func(tx vibejobs.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}
