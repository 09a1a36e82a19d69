package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// follow reads s's feed of project from after until stop is closed and the
// head is reached, checking that every page continues the sequence without a
// gap: a reader must never see event N+1 while N is not yet visible, else it
// would move past N for good. It returns the events seen.
func follow(t *testing.T, s *postgres.Store, project string, stop <-chan struct{}) []*vibejobs.Event {
	t.Helper()
	ctx := context.Background()
	var seen []*vibejobs.Event
	var after int64
	for {
		stopping := false
		select {
		case <-stop:
			stopping = true
		default:
		}
		p, err := s.ListEvents(ctx, project, vibejobs.EventFilter{After: after, Limit: 100})
		if err != nil {
			t.Errorf("ListEvents: %v", err)
			return seen
		}
		for _, e := range p.Events {
			if e.Sequence != after+1 {
				t.Errorf("after %d the reader saw %d: an event was skipped (its transaction committed after a later one)", after, e.Sequence)
				return seen
			}
			after = e.Sequence
			seen = append(seen, e)
		}
		if p.Next != after {
			t.Errorf("next %d after %d unfiltered events ending at %d", p.Next, len(p.Events), after)
			return seen
		}
		if stopping && after == p.Head {
			return seen
		}
	}
}

// TestFeedOrderAcrossReplicas: writers on four Stores (replicas) append
// events concurrently, some holding their transaction open for a while after
// appending (a slow commit), others recording run outcomes in batches; a
// reader on a fifth Store follows the cursor meanwhile. It must see every
// event exactly once, in sequence order, never a later one before an
// earlier one is visible.
func TestFeedOrderAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	stores := replicas(t, 5)
	prj := newProject(t, stores[0])
	other := newProject(t, stores[0])
	jobs := newJobs(t, stores[0], prj, 40)

	// Runs to record outcomes of, due in the past.
	var plans []vibejobs.RunPlan
	for _, j := range jobs {
		var ats []time.Time
		for i := range 25 {
			ats = append(ats, t0.Add(time.Duration(i-30)*time.Second))
		}
		plans = append(plans, planFor(j, ats...))
	}
	if n, _, err := stores[0].ApplyRunPlans(ctx, plans, t0); err != nil || n != 1000 {
		t.Fatalf("ApplyRunPlans = %d, %v", n, err)
	}

	stop := make(chan struct{})
	var seen []*vibejobs.Event
	var reader sync.WaitGroup
	reader.Go(func() { seen = follow(t, stores[4], prj, stop) })

	var appended atomic.Int64
	var writers sync.WaitGroup
	for w := range 8 {
		s := stores[w%4]
		if w%2 == 0 {
			// Job events in transactions that stay open after the append.
			writers.Go(func() {
				r := rand.New(rand.NewPCG(uint64(w), 7))
				for i := range 60 {
					n := 1 + r.IntN(4)
					err := s.Update(ctx, func(tx vibejobs.Tx) error {
						var evs []*vibejobs.Event
						for range n {
							evs = append(evs, vibejobs.JobEvent(vibejobs.EventJobUpdated, jobs[r.IntN(len(jobs))], t0))
						}
						if i%5 == 0 {
							evs = append(evs, &vibejobs.Event{ProjectID: other, Type: vibejobs.EventJobUpdated, OccurredAt: t0, JobID: "job_x"})
						}
						if err := tx.AppendEvents(ctx, evs...); err != nil {
							return err
						}
						time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
					appended.Add(int64(n))
				}
			})
			continue
		}
		// Run outcomes in batches, as dispatchers on several replicas do.
		owner := fmt.Sprintf("w%d", w)
		writers.Go(func() {
			for {
				claims, err := s.ClaimDueRuns(ctx, owner, t0, 1+w*3, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if len(claims) == 0 {
					return
				}
				var outcomes []vibejobs.Outcome
				for i, c := range claims {
					a := vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: t0, FinishedAt: t0.Add(time.Second), StatusCode: 200}
					step := vibejobs.Step{State: vibejobs.RunSucceeded}
					if i%3 == 0 {
						a.StatusCode, a.ErrorCode = 500, "http_5xx"
						step = vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAttemptsExhausted}
					}
					outcomes = append(outcomes, vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Attempt: a, Step: step})
				}
				if err := s.RecordOutcomes(ctx, owner, outcomes); err != nil {
					t.Error(err)
					return
				}
				appended.Add(int64(len(outcomes)))
			}
		})
	}
	writers.Wait()
	close(stop)
	reader.Wait()

	if int64(len(seen)) != appended.Load() {
		t.Fatalf("the reader saw %d events, %d were appended", len(seen), appended.Load())
	}
	runs := map[string]bool{}
	for _, e := range seen {
		if e.RunID != "" {
			if runs[e.RunID] {
				t.Fatalf("run %s has two events", e.RunID)
			}
			runs[e.RunID] = true
		}
	}
	if len(runs) != 1000 {
		t.Fatalf("%d runs have an event, want 1000", len(runs))
	}
	if p, err := stores[0].ListEvents(ctx, other, vibejobs.EventFilter{Limit: 100}); err != nil || p.Head != int64(len(p.Events)) || p.Head == 0 {
		t.Fatalf("the other project's feed: head %d, %d events, %v", p.Head, len(p.Events), err)
	}
}

