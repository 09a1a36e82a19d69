package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/vibejobs/vibejobs"
)

// dueJobsSQL lists due jobs after a position. Both bounds are on
// jobs_due_idx (next_run_at, id): the list is one range of that index,
// however many due jobs come before the position.
const dueJobsSQL = `SELECT ` + jobColumns + ` FROM jobs j` + noLastRun + `
	WHERE j.state = 'active' AND j.enabled AND j.deleted_at IS NULL
		AND j.next_run_at IS NOT NULL AND j.next_run_at <= $1
		AND (j.next_run_at, j.id) > ($2, $3)
	ORDER BY j.next_run_at, j.id LIMIT $4`

// DueJobs returns up to limit active, enabled, live jobs whose NextRunAt ≤
// before and whose position comes after after, earliest first (without
// LastRun).
func (s *Store) DueJobs(ctx context.Context, before time.Time, after vibejobs.DuePosition, limit int) ([]*vibejobs.Job, error) {
	rows, err := s.pool.Query(ctx, dueJobsSQL, before, after.NextRunAt, after.JobID, limit)
	if err != nil {
		return nil, mapError(err, "listing due jobs")
	}
	jobs, err := collect(rows, scanJob)
	return jobs, mapError(err, "listing due jobs")
}

// applyPlansSQL applies a batch of plans in one statement. A job advances
// only while it still has the plan's From and Anchor, is active, enabled
// and not deleted. Its row is locked with SKIP LOCKED: a job another
// replica is advancing right now is skipped rather than waited for (that
// plan is stale once the other commits, and if it rolls back the next scan
// plans the job again), so replicas applying overlapping batches neither
// wait nor deadlock. Runs are inserted only for the jobs that advanced, and
// the unique (job_id, scheduled_for, occurrence_at) skips an occurrence
// that already has its run (occurrence_at is scheduled_for for a
// schedule-triggered run; see migration 00007). It returns the runs
// created and the skipped occurrences of the jobs that advanced. The
// NOTIFY goes out at commit when runs were created.
//
// Rows are reached by primary-key probes from the plan array (a LATERAL
// subquery with a locking clause is never flattened) and updated by the
// ctid the lock returned: joins left to the planner chose, on freshly loaded
// tables, to scan every due job for every plan row (seconds per batch), or
// to hash the whole table for a batch of a thousand rows.
//
// The ctid join also names the locked ctids as a list (ctid = ANY(ARRAY(…))),
// which PostgreSQL can only read by TID: on their own, on tables of a few
// thousand rows (2,000 jobs ticking every second, or runs in the first
// seconds of an installation), the planner hashed the locked rows and read
// the whole table for them, on every batch. Every statement below that
// updates locked rows by ctid does the same.
//
// Updating by the locked row's ctid is safe: the lock keeps the row version
// in place until commit. Should a concurrent commit have made the locked
// version newer than this statement's snapshot, the UPDATE finds no row and
// the plan is simply not applied, which the From check allows anyway.
var applyPlansSQL = `WITH plan AS (
	SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::bigint[], $5::boolean[],
			$17::timestamptz[])
		AS p(job_id, from_at, next_at, skipped, complete, anchor)
), locked AS (
	SELECT l.id, l.tid, plan.next_at, plan.skipped, plan.complete
	FROM plan CROSS JOIN LATERAL (
		SELECT j.id, j.ctid AS tid FROM jobs j
		WHERE j.id = plan.job_id AND j.next_run_at = plan.from_at AND j.schedule_anchor = plan.anchor
			AND j.state = 'active' AND j.enabled AND j.deleted_at IS NULL
		FOR UPDATE SKIP LOCKED) l
), advanced AS (
	UPDATE jobs j SET next_run_at = locked.next_at, skipped_runs = j.skipped_runs + locked.skipped,
		state = CASE WHEN locked.complete THEN 'completed' ELSE j.state END
	FROM locked
	WHERE j.ctid = locked.tid AND j.ctid = ANY(ARRAY(SELECT tid FROM locked))
	RETURNING j.id, locked.skipped
), created AS (
	INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, occurrence_at, deadline_at, state,
		next_attempt_at, created_at)
	SELECT n.id, n.job_id, n.project_id, n.trigger, n.scheduled_for,
		CASE WHEN n.trigger = 'schedule' THEN n.scheduled_for END, n.deadline_at, n.state,
		n.next_attempt_at, n.created_at
	FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::timestamptz[],
			$12::text[], $13::timestamptz[], $14::timestamptz[])
		AS n(id, job_id, project_id, trigger, scheduled_for, deadline_at, state, next_attempt_at, created_at)
	WHERE n.job_id IN (SELECT id FROM advanced)
	ON CONFLICT (job_id, scheduled_for, occurrence_at) DO NOTHING
	RETURNING id, state, next_attempt_at, deadline_at
), wanted AS (
	-- A held run whose occurrence a change withdrew (see
	-- tx.DeleteFutureRuns) and that this plan wants again keeps it: given
	-- back, it is claimed again rather than deleted. Its insert above met
	-- it and did nothing.
	UPDATE runs r SET withdrawn = false
	FROM unnest($7::text[], $9::text[], $10::timestamptz[]) AS n(job_id, trigger, scheduled_for)
	WHERE r.withdrawn AND r.job_id = n.job_id AND r.scheduled_for = n.scheduled_for
		AND n.trigger = 'schedule' AND n.job_id IN (SELECT id FROM advanced)
), already AS (
	-- The runs of resent plans ($18, their ids) that exist: an earlier
	-- call created them and lost its answer (see vibejobs.RunPlan.Resent).
	-- Resent plans are not among those above, and run ids are never
	-- reused, so none is this statement's own run or another caller's.
	-- Without resent plans the array is empty and no index is read.
	SELECT array_agg(r.id) AS ids FROM runs r WHERE r.id = ANY($18::text[])
)` + enqueueSQL("created") + `
SELECT c.n, (SELECT COALESCE(sum(skipped), 0)::bigint FROM advanced),
	CASE WHEN c.n > 0 THEN pg_notify($15, $16) END, (SELECT ids FROM already)
FROM (SELECT count(*) AS n FROM created) c`

