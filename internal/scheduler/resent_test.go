package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// errLost is the error of a call whose answer was lost.
var errLost = vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "connection lost")

// runLost runs one scan of s, named what, and fails the test unless its
// call's answer was lost (errLost).
func runLost(t *testing.T, s *scheduler.Scheduler, what string) {
	t.Helper()
	if _, err := s.RunOnce(context.Background()); !errors.Is(err, errLost) {
		t.Fatalf("%s: %v, want its answer lost", what, err)
	}
}

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

// counter counts what a scheduler tells of: runs created (int) or
// occurrences skipped (int64).
type counter[T int | int64] struct {
	mu sync.Mutex
	n  T
}

func (c *counter[T]) add(n T) { c.mu.Lock(); c.n += n; c.mu.Unlock() }
func (c *counter[T]) get() T  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// counted returns a scheduler on store whose clock reads *now, with
// counters of the runs created and the occurrences skipped it tells of.
func counted(store vibejobs.SchedulerStore, now *time.Time) (*scheduler.Scheduler, *counter[int], *counter[int64]) {
	runs, skips := new(counter[int]), new(counter[int64])
	s := scheduler.New(scheduler.Config{Store: store, Now: func() time.Time { return *now },
		OnRunsCreated: runs.add, OnSkipped: skips.add})
	return s, runs, skips
}

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
	s, told, _ := counted(fs, &now)

	runLost(t, s, "RunOnce whose answer was lost")
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
	a, toldA, _ := counted(fs, &now)
	b, toldB, _ := counted(st, &now)
	runLost(t, a, "RunOnce that failed")
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

// TestResentPlansBounded: while every call fails after committing (each
// moving the job on, so each plan may have created runs), the plans kept
// to be sent again are bounded by their runs, the newest kept.
func TestResentPlansBounded(t *testing.T) {
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now))
	fs := &flakyStore{SchedulerStore: st}
	s, _, _ := counted(fs, &now)
	scheduler.SetMaxResentRuns(s, 3)
	for i := range 6 {
		fs.commit = true
		runLost(t, s, fmt.Sprintf("RunOnce %d", i))
		if n := len(fs.runIDs(i)); n != 1 {
			t.Fatalf("call %d planned %d runs, want 1", i, n)
		}
		var want []string
		for j := max(0, i-3); j < i; j++ {
			want = append(want, fs.runIDs(j)...)
		}
		if got := fs.resentRuns(i); !slices.Equal(got, want) {
			t.Fatalf("call %d resent runs %v, want those of the newest failed calls, oldest first: %v", i, got, want)
		}
		now = now.Add(time.Minute) // the next occurrence
	}
}

// TestResentPlansOneAJobWhileWritesFail: while the database answers reads
// but refuses every write, each scan reads the due jobs still where they
// were and plans them again, with new run IDs. A failed call's plan whose
// job a later read found still at its From was never applied: only the
// latest plan of each job is kept and sent again, not one a scan. Once
// writes succeed, the runs told of are those the call created.
func TestResentPlansOneAJobWhileWritesFail(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now.Add(-2*time.Minute)),
		storedJob("job_y", vibejobs.CatchUpAll, now))
	fs := &flakyStore{SchedulerStore: st}
	s, told, _ := counted(fs, &now)
	for i := range 5 {
		fs.fail = true
		runLost(t, s, fmt.Sprintf("RunOnce %d", i))
		if n := len(fs.runIDs(i)); n != 4 {
			t.Fatalf("call %d planned %d runs, want 4 (3 of job_x, 1 of job_y)", i, n)
		}
		if got := fs.resentRuns(i); len(got) != 0 {
			t.Fatalf("call %d resent %d runs of earlier calls, want none: none of them applied", i, len(got))
		}
		now = now.Add(100 * time.Millisecond)
	}
	if n, err := s.RunOnce(ctx); err != nil || n != 4 {
		t.Fatalf("RunOnce once writes succeed = %d, %v; want 4", n, err)
	}
	if got := fs.resentRuns(5); len(got) != 0 {
		t.Errorf("the call that succeeded resent runs %v, want none", got)
	}
	if got := told.get(); got != 4 {
		t.Errorf("runs told of: %d, want 4", got)
	}
}

