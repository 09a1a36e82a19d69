package sqlite_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// burstRuns is the burst: runs due at the same instant.
const burstRuns = 20_000

// seedBurst creates a project, jobs and burstRuns schedule-triggered runs
// all due at now, spread evenly over the jobs, through ApplyRunPlans with
// chunk plans per call. It returns how long ApplyRunPlans took in all.
func seedBurst(b *testing.B, s *sqlite.Store, jobs, chunk int, now time.Time) time.Duration {
	b.Helper()
	ctx := context.Background()
	secret := make([]byte, 60)
	rand.Read(secret)
	var js []*vibejobs.Job
	err := s.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(ctx, &vibejobs.Project{ID: "prj_bench", Name: "bench", CreatedAt: now}); err != nil {
			return err
		}
		for i := range jobs {
			from := now.Add(-time.Duration(burstRuns/jobs) * time.Second)
			j := &vibejobs.Job{
				ID: vibejobs.NewID("job_", now.Add(time.Duration(i)*time.Millisecond), nil), ProjectID: "prj_bench",
				Name: "burst", Schedule: "@every 1s", Timezone: "UTC", URL: "http://127.0.0.1:9/hook",
				Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(),
				Timeout: vibejobs.DefaultTimeout, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: from,
				NextRunAt: &from, Secret: vibejobs.SealedSecret{KeyID: "k1", Ciphertext: secret},
				CreatedAt: now, UpdatedAt: now,
			}
			if err := tx.CreateJob(ctx, j); err != nil {
				return err
			}
			js = append(js, j)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	perJob := burstRuns / jobs
	plans := make([]vibejobs.RunPlan, 0, jobs)
	for _, j := range js {
		from := *j.NextRunAt
		p := vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: from, Next: &now}
		for k := range perJob {
			at := from.Add(time.Duration(k) * time.Second)
			r := vibejobs.NewRun(vibejobs.NewID("run_", now, nil), j, vibejobs.TriggerSchedule, at, now)
			r.NextAttemptAt = &now // all due at once
			p.Runs = append(p.Runs, r)
		}
		plans = append(plans, p)
	}
	start := time.Now()
	created := 0
	for len(plans) > 0 {
		k := min(chunk, len(plans))
		n, _, err := s.ApplyRunPlans(ctx, plans[:k], now)
		if err != nil {
			b.Fatal(err)
		}
		created += n
		plans = plans[k:]
	}
	took := time.Since(start)
	if created != burstRuns {
		b.Fatalf("ApplyRunPlans created %d runs, want %d", created, burstRuns)
	}
	return took
}

// BenchmarkApplyRunPlans measures creating the burst's 20,000 runs as the
// scheduler would: one run for each of 20,000 jobs, 1,000 or 2,000 plans
// per call; or 20 runs for each of 1,000 jobs in one call.
func BenchmarkApplyRunPlans(b *testing.B) {
	for _, c := range []struct{ jobs, chunk int }{{20_000, 1000}, {20_000, 2000}, {1000, 1000}} {
		b.Run(fmt.Sprintf("jobs=%d/plans-per-call=%d", c.jobs, c.chunk), func(b *testing.B) {
			now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			var took time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), fmt.Sprintf("apply%d.db", i)),
					sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					b.Fatal(err)
				}
				took += seedBurst(b, s, c.jobs, c.chunk, now)
				s.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/20k-runs")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// cpuTime is the CPU time (user + system) the process used so far: on a
// busy machine runs/cpu-s varies less than runs/s.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkClaimAndRecord measures the store's share of the burst: claiming
// 20,000 due runs in batches and recording a success for each, in batches of
// the same size, as the dispatcher does. runs/s is the throughput of claim +
// record together (runs/cpu-s per CPU second used); apply-ms is the time ApplyRunPlans took to create the
// 20,000 runs (not part of runs/s).
//
//	go test -run '^$' -bench ClaimAndRecord -benchtime 5x ./internal/sqlite/
func BenchmarkClaimAndRecord(b *testing.B) {
	for _, batch := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			var busy, cpu, apply time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), fmt.Sprintf("bench%d.db", i)), sqlite.Options{
					Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now },
				})
				if err != nil {
					b.Fatal(err)
				}
				apply += seedBurst(b, s, 1000, 1000, now)
				b.StartTimer()

				start, startCPU := time.Now(), cpuTime()
				done := 0
				for done < burstRuns {
					claims, err := s.ClaimDueRuns(ctx, "bench", now, batch, 5*time.Second)
					if err != nil {
						b.Fatal(err)
					}
					if len(claims) == 0 {
						b.Fatalf("claimed nothing after %d runs", done)
					}
					outcomes := make([]vibejobs.Outcome, len(claims))
					for k, c := range claims {
						outcomes[k] = vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Step: vibejobs.Step{State: vibejobs.RunSucceeded},
							Attempt: vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: now, FinishedAt: now.Add(3 * time.Millisecond),
								StatusCode: 200, SignatureTimestamp: now.Unix(), ResponseSnippet: "ok"}}
					}
					if err := s.RecordOutcomes(ctx, "bench", outcomes); err != nil {
						b.Fatal(err)
					}
					done += len(claims)
				}
				busy += time.Since(start)
				cpu += cpuTime() - startCPU

				b.StopTimer()
				if st, err := s.QueueStats(ctx, now); err != nil || st.Due != 0 {
					b.Fatalf("QueueStats after the burst = %+v, %v", st, err)
				}
				s.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(burstRuns*b.N)/busy.Seconds(), "runs/s")
			b.ReportMetric(float64(burstRuns*b.N)/cpu.Seconds(), "runs/cpu-s")
			b.ReportMetric(float64(apply.Milliseconds())/float64(b.N), "apply-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