// ApplyRunPlans applies plans in one transaction and returns the runs
// created and the skipped occurrences of the plans applied. Each plan
// applies only while its job still has NextRunAt = From and ScheduleAnchor
// = Anchor and is active, enabled and live, and not while another
// transaction holds the job (see applyPlansSQL); at most one schedule-triggered run exists per (job,
// scheduledFor), enforced by a unique constraint.
//
// The runs created include those of resent plans that exist (see
// vibejobs.RunPlan.Resent), and the skipped occurrences those of each
// resent plan with one of them (see vibejobs.CountResent): a call whose
// statement committed but whose answer was lost (a connection cut after
// the commit, a store timeout) failed, and the caller sends its plans
// again, resent, with its next call. The first statement reads them, in
// the same round trip; a call of resent plans alone makes one statement
// for them.
func (s *Store) ApplyRunPlans(ctx context.Context, plans []vibejobs.RunPlan, now time.Time) (int, int64, error) {
	if err := vibejobs.CheckPlans(plans); err != nil {
		return 0, 0, err
	}
	apply, resent := splitResent(plans)
	// One statement takes each job at most once (an UPDATE … FROM changes a
	// row once however many plan rows match), so plans for a job already in
	// the batch start the next statement, in the order given.
	batches := splitByKey(apply, func(p vibejobs.RunPlan) string { return p.JobID })
	var (
		created int
		skipped int64
		found   []string
	)
	switch {
	case len(batches) == 0 && len(resent) == 0:
		return 0, 0, nil
	case len(batches) <= 1:
		var b []vibejobs.RunPlan
		if len(batches) == 1 {
			b = batches[0]
		}
		var err error
		if created, skipped, found, err = s.applyPlans(ctx, s.pool, b, resent); err != nil {
			return 0, 0, err
		}
	default:
		err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			created, skipped, found = 0, 0, nil
			for i, b := range batches {
				var ids []string
				if i == 0 {
					ids = resent
				}
				n, sk, f, err := s.applyPlans(ctx, tx, b, ids)
				if err != nil {
					return err
				}
				created += n
				skipped += sk
				found = append(found, f...)
			}
			return nil
		})
		if err != nil {
			return 0, 0, mapError(err, "applying run plans")
		}
	}
	n, sk := vibejobs.CountResent(plans, found)
	return created + n, skipped + sk, nil
}

// splitResent returns the plans to apply and the run ids of the resent
// ones. Without resent plans (the rule) it returns plans as they are.
func splitResent(plans []vibejobs.RunPlan) (apply []vibejobs.RunPlan, resent []string) {
	if !slices.ContainsFunc(plans, func(p vibejobs.RunPlan) bool { return p.Resent }) {
		return plans, nil
	}
	apply = make([]vibejobs.RunPlan, 0, len(plans))
	for _, p := range plans {
		if !p.Resent {
			apply = append(apply, p)
			continue
		}
		for _, r := range p.Runs {
			resent = append(resent, r.ID)
		}
	}
	return apply, resent
}

// applyPlans applies plans of distinct jobs in one statement; it returns
// the runs created and the skipped occurrences of the plans applied, and
// those of resentIDs that are the ids of runs.
func (s *Store) applyPlans(ctx context.Context, q querier, plans []vibejobs.RunPlan, resentIDs []string) (int, int64, []string, error) {
	var (
		created int
		skipped int64
		found   []string
	)
	err := q.QueryRow(ctx, applyPlansSQL, s.applyPlansArgs(plans, resentIDs)...).Scan(&created, &skipped, nil, &found)
	if err != nil {
		return 0, 0, nil, mapError(err, "applying run plans")
	}
	return created, skipped, found, nil
}

// applyPlansArgs are the arguments of applyPlansSQL for plans and the run
// ids of resent plans.
func (s *Store) applyPlansArgs(plans []vibejobs.RunPlan, resentIDs []string) []any {
	if resentIDs == nil {
		resentIDs = []string{}
	}
	nRuns := 0
	for _, p := range plans {
		nRuns += len(p.Runs)
	}
	var (
		jobIDs   = make([]string, len(plans))
		froms    = make([]time.Time, len(plans))
		nexts    = make([]*time.Time, len(plans))
		skipped  = make([]int64, len(plans))
		complete = make([]bool, len(plans))
		anchors  = make([]time.Time, len(plans))

		ids        = make([]string, 0, nRuns)
		runJobs    = make([]string, 0, nRuns)
		projects   = make([]string, 0, nRuns)
		triggers   = make([]string, 0, nRuns)
		scheduled  = make([]time.Time, 0, nRuns)
		deadlines  = make([]time.Time, 0, nRuns)
		states     = make([]string, 0, nRuns)
		nextTries  = make([]*time.Time, 0, nRuns)
		createdAts = make([]time.Time, 0, nRuns)
	)
	for i, p := range plans {
		jobIDs[i], froms[i], nexts[i], skipped[i], complete[i] = p.JobID, p.From, p.Next, p.Skipped, p.Complete
		anchors[i] = p.Anchor
		for _, r := range p.Runs {
			ids = append(ids, r.ID)
			runJobs = append(runJobs, p.JobID) // a plan's runs belong to its job
			projects = append(projects, r.ProjectID)
			triggers = append(triggers, r.Trigger)
			scheduled = append(scheduled, r.ScheduledFor)
			deadlines = append(deadlines, r.DeadlineAt)
			states = append(states, string(r.State))
			nextTries = append(nextTries, r.NextAttemptAt)
			createdAts = append(createdAts, r.CreatedAt)
		}
	}
	return []any{jobIDs, froms, nexts, skipped, complete,
		ids, runJobs, projects, triggers, scheduled, deadlines, states, nextTries, createdAts,
		NotifyChannel, s.schema, anchors, resentIDs}
}

// sentAttemptSQL is the number of the attempt a claim of run r sends (and
// the one in flight while r is leased): the attempt after the last one
// recorded, or that one again for a redelivery of an interrupted attempt.
// runs.attempt is the last attempt recorded (see migration 00015).
const sentAttemptSQL = `CASE WHEN r.redeliver THEN r.attempt ELSE r.attempt + 1 END`

// lateSQL is run r's lateness for an attempt claimed at claimedAt (an SQL
// expression): the lateness an earlier attempt decided, or else whether
// the claim came more than vibejobs.LateThreshold after its scheduledFor.
func lateSQL(claimedAt string) string {
	return `CASE WHEN r.late_decided THEN r.late ELSE r.scheduled_for + interval '` +
		strconv.Itoa(int(vibejobs.LateThreshold/time.Second)) + ` seconds' < ` + claimedAt + ` END`
}

// claimSQL leases due runs: it walks run_queue in due order and locks each
// waiting row (SKIP LOCKED lets replicas claim at once without waiting for
// each other or taking the same run), and moves the rows it locked to their
// lease key (leased, the claim time, the run) with the lease's owner and
// expiry, now + the job's timeout + the margin (see migration 00015). The
// run itself is not written: the claim sends attempt + 1, or attempt again
// for a redelivery, and decides Late from the claim time unless an earlier
// attempt decided it; the outcome writes both. The job's delivery settings
// are read at claim time.
//
// The runs are read from the statement's snapshot, unlocked, and that is
// safe: the rows are updated by the ctid their lock returned, which is the
// row's latest version, and should a transaction that committed after the
// snapshot have made that version, the UPDATE finds no row and the run is
// not claimed (see applyPlansSQL). So a run is claimed only with the queue
// row its snapshot saw, and every statement that changes a run's attempt
// number or lateness changes its queue row in the same transaction.
//
// The runs and jobs are probed by key from each locked row (a lateral
// subquery with OFFSET 0 is never flattened): joined by the planner, the
// generic plan might hash a whole table for every claim.
var claimSQL = `WITH due AS (
	SELECT q.ctid AS tid, q.run_id, q.due_at FROM run_queue q
	WHERE q.leased = false AND q.due_at <= $1 AND q.deadline_at >= $1
	ORDER BY q.due_at, q.run_id
	LIMIT $3
	FOR UPDATE SKIP LOCKED
), leased AS (
	UPDATE run_queue q SET leased = true, due_at = $1, owner = $2,
		lease_expires_at = $1::timestamptz + ((j.timeout_ns + $4::bigint) / 1000) * interval '1 microsecond'
	FROM due
	CROSS JOIN LATERAL (SELECT * FROM runs r WHERE r.id = due.run_id OFFSET 0) r
	CROSS JOIN LATERAL (SELECT * FROM jobs j WHERE j.id = r.job_id OFFSET 0) j
	WHERE q.ctid = due.tid AND q.ctid = ANY(ARRAY(SELECT tid FROM due))
	RETURNING ` + claimColumns("$1", "due.due_at") + `
)
SELECT * FROM leased`

