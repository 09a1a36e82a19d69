package sqlite_test

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/storetest"
)

// TestPruneRunsTakesTheirAttempts: a pruned run's attempts go with it (the
// foreign key's ON DELETE CASCADE, which holds only while the connection
// enforces foreign keys): no attempt row is left behind, and a run kept
// keeps its attempts.
func TestPruneRunsTakesTheirAttempts(t *testing.T) {
	ctx := context.Background()
	t0 := storetest.T0
	path := filepath.Join(t.TempDir(), "vibejobs.db")
	s, err := sqlite.Open(ctx, path, sqlite.Options{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	j := &vibejobs.Job{ID: "job_prune", ProjectID: "prj_prune", Name: "j", Schedule: "0 0 1 1 *", Timezone: "UTC",
		URL: "https://example.test/", Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(),
		Timeout: time.Second, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: t0, CreatedAt: t0, UpdatedAt: t0,
		Secret: vibejobs.SealedSecret{KeyID: "k", Ciphertext: []byte("x")}}
	done := vibejobs.NewRun("run_done", j, vibejobs.TriggerManual, t0.Add(-time.Second), t0.Add(-time.Second))
	retrying := vibejobs.NewRun("run_retrying", j, vibejobs.TriggerManual, t0, t0)
	if err := s.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(ctx, &vibejobs.Project{ID: j.ProjectID, Name: "p", CreatedAt: t0}); err != nil {
			return err
		}
		if err := tx.CreateJob(ctx, j); err != nil {
			return err
		}
		if err := tx.CreateRun(ctx, done); err != nil {
			return err
		}
		return tx.CreateRun(ctx, retrying)
	}); err != nil {
		t.Fatal(err)
	}
	claims, err := s.ClaimDueRuns(ctx, "a", t0, 10, 5*time.Second)
	if err != nil || len(claims) != 2 {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	retryAt := t0.Add(time.Hour)
	var outcomes []vibejobs.Outcome
	for _, c := range claims {
		o := vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
			Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0, StatusCode: 200},
			Step:    vibejobs.Step{State: vibejobs.RunSucceeded}}
		if c.Run.ID == retrying.ID {
			o.Attempt.StatusCode, o.Attempt.ErrorCode = 503, "http_5xx"
			o.Step = vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &retryAt}
		}
		outcomes = append(outcomes, o)
	}
	if err := s.RecordOutcomes(ctx, "a", outcomes); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneRuns(ctx, j.ProjectID, t0.Add(time.Minute), 10); err != nil || n != 1 {
		t.Fatalf("PruneRuns = %d, %v; want the finished run", n, err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		what string
		want int
	}{{"NOT IN (SELECT seq FROM runs)", 0}, {"IN (SELECT seq FROM runs WHERE id = 'run_retrying')", 1}} {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM attempts WHERE run_seq `+tc.what).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != tc.want {
			t.Errorf("attempts whose run_seq is %s: %d, want %d", tc.what, n, tc.want)
		}
	}
}
