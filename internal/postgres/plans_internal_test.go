package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vibejobs/vibejobs"
)

// explain returns the plan PostgreSQL picks for sql with args on q.
func explain(t *testing.T, q querier, sql string, args ...any) string {
	t.Helper()
	rows, err := q.Query(context.Background(), "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatalf("EXPLAIN: %v", err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestRowsLockedByCTIDAreFetchedByCTID: the statements that lock rows and
// then update them by ctid must fetch exactly those rows. On tables of a
// few thousand rows the planner preferred hashing the locked rows and
// scanning the whole table for them, on every batch: the jobs table of
// 2,000 jobs ticking every second (bloated by those ticks), or runs a few
// seconds into a fresh installation.
func TestRowsLockedByCTIDAreFetchedByCTID(t *testing.T) {
	ctx := context.Background()
	s := MustOpenTestWith(t, Options{Now: func() time.Time { return t0 }})
	seq := 0
	id := func(prefix string) string {
		seq++
		return fmt.Sprintf("%s%012x%016x", prefix, t0.UnixMilli(), seq)
	}
	project := &vibejobs.Project{ID: id("prj_"), Name: "plans", CreatedAt: t0}
	jobs := make([]*vibejobs.Job, 2000)
	err := s.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(ctx, project); err != nil {
			return err
		}
		for i := range jobs {
			next := t0
			jobs[i] = &vibejobs.Job{
				ID: id("job_"), ProjectID: project.ID, Name: "tick", Schedule: "@every 1s", Timezone: "UTC",
				URL: "https://example.test/hook", Enabled: true, State: vibejobs.JobActive,
				Retry: vibejobs.DefaultRetryPolicy(), Timeout: 10 * time.Second, CatchUp: vibejobs.CatchUpAll,
				ScheduleAnchor: t0, NextRunAt: &next, CreatedAt: t0, UpdatedAt: t0,
				Secret: vibejobs.SealedSecret{KeyID: "k1", Ciphertext: []byte("sealed")},
			}
			if err := tx.CreateJob(ctx, jobs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Two ticks of every job: 4,000 runs, and jobs rows rewritten.
	plans := func(jobs []*vibejobs.Job) []vibejobs.RunPlan {
		var ps []vibejobs.RunPlan
		for _, j := range jobs {
			at := *j.NextRunAt
			next := at.Add(time.Second)
			ps = append(ps, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: at, Next: &next,
				Runs: []*vibejobs.Run{vibejobs.NewRun(id("run_"), j, vibejobs.TriggerSchedule, at, t0)}})
			j.NextRunAt = &next
		}
		return ps
	}
	for range 2 {
		if n, _, err := s.ApplyRunPlans(ctx, plans(jobs), t0); err != nil || n != len(jobs) {
			t.Fatalf("ApplyRunPlans = %d, %v", n, err)
		}
	}

	if p := explain(t, s.pool, applyPlansSQL, s.applyPlansArgs(plans(jobs[:100]), nil)...); strings.Contains(p, "Seq Scan on jobs") ||
		strings.Contains(p, "Seq Scan on runs") {
		t.Errorf("applying 100 plans scans every job or every run:\n%s", p)
	} else if !strings.Contains(p, "runs_withdrawn_idx") {
		t.Errorf("applying 100 plans looks for withdrawn runs wanted again without their index:\n%s", p)
	}
	claims, err := s.ClaimDueRuns(ctx, "w1", t0.Add(time.Minute), 64, time.Second)
	if err != nil || len(claims) != 64 {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	args, err := recordArgs("w1", succeededAt(claims, t0))
	if err != nil {
		t.Fatal(err)
	}
	p := explain(t, s.queue, recordSQL, args...)
	if strings.Contains(p, "Seq Scan on run") {
		t.Errorf("recording 64 outcomes scans every run or the whole queue:\n%s", p)
	}
	if strings.Contains(p, "JIT") {
		t.Errorf("recording 64 outcomes compiles its plan:\n%s", p)
	}
	claimArgs := []any{t0.Add(time.Minute), "w2", 64, int64(time.Second)}
	if p := explain(t, s.queue, claimSQL, claimArgs...); strings.Contains(p, "Seq Scan") {
		t.Errorf("claiming 64 runs scans a table:\n%s", p)
	}
}

// succeededAt is the outcome of each claim's attempt answered 200 at "at".
func succeededAt(claims []*vibejobs.Claim, at time.Time) []vibejobs.Outcome {
	outcomes := make([]vibejobs.Outcome, len(claims))
	for i, c := range claims {
		outcomes[i] = vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
			Attempt: vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: at, FinishedAt: at, StatusCode: 200},
			Step:    vibejobs.Step{State: vibejobs.RunSucceeded}}
	}
	return outcomes
}

// sharedHits returns the buffers EXPLAIN (ANALYZE, BUFFERS) says sql read.
func sharedHits(t *testing.T, q querier, sql string, args ...any) int {
	t.Helper()
	plan := explain(t, q, "(ANALYZE, BUFFERS, COSTS OFF) "+sql, args...)
	for _, line := range strings.Split(plan, "\n") {
		var n int
		if i := strings.Index(line, "shared hit="); i >= 0 {
			fmt.Sscanf(line[i+len("shared hit="):], "%d", &n)
			return n
		}
	}
	t.Fatalf("no buffer counts in:\n%s", plan)
	return 0
}

// TestVacuumQueueClearsTheClaimIndex: finished runs leave dead entries at
// the start of run_queue's index, which every due-time read walks until a
// vacuum removes them. VacuumQueue vacuums run_queue whether the server's
// autovacuum is on or off, and the walk shrinks.
func TestVacuumQueueClearsTheClaimIndex(t *testing.T) {
	ctx := context.Background()
	s, job, id := queueTestJob(t)
	// 6,000 runs due before t0, all delivered, and one still waiting.
	const n = 6000
	var runs []*vibejobs.Run
	for i := range n + 1 {
		runs = append(runs, vibejobs.NewRun(id("run_"), job, vibejobs.TriggerManual, t0.Add(time.Duration(i-n)*time.Second), t0))
	}
	next := t0.Add(time.Hour)
	runs[n].NextAttemptAt = &next
	createRuns(t, s, runs)
	deliverAll(t, s, n)

	// The first read also visits the dead runs in the heap and marks their
	// entries dead; what a second read still walks, only a vacuum removes.
	sharedHits(t, s.queue, nextDueSQL, t0)
	before := sharedHits(t, s.queue, nextDueSQL, t0)
	waitVacuumHorizon(t, s)
	if err := s.VacuumQueue(ctx); err != nil {
		t.Fatalf("VacuumQueue: %v", err)
	}
	after := sharedHits(t, s.queue, nextDueSQL, t0)
	if after*3 > before {
		t.Errorf("the next due time read %d buffers before the vacuum and %d after; want a third at most", before, after)
	}
	if at, ok, err := s.NextDueAt(ctx); err != nil || !ok || !at.Equal(next) {
		t.Errorf("NextDueAt after the vacuum = %v, %v, %v; want %v", at, ok, err, next)
	}
}

// TestVacuumQueueKeepsThePages: once every run is delivered, run_queue is
// all empty pages, and a vacuum that cut them off would hold an ACCESS
// EXCLUSIVE lock on the queue, stalling every claim, while it did (see
// migration 00012). The vacuum leaves the table its size.
func TestVacuumQueueKeepsThePages(t *testing.T) {
	ctx := context.Background()
	s, job, id := queueTestJob(t)
	const n = 2000
	var runs []*vibejobs.Run
	for i := range n {
		runs = append(runs, vibejobs.NewRun(id("run_"), job, vibejobs.TriggerManual, t0.Add(time.Duration(i-n)*time.Second), t0))
	}
	createRuns(t, s, runs)
	deliverAll(t, s, n)
	size := func() (bytes int64) {
		t.Helper()
		if err := s.pool.QueryRow(ctx, `SELECT pg_relation_size('run_queue')`).Scan(&bytes); err != nil {
			t.Fatal(err)
		}
		return bytes
	}
	before := size()
	if before == 0 {
		t.Fatal("run_queue is empty on disk before the vacuum; the test proves nothing")
	}
	waitVacuumHorizon(t, s)
	if err := s.VacuumQueue(ctx); err != nil {
		t.Fatalf("VacuumQueue: %v", err)
	}
	if after := size(); after != before {
		t.Errorf("run_queue was %d bytes before the vacuum and %d after; want its pages kept", before, after)
	}
}

// deliverAll claims n due runs at t0, in batches of 500, and records each
// batch succeeded.
func deliverAll(t *testing.T, s *Store, n int) {
	t.Helper()
	ctx := context.Background()
	for done := 0; done < n; {
		claims, err := s.ClaimDueRuns(ctx, "w1", t0, 500, time.Minute)
		if err != nil || len(claims) == 0 {
			t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
		}
		if err := s.RecordOutcomes(ctx, "w1", succeededAt(claims, t0)); err != nil {
			t.Fatal(err)
		}
		done += len(claims)
	}
}

// waitVacuumHorizon waits until no session of the database but the caller's
// holds a snapshot or a transaction id from before the writes committed so
// far. Until then VACUUM keeps the rows they deleted, which such a session
// may still see: CI runs the test binaries of several packages at once
// against one database, and a transaction another test holds open, even
// in another schema, made TestVacuumQueueClearsTheClaimIndex find its
// vacuum had removed nothing.
func waitVacuumHorizon(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	// Every transaction id below this one has ended: the deletions among them.
	var written string
	if err := s.pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&written); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var older []string
		rows, err := s.pool.Query(ctx, `SELECT format('pid %s (%s, %s since %s)', pid, backend_type, state, xact_start)
			FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND greatest(age(backend_xmin), age(backend_xid)) > age(xid($1::text::xid8))`, written)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var session string
			if err := rows.Scan(&session); err != nil {
				t.Fatal(err)
			}
			older = append(older, session)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(older) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions older than the deletions keep them from the vacuum: %s", strings.Join(older, "; "))
		}
	}
}