// claimColumns are the columns of a claim (see ClaimDueRuns) of run r and
// job j, made at claimedAt of the run due at due (SQL expressions).
func claimColumns(claimedAt, due string) string {
	return `r.id, r.job_id, r.project_id, r.trigger, r.scheduled_for, r.deadline_at,
		` + lateSQL(claimedAt) + `,
		'delivering', ` + sentAttemptSQL + `, NULL::timestamptz,
		r.failure_reason, r.created_at, r.finished_at, ` + due + `,
		j.url, j.secret_key_id, j.secret_ciphertext, j.timeout_ns, j.max_attempts, j.min_backoff_ns,
		j.max_backoff_ns, r.late_decided`
}

// readClaimsSQL reads back the claims an owner ($2) made at a claim time
// ($1): the queue rows still leased under it, keyed (true, claim time, run),
// with their runs, which the claim did not write, and their jobs (see
// migration 00015). A waiting run's due time is its next_attempt_at (its
// waiting queue row's key), which the claim leaves in the run.
var readClaimsSQL = `SELECT ` + claimColumns("$1", "r.next_attempt_at") + `
	FROM run_queue q
	CROSS JOIN LATERAL (SELECT * FROM runs r WHERE r.id = q.run_id OFFSET 0) r
	CROSS JOIN LATERAL (SELECT * FROM jobs j WHERE j.id = r.job_id OFFSET 0) j
	WHERE q.leased = true AND q.due_at = $1 AND q.owner = $2`

// ClaimDueRuns moves up to limit due runs (scheduled or retrying, NextAttemptAt
// ≤ now ≤ DeadlineAt) to delivering, leased to owner until now + the job's
// timeout + leaseMargin, and returns them in NextAttemptAt order with the
// job's delivery settings. The attempt number grows by one unless the run is
// redelivered; Late is decided at the first claim and kept. Run.NextAttemptAt
// is nil while delivering.
func (s *Store) ClaimDueRuns(ctx context.Context, owner string, now time.Time, limit int, leaseMargin time.Duration) ([]*vibejobs.Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	// The claim time as the store keeps it, to the microsecond: outcomes
	// find their claim's queue row by it.
	now = now.Truncate(time.Microsecond)
	return s.queryClaims(ctx, "claiming runs", now, claimSQL, now, owner, limit, int64(leaseMargin))
}

// ReadClaims implements vibejobs.ClaimReader.
func (s *Store) ReadClaims(ctx context.Context, owner string, now time.Time) ([]*vibejobs.Claim, error) {
	now = now.Truncate(time.Microsecond) // as ClaimDueRuns keeps it
	return s.queryClaims(ctx, "reading claims back", now, readClaimsSQL, now, owner)
}

// queryClaims runs sql, whose rows are the claimColumns of claims made at
// now, and returns the claims in DueAt order; what names the call in its
// errors. On the queue pool: see Store.queue.
func (s *Store) queryClaims(ctx context.Context, what string, now time.Time, sql string, args ...any) ([]*vibejobs.Claim, error) {
	rows, err := s.queue.Query(ctx, sql, args...)
	if err != nil {
		return nil, mapError(err, what)
	}
	claims, err := collectClaims(rows, now)
	if err != nil {
		return nil, mapError(err, what)
	}
	return claims, nil
}

