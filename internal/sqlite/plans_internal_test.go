package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDueJobsStartsAtItsPosition: a scheduler passes the due jobs it cannot
// plan by listing after the last one, and those jobs stay due, on every
// scan. The position must start the walk of jobs_due, not filter it, and
// the walk must give the order without a sort.
func TestDueJobsStartsAtItsPosition(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "vibejobs.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	plan := queryPlan(t, s, dueJobsSQL, ms(now), ms(now.Add(-time.Hour)), "job_x", 5)
	if p := strings.Join(plan, "\n"); len(plan) != 1 || !strings.Contains(p, "USING INDEX jobs_due ((next_run_at,id)>(?,?)") {
		t.Errorf("the list of due jobs after a position does not start its walk of jobs_due there:\n%s", p)
	}
}

// TestDeleteJobReadsOnlyTheRunsItMayCancel: deleting a job cancels its
// waiting runs whose deadline is not past, which are among its last
// DeliveryLifetime of occurrences. The statement must find them by a range
// of the occurrence key (job_id, scheduled_for), not by walking every run
// of the job (millions for a job that fires every second) or every
// waiting run.
func TestDeleteJobReadsOnlyTheRunsItMayCancel(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "vibejobs.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	plan := queryPlan(t, s, cancelJobRunsSQL, "job_deleted", ms(now), "job_x", ms(now.Add(-96*time.Hour)))
	if p := strings.Join(plan, "\n"); len(plan) != 1 || !strings.Contains(p, "(job_id=? AND scheduled_for>?)") {
		t.Errorf("the cancellation of a deleted job's runs does not take a range of (job_id, scheduled_for):\n%s", p)
	}
}

// queryPlan returns the details of EXPLAIN QUERY PLAN for query with args.
func queryPlan(t *testing.T, s *Store, query string, args ...any) []string {
	t.Helper()
	rows, err := s.r.QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}