// TestRunEventVisibleWithItsState: a reader that sees a run finished finds
// its terminal event in the feed, whichever replica recorded it.
func TestRunEventVisibleWithItsState(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b, reader := open(t, schema), open(t, schema), open(t, schema)
	prj := newProject(t, a)
	jobs := newJobs(t, a, prj, 10)
	var plans []vibejobs.RunPlan
	for _, j := range jobs {
		plans = append(plans, planFor(j, t0.Add(-3*time.Second), t0.Add(-2*time.Second), t0.Add(-time.Second)))
	}
	if _, _, err := a.ApplyRunPlans(ctx, plans, t0); err != nil {
		t.Fatal(err)
	}
	runs, _, err := a.ListRuns(ctx, prj, vibejobs.RunFilter{}, vibejobs.Page{Limit: 100})
	if err != nil || len(runs) != 30 {
		t.Fatalf("ListRuns: %d, %v", len(runs), err)
	}

	done := make(chan struct{})
	var checked atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		pending := map[string]bool{}
		for _, r := range runs {
			pending[r.ID] = true
		}
		for len(pending) > 0 {
			select {
			case <-done:
				if len(pending) > 0 {
					t.Errorf("%d runs never seen finished", len(pending))
				}
				return
			default:
			}
			for id := range pending {
				r, err := reader.GetRun(ctx, prj, id)
				if err != nil {
					t.Error(err)
					return
				}
				if !r.State.Finished() {
					continue
				}
				p, err := reader.ListEvents(ctx, prj, vibejobs.EventFilter{Limit: 100})
				if err != nil {
					t.Error(err)
					return
				}
				found := false
				for _, e := range p.Events {
					found = found || e.RunID == id && e.State == string(r.State)
				}
				if !found {
					t.Errorf("run %s is %s but its event is not in the feed", id, r.State)
				}
				delete(pending, id)
				checked.Add(1)
			}
		}
	})
	for i, s := range []*postgres.Store{a, b} {
		owner := fmt.Sprintf("w%d", i)
		wg.Go(func() {
			for {
				claims, err := s.ClaimDueRuns(ctx, owner, t0, 2, time.Minute)
				if err != nil || len(claims) == 0 {
					return
				}
				var outcomes []vibejobs.Outcome
				for _, c := range claims {
					outcomes = append(outcomes, vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
						Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0, StatusCode: 200},
						Step:    vibejobs.Step{State: vibejobs.RunSucceeded}})
				}
				if err := s.RecordOutcomes(ctx, owner, outcomes); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	tm := time.AfterFunc(30*time.Second, func() { close(done) })
	wg.Wait()
	tm.Stop()
	if checked.Load() != 30 {
		t.Fatalf("checked %d runs, want 30", checked.Load())
	}
}

// TestPruneEventsAcrossReplicas: replicas pruning one feed at once, in small
// batches, delete exactly the old events before the first recent one and
// leave the rest contiguous. A pruner that skipped rows another one held
// could step past the recent event and cut a hole after it.
func TestPruneEventsAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	stores := replicas(t, 4)
	prj := newProject(t, stores[0])
	job := newJobs(t, stores[0], prj, 1)[0]
	old, recent, cutoff := t0.Add(-20*24*time.Hour), t0.Add(-time.Hour), t0.Add(-7*24*time.Hour)
	appendAt := func(n int, at time.Time) {
		err := stores[0].Update(ctx, func(tx vibejobs.Tx) error {
			evs := make([]*vibejobs.Event, n)
			for i := range evs {
				evs[i] = vibejobs.JobEvent(vibejobs.EventJobUpdated, job, at)
			}
			return tx.AppendEvents(ctx, evs...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	appendAt(1000, old) // 1–1000: to prune
	appendAt(1, recent) // 1001: the first kept
	appendAt(999, old)  // 1002–2000: old, but after a recent one
	var pruned atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			for {
				n, err := s.PruneEvents(ctx, prj, cutoff, 37)
				if err != nil {
					t.Error(err)
					return
				}
				pruned.Add(int64(n))
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if pruned.Load() != 1000 {
		t.Errorf("replicas pruned %d events in all, want 1000", pruned.Load())
	}
	var after int64
	var kept []*vibejobs.Event
	for {
		p, err := stores[1].ListEvents(ctx, prj, vibejobs.EventFilter{After: after, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if p.Oldest != 1001 {
			t.Fatalf("oldest %d, want 1001", p.Oldest)
		}
		kept = append(kept, p.Events...)
		if p.Next == after {
			break
		}
		after = p.Next
	}
	if len(kept) != 1000 || kept[0].Sequence != 1001 || kept[len(kept)-1].Sequence != 2000 {
		t.Fatalf("kept %d events (%d–%d), want 1001–2000", len(kept), kept[0].Sequence, kept[len(kept)-1].Sequence)
	}
	for i, e := range kept {
		if e.Sequence != 1001+int64(i) {
			t.Fatalf("a hole in the kept feed: event %d is sequence %d", i, e.Sequence)
		}
	}
}
