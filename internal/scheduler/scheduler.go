// Package scheduler turns the due occurrences of jobs into runs.
//
// It materialises each occurrence a little ahead of its time (Lookahead), so
// the dispatcher can start the first attempt on the dot, and applies the
// catch-up rules to occurrences missed while the platform was down. Every
// replica may run it: the Store applies a plan only while the job still has
// the NextRunAt the plan was computed from, and a unique constraint keeps one
// run per (job, scheduledFor).
package scheduler

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/health"
	"github.com/vibejobs/vibejobs/internal/schedule"
)

// Defaults of Config.
const (
	DefaultLookahead    = 2 * time.Second
	DefaultInterval     = 250 * time.Millisecond
	DefaultBatchSize    = 1000
	DefaultCatchUpGrace = 5 * time.Second
	// DefaultStoreTimeout bounds each store call (see Config.StoreTimeout).
	DefaultStoreTimeout = 10 * time.Second
	// applyTimePerRun is the time ApplyRunPlans is given per run to create,
	// when that is more than StoreTimeout: generous, a run takes some tens
	// of microseconds.
	applyTimePerRun = 200 * time.Microsecond
	// unplannableRetryEvery: a job whose schedule does not parse here stays
	// due, and every scan meets it again; each is remembered, parsed again
	// and logged once per this period, or as soon as its schedule, time
	// zone or anchor changes (OnUnplannable counts them on every scan).
	unplannableRetryEvery = 10 * time.Minute
	// maxRememberedUnplannable bounds the jobs remembered as unplannable;
	// those beyond it are parsed on every scan, and not logged.
	maxRememberedUnplannable = 100_000
	// maxResentRuns bounds the runs of failed calls' plans kept to be
	// sent again (see Scheduler.resent): those of a full batch of
	// caught-up jobs at the default batch size. A job keeps at most one
	// plan per NextRunAt it was planned from (see supersede),
	// so while every call fails against a database that refuses writes
	// the plans kept are one a job; more accumulate only for jobs that
	// moved on between failed calls (a call that committed and lost its
	// answer, or another replica's). Beyond the bound the oldest plans
	// are forgotten, and the runs they created, if any, go uncounted.
	maxResentRuns = DefaultBatchSize * vibejobs.MaxCatchUpRuns
)

// Config of a Scheduler.
type Config struct {
	Store  vibejobs.SchedulerStore
	Logger *slog.Logger
	Now    func() time.Time
	Rand   io.Reader
	// Lookahead is how far ahead of its time an occurrence becomes a run.
	Lookahead time.Duration
	// Interval between scans when nothing wakes the scheduler.
	Interval time.Duration
	// BatchSize is the number of due jobs planned per transaction.
	BatchSize int
	// CatchUpGrace: an occurrence older than now − CatchUpGrace when planned
	// was missed (the platform was down) and follows the job's catch-up rule.
	CatchUpGrace time.Duration
	// OnRunsCreated is called after runs were created (wakes the
	// dispatcher), each run once. A run created by an ApplyRunPlans call
	// that failed after its commit (its answer lost) is told of by the
	// next call that succeeds, which sends that call's plans again
	// (RunPlan.Resent). None is told of twice; one goes untold only when
	// it was deleted (withdrawn) before that call, when calls failed
	// in a row for longer than the scheduler keeps their plans (the
	// runs of a full batch of caught-up jobs), or when the failed call
	// committed only after a later scan read its job (see supersede).
	OnRunsCreated func(n int)
	// OnSkipped is called with the number of occurrences skipped by
	// catch-up, each once. Those of a plan whose call failed after its
	// commit are told of by the next call that succeeds, as its runs are,
	// when a run of that plan is found: those of a plan that left no run
	// of its own (it had none, each met a run that existed, or they were
	// withdrawn since) go untold, since nothing tells its application
	// apart from another replica's plan of the same occurrences.
	OnSkipped func(n int64)
	// OnUnplannable is called after each scan that lists every due job, with
	// the number of them whose schedule does not parse here (a time zone
	// missing from this replica's tzdata), parsed by this scan or remembered
	// from an earlier one: they are left due, for a replica that can plan
	// them.
	OnUnplannable func(n int)
	// OnUnplannableUnknown is called after each scan that failed (not one
	// cut short by the end of its context): the due jobs it did not list
	// may hold unplannable ones, so the count of the last scan that
	// succeeded no longer holds. OnUnplannable follows the next scan that
	// succeeds.
	OnUnplannableUnknown func()
	// StoreTimeout bounds each store call: a connection gone silent
	// without a reset would otherwise hang the scans until TCP gives up.
	StoreTimeout time.Duration
}