// collectClaims reads the claims made at now from rows of claimColumns, in
// DueAt order.
func collectClaims(rows pgx.Rows, now time.Time) ([]*vibejobs.Claim, error) {
	claims, err := collect(rows, func(row rowScanner) (*vibejobs.Claim, error) {
		var (
			c                               vibejobs.Claim
			timeout, minBackoff, maxBackoff int64
		)
		run, err := scanRun(row, &c.DueAt, &c.URL, &c.Secret.KeyID, &c.Secret.Ciphertext, &timeout,
			&c.Retry.MaxAttempts, &minBackoff, &maxBackoff, &c.LateDecided)
		if err != nil {
			return nil, err
		}
		c.Run = run
		c.ClaimedAt = now
		c.DueAt = c.DueAt.UTC()
		c.Timeout = time.Duration(timeout)
		c.Retry.MinBackoff = time.Duration(minBackoff)
		c.Retry.MaxBackoff = time.Duration(maxBackoff)
		return &c, nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(claims, func(a, b *vibejobs.Claim) int {
		if c := a.DueAt.Compare(b.DueAt); c != 0 {
			return c
		}
		return cmpString(a.Run.ID, b.Run.ID)
	})
	return claims, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// nextDueSQL reads the earliest due time of a waiting run from run_queue,
// which holds it exactly (see migration 00008).
const nextDueSQL = `SELECT due_at FROM run_queue WHERE leased = false AND deadline_at >= $1
	ORDER BY due_at, run_id LIMIT 1`

// waitingRowOf is the condition that run_queue row q is the waiting row of
// run (an alias of runs, or a row with its id and next_attempt_at): the key
// (false, next_attempt_at, id) that a run waiting in scheduled or retrying
// has its row at, and that readers and writers probe (see migrations 00008
// and 00015).
func waitingRowOf(run string) string {
	return `q.leased = false AND q.due_at = ` + run + `.next_attempt_at AND q.run_id = ` + run + `.id`
}

// lockQueueRowSQL returns a lateral subquery that locks the run_queue row
// the walk's row q (read from the statement's snapshot) is, with SKIP
// LOCKED, when that version is still the latest: a row another transaction
// changed since the snapshot is passed over, as is one locked now. The
// locked row's ctid is tid, and a statement may delete or update the row by
// it (see requeueSQL). and, when not empty, is a further condition, one
// that names an earlier lateral subquery, say, so that the row is locked
// after what that one locks.
func lockQueueRowSQL(tid, and string) string {
	if and != "" {
		and = " AND " + and
	}
	return `SELECT lq.ctid AS ` + tid + ` FROM run_queue lq WHERE lq.ctid = q.ctid` + and + ` FOR UPDATE SKIP LOCKED`
}

// enqueueSQL returns the CTE that gives each run just inserted, of those
// rows (a CTE with columns id, state, next_attempt_at and deadline_at)
// holds, its run_queue row when it waits in scheduled or retrying with a
// due time (see migration 00008).
func enqueueSQL(rows string) string {
	return `, queued AS (
	INSERT INTO run_queue (due_at, run_id, deadline_at)
	SELECT next_attempt_at, id, deadline_at FROM ` + rows + `
	WHERE state IN ('scheduled', 'retrying') AND next_attempt_at IS NOT NULL
)`
}

// requeueSQL returns the CTEs that keep run_queue in step with the runs a
// statement moved. rows (a CTE) holds a row per moved run with the ctid of
// its queue row in column qtid, which the statement locked, and in column
// due its due time after the move, NULL once it left scheduled and
// retrying. A run that left the queue loses its row; a run still waiting
// has its row moved to the new due time, not leased.
//
// The rows are deleted or moved by their ctids (see applyPlansSQL): every
// statement locks the queue row of a run it moves (see migration 00015),
// and the version it locked is one its snapshot sees, so the ctid finds it
// (see lockQueueRowSQL; an outcome's or a release's leased row was made by
// its claim, which committed before).
func requeueSQL(rows, due string) string {
	return `, dequeued AS (
	DELETE FROM run_queue q WHERE q.ctid = ANY(ARRAY(SELECT qtid FROM ` + rows + ` WHERE ` + due + ` IS NULL))
), requeued AS (
	UPDATE run_queue q SET due_at = m.` + due + `, leased = false, owner = NULL, lease_expires_at = NULL
	FROM ` + rows + ` m
	WHERE m.` + due + ` IS NOT NULL AND q.ctid = m.qtid
		AND q.ctid = ANY(ARRAY(SELECT qtid FROM ` + rows + ` WHERE ` + due + ` IS NOT NULL))
)`
}

// leaseRowSQL returns a lateral subquery that locks the leased run_queue row
// of the claim at claimedAt by owner ($1) of the run runID, which the
// statement locked before: its ctid is qtid. It finds none once that lease
// is gone (recovered, or released).
func leaseRowSQL(runID, claimedAt string) string {
	return `SELECT lq.ctid AS qtid FROM run_queue lq
		WHERE lq.leased = true AND lq.due_at = ` + claimedAt + ` AND lq.run_id = ` + runID + ` AND lq.owner = $1
		FOR UPDATE`
}

// NextDueAt returns the earliest NextAttemptAt of a run waiting in scheduled
// or retrying whose deadline has not passed (by the Store's clock).
func (s *Store) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	var t time.Time
	err := s.queue.QueryRow(ctx, nextDueSQL, s.now()).Scan(&t)
	if err == pgx.ErrNoRows {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, mapError(err, "reading the next due time")
	}
	return t, true, nil
}

// recordSQL records a batch of outcomes in one statement: a run moves, and
// its attempt is inserted, only while it is still delivering under the
// lease of the outcome's claim (owner, attempt number, claim time); any
// other outcome lost its lease and is dropped with its attempt, even when
// the same owner claimed the run again since. A retrying step of a deleted
// job's run becomes cancelled (job_deleted), and one due after the run's
// deadline failed (deadline_exceeded). Every run moved gets its event, in outcome order,
// with one take of each project's feed counter for the whole batch.
var recordSQL = `WITH o AS NOT MATERIALIZED (
	SELECT * FROM unnest($2::text[], $3::integer[], $4::timestamptz[], $5::timestamptz[], $6::integer[],
			$7::text[], $8::bigint[], $9::bytea[], $10::text[], $11::text[], $12::timestamptz[],
			$15::timestamptz[]) WITH ORDINALITY
		AS o(run_id, number, started_at, finished_at, status_code, error_code, signature_timestamp,
			response_snippet, step_state, step_reason, step_next, claimed_at, ord)
), held AS (
	-- The outcomes whose run is still delivering under the lease of their
	-- claim (owner and claim time: its leased queue row) with the attempt
	-- number that claim sent, locked: the run, then its queue row, the
	-- order every statement that waits for both takes. A retrying step
	-- ends the run instead (end_state) when its job is deleted, or when its
	-- next attempt falls after the run's deadline. The job is read under a
	-- share lock (see tx.DeleteJob). The lateness is decided from the claim
	-- time unless an earlier attempt decided it (see claimSQL).
	SELECT o.*, CASE WHEN o.step_state <> 'retrying' THEN NULL WHEN l.job_deleted THEN 'cancelled'
			WHEN COALESCE(o.step_next, o.finished_at) > l.deadline_at THEN 'failed' END AS end_state,
		l.late, lq.qtid
	FROM o CROSS JOIN LATERAL (
		SELECT r.id, r.deadline_at,
			` + lateSQL("o.claimed_at") + ` AS late,
			o.step_state = 'retrying'
				AND (SELECT j.deleted_at IS NOT NULL FROM jobs j WHERE j.id = r.job_id FOR SHARE) AS job_deleted
		FROM runs r
		WHERE r.id = o.run_id AND r.state IN ('scheduled', 'retrying')
			AND o.number = ` + sentAttemptSQL + `
		FOR UPDATE) l
	CROSS JOIN LATERAL (` + leaseRowSQL("l.id", "o.claimed_at") + `) lq
), moved AS (
	UPDATE runs r SET
		state = COALESCE(c.end_state, c.step_state),
		failure_reason = CASE c.end_state WHEN 'cancelled' THEN $13 WHEN 'failed' THEN $14 ELSE c.step_reason END,
		next_attempt_at = CASE WHEN c.step_state = 'retrying' AND c.end_state IS NULL
			THEN COALESCE(c.step_next, c.finished_at) END,
		finished_at = CASE WHEN c.step_state = 'retrying' AND c.end_state IS NULL THEN NULL ELSE c.finished_at END,
		attempt = c.number,
		redeliver = false,
		late = c.late,
		late_decided = true
	FROM held c
	-- By id, not by the locked ctid: a pause that marked the run withdrawn
	-- (see tx.DeleteFutureRuns) and committed after this statement's
	-- snapshot made the locked version one the snapshot cannot see; the
	-- ctid found no row and the outcome of an attempt that went out was
	-- dropped. By id, the row visible to the snapshot leads to its latest
	-- version.
	WHERE r.id = c.run_id AND r.id = ANY(ARRAY(SELECT run_id FROM held))
	RETURNING c.run_id, c.number, c.started_at, c.finished_at, c.status_code, c.error_code,
		c.signature_timestamp, c.response_snippet, c.ord, r.project_id, r.job_id, r.state, r.failure_reason,
		r.next_attempt_at, c.qtid
)` + requeueSQL("moved", "next_attempt_at") + `, recorded AS (
	INSERT INTO attempts (run_id, number, started_at, finished_at, status_code, error_code, signature_timestamp,
		response_snippet)
	SELECT run_id, number, started_at, finished_at, status_code, error_code, signature_timestamp, response_snippet
	FROM moved
), ev AS (
	SELECT project_id, ord, ` + runEventType + ` AS type, finished_at AS occurred_at, job_id, run_id, state,
		failure_reason AS reason, number AS attempt, error_code, status_code, next_attempt_at AS next_at
	FROM moved
), unheld AS MATERIALIZED (
	SELECT * FROM o WHERE o.ord NOT IN (SELECT ord FROM held)
), already AS (
	-- Outcomes an earlier call recorded and committed, but whose answer
	-- it lost (a connection cut, a timeout): the caller sent them again,
	-- their leases are gone, and neither call told of them. Their attempt
	-- is there as sent (an interrupted one has no signature timestamp).
	-- The run moved to its state of now when this attempt is its last and
	-- ended it, to retrying otherwise. The snapshot of this statement does
	-- not see its own inserts, so these are never its own outcomes; the
	-- OFFSET keeps the lookup a probe per outcome not held (none, as a
	-- rule).
	SELECT CASE WHEN l.ended THEN l.state ELSE 'retrying' END AS state,
		CASE WHEN l.ended THEN l.failure_reason ELSE '' END AS reason, u.error_code
	FROM unheld u CROSS JOIN LATERAL (
		SELECT r.attempt = u.number AND r.finished_at = u.finished_at
				AND r.state IN ('succeeded', 'failed', 'cancelled') AS ended,
			r.state, r.failure_reason
		FROM runs r WHERE r.id = u.run_id
		OFFSET 0) l
	WHERE u.signature_timestamp <> 0 AND EXISTS (SELECT 1 FROM attempts a
		WHERE a.run_id = u.run_id AND a.number = u.number AND a.started_at = u.started_at
			AND a.finished_at = u.finished_at AND a.signature_timestamp = u.signature_timestamp)
)` + appendEventsTail + `
-- One aggregate tells both the runs ended and the attempts recorded (see
-- recordOutcomes), so the hottest statement groups its rows once.
SELECT (SELECT json_agg(json_build_object('s', f.state, 'r', f.reason, 'e', f.error_code, 'n', f.n)) FROM (
	SELECT state, reason, error_code, count(*) AS n FROM (
		SELECT state, reason, error_code FROM ev UNION ALL SELECT state, reason, error_code FROM already) x
	GROUP BY state, reason, error_code) f)`

// RecordOutcomes records each outcome's attempt and moves its run to the
// outcome's step, in one statement, for the runs still delivering under
// owner's lease at that attempt number and claim time; the others are
// dropped. Terminal steps set FinishedAt to the attempt's end.
//
// An outcome an earlier call recorded, whose answer was lost after the
// commit (the call failed), is told of (OnRunsEnded, OnAttemptsRecorded)
// by the call that sends it again, recording nothing: a caller sends a
// batch again only after a call that failed, never after one that
// succeeded, or its outcomes are told of twice.
//
// Two outcomes of one run in a batch (one that waited while its claim's
// lease was recovered, and one of this owner's newer claim of the run)
// name different claims, of which recordSQL's held keeps one at most, so
// the UPDATE changes the run once; an outcome repeating an earlier one's
// claim would be dropped after it anyway, and is dropped here. One
// statement, not one per outcome of a run in a transaction: a later
// statement waited for a job (recordSQL's share lock) while holding the
// feed counters the earlier one took, and an API transaction holding that
// job and appending its events waited for those counters: a deadlock.
func (s *Store) RecordOutcomes(ctx context.Context, owner string, outcomes []vibejobs.Outcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	type claim struct {
		run    string
		at     int64
		number int
	}
	seen := make(map[claim]bool, len(outcomes))
	distinct := make([]vibejobs.Outcome, 0, len(outcomes))
	for _, o := range outcomes {
		if k := (claim{o.RunID, o.ClaimedAt.UnixMicro(), o.Attempt.Number}); !seen[k] {
			seen[k] = true
			distinct = append(distinct, o)
		}
	}
	ended := vibejobs.RunsEnded{}
	// On the queue pool: see Store.queue.
	if err := s.recordOutcomes(ctx, s.queue, owner, distinct, ended); err != nil {
		return err
	}
	s.ended(ended)
	return nil
}

// recordOutcomes runs recordSQL, adds the runs it ended to ended and tells
// the OnAttemptsRecorded function of the attempts it recorded, by the state
// their run moved to and their error code.
func (s *Store) recordOutcomes(ctx context.Context, q querier, owner string, outcomes []vibejobs.Outcome, ended vibejobs.RunsEnded) error {
	args, err := recordArgs(owner, outcomes)
	if err != nil {
		return err
	}
	var value []byte
	if err := q.QueryRow(ctx, recordSQL, args...).Scan(&value); err != nil {
		return mapError(err, "recording outcomes")
	}
	if value == nil {
		return nil // every lease was lost
	}
	var counts []struct {
		S, R, E string
		N       int
	}
	if err := json.Unmarshal(value, &counts); err != nil {
		return fmt.Errorf("postgres: decoding the outcomes a statement recorded: %w", err)
	}
	attempts := make(vibejobs.AttemptsRecorded, len(counts))
	for _, c := range counts {
		ended.Add(vibejobs.RunState(c.S), c.R, c.N)
		attempts[vibejobs.AttemptOutcome{State: vibejobs.RunState(c.S), ErrorCode: c.E}] += c.N
	}
	if f := s.onAttempts.Load(); f != nil {
		(*f)(attempts)
	}
	return nil
}

// recordArgs are the arguments of recordSQL for owner's outcomes.
func recordArgs(owner string, outcomes []vibejobs.Outcome) ([]any, error) {
	n := len(outcomes)
	var (
		runIDs     = make([]string, n)
		numbers    = make([]int32, n)
		starts     = make([]time.Time, n)
		ends       = make([]time.Time, n)
		statuses   = make([]int32, n)
		errCodes   = make([]string, n)
		sigTimes   = make([]int64, n)
		snippets   = make([][]byte, n)
		stepStates = make([]string, n)
		reasons    = make([]string, n)
		stepNexts  = make([]*time.Time, n)
		claimedAts = make([]time.Time, n)
	)
	for i, o := range outcomes {
		a := o.Attempt
		runIDs[i], numbers[i], starts[i], ends[i] = o.RunID, int32(a.Number), a.StartedAt, a.FinishedAt
		statuses[i], errCodes[i], sigTimes[i], snippets[i] = int32(a.StatusCode), a.ErrorCode, a.SignatureTimestamp, []byte(snippet(a.ResponseSnippet))
		stepStates[i], reasons[i], stepNexts[i] = string(o.Step.State), o.Step.FailureReason, o.Step.NextAttemptAt
		claimedAts[i] = o.ClaimedAt
		if snippets[i] == nil {
			snippets[i] = []byte{}
		}
		switch o.Step.State {
		case vibejobs.RunSucceeded, vibejobs.RunFailed, vibejobs.RunCancelled, vibejobs.RunRetrying:
		default:
			return nil, fmt.Errorf("postgres: recording outcomes: run %s: step to %q is not an outcome", o.RunID, o.Step.State)
		}
	}
	return []any{owner, runIDs, numbers, starts, ends, statuses, errCodes, sigTimes,
		snippets, stepStates, reasons, stepNexts, vibejobs.ReasonJobDeleted, vibejobs.ReasonDeadlineExceeded,
		claimedAts}, nil
}

// ReleaseClaims puts the runs of owner's claims, while each is still
// delivering under that claim's lease (owner and claim time: a lease
// recovered and taken again by the same owner is another claim's), back to
// be claimed from due when that is after now, but no later than the run's
// deadline (now, if that passed), so that FailExpiredRuns finds it once the
// deadline passes; otherwise at once, in its place in line (from the due
// time its claim took it at, Claim.DueAt, or now if that is later). No
// attempt is recorded since none was sent, and the run keeps its attempt
// number and lateness: the claim wrote neither (see migration 00015). A
// released run of a deleted job is cancelled (job_deleted) at now instead,
// whatever due says, its job read under a share lock (see tx.DeleteJob). A
// released run whose claim's attempt number is beyond its job's
// maxAttempts, lowered since its last attempt, fails (attempts_exhausted)
// at now. A run never sent whose occurrence was withdrawn while it was
// held is deleted (see tx.DeleteFutureRuns).
func (s *Store) ReleaseClaims(ctx context.Context, owner string, claims []*vibejobs.Claim, now, due time.Time) error {
	if len(claims) == 0 {
		return nil
	}
	if due.Before(now) {
		due = now
	}
	runIDs := make([]string, len(claims))
	claimedAts := make([]time.Time, len(claims))
	claimDues := make([]time.Time, len(claims))
	for i, c := range claims {
		runIDs[i], claimedAts[i], claimDues[i] = c.Run.ID, c.ClaimedAt, c.DueAt
	}
	var value []byte
	err := s.pool.QueryRow(ctx, `WITH held AS (
		-- The job is locked before its run, as an API change locks them
		-- (tx.UpdateJob, then tx.DeleteFutureRuns marking the held runs):
		-- locked after it, a release holding the run waited for the job
		-- that a pause held while the pause waited for the run, a
		-- deadlock. The run's lateral subquery names the job's, so it is
		-- evaluated after it; the queue row's names the run's.
		SELECT r.id, c.claim_due, j.deleted_at AS job_deleted_at, r.unsent, r.withdrawn, lq.qtid,
			CASE WHEN j.deleted_at IS NOT NULL THEN 'cancelled' WHEN r.used_up THEN 'failed' END AS end_state
		FROM unnest($2::text[], $7::timestamptz[], $10::timestamptz[]) AS c(run_id, claimed_at, claim_due)
		CROSS JOIN LATERAL (
			SELECT j.id, j.deleted_at, j.max_attempts FROM jobs j
			WHERE j.id = (SELECT job_id FROM runs WHERE id = c.run_id)
			FOR SHARE) j
		CROSS JOIN LATERAL (
			SELECT r.id, NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = r.id) AS unsent,
				r.withdrawn, `+sentAttemptSQL+` > j.max_attempts AS used_up
			FROM runs r
			WHERE r.id = c.run_id AND r.job_id = j.id AND r.state IN ('scheduled', 'retrying')
			FOR UPDATE) r
		CROSS JOIN LATERAL (`+leaseRowSQL("r.id", "c.claimed_at")+`) lq
	), withdrawn AS (
		-- Never sent, its occurrence withdrawn while it was held (see
		-- tx.DeleteFutureRuns): deleted, as an unheld one was.
		-- By id, not by the locked ctid, here and below: a pause that
		-- marked the run (or a plan that cleared its mark) and committed
		-- after this statement's snapshot made the locked version one the
		-- snapshot cannot see, and the ctid found no row: the run stayed
		-- leased, given back, until its lease was recovered and it went out.
		-- By id, the row visible to the snapshot leads to its latest version.
		DELETE FROM runs r USING held c
		WHERE r.id = c.id AND r.id = ANY(ARRAY(SELECT id FROM held))
			AND c.withdrawn AND c.unsent AND c.job_deleted_at IS NULL
		RETURNING c.id
	), unqueued AS (
		DELETE FROM run_queue q
		WHERE q.ctid = ANY(ARRAY(SELECT qtid FROM held WHERE id IN (SELECT id FROM withdrawn)))
	), kept AS (
		SELECT * FROM held WHERE NOT (withdrawn AND unsent AND job_deleted_at IS NULL)
	), released AS (
		-- A run of a deleted job is cancelled; one whose claim's attempt
		-- number is beyond its job's maxAttempts, lowered since its last
		-- attempt, fails.
		UPDATE runs r SET
			state = COALESCE(kept.end_state, r.state),
			failure_reason = CASE kept.end_state WHEN 'cancelled' THEN $4 WHEN 'failed' THEN $9
				ELSE r.failure_reason END,
			finished_at = CASE WHEN kept.end_state IS NOT NULL THEN $3::timestamptz END,
			redeliver = kept.end_state IS NULL AND r.redeliver,
			-- Due again now: in its place in line, at the due time the
			-- claim took it at, so that a run given back is not overtaken
			-- by the runs due after it (caught-up occurrences go out in
			-- order).
			next_attempt_at = CASE WHEN kept.end_state IS NOT NULL THEN NULL
				WHEN $8::timestamptz > $3::timestamptz THEN GREATEST($3::timestamptz, LEAST($8::timestamptz, r.deadline_at))
				ELSE LEAST(kept.claim_due, $3::timestamptz) END
		FROM kept
		WHERE r.id = kept.id AND r.id = ANY(ARRAY(SELECT id FROM kept))
		RETURNING kept.end_state IS NULL AS claimable, r.id, r.project_id, r.job_id, r.state, r.failure_reason,
			r.attempt, kept.qtid, r.next_attempt_at
	)`+requeueSQL("released", "next_attempt_at")+`, ev AS (
		SELECT project_id, id AS ord, `+runEventType+` AS type, $3::timestamptz AS occurred_at, job_id,
			id AS run_id, state, failure_reason AS reason, attempt, '' AS error_code, 0 AS status_code,
			NULL::timestamptz AS next_at
		FROM released WHERE NOT claimable
	)`+appendEventsTail+`
	SELECT CASE WHEN bool_or(claimable) THEN pg_notify($5, $6) END, `+endedSQL+` FROM released`,
		owner, runIDs, now, vibejobs.ReasonJobDeleted, NotifyChannel, s.schema, claimedAts, due,
		vibejobs.ReasonAttemptsExhausted, claimDues).Scan(nil, &value)
	if err != nil {
		return mapError(err, "releasing claims")
	}
	return s.endedBy(value)
}

// endedBy tells of the runs a committed statement ended, from its endedSQL
// value.
func (s *Store) endedBy(value []byte) error {
	ended := vibejobs.RunsEnded{}
	if err := addEnded(ended, value); err != nil {
		return err
	}
	s.ended(ended)
	return nil
}

// RecoverExpiredLeases ends, as interrupted, the attempts of up to limit runs
// whose lease expired before now and makes them claimable at once under the
// same attempt number (back to scheduled for a first attempt, retrying
// otherwise); a run past its deadline fails (deadline_exceeded) and a run of
// a deleted job is cancelled (job_deleted), its job read under a share lock
// (see tx.DeleteJob). Replicas running it at once skip each other's rows.
// The runs in flight are found in run_queue, where a leased run is keyed at
// its claim time (see migration 00015): the walk passes, in claim order,
// the leases not yet expired that were taken before now.
func (s *Store) RecoverExpiredLeases(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var (
		n     int
		value []byte
	)
	err := s.pool.QueryRow(ctx, `WITH expired AS (
		-- The job is locked before its run, as an API change locks them
		-- (tx.UpdateJob, then tx.DeleteFutureRuns locking the job's
		-- runs): locked after it, recovery holding the run waited for the
		-- job that a pause held while the pause waited for the run, a
		-- deadlock. The queue row and the run are locked with SKIP LOCKED,
		-- so recovery waits for nothing after the job; each lateral
		-- subquery names the one before, so they are evaluated in order.
		SELECT l.id, l.qtid, q.due_at AS claimed_at, j.deleted_at IS NOT NULL AS job_deleted
		FROM run_queue q
		CROSS JOIN LATERAL (
			SELECT j.id, j.deleted_at FROM jobs j
			WHERE j.id = (SELECT job_id FROM runs WHERE id = q.run_id)
			FOR SHARE) j
		CROSS JOIN LATERAL (`+lockQueueRowSQL("qtid", "j.id IS NOT NULL")+`) lq
		CROSS JOIN LATERAL (
			SELECT r.id, lq.qtid FROM runs r
			WHERE r.id = q.run_id AND r.job_id = j.id AND r.state IN ('scheduled', 'retrying')
			FOR UPDATE SKIP LOCKED) l
		WHERE q.leased = true AND q.due_at < $1 AND q.lease_expires_at < $1
		ORDER BY q.due_at, q.run_id
		LIMIT $2
	), recovered AS (
		UPDATE runs r SET
			state = CASE WHEN expired.job_deleted THEN 'cancelled'
				WHEN $1 > r.deadline_at THEN 'failed'
				WHEN `+sentAttemptSQL+` <= 1 THEN 'scheduled'
				ELSE 'retrying' END,
			failure_reason = CASE WHEN expired.job_deleted THEN $3
				WHEN $1 > r.deadline_at THEN $4 ELSE '' END,
			finished_at = CASE WHEN expired.job_deleted OR $1 > r.deadline_at THEN $1::timestamptz END,
			next_attempt_at = CASE WHEN NOT expired.job_deleted AND $1 <= r.deadline_at THEN $1::timestamptz END,
			attempt = `+sentAttemptSQL+`,
			redeliver = NOT expired.job_deleted AND $1 <= r.deadline_at,
			late = `+lateSQL("expired.claimed_at")+`,
			late_decided = true
		FROM expired
		-- By id, not by the locked ctid: a pause that marked the run
		-- withdrawn (see tx.DeleteFutureRuns) and committed after this
		-- statement's snapshot, while the statement waited for the job,
		-- made the locked version one the snapshot cannot see; the ctid
		-- found no row, and the lease waited for the next pass. By id, the
		-- row visible to the snapshot leads to its latest version, which
		-- the lock above holds.
		WHERE r.id = expired.id AND r.id = ANY(ARRAY(SELECT id FROM expired))
		RETURNING r.id, r.attempt, expired.claimed_at AS started_at, r.redeliver AS claimable,
			r.project_id, r.job_id, r.state, r.failure_reason, r.next_attempt_at, expired.qtid
	)`+requeueSQL("recovered", "next_attempt_at")+`, interrupted AS (
		INSERT INTO attempts (run_id, number, started_at, finished_at, status_code, error_code, signature_timestamp)
		SELECT id, attempt, started_at, $1, 0, $5, 0 FROM recovered
	), ev AS (
		SELECT project_id, id AS ord, `+runEventType+` AS type, $1::timestamptz AS occurred_at, job_id,
			id AS run_id, state, failure_reason AS reason, attempt, $5::text AS error_code, 0 AS status_code,
			next_attempt_at AS next_at
		FROM recovered
	)`+appendEventsTail+`
	SELECT count(*), CASE WHEN bool_or(claimable) THEN pg_notify($6, $7) END, `+endedSQL+` FROM recovered`,
		now, limit, vibejobs.ReasonJobDeleted, vibejobs.ReasonDeadlineExceeded, vibejobs.ErrorCodeInterrupted,
		NotifyChannel, s.schema).Scan(&n, nil, &value)
	if err != nil {
		return 0, mapError(err, "recovering expired leases")
	}
	return n, s.endedBy(value)
}

// FailExpiredRuns fails (deadline_exceeded, finished at now) up to limit runs
// waiting in scheduled or retrying whose deadline passed, earliest due
// first. It walks only the part of run_queue due by now, where every
// expired run is (see vibejobs.MaintenanceStore): runs waiting for a retry
// after a receiver failed, or materialised ahead of their time, cost it
// nothing, and no index on deadlines costs every run insert.
func (s *Store) FailExpiredRuns(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int
	err := s.pool.QueryRow(ctx, failExpiredSQL, now, limit, vibejobs.ReasonDeadlineExceeded).Scan(&n)
	if err != nil {
		return 0, mapError(err, "failing expired runs")
	}
	ended := vibejobs.RunsEnded{}
	ended.Add(vibejobs.RunFailed, vibejobs.ReasonDeadlineExceeded, n)
	s.ended(ended)
	return n, nil
}

// failExpiredSQL is the statement of FailExpiredRuns.
var failExpiredSQL = `WITH expired AS (
	-- The queue row, then the run, both with SKIP LOCKED: a claim holding
	-- the row is passed over, as is a run another statement holds.
	SELECT l.tid, l.qtid FROM run_queue q
	CROSS JOIN LATERAL (` + lockQueueRowSQL("qtid", "") + `) lq
	CROSS JOIN LATERAL (
		SELECT r.ctid AS tid, lq.qtid FROM runs r
		WHERE r.id = q.run_id AND r.state IN ('scheduled', 'retrying') AND r.next_attempt_at = q.due_at
			AND r.deadline_at < $1
		FOR UPDATE SKIP LOCKED) l
	WHERE q.leased = false AND q.due_at <= $1 AND q.deadline_at < $1
	ORDER BY q.due_at, q.run_id
	LIMIT $2
), failed AS (
	UPDATE runs r SET state = 'failed', failure_reason = $3, finished_at = $1, next_attempt_at = NULL,
		redeliver = false
	FROM expired WHERE r.ctid = expired.tid AND r.ctid = ANY(ARRAY(SELECT tid FROM expired))
	RETURNING r.id, r.project_id, r.job_id, r.attempt, expired.qtid, r.next_attempt_at
)` + requeueSQL("failed", "next_attempt_at") + `, ev AS (
	SELECT project_id, id AS ord, 'run.failed' AS type, $1::timestamptz AS occurred_at, job_id, id AS run_id,
		'failed' AS state, $3::text AS reason, attempt, '' AS error_code, 0 AS status_code,
		NULL::timestamptz AS next_at
	FROM failed
)` + appendEventsTail + `
SELECT count(*) FROM failed`

// PruneRuns deletes up to limit of projectID's finished runs (with their
// attempts), the earliest created first, that finished before cutoff. It
// finds them by creation time, which runs_created_idx keeps (no index of
// runs covers finished_at: see migration 00008): a run finished before
// cutoff was created before it. Only a clock that differs between
// replicas can put a run's finishing time before its creation time, and
// that run is pruned once cutoff passes its creation time. Attempts carry
// no foreign key to their run (its check cost every recorded outcome a
// lookup), so they are deleted here, in the same statement.
func (s *Store) PruneRuns(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int
	err := s.pool.QueryRow(ctx, `WITH pruned AS (
		DELETE FROM runs WHERE ctid = ANY(ARRAY(
			SELECT ctid FROM runs
			WHERE project_id = $1 AND created_at < $2 AND finished_at < $2
				AND state IN ('succeeded', 'failed', 'cancelled')
			ORDER BY created_at
			LIMIT $3
			FOR UPDATE SKIP LOCKED))
		RETURNING id
	), attempts_pruned AS (
		DELETE FROM attempts WHERE run_id = ANY(ARRAY(SELECT id FROM pruned))
	)
	SELECT count(*) FROM pruned`, projectID, cutoff, limit).Scan(&n)
	if err != nil {
		return 0, mapError(err, "pruning runs")
	}
	return n, nil
}

// PruneDeletedJobs deletes up to limit of projectID's jobs deleted before
// cutoff that no run refers to, the earliest deleted first; replicas
// pruning at once skip each other's rows. runs.job_id has no foreign key
// (see migration 00007), and none is needed: no run of a deleted job can
// be created, since CreateRun and ApplyRunPlans insert a run only for a
// live job, read and locked in the same statement.
func (s *Store) PruneDeletedJobs(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM jobs WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM jobs j
		WHERE j.project_id = $1 AND j.deleted_at IS NOT NULL AND j.deleted_at < $2
			AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.id)
		ORDER BY j.deleted_at
		LIMIT $3
		FOR UPDATE SKIP LOCKED))`, projectID, cutoff, limit)
	if err != nil {
		return 0, mapError(err, "pruning deleted jobs")
	}
	return int(tag.RowsAffected()), nil
}

// PruneRevokedTokens deletes up to limit of projectID's tokens revoked
// before cutoff, the earliest revoked first, found on tokens_revoked_idx
// (the revoked tokens alone); replicas pruning at once skip each other's
// rows. Live tokens stay, so CreateToken's count of them is unchanged.
func (s *Store) PruneRevokedTokens(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM tokens WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM tokens
		WHERE project_id = $1 AND revoked_at IS NOT NULL AND revoked_at < $2
		ORDER BY revoked_at
		LIMIT $3
		FOR UPDATE SKIP LOCKED))`, projectID, cutoff, limit)
	if err != nil {
		return 0, mapError(err, "pruning revoked tokens")
	}
	return int(tag.RowsAffected()), nil
}

