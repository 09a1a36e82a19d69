package api_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// TestChangeBehindTheSchedulerCountsItsOccurrences: a pause or a schedule
// change moves a job's next occurrence past now. When the scheduler is
// behind (the platform was down, or the job's schedule does not parse on
// this replica), the old schedule's occurrences up to now have no run yet,
// and the change skips them for good: they are counted on the job and in
// the skipped occurrences metric, as catch-up counts those it skips
// (SEMANTICS.md section 4), once, a replayed request counting nothing.
// Occurrences that fall while the job is paused are the user's choice, not
// missed: a resume counts none.
func TestChangeBehindTheSchedulerCountsItsOccurrences(t *testing.T) {
	var metric atomic.Int64
	e := newEnv(t, func(c *api.Config) { c.OccurrencesSkipped = func(n int64) { metric.Add(n) } })
	j := e.createJob(e.admin, map[string]any{"schedule": "@every 10s"})["id"].(string)
	k := e.createJob(e.admin, map[string]any{"schedule": "@every 10s"})["id"].(string)

	// On time (nothing due by now): nothing skipped.
	e.clock.Advance(5 * time.Second)
	checkFields(t, "changed on time", e.must(200, "PATCH", "/v1/jobs/"+j, e.admin, map[string]any{"schedule": "*/10 * * * * *"}),
		map[string]any{"skippedRuns": float64(0), "nextRunAt": apiTimeString(t0.Add(10 * time.Second))})

	// No scan for 65 s: j's occurrences at +10 s … +60 s, and the one at
	// +70 s, the instant of the change, have no run.
	e.clock.Advance(65 * time.Second)
	checkFields(t, "schedule changed behind the scheduler", e.must(200, "PATCH", "/v1/jobs/"+j, e.admin, map[string]any{"schedule": "@every 7s"}),
		map[string]any{"skippedRuns": float64(7), "nextRunAt": apiTimeString(e.clock.Now().Add(7 * time.Second))})
	// k's occurrences at +10 s … +70 s.
	pause := req{method: "POST", path: "/v1/jobs/" + k + "/pause", token: e.admin, key: newKey()}
	if res := e.send(pause); res.status != 200 {
		t.Fatalf("pause: %s", res)
	}
	checkFields(t, "paused behind the scheduler", e.must(200, "GET", "/v1/jobs/"+k, e.admin, nil),
		map[string]any{"skippedRuns": float64(7)})
	if res := e.send(pause); res.status != 200 || res.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("pause replayed: %s", res)
	}
	if got := metric.Load(); got != 14 {
		t.Errorf("skipped occurrences metric after the changes = %d, want 14", got)
	}

	// A resume an hour later: the occurrences of the pause are skipped,
	// not counted.
	e.clock.Advance(time.Hour)
	checkFields(t, "resumed", e.must(200, "POST", "/v1/jobs/"+k+"/resume", e.admin, nil),
		map[string]any{"skippedRuns": float64(7), "state": "active"})
	if got := metric.Load(); got != 14 {
		t.Errorf("skipped occurrences metric after a resume = %d, want 14", got)
	}
}

// apiTimeString is t as the API writes it.
func apiTimeString(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// TestRetriedChangeCountsWhatItsRetrySkipped: a PATCH whose transaction
// the store runs again (PostgreSQL, after a deadlock or a serialization
// failure) counts in the metric what the attempt that committed skipped,
// as the job's skippedRuns does. Its first attempt, rolled back, found the
// scheduler behind; the scheduler then caught the job up (a run for each
// occurrence), and the retry skipped nothing: the metric still counted the
// first attempt's 7.
func TestRetriedChangeCountsWhatItsRetrySkipped(t *testing.T) {
	var metric atomic.Int64
	var rs *retryingStore
	e := newEnv(t, func(c *api.Config) {
		rs = &retryingStore{Store: c.Store}
		c.Store = rs
		c.OccurrencesSkipped = func(n int64) { metric.Add(n) }
	})
	j := e.createJob(e.admin, map[string]any{"schedule": "@every 10s"})["id"].(string)
	e.clock.Advance(70 * time.Second) // the occurrences at +10 s … +70 s have no run

	sched := scheduler.New(scheduler.Config{Store: e.store, Now: e.clock.Now, Logger: slog.New(slog.DiscardHandler)})
	rs.mu.Lock()
	rs.calls, rs.at = 0, 1 // the PATCH's one transaction
	rs.between = func() {
		if n, err := sched.RunOnce(context.Background()); err != nil || n != 7 {
			t.Errorf("the scheduler catching up between the attempts: %d runs, %v; want 7", n, err)
		}
	}
	rs.mu.Unlock()

	checkFields(t, "schedule changed, retried", e.must(200, "PATCH", "/v1/jobs/"+j, e.admin, map[string]any{"schedule": "@every 7s"}),
		map[string]any{"skippedRuns": float64(0)})
	if got := metric.Load(); got != 0 {
		t.Errorf("skipped occurrences metric = %d, want 0, as the job's skippedRuns: its runs exist", got)
	}
}