// Scheduler materialises runs. Run loops; RunOnce does one pass.
type Scheduler struct {
	cfg     Config
	wake    chan struct{}
	failing health.Streak // of passes (see FailingSince)
	// jobSchedule is JobSchedule; tests observe it.
	jobSchedule func(*vibejobs.Job) (schedule.Schedule, error)

	mu sync.Mutex
	// unplannable holds, by job id, the jobs whose schedule did not parse
	// here, for at most unplannableRetryEvery after they were parsed (and
	// logged).
	unplannable map[string]unplannableJob
	// resent holds the plans with runs of ApplyRunPlans calls that
	// failed, marked Resent, oldest first: such a call may have
	// committed and lost its answer, and the next call sends them again
	// to learn of the runs it created. They are taken by the call that
	// sends them, and given back if it fails too; resentRuns counts
	// their runs, at most maxResentRuns. failedCalls counts the calls
	// that failed, the clock of keptPlan.failedAt.
	resent      []keptPlan
	resentRuns  int
	failedCalls uint64
	// maxResentRuns is maxResentRuns; tests lower it.
	maxResentRuns int
}

// keptPlan is a plan of a failed call, kept to be sent again: failedAt
// is the number of calls that had failed once that call had (see
// Scheduler.failedCalls). A plan sent again by later calls keeps it:
// they only counted its runs, and only its first call may have applied it.
type keptPlan struct {
	plan     vibejobs.RunPlan
	failedAt uint64
}

// unplannableJob is a job whose schedule did not parse: what it was
// parsed from, and when.
type unplannableJob struct {
	schedule, timezone string
	anchor, at         time.Time
	parsedAt           time.Time
}

// parsedFrom reports whether u failed with j's schedule as it is now.
func (u unplannableJob) parsedFrom(j *vibejobs.Job) bool {
	var at time.Time
	if j.At != nil {
		at = *j.At
	}
	return u.schedule == j.Schedule && u.timezone == j.Timezone && u.anchor.Equal(j.ScheduleAnchor) && u.at.Equal(at)
}

// New returns a Scheduler with the defaults filled in.
func New(cfg Config) *Scheduler {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	cfg.Lookahead = cmp.Or(cfg.Lookahead, DefaultLookahead)
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.CatchUpGrace = cmp.Or(cfg.CatchUpGrace, DefaultCatchUpGrace)
	cfg.StoreTimeout = cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout)
	return &Scheduler{cfg: cfg, wake: make(chan struct{}, 1), jobSchedule: JobSchedule,
		unplannable: make(map[string]unplannableJob), maxResentRuns: maxResentRuns}
}