// PruneIdempotencyKeys deletes up to limit records expired at now.
func (s *Store) PruneIdempotencyKeys(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.pruneExpired(ctx, "idempotency_keys", now, limit)
}

// pruneExpired deletes up to limit rows of table (idempotency_keys or
// dashboard_sessions) whose expires_at ≤ now, the earliest first; replicas
// pruning at once skip each other's rows.
func (s *Store) pruneExpired(ctx context.Context, table string, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+table+` WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM `+table+`
		WHERE expires_at <= $1
		ORDER BY expires_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))`, now, limit)
	if err != nil {
		return 0, mapError(err, "pruning "+table)
	}
	return int(tag.RowsAffected()), nil
}

// QueueStats counts the runs claimable at now and the age of the oldest.
func (s *Store) QueueStats(ctx context.Context, now time.Time) (vibejobs.QueueStats, error) {
	var (
		st     vibejobs.QueueStats
		oldest *time.Time
	)
	err := s.pool.QueryRow(ctx, `SELECT count(*), min(due_at) FROM run_queue
		WHERE leased = false AND due_at <= $1 AND deadline_at >= $1`, now).
		Scan(&st.Due, &oldest)
	if err != nil {
		return st, mapError(err, "reading queue stats")
	}
	if oldest != nil {
		st.OldestDueAge = now.Sub(*oldest)
	}
	return st, nil
}