// t0 is the time at which the internal tests of this package run.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// queueTestJob opens a test store whose clock stands at t0, with a project
// and a job in it, and returns them with a maker of fresh ids.
func queueTestJob(t *testing.T) (*Store, *vibejobs.Job, func(prefix string) string) {
	t.Helper()
	ctx := context.Background()
	s := MustOpenTestWith(t, Options{Now: func() time.Time { return t0 }})
	seq := 0
	id := func(prefix string) string {
		seq++
		return fmt.Sprintf("%s%012x%016x", prefix, t0.UnixMilli(), seq)
	}
	project := &vibejobs.Project{ID: id("prj_"), Name: "queue", CreatedAt: t0}
	next := t0.Add(time.Hour)
	job := &vibejobs.Job{
		ID: id("job_"), ProjectID: project.ID, Name: "tick", Schedule: "@every 1s", Timezone: "UTC",
		URL: "https://example.test/hook", Enabled: true, State: vibejobs.JobActive,
		Retry: vibejobs.DefaultRetryPolicy(), Timeout: 10 * time.Second, CatchUp: vibejobs.CatchUpAll,
		ScheduleAnchor: t0, NextRunAt: &next, CreatedAt: t0, UpdatedAt: t0,
		Secret: vibejobs.SealedSecret{KeyID: "k1", Ciphertext: []byte("sealed")},
	}
	err := s.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(ctx, project); err != nil {
			return err
		}
		return tx.CreateJob(ctx, job)
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, job, id
}