// TestResentPlansOfACommittedCallKept: a call that committed and lost its
// answer moved its job on, so the scans after it plan the job from its
// next occurrence: its plan is kept among theirs, and its runs are told
// of once a call succeeds. The plans of the calls after it that failed
// without committing are replaced by each new one of the same job.
func TestResentPlansOfACommittedCallKept(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now.Add(-2*time.Minute)))
	fs := &flakyStore{SchedulerStore: st, commit: true}
	s, told, _ := counted(fs, &now)
	runLost(t, s, "RunOnce whose answer was lost")
	committed := fs.runIDs(0)
	now = now.Add(time.Minute) // the job's next occurrence is due
	for i := 1; i <= 3; i++ {
		fs.fail = true
		runLost(t, s, fmt.Sprintf("RunOnce %d", i))
		if got := fs.resentRuns(i); !slices.Equal(got, committed) {
			t.Fatalf("call %d resent runs %v, want those of the committed call alone: %v", i, got, committed)
		}
	}
	if n, err := s.RunOnce(ctx); err != nil || n != 3+1 {
		t.Fatalf("RunOnce once writes succeed = %d, %v; want the 3 runs of the lost answer and 1 of its own", n, err)
	}
	if got := told.get(); got != 4 {
		t.Errorf("runs told of: %d, want 4", got)
	}
}

// TestResentPlanOfACallEndingAfterTheReadKept: a scan whose read of the due
// jobs began before a failed call ended learns nothing from it of that
// call's plans: the call may have committed after the read. Here another
// scan's call commits and loses its answer while the read is under way;
// the read still shows the job at the plan's From, and the plan is kept
// and its runs told of.
func TestResentPlanOfACallEndingAfterTheReadKept(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now.Add(-2*time.Minute)))
	fs := &flakyStore{SchedulerStore: st, commit: true}
	rs := &racingStore{SchedulerStore: fs}
	s, told, _ := counted(rs, &now)
	rs.other = func() {
		rs.other = nil // the scan below reads alone
		if _, err := s.RunOnce(ctx); !errors.Is(err, errLost) {
			t.Errorf("the scan during the read: %v, want its answer lost", err)
		}
	}
	if n, err := s.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("RunOnce whose read began before the lost call ended = %d, %v; want its 3 runs", n, err)
	}
	if got := told.get(); got != 3 {
		t.Errorf("runs told of: %d, want 3", got)
	}
}

// TestSkipsOfALostAnswerToldOfOnce: a call that committed and lost its
// answer skipped occurrences (catch-up) that nothing told of, so
// vibejobs_skipped_occurrences_total never counted them. The call that
// sends its plan again finds a run of that plan, so the plan was applied
// by the lost call: it tells of its skips, once.
func TestSkipsOfALostAnswerToldOfOnce(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpLatest, now.Add(-10*time.Minute))) // down for ten minutes
	fs := &flakyStore{SchedulerStore: st, commit: true}
	s, _, skips := counted(fs, &now)
	runLost(t, s, "RunOnce whose answer was lost")
	j, err := st.GetJob(ctx, "prj_x", "job_x")
	if err != nil || j.SkippedRuns != 9 {
		t.Fatalf("job after the lost call: %d skipped, %v; want 9 (the lost call committed)", j.SkippedRuns, err)
	}
	for range 3 {
		if _, err := s.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := skips.get(); got != 9 {
		t.Errorf("skipped occurrences told of: %d, want the 9 the lost call applied", got)
	}
}

// TestSkipsOfAPlanAnotherReplicaAppliedToldOfOnce: a call that failed
// without committing, and another replica then applied the same
// occurrences, skips included. The plan sent again names runs that do not
// exist: this replica tells of no skips, the other of its own.
func TestSkipsOfAPlanAnotherReplicaAppliedToldOfOnce(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpLatest, now.Add(-10*time.Minute)))
	fs := &flakyStore{SchedulerStore: st, fail: true}
	a, _, skipsA := counted(fs, &now)
	b, _, skipsB := counted(st, &now)
	runLost(t, a, "RunOnce that failed")
	if _, err := b.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if len(fs.resentRuns(1)) == 0 {
		t.Fatal("the call after the failed one resent nothing: the test proved nothing")
	}
	if a, b := skipsA.get(), skipsB.get(); a != 0 || b != 9 {
		t.Errorf("skipped occurrences told of: %d by the replica whose call failed, %d by the other; want 0 and 9", a, b)
	}
}