// snippet cuts s to at most vibejobs.SnippetBytes without splitting a UTF-8
// sequence (as the SQLite store does).
func snippet(s string) string {
	if len(s) <= vibejobs.SnippetBytes {
		return s
	}
	cut := vibejobs.SnippetBytes
	for cut > 0 && cut > vibejobs.SnippetBytes-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// splitByKey cuts items, in order, into consecutive batches in which no key
// repeats: a statement that updates rows FROM a batch changes each row once.
func splitByKey[T any](items []T, key func(T) string) [][]T {
	var batches [][]T
	seen := map[string]bool{}
	start := 0
	for i, it := range items {
		k := key(it)
		if seen[k] {
			batches = append(batches, items[start:i])
			clear(seen)
			start = i
		}
		seen[k] = true
	}
	if start < len(items) {
		batches = append(batches, items[start:])
	}
	return batches
}

// Analyze refreshes the planner's statistics of the tables that claims and
// records read, as autovacuum's analyze does on a running server, and so
// replaces the plans made before. Benchmarks call it so that their
// statements run with the plans a running server's would get, not with
// those of tables never analyzed (the statistics of a queue of waiting
// runs once picked plans whose cost grew with the runs in flight; see
// requeueSQL).
func (s *Store) Analyze(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `ANALYZE jobs, runs, run_queue`, pgx.QueryExecModeSimpleProtocol); err != nil {
		return mapError(err, "analyzing the queue tables")
	}
	return nil
}