// createRuns creates runs in one transaction.
func createRuns(t *testing.T, s *Store, runs []*vibejobs.Run) {
	t.Helper()
	ctx := context.Background()
	err := s.Update(ctx, func(tx vibejobs.Tx) error {
		for _, r := range runs {
			if err := tx.CreateRun(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFailExpiredRunsReadsOnlyDueRuns: every replica checks deadlines each
// second. Runs waiting for a later attempt, after a receiver failed or
// materialised ahead of their time, cannot have passed their deadline
// (see vibejobs.Run.CheckDue), and the check does not read them.
func TestFailExpiredRunsReadsOnlyDueRuns(t *testing.T) {
	s, job, id := queueTestJob(t)
	const n = 3000
	var runs []*vibejobs.Run
	for i := range n {
		runs = append(runs, vibejobs.NewRun(id("run_"), job, vibejobs.TriggerManual, t0.Add(time.Duration(i+1)*time.Second), t0))
	}
	createRuns(t, s, runs)
	if hits := sharedHits(t, s.pool, failExpiredSQL, t0, 100, vibejobs.ReasonDeadlineExceeded); hits > 10 {
		t.Errorf("the deadline check read %d buffers with %d runs waiting, none due; want 10 at most", hits, n)
	}
}

// TestEventsReadStopsAtItsWindow: a read of the feed covers at most 1,000
// sequences after its cursor, and the index scan must stop there: a read
// with type or job filters that match few events would otherwise walk the
// feed to its head, on every poll of every subscription.
func TestEventsReadStopsAtItsWindow(t *testing.T) {
	s := MustOpenTestWith(t, Options{})
	p := explain(t, s.pool, listEventsSQL, "prj_x", int64(5), 1000, []string{"run.failed"}, "", 100)
	if !strings.Contains(p, "AND (sequence <= w.upto))") {
		t.Errorf("the feed's read does not bound its index scan by its window:\n%s", p)
	}
}

// TestDueJobsStartsAtItsPosition: a scheduler passes the due jobs it cannot
// plan by listing after the last one, and those jobs stay due, on every
// scan. The position must start the index scan, not filter it: a list after
// thousands of due jobs reads a page's worth of rows, not all of them.
func TestDueJobsStartsAtItsPosition(t *testing.T) {
	ctx := context.Background()
	s, job, id := queueTestJob(t)
	const n = 3000
	jobs := make([]*vibejobs.Job, n)
	err := s.Update(ctx, func(tx vibejobs.Tx) error {
		for i := range jobs {
			j := *job
			j.ID = id("job_")
			next := t0.Add(time.Duration(i-n) * time.Second)
			j.NextRunAt = &next
			jobs[i] = &j
			if err := tx.CreateJob(ctx, &j); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	last := jobs[n-6]
	if hits := sharedHits(t, s.pool, dueJobsSQL, t0, *last.NextRunAt, last.ID, 5); hits > 10 {
		t.Errorf("listing 5 due jobs after %d others read %d buffers; want 10 at most", n-5, hits)
	}
}

// TestRecordFindsQueueRowsByKey: recording a batch of outcomes reads the
// queue row of each run it moves by the row's whole key, however many
// runs are in flight. Joined to the moved runs directly, the generic plan
// of the record statement, made with statistics from a queue of waiting
// runs (autovacuum's analyze, taken while few runs were in flight),
// walked every leased row for each batch, and each moved run for each of
// those rows.
func TestRecordFindsQueueRowsByKey(t *testing.T) {
	ctx := context.Background()
	s, job, id := queueTestJob(t)
	const n, inFlight, recorded = 3000, 2000, 10
	var runs []*vibejobs.Run
	for i := range n {
		runs = append(runs, vibejobs.NewRun(id("run_"), job, vibejobs.TriggerManual, t0.Add(time.Duration(i-n)*time.Second), t0))
	}
	createRuns(t, s, runs)
	if _, err := s.pool.Exec(ctx, `ANALYZE run_queue`); err != nil {
		t.Fatal(err)
	}
	claims, err := s.ClaimDueRuns(ctx, "w1", t0, inFlight, time.Minute)
	if err != nil || len(claims) != inFlight {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	err = pgx.BeginFunc(ctx, s.queue, func(tx pgx.Tx) error {
		read, err := queueEntriesRead(ctx, tx, func() error {
			return s.recordOutcomes(ctx, tx, "w1", succeededAt(claims[:recorded], t0), vibejobs.RunsEnded{})
		})
		if err == nil && read > 4*recorded {
			t.Errorf("recording %d outcomes with %d runs in flight read %d entries of run_queue's index; want one a run", recorded, inFlight, read)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestClaimFindsQueueRowsByKey: a claim moves the queue row of each run it
// leases by the row's whole key, whatever share of the queue the
// statistics saw leased (an analyze taken during a burst sees nearly
// every run in flight).
func TestClaimFindsQueueRowsByKey(t *testing.T) {
	ctx := context.Background()
	s, job, id := queueTestJob(t)
	const n, claimed = 3000, 10
	newRuns := func(at time.Time) {
		var runs []*vibejobs.Run
		for i := range n {
			runs = append(runs, vibejobs.NewRun(id("run_"), job, vibejobs.TriggerManual, at.Add(time.Duration(i-n)*time.Millisecond), t0))
		}
		createRuns(t, s, runs)
	}
	newRuns(t0)
	claims, err := s.ClaimDueRuns(ctx, "w1", t0, n, time.Minute)
	if err != nil || len(claims) != n {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	if _, err := s.pool.Exec(ctx, `ANALYZE run_queue`); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordOutcomes(ctx, "w1", succeededAt(claims, t0)); err != nil {
		t.Fatal(err)
	}
	// Due before the first runs were: the walk meets them before the
	// entries the first runs left, which only a vacuum removes.
	newRuns(t0.Add(-time.Minute))
	err = pgx.BeginFunc(ctx, s.queue, func(tx pgx.Tx) error {
		read, err := queueEntriesRead(ctx, tx, func() error {
			rows, err := tx.Query(ctx, claimSQL, t0, "w2", claimed, int64(time.Second))
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		})
		if err == nil && read > 4*claimed {
			t.Errorf("claiming %d runs of %d due read %d entries of run_queue's index; want one or two a run", claimed, n, read)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// queueEntriesRead returns the entries of run_queue's index that index
// scans returned to statements of tx while do ran. The counters are the
// backend's own, not yet reported: a backend reports them at most once a
// second, and only between transactions, so they are read within tx.
func queueEntriesRead(ctx context.Context, tx pgx.Tx, do func() error) (int, error) {
	const read = `SELECT pg_stat_get_xact_tuples_returned('run_queue_pkey'::regclass)`
	var before, after int
	if err := tx.QueryRow(ctx, read).Scan(&before); err != nil {
		return 0, err
	}
	if err := do(); err != nil {
		return 0, err
	}
	if err := tx.QueryRow(ctx, read).Scan(&after); err != nil {
		return 0, err
	}
	return after - before, nil
}
