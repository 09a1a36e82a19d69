package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/procstat"
)

const benchRuns = 20_000

// seedDueRuns creates jobs and, through ApplyRunPlans in batches of 1,000
// plans (the scheduler's batch), one due run per job; it returns the time
// ApplyRunPlans took.
func seedDueRuns(b *testing.B, s *postgres.Store, jobs []*vibejobs.Job) time.Duration {
	b.Helper()
	ctx := context.Background()
	var took time.Duration
	for i := 0; i < len(jobs); i += 1000 {
		var plans []vibejobs.RunPlan
		for _, j := range jobs[i:min(i+1000, len(jobs))] {
			plans = append(plans, planFor(j, *j.NextRunAt))
			next := j.NextRunAt.Add(time.Second)
			j.NextRunAt = &next
		}
		start := time.Now()
		n, _, err := s.ApplyRunPlans(ctx, plans, t0)
		took += time.Since(start)
		if err != nil || n != len(plans) {
			b.Fatalf("ApplyRunPlans = %d, %v", n, err)
		}
	}
	return took
}

// BenchmarkApplyRunPlans materialises 20,000 due occurrences (one per job)
// in batches of 1,000 plans.
func BenchmarkApplyRunPlans(b *testing.B) {
	s := open(b, "")
	jobs := newJobs(b, s, newProject(b, s), benchRuns)
	var took time.Duration
	for b.Loop() {
		took += seedDueRuns(b, s, jobs)
	}
	b.ReportMetric(float64(benchRuns*b.N)/took.Seconds(), "runs/s")
}

// BenchmarkClaimAndRecord drains 20,000 due runs the way dispatchers do:
// workers (spread over two Stores, as two replicas) each claim batches of
// 200 and record their outcomes in batches of 200.
func BenchmarkClaimAndRecord(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchClaimAndRecord(b, workers) })
	}
}

func benchClaimAndRecord(b *testing.B, workers int) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(b)
	stores := []*postgres.Store{open(b, schema), open(b, schema)}
	jobs := newJobs(b, stores[0], newProject(b, stores[0]), benchRuns)
	const batch = 200
	var took, pgCPU time.Duration
	for b.Loop() {
		b.StopTimer()
		seedDueRuns(b, stores[0], jobs)
		now := *jobs[0].NextRunAt // every seeded run is due
		b.StartTimer()
		start, pgStart := time.Now(), procstat.PostgresCPU()
		var wg sync.WaitGroup
		for w := range workers {
			s, owner := stores[w%2], fmt.Sprintf("w%d", w)
			wg.Go(func() {
				for {
					claims, err := s.ClaimDueRuns(ctx, owner, now, batch, time.Second)
					if err != nil {
						b.Error(err)
						return
					}
					if len(claims) == 0 {
						return
					}
					out := make([]vibejobs.Outcome, len(claims))
					for i, c := range claims {
						out[i] = vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
							Attempt: vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: now, FinishedAt: now, StatusCode: 200, SignatureTimestamp: now.Unix()},
							Step:    vibejobs.Step{State: vibejobs.RunSucceeded}}
					}
					if err := s.RecordOutcomes(ctx, owner, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		took += time.Since(start)
		pgCPU += procstat.PostgresCPU() - pgStart
	}
	var left int
	if err := stores[0].Pool().QueryRow(ctx, `SELECT count(*) FROM runs WHERE state <> 'succeeded'`).Scan(&left); err != nil || left != 0 {
		b.Fatalf("%d runs not succeeded (%v)", left, err)
	}
	b.ReportMetric(float64(benchRuns*b.N)/took.Seconds(), "runs/s")
	// PostgreSQL's CPU per run, all its processes (10 ms ticks): what
	// the delivery path costs the database, less swayed than the rate by
	// whatever else the machine runs.
	b.ReportMetric(float64(pgCPU.Microseconds())/float64(benchRuns*b.N), "pg-cpu-µs/run")
}