// Wake asks for a scan now (after a job was created or changed).
func (s *Scheduler) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run scans until ctx is done.
func (s *Scheduler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := s.scan(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.cfg.Logger.Error("scheduler.scan_failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
	}
}

// RunOnce plans and applies every due job, BatchSize at a time, as one scan
// of Run does, and returns the runs created.
func (s *Scheduler) RunOnce(ctx context.Context) (int, error) {
	return s.scan(ctx)
}

// FailingSince returns when the scheduler's passes (scans of every due
// job, as RunOnce's) began to fail: each pass since then failed against the
// store, at one batch or another. It is zero while the last pass
// succeeded (one that found nothing due included), or before the first; a
// pass cut short by the end of its context (a shutdown) counts as neither.
func (s *Scheduler) FailingSince() time.Time { return s.failing.Since() }

// scan plans and applies the due jobs a batch at a time, in due order, each
// batch continuing after the last job of the one before. A job whose
// schedule does not parse here keeps its NextRunAt (another replica may
// plan it), so it stays first in due order: restarting each batch from the
// first due job, a batch's worth of them would hide every other job from
// this replica for good.
//
// A scan is the pass FailingSince counts: one that failed at any batch
// failed, so a batch that succeeds before a failing one (jobs that stay
// due head every scan) does not end the streak.
func (s *Scheduler) scan(ctx context.Context) (created int, err error) {
	defer func() {
		s.failing.Pass(s.cfg.Now(), err, ctx.Err())
		if err != nil && ctx.Err() == nil && s.cfg.OnUnplannableUnknown != nil {
			s.cfg.OnUnplannableUnknown()
		}
	}()
	var c scanCursor
	for {
		n, full, err := s.runOnce(ctx, &c)
		created += n
		if err != nil {
			return created, err
		}
		if n > 0 && s.cfg.OnRunsCreated != nil {
			s.cfg.OnRunsCreated(n)
		}
		if !full {
			break
		}
	}
	if s.cfg.OnUnplannable != nil {
		s.cfg.OnUnplannable(c.unplannable)
	}
	s.forgetUnplannable(s.cfg.Now())
	return created, nil
}

// scanCursor is how far a scan went: the position its next batch starts
// after, and the due jobs it could not plan so far.
type scanCursor struct {
	after       vibejobs.DuePosition
	unplannable int
}

// runOnce plans and applies the batch of due jobs after c.after, moves
// c.after to the batch's last job and reports whether the batch was full.
// The plans of failed calls go with it, resent (see Scheduler.resent),
// but those its read of the due jobs shows never applied (see
// supersede), and with a call of their own when nothing is due.
func (s *Scheduler) runOnce(ctx context.Context, c *scanCursor) (created int, full bool, err error) {
	now := s.cfg.Now()
	readAfter := s.failedSoFar()
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	jobs, err := s.cfg.Store.DueJobs(sctx, now.Add(s.cfg.Lookahead), c.after, s.cfg.BatchSize)
	cancel()
	if err != nil {
		return 0, false, fmt.Errorf("listing due jobs: %w", err)
	}
	resent := supersede(s.takeResent(), jobs, readAfter)
	if len(jobs) == 0 {
		if len(resent) == 0 {
			return 0, false, nil
		}
		created, skipped, err := s.apply(ctx, resent, nil, now)
		if err == nil && skipped > 0 && s.cfg.OnSkipped != nil {
			s.cfg.OnSkipped(skipped)
		}
		return created, false, err
	}
	last := jobs[len(jobs)-1]
	c.after = vibejobs.DuePosition{NextRunAt: *last.NextRunAt, JobID: last.ID}
	plans := make([]vibejobs.RunPlan, 0, len(jobs))
	for _, j := range jobs {
		// A stored schedule was validated when it was set; one that no
		// longer parses (a time zone gone from tzdata) stops here, loudly,
		// but not on every scan: the job stays due.
		if s.knownUnplannable(j, now) {
			c.unplannable++
			continue
		}
		sch, err := s.jobSchedule(j)
		if err != nil {
			c.unplannable++
			if s.rememberUnplannable(j, now) {
				s.cfg.Logger.Error("scheduler.bad_schedule", "job_id", j.ID, "error", err)
			}
			continue
		}
		s.forgetPlannable(j.ID)
		// A run's id carries its occurrence's time, not the planning
		// time: ids of one job then sort as its occurrences do, and runs
		// due at the same instant (given back, or recovered after a
		// crash) are claimed oldest occurrence first (on PostgreSQL,
		// which breaks a tie of due times by id).
		p := Plan(j, sch, now, s.cfg.Lookahead, s.cfg.CatchUpGrace, func(at time.Time) string {
			return vibejobs.NewID("run_", at, s.cfg.Rand)
		})
		plans = append(plans, p)
	}
	// Skipped occurrences are counted only for the plans applied: a plan
	// another replica applied first was counted there. Those of resent
	// plans a failed call applied are counted too (see
	// vibejobs.CountResent).
	created, skipped, err := s.apply(ctx, resent, plans, now)
	if err != nil {
		return 0, false, err
	}
	if skipped > 0 && s.cfg.OnSkipped != nil {
		s.cfg.OnSkipped(skipped)
	}
	return created, len(jobs) == s.cfg.BatchSize, nil
}

// apply applies plans after sending the resent ones again (they are only
// counted, see vibejobs.RunPlan.Resent), and keeps both to be sent again
// when the call fails. A batch catching up after downtime may hold 100
// runs a job: its time grows with its runs, or a slow database would time
// the same batch out for ever.
func (s *Scheduler) apply(ctx context.Context, resent []keptPlan, plans []vibejobs.RunPlan, now time.Time) (created int, skipped int64, err error) {
	all := make([]vibejobs.RunPlan, 0, len(resent)+len(plans))
	runs := 0
	for _, k := range resent {
		all = append(all, k.plan)
		runs += len(k.plan.Runs)
	}
	for _, p := range plans {
		all = append(all, p)
		runs += len(p.Runs)
	}
	sctx, cancel := context.WithTimeout(ctx, max(s.cfg.StoreTimeout, time.Duration(runs)*applyTimePerRun))
	created, skipped, err = s.cfg.Store.ApplyRunPlans(sctx, all, now)
	cancel()
	if err != nil {
		s.keepResent(resent, plans)
		return 0, 0, fmt.Errorf("applying run plans: %w", err)
	}
	return created, skipped, nil
}

// failedSoFar returns the number of calls that failed so far: a kept
// plan whose failedAt is at most that failed before what follows.
func (s *Scheduler) failedSoFar() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failedCalls
}

