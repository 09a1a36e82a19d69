package scheduler_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// errLost is the error of a call whose answer was lost.
var errLost = vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "connection lost")

// flakyStore fails the ApplyRunPlans calls it is told to: after the store
// committed them (commit, an answer lost after the commit, as a connection
// cut or a timeout loses it on PostgreSQL), or before (a call that never
// reached the database). It keeps the plans of every call.
type flakyStore struct {
	vibejobs.SchedulerStore
	mu     sync.Mutex
	commit bool // the next call commits, then fails
	fail   bool // the next call fails without committing
	calls  [][]vibejobs.RunPlan
}

func (s *flakyStore) ApplyRunPlans(ctx context.Context, plans []vibejobs.RunPlan, now time.Time) (int, int64, error) {
	s.mu.Lock()
	s.calls = append(s.calls, slices.Clone(plans))
	commit, fail := s.commit, s.fail
	s.commit, s.fail = false, false
	s.mu.Unlock()
	if fail {
		return 0, 0, errLost
	}
	n, sk, err := s.SchedulerStore.ApplyRunPlans(ctx, plans, now)
	if commit && err == nil {
		return 0, 0, errLost
	}
	return n, sk, err
}

// resentRuns returns the IDs of the runs of the resent plans of call i.
func (s *flakyStore) resentRuns(i int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, p := range s.calls[i] {
		if p.Resent {
			for _, r := range p.Runs {
				ids = append(ids, r.ID)
			}
		}
	}
	return ids
}

// numCalls returns the ApplyRunPlans calls made.
func (s *flakyStore) numCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// runIDs returns the IDs of the runs of the plans of call i that are not
// resent.
func (s *flakyStore) runIDs(i int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, p := range s.calls[i] {
		if !p.Resent {
			for _, r := range p.Runs {
				ids = append(ids, r.ID)
			}
		}
	}
	return ids
}

// counter counts the runs a scheduler tells of.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) add(n int) { c.mu.Lock(); c.n += n; c.mu.Unlock() }
func (c *counter) get() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// TestRunsOfALostAnswerToldOfOnce: an ApplyRunPlans call that committed
// but lost its answer fails, and its job has moved on: the scheduler
// plans it no more, and nothing told of the runs that call created, so
// vibejobs_runs_created_total never counted them. The next call sends the
// failed call's plans again, resent, and tells of them: once, however many
// calls follow.
func TestRunsOfALostAnswerToldOfOnce(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now.Add(-2*time.Minute)))
	fs := &flakyStore{SchedulerStore: st, commit: true}
	var told counter
	s := scheduler.New(scheduler.Config{Store: fs, Now: func() time.Time { return now }, OnRunsCreated: told.add})

	if _, err := s.RunOnce(ctx); !errors.Is(err, errLost) {
		t.Fatalf("RunOnce whose answer was lost: %v", err)
	}
	created := fs.runIDs(0)
	if len(created) != 3 {
		t.Fatalf("the lost call planned %d runs, want 3", len(created))
	}
	runs, _, err := st.ListRuns(ctx, "prj_x", vibejobs.RunFilter{JobID: "job_x"}, vibejobs.Page{})
	if err != nil || len(runs) != 3 {
		t.Fatalf("runs after the lost call: %d, %v; want 3: it did not commit", len(runs), err)
	}
	for range 2 {
		if _, err := s.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := told.get(); got != 3 {
		t.Errorf("runs told of after the lost call and two more scans: %d, want 3", got)
	}
	if got := fs.resentRuns(1); !slices.Equal(got, created) {
		t.Errorf("the call after the lost one resent runs %v, want %v", got, created)
	}
	if n := fs.numCalls(); n != 2 {
		t.Errorf("ApplyRunPlans calls: %d, want 2: the last scan found nothing due and nothing to send again", n)
	}

	// Then the next occurrence, on its own.
	now = now.Add(time.Minute)
	if n, err := s.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce at the next occurrence = %d, %v; want 1", n, err)
	}
	if got := fs.resentRuns(fs.numCalls() - 1); got != nil {
		t.Errorf("a call after one that succeeded resent runs %v, want none", got)
	}
	if got := told.get(); got != 4 {
		t.Errorf("runs told of after the next occurrence: %d, want 4", got)
	}
}

// TestRunsAnotherReplicaCreatedNotToldOf: a call that failed without
// committing created nothing, and another replica then created the runs
// of those occurrences. The plans sent again name runs that do not exist
// (run IDs are never reused): this replica tells of none, the other tells
// of its own.
func TestRunsAnotherReplicaCreatedNotToldOf(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now))
	fs := &flakyStore{SchedulerStore: st, fail: true}
	var toldA, toldB counter
	a := scheduler.New(scheduler.Config{Store: fs, Now: func() time.Time { return now }, OnRunsCreated: toldA.add})
	b := scheduler.New(scheduler.Config{Store: st, Now: func() time.Time { return now }, OnRunsCreated: toldB.add})
	if _, err := a.RunOnce(ctx); !errors.Is(err, errLost) {
		t.Fatalf("RunOnce that failed: %v", err)
	}
	if n, err := b.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("the other replica's RunOnce = %d, %v; want 1", n, err)
	}
	if n, err := a.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("RunOnce after the other replica's = %d, %v; want 0", n, err)
	}
	if len(fs.resentRuns(1)) != 1 {
		t.Fatalf("the call after the failed one resent %v, want its one run", fs.resentRuns(1))
	}
	if a, b := toldA.get(), toldB.get(); a != 0 || b != 1 {
		t.Errorf("runs told of: %d by the replica whose call failed, %d by the other; want 0 and 1", a, b)
	}
}

// TestResentPlansBounded: while every call fails, the plans kept to be
// sent again are bounded by their runs, the newest kept.
func TestResentPlansBounded(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now))
	fs := &flakyStore{SchedulerStore: st}
	s := scheduler.New(scheduler.Config{Store: fs, Now: func() time.Time { return now }})
	scheduler.SetMaxResentRuns(s, 3)
	for i := range 6 {
		fs.fail = true
		if _, err := s.RunOnce(ctx); !errors.Is(err, errLost) {
			t.Fatalf("RunOnce %d: %v", i, err)
		}
		var want []string
		for j := max(0, i-3); j < i; j++ {
			want = append(want, fs.runIDs(j)...)
		}
		if got := fs.resentRuns(i); !slices.Equal(got, want) {
			t.Fatalf("call %d resent runs %v, want those of the newest failed calls, oldest first: %v", i, got, want)
		}
	}
}
