package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// TestRecoveredCaughtUpRunsKeepScheduledForOrder: SEMANTICS.md §4
// "Caught-up runs go out in scheduledFor order" and §3 (a run whose process
// died is taken over once its lease ends). The scheduler catches up twelve
// missed occurrences of a job; a process claims them and dies; lease
// recovery makes them all due at the same instant, and the next claim must
// still hand them out oldest occurrence first. PostgreSQL breaks the tie by
// run id: the scheduler's run ids carried the planning time, so their order
// was random; they now carry the occurrence's.
func TestRecoveredCaughtUpRunsKeepScheduledForOrder(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	j := jobFor(prj)
	j.Schedule = "* * * * *"
	from := t0.Add(-12 * time.Minute)
	j.NextRunAt = &from
	mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.CreateJob(ctx, j) })

	now := t0
	sch := scheduler.New(scheduler.Config{Store: s, Now: func() time.Time { return now }, Logger: quiet})
	if n, err := sch.RunOnce(ctx); err != nil || n < 12 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	claims, err := s.ClaimDueRuns(ctx, "dead-owner", now, 100, 5*time.Second)
	if err != nil || len(claims) < 12 {
		t.Fatalf("claimed %d, %v", len(claims), err)
	}
	later := now.Add(time.Minute) // every lease has ended
	if n, err := s.RecoverExpiredLeases(ctx, later, 100); err != nil || n != len(claims) {
		t.Fatalf("recovered %d of %d, %v", n, len(claims), err)
	}
	again, err := s.ClaimDueRuns(ctx, "live-owner", later, 100, 5*time.Second)
	if err != nil || len(again) != len(claims) {
		t.Fatalf("claimed again %d, %v", len(again), err)
	}
	for i := 1; i < len(again); i++ {
		if again[i].Run.ScheduledFor.Before(again[i-1].Run.ScheduledFor) {
			var order []string
			for _, c := range again {
				order = append(order, c.Run.ScheduledFor.Format("15:04"))
			}
			t.Fatalf("recovered caught-up runs claimed in this scheduledFor order: %v", order)
		}
	}
}