// takeResent takes the plans kept to be sent again.
func (s *Scheduler) takeResent() []keptPlan {
	s.mu.Lock()
	defer s.mu.Unlock()
	plans := s.resent
	s.resent, s.resentRuns = nil, 0
	return plans
}

// supersede returns resent without the plans that jobs, read by a read
// that began once readAfter calls had failed, shows were never applied:
// those whose job the read found still at the plan's From and Anchor,
// when the call that sent the plan first had failed before the read
// began. A plan applies only while its job is at its From and Anchor,
// and applied it moves the job on (to Next, after From, or to none), so
// had that call committed, the read would have found the job moved on;
// another plan of the job with the same From is made for each scan that
// finds it so, and only the latest of them is kept.
//
// A call's commit is taken to have happened before the call returned, if
// at all. A database that commits a statement whose client gave up (the
// client's timeout fired, its connection was cut) after a read by another
// connection can break that; so can a job paused and resumed, back at
// the same From, between the call's commit and the read (the call's runs
// are withdrawn then, and any of them already held and sent is found no
// more). The runs of such a call go uncounted.
func supersede(resent []keptPlan, jobs []*vibejobs.Job, readAfter uint64) []keptPlan {
	if len(resent) == 0 || len(jobs) == 0 {
		return resent
	}
	type at struct {
		from, anchor time.Time
	}
	read := make(map[string]at, len(jobs))
	for _, j := range jobs {
		if j.NextRunAt != nil {
			read[j.ID] = at{*j.NextRunAt, j.ScheduleAnchor}
		}
	}
	return slices.DeleteFunc(resent, func(k keptPlan) bool {
		a, ok := read[k.plan.JobID]
		return ok && k.failedAt <= readAfter && a.from.Equal(k.plan.From) && a.anchor.Equal(k.plan.Anchor)
	})
}

