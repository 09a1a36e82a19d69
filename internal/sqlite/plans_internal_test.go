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
	rows, err := s.r.QueryContext(ctx, "EXPLAIN QUERY PLAN "+dueJobsSQL, ms(now), ms(now.Add(-time.Hour)), "job_x", 5)
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
	if p := strings.Join(plan, "\n"); len(plan) != 1 || !strings.Contains(p, "USING INDEX jobs_due ((next_run_at,id)>(?,?)") {
		t.Errorf("the list of due jobs after a position does not start its walk of jobs_due there:\n%s", p)
	}
}
