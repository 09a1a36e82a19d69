package scheduler_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/scheduler"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// racingStore runs other, once, between reading the due jobs and applying
// their plans: another replica's scheduler pass in between.
type racingStore struct {
	vibejobs.SchedulerStore
	other func()
}

func (s *racingStore) DueJobs(ctx context.Context, before time.Time, after vibejobs.DuePosition, limit int) ([]*vibejobs.Job, error) {
	jobs, err := s.SchedulerStore.DueJobs(ctx, before, after, limit)
	if s.other != nil {
		s.other()
		s.other = nil
	}
	return jobs, err
}

// TestSkippedCountedOnceAcrossReplicas: two replicas plan the same missed
// occurrences; one applies its plan, the other's is stale. The skipped
// occurrences are counted once, on the job and in the metric.
func TestSkippedCountedOnceAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	next := now.Add(-10 * time.Minute) // down for ten minutes
	j := &vibejobs.Job{ID: "job_x", ProjectID: "prj_x", Name: "x", Schedule: "* * * * *", Timezone: "UTC",
		URL: "https://example.com/", Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(),
		Timeout: 10 * time.Second, CatchUp: vibejobs.CatchUpNone, ScheduleAnchor: now.Add(-time.Hour), NextRunAt: &next,
		Secret: vibejobs.SealedSecret{KeyID: "k", Ciphertext: []byte{1}}, CreatedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-time.Hour)}
	err = st.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(ctx, &vibejobs.Project{ID: "prj_x", Name: "x", CreatedAt: now.Add(-time.Hour)}); err != nil {
			return err
		}
		return tx.CreateJob(ctx, j)
	})
	if err != nil {
		t.Fatal(err)
	}
	var metric int64
	config := func(s vibejobs.SchedulerStore) scheduler.Config {
		return scheduler.Config{Store: s, Now: func() time.Time { return now }, OnSkipped: func(n int64) { metric += n }}
	}
	b := scheduler.New(config(st))
	a := scheduler.New(config(&racingStore{SchedulerStore: st, other: func() {
		if _, err := b.RunOnce(ctx); err != nil {
			t.Error(err)
		}
	}}))
	if _, err := a.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetJob(ctx, "prj_x", "job_x")
	if err != nil {
		t.Fatal(err)
	}
	if got.SkippedRuns != 10 || metric != 10 {
		t.Fatalf("skipped occurrences: %d on the job, %d in the metric; want 10 and 10", got.SkippedRuns, metric)
	}
}