// keepResent keeps, oldest first, the plans sent again by a call that
// failed and the plans with runs it applied, to be sent again, resent, by
// the next call: it may have committed them and lost its answer. The
// oldest plans are forgotten beyond maxResentRuns.
func (s *Scheduler) keepResent(resent []keptPlan, plans []vibejobs.RunPlan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedCalls++
	for _, k := range resent {
		s.resent = append(s.resent, k)
		s.resentRuns += len(k.plan.Runs)
	}
	for _, p := range plans {
		if len(p.Runs) == 0 {
			continue // nothing to count
		}
		p.Resent = true
		s.resent = append(s.resent, keptPlan{plan: p, failedAt: s.failedCalls})
		s.resentRuns += len(p.Runs)
	}
	drop := 0
	for s.resentRuns > s.maxResentRuns {
		s.resentRuns -= len(s.resent[drop].plan.Runs)
		drop++
	}
	if drop > 0 {
		s.resent = slices.Delete(s.resent, 0, drop)
	}
}

// knownUnplannable reports whether j, with its schedule as it is now,
// was found unplannable less than unplannableRetryEvery before now.
func (s *Scheduler) knownUnplannable(j *vibejobs.Job, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.unplannable[j.ID]
	return ok && u.parsedFrom(j) && now.Sub(u.parsedAt) < unplannableRetryEvery
}

// rememberUnplannable remembers that j did not parse at now, and reports
// whether it did: false once maxRememberedUnplannable other jobs are.
func (s *Scheduler) rememberUnplannable(j *vibejobs.Job, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.unplannable[j.ID]; !ok && len(s.unplannable) >= maxRememberedUnplannable {
		return false
	}
	u := unplannableJob{schedule: j.Schedule, timezone: j.Timezone, anchor: j.ScheduleAnchor, parsedAt: now}
	if j.At != nil {
		u.at = *j.At
	}
	s.unplannable[j.ID] = u
	return true
}

// forgetPlannable forgets job id, whose schedule parsed.
func (s *Scheduler) forgetPlannable(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unplannable) > 0 {
		delete(s.unplannable, id)
	}
}

// forgetUnplannable forgets the jobs parsed unplannableRetryEvery or
// longer before now, which would be parsed again anyway: what is kept is
// bounded by the jobs found unplannable in that period (and by
// maxRememberedUnplannable), not by every job that ever was.
func (s *Scheduler) forgetUnplannable(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, u := range s.unplannable {
		if now.Sub(u.parsedAt) >= unplannableRetryEvery {
			delete(s.unplannable, id)
		}
	}
}

// JobSchedule returns the schedule of j: its one-off instant or its parsed
// recurring schedule in its time zone, anchored at ScheduleAnchor.
func JobSchedule(j *vibejobs.Job) (schedule.Schedule, error) {
	if j.At != nil {
		return schedule.At(*j.At), nil
	}
	return schedule.Parse(j.Schedule, j.Timezone, j.ScheduleAnchor)
}

// Unplanned returns how many occurrences of j, as it is, are due by now
// and were never planned: those from its NextRunAt through now, which the
// scheduler has not reached (the platform was down, the scan is behind, or
// j's schedule does not parse on this replica). A change that moves
// NextRunAt past now (a pause, a schedule change) skips them for good, and
// counts them as the occurrences catch-up skips are counted (SEMANTICS.md
// section 4). For a schedule that does not parse here it returns 1, the
// occurrence at NextRunAt: how many follow it up to now is unknown.
func Unplanned(j *vibejobs.Job, now time.Time) int64 {
	if j.NextRunAt == nil || j.NextRunAt.After(now) {
		return 0
	}
	sch, err := JobSchedule(j)
	if err != nil {
		return 1
	}
	return 1 + sch.Count(*j.NextRunAt, now)
}