// VacuumQueue vacuums run_queue, and jobs as well when the server's
// autovacuum is off. Every claim, due-time read and scheduler scan walks
// run_queue or jobs_due_idx from its start, where each delivered run and
// each tick leave dead entries that only a vacuum removes: unvacuumed, a
// scan's cost grew with every run since the last vacuum (on this project's
// CI server, PostgreSQL's CPU for 2,000 runs a second went from 0.44 to
// 0.80 of a core within a minute; vacuumed every 5 s it stayed near 0.5).
// Autovacuum visits a database at most once a minute (its default
// naptime), so run_queue, which holds only the queue and is cheap to
// vacuum, is vacuumed here whatever the setting; jobs, which holds every
// job, is left to autovacuum when it is on. runs, the history, is never
// vacuumed here: its updates are in place (see migration 00008) and no
// statement walks its dead entries. INDEX_CLEANUP ON, because the entries
// to remove are index entries and few heap pages hold them; SKIP_LOCKED,
// so replicas vacuuming at once skip a table another is vacuuming instead
// of queueing behind it.
func (s *Store) VacuumQueue(ctx context.Context) error {
	var on bool
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('autovacuum')::boolean`).Scan(&on); err != nil {
		return mapError(err, "reading the autovacuum setting")
	}
	tables := "run_queue, jobs"
	if on {
		tables = "run_queue"
	}
	// VACUUM cannot run in a transaction block, nor be prepared.
	if _, err := s.pool.Exec(ctx, `VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) `+tables, pgx.QueryExecModeSimpleProtocol); err != nil {
		return mapError(err, "vacuuming "+tables)
	}
	return nil
}