// Plan decides the runs of job j at time now: every occurrence from
// j.NextRunAt up to now + lookahead. Occurrences older than now − grace were
// missed: those past the 96 h delivery lifetime are skipped, then the job's
// catch-up rule applies (all: the newest 100 run; latest: only the newest
// runs; none: none run). Skipped occurrences are counted in Plan.Skipped.
// newRunID names each run.
func Plan(j *vibejobs.Job, sch schedule.Schedule, now time.Time, lookahead, grace time.Duration, newRunID func(time.Time) string) vibejobs.RunPlan {
	p := vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor}
	if j.NextRunAt == nil {
		return p
	}
	p.From = *j.NextRunAt
	horizon := now.Add(lookahead)
	missedBefore := now.Add(-grace)
	expiredBefore := now.Add(-vibejobs.DeliveryLifetime)

	var missed ring
	var upcoming []time.Time
	t := p.From
	if t.Before(expiredBefore) {
		// Occurrences past the lifetime are counted, not walked: a
		// per-second schedule down for a month has 2.6 million of them.
		// The walk below goes through 96 h of occurrences at most.
		last := expiredBefore.Add(-time.Nanosecond)
		p.Skipped += 1 + sch.Count(t, last)
		t = sch.Next(last)
	}
	if !t.IsZero() && t.Before(missedBefore) {
		// Of the missed occurrences only the newest MaxCatchUpRuns can
		// run: the older ones are counted too, and the walk below starts
		// with the newest that may run (a per-second schedule down for
		// 96 h has 345,600, and walking them took 40 ms a job).
		if from, ok := newestMissed(sch, t, missedBefore); ok {
			last := from.Add(-time.Nanosecond)
			p.Skipped += 1 + sch.Count(t, last)
			t = sch.Next(last)
		}
	}
	for !t.IsZero() && !t.After(horizon) {
		switch {
		case t.Before(missedBefore):
			if missed.push(t) {
				p.Skipped++ // pushed out of the newest 100
			}
		default:
			upcoming = append(upcoming, t)
		}
		t = sch.Next(t)
	}
	keep := missed.items()
	switch j.CatchUp {
	case vibejobs.CatchUpNone:
		p.Skipped += int64(len(keep))
		keep = nil
	case vibejobs.CatchUpLatest:
		if len(keep) > 1 {
			p.Skipped += int64(len(keep) - 1)
			keep = keep[len(keep)-1:]
		}
	}
	for _, at := range append(keep, upcoming...) {
		at = at.UTC().Truncate(time.Millisecond)
		p.Runs = append(p.Runs, vibejobs.NewRun(newRunID(at), j, vibejobs.TriggerSchedule, at, now))
	}
	if t.IsZero() {
		p.Complete = j.At != nil
	} else {
		next := t.UTC()
		p.Next = &next
	}
	return p
}

// newestMissed returns an instant from, after t (an occurrence of sch), such
// that at least MaxCatchUpRuns occurrences of sch lie in [from, before), and
// not many more for a schedule that fires evenly; ok is false when there
// are too few occurrences after t for skipping to matter. It looks back from
// before over windows doubling from a second, and walks at most
// MaxCatchUpRuns occurrences in each.
func newestMissed(sch schedule.Schedule, t, before time.Time) (from time.Time, ok bool) {
	for d := time.Second; d <= vibejobs.DeliveryLifetime; d *= 2 {
		from = before.Add(-d)
		if !from.After(t) {
			return time.Time{}, false
		}
		n := 0
		for at := sch.Next(from.Add(-time.Nanosecond)); !at.IsZero() && at.Before(before); at = sch.Next(at) {
			if n++; n == vibejobs.MaxCatchUpRuns {
				return from, true
			}
		}
	}
	return time.Time{}, false
}

// ring keeps the newest MaxCatchUpRuns times pushed into it.
type ring struct {
	buf [vibejobs.MaxCatchUpRuns]time.Time
	n   int // items pushed in total
}

// push adds t and reports whether an older item was pushed out.
func (r *ring) push(t time.Time) bool {
	r.buf[r.n%len(r.buf)] = t
	r.n++
	return r.n > len(r.buf)
}

// items returns the kept items oldest first.
func (r *ring) items() []time.Time {
	if r.n <= len(r.buf) {
		return append([]time.Time(nil), r.buf[:r.n]...)
	}
	start := r.n % len(r.buf)
	return append(append([]time.Time(nil), r.buf[start:]...), r.buf[:start]...)
}
