package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/vibejobs/vibejobs"
)

// dueJobsSQL lists due jobs after a position. Both bounds are on jobs_due
// (next_run_at, id): the list is one range of that index, however many due
// jobs come before the position.
const dueJobsSQL = `SELECT ` + jobColumns + ` FROM jobs j
	WHERE j.enabled = 1 AND j.state = 'active' AND j.deleted_at IS NULL AND j.next_run_at <= ?
		AND (j.next_run_at, j.id) > (?, ?)
	ORDER BY j.next_run_at, j.id LIMIT ?`

// DueJobs returns active, enabled, undeleted jobs whose NextRunAt ≤ before
// and whose position comes after after, earliest first (ties by id).
// LastRun is not filled.
func (s *Store) DueJobs(ctx context.Context, before time.Time, after vibejobs.DuePosition, limit int) ([]*vibejobs.Job, error) {
	rows, err := s.q.QueryContext(ctx, dueJobsSQL, ms(before), ms(after.NextRunAt), after.JobID, limit)
	if err != nil {
		return nil, fmt.Errorf("listing due jobs: %w", err)
	}
	defer rows.Close()
	var jobs []*vibejobs.Job
	for rows.Next() {
		j, err := scanJob(rows, false)
		if err != nil {
			return nil, fmt.Errorf("listing due jobs: %w", err)
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing due jobs: %w", err)
	}
	return jobs, nil
}

// ApplyRunPlans applies all plans in one transaction. A plan advances its job
// only while the job is enabled, active, undeleted and still at plan.From and
// plan.Anchor; its runs are inserted only then, each skipped when its (job,
// scheduledFor) exists. It returns the runs created and the skipped
// occurrences of the plans applied.
//
// The plans go to the database as JSON, a statement per round: one UPDATE
// advances the jobs, one INSERT adds the runs of those that advanced. A job
// with several plans in one call gets one per round, in order, so each plan
// sees the job as the previous one left it.
//
// Resent plans (vibejobs.RunPlan.Resent) are not applied; those of their
// runs that exist, read by one more statement in the same transaction,
// are counted in created, and the skipped occurrences of each plan with
// one of them in skipped (see vibejobs.CountResent). Here they are none
// as a rule: a call fails only before its commit or at it (the commit's
// answer is local and not lost, and nothing after it fails), so a failed
// call created nothing.
func (s *Store) ApplyRunPlans(ctx context.Context, plans []vibejobs.RunPlan, now time.Time) (int, int64, error) {
	if len(plans) == 0 {
		return 0, 0, nil
	}
	if err := vibejobs.CheckPlans(plans); err != nil {
		return 0, 0, err
	}
	var (
		rounds [][]*vibejobs.RunPlan
		resent []string
	)
	round := make(map[string]int, len(plans))
	for i := range plans {
		p := &plans[i]
		if p.Resent {
			for _, r := range p.Runs {
				resent = append(resent, r.ID)
			}
			continue
		}
		r := round[p.JobID]
		round[p.JobID] = r + 1
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], p)
	}
	var (
		created int
		skipped int64
	)
	err := s.write(ctx, func(t wtx) error {
		created, skipped = 0, 0
		for _, ps := range rounds {
			n, sk, err := applyRound(ctx, t, ps)
			if err != nil {
				return err
			}
			created += n
			skipped += sk
		}
		if len(resent) > 0 {
			found, err := resentRuns(ctx, t, resent)
			if err != nil {
				return err
			}
			n, sk := vibejobs.CountResent(plans, found)
			created += n
			skipped += sk
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("applying run plans: %w", err)
	}
	return created, skipped, nil
}

// resentRuns returns those of ids that are the ids of runs.
func resentRuns(ctx context.Context, t wtx, ids []string) ([]string, error) {
	rows, err := t.QueryContext(ctx, resentRunsSQL, jsonArray(ids))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		found = append(found, id)
	}
	return found, rows.Err()
}

// applyRound applies plans of distinct jobs; it returns the runs created and
// the skipped occurrences of the plans applied.
func applyRound(ctx context.Context, t wtx, plans []*vibejobs.RunPlan) (int, int64, error) {
	advance := make([][6]any, len(plans))
	for i, p := range plans {
		advance[i] = [6]any{p.JobID, msPtr(p.Next), p.Skipped, p.Complete, ms(p.From), ms(p.Anchor)}
	}
	rows, err := t.QueryContext(ctx, applyAdvanceSQL, jsonArray(advance))
	if err != nil {
		return 0, 0, err
	}
	advanced := make(map[string]bool, len(plans))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, 0, err
		}
		advanced[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	var (
		runs    [][14]any
		skipped int64
	)
	for _, p := range plans {
		if !advanced[p.JobID] {
			continue // the job moved on, was paused or deleted
		}
		skipped += p.Skipped
		for _, r := range p.Runs {
			runs = append(runs, [14]any(insertRunArgs(r)))
		}
	}
	if len(runs) == 0 {
		return 0, skipped, nil
	}
	n, err := changed(t.ExecContext(ctx, applyInsertSQL, jsonArray(runs)))
	if err != nil {
		return 0, 0, err
	}
	// A held run whose occurrence a change withdrew (see
	// tx.DeleteFutureRuns) and that these plans want again keeps it: given
	// back, it is claimed again rather than deleted.
	if _, err := t.ExecContext(ctx, applyWantedSQL, jsonArray(runs)); err != nil {
		return 0, 0, err
	}
	return int(n), skipped, nil
}

// ClaimDueRuns claims the earliest due runs for owner and returns them in
// that order; runs due at the same instant go in insertion order, so one
// batch updates neighbouring rows. See vibejobs.DispatchStore.
func (s *Store) ClaimDueRuns(ctx context.Context, owner string, now time.Time, limit int, leaseMargin time.Duration) ([]*vibejobs.Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	var claims []*vibejobs.Claim
	err := s.write(ctx, func(t wtx) error {
		claims = nil
		nowMS := ms(now)
		// Pick in due order first: UPDATE … RETURNING returns rows in no
		// particular order, and the claim clears next_attempt_at.
		rows, err := t.QueryContext(ctx, claimPickSQL, nowMS, limit)
		if err != nil {
			return err
		}
		var ids []string
		var rowids []int64
		decided := map[string]bool{}    // Late decided before this claim
		dueAt := map[string]time.Time{} // next_attempt_at, which the claim clears
		for rows.Next() {
			var rowid, due int64
			var id string
			var wasDecided bool
			if err := rows.Scan(&rowid, &id, &wasDecided, &due); err != nil {
				rows.Close()
				return err
			}
			rowids = append(rowids, rowid)
			ids = append(ids, id)
			decided[id] = wasDecided
			dueAt[id] = time.UnixMilli(due).UTC()
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}

		// Attempt numbering: a redelivery keeps the number of the attempt it
		// sends again. Late is decided by the run's first claim that sends.
		rows, err = t.QueryContext(ctx, claimSQL,
			nowMS, vibejobs.LateThreshold.Milliseconds(), owner, leaseMargin.Milliseconds(), jsonArray(rowids))
		if err != nil {
			return err
		}
		byID := make(map[string]*vibejobs.Run, len(ids))
		var jobIDs []string
		for rows.Next() {
			r, err := scanRun(rows)
			if err != nil {
				rows.Close()
				return err
			}
			byID[r.ID] = r
			jobIDs = append(jobIDs, r.JobID)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		// The delivery settings of each job as they are now.
		rows, err = t.QueryContext(ctx, claimJobsSQL, jsonArray(jobIDs))
		if err != nil {
			return err
		}
		settings := make(map[string]*vibejobs.Claim)
		for rows.Next() {
			var id string
			var c vibejobs.Claim
			var timeout, minB, maxB int64
			if err := rows.Scan(&id, &c.URL, &c.Secret.KeyID, &c.Secret.Ciphertext, &timeout,
				&c.Retry.MaxAttempts, &minB, &maxB); err != nil {
				rows.Close()
				return err
			}
			c.Timeout = time.Duration(timeout)
			c.Retry.MinBackoff = time.Duration(minB)
			c.Retry.MaxBackoff = time.Duration(maxB)
			settings[id] = &c
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		claims = make([]*vibejobs.Claim, 0, len(ids))
		for _, id := range ids {
			r := byID[id]
			if r == nil {
				return fmt.Errorf("run %s vanished while claimed", id)
			}
			set := settings[r.JobID]
			if set == nil {
				return fmt.Errorf("job %s of run %s missing", r.JobID, id)
			}
			c := *set
			c.Run = r
			c.ClaimedAt = time.UnixMilli(nowMS).UTC() // attempt_started_at, as claimSQL wrote it
			c.LateDecided = decided[id]
			c.DueAt = dueAt[id]
			claims = append(claims, &c)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claiming due runs: %w", err)
	}
	return claims, nil
}

// NextDueAt returns the earliest NextAttemptAt of a run in scheduled or
// retrying whose deadline has not passed by the Store's clock (Options.Now):
// a run past its deadline is never claimable, and would otherwise wake the
// dispatcher in a loop until FailExpiredRuns ends it.
func (s *Store) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	var next sql.NullInt64
	err := s.q.QueryRowContext(ctx, `SELECT next_attempt_at FROM runs
		WHERE state IN ('scheduled', 'retrying') AND deadline_at >= ?
		ORDER BY next_attempt_at LIMIT 1`, ms(s.now())).Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("finding next due run: %w", err)
	}
	if !next.Valid {
		return time.Time{}, false, nil
	}
	return fromMS(next.Int64), true, nil
}

// RecordOutcomes records the outcomes in one transaction. An outcome counts
// only while its run is delivering under owner's lease at the outcome's
// attempt number; any other is dropped with its attempt.
//
// The outcomes go to the database as JSON: one UPDATE moves the runs, one
// INSERT adds the attempts of those that moved. Outcomes of one run (there
// should be none) go in later rounds, in order.
func (s *Store) RecordOutcomes(ctx context.Context, owner string, outcomes []vibejobs.Outcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	var rounds [][]*vibejobs.Outcome
	round := make(map[string]int, len(outcomes))
	for i := range outcomes {
		o := &outcomes[i]
		switch o.Step.State {
		case vibejobs.RunSucceeded, vibejobs.RunFailed, vibejobs.RunRetrying, vibejobs.RunCancelled:
		default:
			return fmt.Errorf("recording outcomes: run %s: step to %q", o.RunID, o.Step.State)
		}
		r := round[o.RunID]
		round[o.RunID] = r + 1
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], o)
	}
	err := s.write(ctx, func(t wtx) error {
		for _, batch := range rounds {
			if err := recordRound(ctx, t, owner, batch); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("recording outcomes: %w", err)
	}
	return nil
}

// recordRound records outcomes of distinct runs and appends the events of
// the runs it moved, in outcome order. The events are read back from the
// attempts and runs just written (final state, reason, next attempt), so
// the batch is not encoded a second time; each project's feed counter is
// taken once per round, and a call has one round unless it holds two
// outcomes of one run.
func recordRound(ctx context.Context, t wtx, owner string, outcomes []*vibejobs.Outcome) error {
	moves := make([][7]any, len(outcomes))
	for i, o := range outcomes {
		var next any
		if o.Step.State == vibejobs.RunRetrying {
			next = ms(o.Attempt.FinishedAt)
			if o.Step.NextAttemptAt != nil {
				next = ms(*o.Step.NextAttemptAt)
			}
		}
		moves[i] = [7]any{o.RunID, string(o.Step.State), o.Step.FailureReason, next, ms(o.Attempt.FinishedAt),
			o.Attempt.Number, ms(o.ClaimedAt)}
	}
	rows, err := t.QueryContext(ctx, recordMoveSQL, jsonArray(moves), owner, vibejobs.ReasonDeadlineExceeded)
	if err != nil {
		return err
	}
	type movedRun struct {
		seq     int64
		project string
	}
	moved := make(map[string]movedRun, len(outcomes))
	for rows.Next() {
		var m movedRun
		var id string
		if err := rows.Scan(&m.seq, &id, &m.project); err != nil {
			rows.Close()
			return err
		}
		moved[id] = m
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(moved) == 0 {
		return nil // every lease was lost: the attempts belong to whoever holds the runs now
	}

	attempts := make([][8]any, 0, len(moved))
	var retried [][2]any
	projects := make([]string, 0, len(moved)) // of each attempt, in order
	perProject := map[string]int64{}
	for _, o := range outcomes {
		m, ok := moved[o.RunID]
		if !ok {
			continue
		}
		a := o.Attempt
		attempts = append(attempts, [8]any{m.seq, a.Number, ms(a.StartedAt), ms(a.FinishedAt), a.StatusCode, a.ErrorCode,
			a.SignatureTimestamp, snippet(a.ResponseSnippet)})
		if o.Step.State == vibejobs.RunRetrying {
			retried = append(retried, [2]any{m.seq, ms(a.FinishedAt)})
		}
		projects = append(projects, m.project)
		perProject[m.project]++
	}
	res, err := t.ExecContext(ctx, recordAttemptsSQL, jsonArray(attempts))
	if err != nil {
		return fmt.Errorf("recording attempts: %w", err)
	}
	// One INSERT under the single writer numbers its rows consecutively.
	lastAttempt, err := res.LastInsertId()
	if err != nil {
		return fmt.Errorf("recording attempts: %w", err)
	}
	if len(retried) > 0 {
		// No further attempt of a deleted job's run.
		if _, err := t.ExecContext(ctx, recordCancelSQL, jsonArray(retried), vibejobs.ReasonJobDeleted); err != nil {
			return fmt.Errorf("cancelling runs of deleted jobs: %w", err)
		}
	}
	next, err := reserveSequences(ctx, t, perProject)
	if err != nil {
		return err
	}
	seqs := make([]int64, len(projects))
	for i, p := range projects {
		seqs[i] = next[p]
		next[p]++
	}
	ends, err := t.QueryContext(ctx, recordEventsSQL, lastAttempt-int64(len(attempts)), jsonArray(seqs))
	if err != nil {
		return fmt.Errorf("appending run events: %w", err)
	}
	defer ends.Close()
	for ends.Next() {
		var state, reason, code string
		if err := ends.Scan(&state, &reason, &code); err != nil {
			return fmt.Errorf("appending run events: %w", err)
		}
		t.ended.Add(vibejobs.RunState(state), reason, 1)
		t.attempts[vibejobs.AttemptOutcome{State: vibejobs.RunState(state), ErrorCode: code}]++
	}
	if err := ends.Err(); err != nil {
		return fmt.Errorf("appending run events: %w", err)
	}
	return nil
}

// reserveSequences takes, in project order, counts[p] sequences of each
// project's feed and returns the first of each.
func reserveSequences(ctx context.Context, t wtx, counts map[string]int64) (map[string]int64, error) {
	projects := make([]string, 0, len(counts))
	for p := range counts {
		projects = append(projects, p)
	}
	slices.Sort(projects)
	first := make(map[string]int64, len(projects))
	for _, p := range projects {
		var head int64
		if err := t.QueryRowContext(ctx, bumpHeadSQL, p, counts[p]).Scan(&head); err != nil {
			return nil, fmt.Errorf("appending events: %w", err)
		}
		first[p] = head - counts[p] + 1
	}
	return first, nil
}

// recordEventsSQL appends the events of the attempts recorded after id ?1,
// with their runs as they are now; ?2 holds the sequence of each attempt's
// event, in attempt order. CROSS JOIN keeps the plan on the new attempts'
// rowids and their runs by primary key: joined freely, the planner walked
// every run of the project.
const recordEventsSQL = `INSERT INTO events (project_id, sequence, type, occurred_at, job_id, run_id, state, reason,
			attempt, error_code, status_code, next_at)
		SELECT r.project_id, ?2 ->> (a.id - ?1 - 1),
			CASE r.state WHEN 'succeeded' THEN 'run.succeeded' WHEN 'failed' THEN 'run.failed'
				WHEN 'cancelled' THEN 'run.cancelled' ELSE 'run.retrying' END,
			a.finished_at, r.job_id, r.id, r.state, r.failure_reason, a.number, a.error_code, a.status_code,
			r.next_attempt_at
		FROM attempts a CROSS JOIN runs r ON r.seq = a.run_seq
		WHERE a.id > ?1
		ORDER BY a.id
		RETURNING state, reason, error_code`

// applyAdvanceSQL advances the jobs of a round of plans that are still at
// their From and Anchor.
const applyAdvanceSQL = `UPDATE jobs SET next_run_at = p.value ->> 1,
			skipped_runs = skipped_runs + (p.value ->> 2),
			state = CASE WHEN p.value ->> 3 THEN 'completed' ELSE jobs.state END
		FROM jsonb_each(?) AS p
		WHERE jobs.id = p.value ->> 0 AND jobs.next_run_at = p.value ->> 4 AND jobs.schedule_anchor = p.value ->> 5
			AND jobs.enabled = 1 AND jobs.state = 'active' AND jobs.deleted_at IS NULL
		RETURNING jobs.id`

// applyInsertSQL inserts the runs of the plans that applied.
const applyInsertSQL = `INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, occurrence,
			deadline_at, late, state, attempt, next_attempt_at, failure_reason, created_at, finished_at)
		SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6,
			value ->> 7, value ->> 8, value ->> 9, value ->> 10, value ->> 11, value ->> 12, value ->> 13
		FROM jsonb_each(?) ORDER BY key
		ON CONFLICT (job_id, scheduled_for, occurrence) DO NOTHING`

// applyWantedSQL clears the withdrawn mark of the runs whose occurrence the
// rows of applyInsertSQL name: job ->> 1, scheduledFor ->> 4, and occurrence
// ->> 5, 1 for a schedule-triggered run.
const applyWantedSQL = `UPDATE runs SET withdrawn = 0
		WHERE withdrawn = 1 AND (job_id, scheduled_for) IN (
			SELECT value ->> 1, value ->> 4 FROM jsonb_each(?) WHERE value ->> 5 = 1)`

// resentRunsSQL reads the ids, of a JSON array of ids, of runs that exist.
const resentRunsSQL = `SELECT id FROM runs WHERE id IN (SELECT value FROM json_each(?))`

// claimPickSQL picks the runs to claim, in due order.
const claimPickSQL = `SELECT seq, id, late IS NOT NULL, next_attempt_at FROM runs
			WHERE state IN ('scheduled', 'retrying') AND next_attempt_at <= ?1 AND deadline_at >= ?1
			ORDER BY next_attempt_at, seq LIMIT ?2`

// claimSQL moves the picked runs to delivering.
const claimSQL = `UPDATE runs SET
				state = 'delivering',
				attempt = CASE WHEN redeliver = 1 THEN attempt ELSE attempt + 1 END,
				redeliver = 0,
				late = coalesce(late, ?1 - scheduled_for > ?2),
				next_attempt_at = NULL,
				attempt_started_at = ?1,
				lease_owner = ?3,
				lease_expires_at = ?1 + ?4 + (SELECT j.timeout_ns / 1000000 FROM jobs j WHERE j.id = runs.job_id)
			WHERE seq IN (SELECT value FROM json_each(?5))
			RETURNING ` + runColumns

// claimJobsSQL reads the delivery settings of the claimed runs' jobs.
const claimJobsSQL = `SELECT j.id, j.url, j.secret_key_id, j.secret_ciphertext, j.timeout_ns,
				j.max_attempts, j.min_backoff_ns, j.max_backoff_ns
			FROM jobs j WHERE j.id IN (SELECT value FROM json_each(?))`

// recordMoveSQL moves the runs whose outcome still holds the lease of its
// claim: owner, attempt number and claim time (attempt_started_at), which
// tells the claim from an earlier one by the same owner whose lease was
// recovered. A retrying step due after the run's deadline fails the run
// instead.
const recordMoveSQL = `UPDATE runs SET
			state = CASE WHEN ` + retryAfterDeadline + ` THEN 'failed' ELSE o.value ->> 1 END,
			failure_reason = CASE WHEN ` + retryAfterDeadline + ` THEN ?3 ELSE o.value ->> 2 END,
			next_attempt_at = CASE WHEN ` + retryAfterDeadline + ` THEN NULL ELSE o.value ->> 3 END,
			finished_at = CASE WHEN o.value ->> 1 = 'retrying' AND NOT ` + retryAfterDeadline + ` THEN NULL
				ELSE o.value ->> 4 END,
			lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL
		FROM jsonb_each(?1) AS o
		WHERE runs.id = o.value ->> 0 AND runs.state = 'delivering' AND runs.lease_owner = ?2
			AND runs.attempt = o.value ->> 5 AND runs.attempt_started_at = o.value ->> 6
		RETURNING runs.seq, runs.id, runs.project_id`

// retryAfterDeadline says that the outcome o (see recordRound) retries the
// run after its deadline.
const retryAfterDeadline = `(o.value ->> 1 = 'retrying' AND o.value ->> 3 > runs.deadline_at)`

// recordAttemptsSQL inserts the attempts of the outcomes that counted.
const recordAttemptsSQL = `INSERT INTO attempts (run_seq, number, started_at, finished_at, status_code,
			error_code, signature_timestamp, response_snippet)
		SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7
		FROM jsonb_each(?) ORDER BY key`

// recordCancelSQL cancels the retrying runs of deleted jobs.
const recordCancelSQL = `UPDATE runs SET state = 'cancelled', failure_reason = ?2,
			finished_at = c.value ->> 1, next_attempt_at = NULL
		FROM jsonb_each(?1) AS c
		WHERE runs.seq = c.value ->> 0
			AND ` + jobDeleted

// releaseSQL puts claims back in the queue, due at ?5 (?5 ≥ ?1) but no later
// than the run's deadline or ?1: the runs still delivering under the lease
// of the claim ?2 names (owner and claim time, as recordMoveSQL tells them).
// A deleted job's run is cancelled at ?1. A claim of a redelivery keeps its
// number to send again (redeliver); any other claim's number, never sent,
// goes back to the last attempt started, and its next claim takes it again.
const releaseSQL = `UPDATE runs SET
				state = CASE WHEN ` + jobDeleted + ` THEN 'cancelled' WHEN ` + attemptsUsedUp + ` THEN 'failed'
					WHEN attempt <= 1 THEN 'scheduled' ELSE 'retrying' END,
				failure_reason = CASE WHEN ` + jobDeleted + ` THEN ?4 WHEN ` + attemptsUsedUp + ` THEN ?6 ELSE '' END,
				attempt = CASE WHEN NOT ` + jobDeleted + ` AND ` + attemptsUsedUp + `
					THEN (SELECT coalesce(max(a.number), 0) FROM attempts a WHERE a.run_seq = runs.seq)
					WHEN ` + claimSent + ` THEN attempt ELSE attempt - 1 END,
				finished_at = CASE WHEN ` + releaseEnds + ` THEN ?1 ELSE NULL END,
				next_attempt_at = CASE WHEN ` + releaseEnds + ` THEN NULL
					WHEN ?5 > ?1 THEN max(?1, min(?5, deadline_at))
					-- Due again now: in its place in line (see ReleaseClaims).
					ELSE min(?1, (SELECT value ->> 2 FROM json_each(?2)
						WHERE value ->> 0 = runs.id AND value ->> 1 = runs.attempt_started_at)) END,
				redeliver = CASE WHEN ` + releaseEnds + ` THEN 0 WHEN ` + claimSent + ` THEN 1 ELSE 0 END,
				late = CASE WHEN attempt <= 1 AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_seq = runs.seq)
					THEN NULL ELSE late END,
				attempt_started_at = NULL, lease_owner = NULL, lease_expires_at = NULL
			WHERE state = 'delivering' AND lease_owner = ?3
				AND (id, attempt_started_at) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?2))
			RETURNING ` + runEventColumns

// releaseWithdrawnSQL deletes, of the claims ?1 that owner ?2 gives back,
// the runs never sent whose occurrence was withdrawn while they were held
// (see tx.DeleteFutureRuns), as an unheld one was; releaseSQL, after it,
// finds them gone. A deleted job's run is left to releaseSQL to cancel.
const releaseWithdrawnSQL = `DELETE FROM runs
			WHERE state = 'delivering' AND lease_owner = ?2 AND withdrawn = 1
				AND (id, attempt_started_at) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?1))
				AND attempt <= 1 AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_seq = runs.seq)
				AND NOT ` + jobDeleted

// jobDeleted is true for a run (in a statement on runs) whose job is deleted.
const jobDeleted = `EXISTS (SELECT 1 FROM jobs j WHERE j.id = runs.job_id AND j.deleted_at IS NOT NULL)`

// attemptsUsedUp is true for a claimed run (in a statement on runs) whose
// attempt number, the one its claim was to send, is beyond its job's
// maxAttempts as it is now: lowered after the run's last attempt.
const attemptsUsedUp = `EXISTS (SELECT 1 FROM jobs j WHERE j.id = runs.job_id AND runs.attempt > j.max_attempts)`

// claimSent is true for a claimed run (in a statement on runs) whose claim
// is a redelivery: an attempt under its number went out before (and was
// interrupted), so the number is to be sent again.
const claimSent = `EXISTS (SELECT 1 FROM attempts a WHERE a.run_seq = runs.seq AND a.number = runs.attempt)`

// releaseEnds is true for a released run that ends instead of going back.
const releaseEnds = `(` + jobDeleted + ` OR ` + attemptsUsedUp + `)`

// writeStatements are prepared once on the write connection.
var writeStatements = []string{applyAdvanceSQL, applyInsertSQL, applyWantedSQL, claimPickSQL, claimSQL, claimJobsSQL,
	recordMoveSQL, recordAttemptsSQL, recordCancelSQL, releaseWithdrawnSQL, releaseSQL, bumpHeadSQL, insertEventsSQL, recordEventsSQL,
	claimSubscriptionsSQL, recordStepSQL}

// jsonArray encodes rows for json_each: one bound parameter however many.
// Rows hold only strings, integers, booleans and nils.
func jsonArray[T any](rows []T) string {
	b, err := json.Marshal(rows)
	if err != nil {
		panic(err) // strings, numbers, booleans and nil always encode
	}
	return string(b)
}

// snippet makes s valid UTF-8 (it travels as JSON text) and cuts it to at
// most vibejobs.SnippetBytes without splitting a character.
func snippet(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= vibejobs.SnippetBytes {
		return s
	}
	cut := vibejobs.SnippetBytes
	for cut > 0 && cut > vibejobs.SnippetBytes-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// ReleaseClaims puts the runs of owner's claims back in the queue, to be
// sent under the same attempt number, while each is still delivering under
// its claim's lease (a lease recovered and taken again, by this owner too,
// is another claim's). Each is due at due when that is after now, but no
// later than its deadline (now, if that passed), so that FailExpiredRuns
// finds it once the deadline passes; otherwise it is due at once, in its
// place in line: at the due time its claim took it at (Claim.DueAt), now if
// that is later, so that the runs due after it do not overtake it. A first
// attempt never sent before (no attempt recorded, not even an interrupted
// one) gets its late flag decided again; one the app has seen keeps it. A
// run whose job was deleted meanwhile has no attempt in flight any more: it
// is cancelled (job_deleted) at now, as DeleteJob would have done, whatever
// due says. A run whose attempt number is beyond its job's maxAttempts,
// lowered since its last attempt, fails (attempts_exhausted) at now, its
// number back to its last attempt recorded. A run never sent whose
// occurrence was withdrawn while it was held is deleted (see
// tx.DeleteFutureRuns).
func (s *Store) ReleaseClaims(ctx context.Context, owner string, claims []*vibejobs.Claim, now, due time.Time) error {
	if len(claims) == 0 {
		return nil
	}
	if due.Before(now) {
		due = now
	}
	held := make([][3]any, len(claims))
	for i, c := range claims {
		held[i] = [3]any{c.Run.ID, ms(c.ClaimedAt), ms(c.DueAt)}
	}
	err := s.write(ctx, func(t wtx) error {
		if _, err := t.ExecContext(ctx, releaseWithdrawnSQL, jsonArray(held), owner); err != nil {
			return err
		}
		rows, err := t.QueryContext(ctx, releaseSQL, ms(now), jsonArray(held), owner, vibejobs.ReasonJobDeleted,
			ms(due), vibejobs.ReasonAttemptsExhausted)
		if err != nil {
			return err
		}
		released, err := scanRunEvents(rows, now, "")
		if err != nil {
			return err
		}
		ended := released[:0]
		for _, e := range released {
			if e.Type == vibejobs.EventRunCancelled || e.Type == vibejobs.EventRunFailed {
				e.NextAt = nil
				ended = append(ended, e)
			}
		}
		return appendEvents(ctx, t, ended)
	})
	if err != nil {
		return fmt.Errorf("releasing claims: %w", err)
	}
	return nil
}

// expiredLeases selects up to ?2 delivering runs whose lease expired before ?1,
// oldest lease first. Both statements of RecoverExpiredLeases use it in one
// transaction, so they see the same runs.
const expiredLeases = `SELECT seq FROM runs WHERE state = 'delivering' AND lease_expires_at < ?1
	ORDER BY lease_expires_at, seq LIMIT ?2`

// RecoverExpiredLeases records the in-flight attempt of each run whose lease
// expired as interrupted (started when it was claimed, finished now, never
// signed as far as the store knows) and makes the run due now under the same
// attempt number: back to scheduled for a first attempt, retrying otherwise.
// A run past its deadline fails (deadline_exceeded); a deleted job's run is
// cancelled (job_deleted).
func (s *Store) RecoverExpiredLeases(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int64
	err := s.write(ctx, func(t wtx) error {
		nowMS := ms(now)
		_, err := t.ExecContext(ctx, `INSERT INTO attempts (run_seq, number, started_at, finished_at, status_code,
				error_code, signature_timestamp, response_snippet)
			SELECT seq, attempt, coalesce(attempt_started_at, ?1), ?1, 0, ?3, 0, ''
			FROM runs WHERE seq IN (`+expiredLeases+`)
			ORDER BY seq`, nowMS, limit, vibejobs.ErrorCodeInterrupted)
		if err != nil {
			return err
		}
		// The expressions all see the row as it was before the update.
		const deleted = jobDeleted
		const ends = `(` + deleted + ` OR deadline_at < ?1)`
		rows, err := t.QueryContext(ctx, `UPDATE runs SET
				state = CASE
					WHEN `+deleted+` THEN 'cancelled'
					WHEN deadline_at < ?1 THEN 'failed'
					WHEN attempt <= 1 THEN 'scheduled'
					ELSE 'retrying' END,
				failure_reason = CASE
					WHEN `+deleted+` THEN ?3
					WHEN deadline_at < ?1 THEN ?4
					ELSE '' END,
				redeliver = CASE WHEN `+ends+` THEN 0 ELSE 1 END,
				next_attempt_at = CASE WHEN `+ends+` THEN NULL ELSE ?1 END,
				finished_at = CASE WHEN `+ends+` THEN ?1 ELSE NULL END,
				attempt_started_at = NULL, lease_owner = NULL, lease_expires_at = NULL
			WHERE seq IN (`+expiredLeases+`)
			RETURNING `+runEventColumns,
			nowMS, limit, vibejobs.ReasonJobDeleted, vibejobs.ReasonDeadlineExceeded)
		if err != nil {
			return err
		}
		events, err := scanRunEvents(rows, now, vibejobs.ErrorCodeInterrupted)
		if err != nil {
			return err
		}
		n = int64(len(events))
		return appendEvents(ctx, t, events)
	})
	if err != nil {
		return 0, fmt.Errorf("recovering expired leases: %w", err)
	}
	return int(n), nil
}

// FailExpiredRuns fails (deadline_exceeded, finished now) up to limit runs
// waiting in scheduled or retrying whose deadline is before now. It walks
// only the runs due by now, where every expired run is (see
// vibejobs.MaintenanceStore): runs waiting for a later retry cost it nothing.
func (s *Store) FailExpiredRuns(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int64
	err := s.write(ctx, func(t wtx) error {
		rows, err := t.QueryContext(ctx, `UPDATE runs SET state = 'failed', failure_reason = ?3,
				finished_at = ?1, next_attempt_at = NULL, redeliver = 0
			WHERE seq IN (SELECT seq FROM runs
				WHERE state IN ('scheduled', 'retrying') AND next_attempt_at <= ?1 AND deadline_at < ?1
				ORDER BY next_attempt_at, seq LIMIT ?2)
			RETURNING `+runEventColumns, ms(now), limit, vibejobs.ReasonDeadlineExceeded)
		if err != nil {
			return err
		}
		events, err := scanRunEvents(rows, now, "")
		if err != nil {
			return err
		}
		n = int64(len(events))
		return appendEvents(ctx, t, events)
	})
	if err != nil {
		return 0, fmt.Errorf("failing expired runs: %w", err)
	}
	return int(n), nil
}

// PruneRuns deletes up to limit of the project's finished runs, oldest
// first, that finished before cutoff; their attempts go with them.
func (s *Store) PruneRuns(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	return s.prune(ctx, "runs", limit, `DELETE FROM runs WHERE seq IN (SELECT seq FROM runs
		WHERE project_id = ? AND finished_at IS NOT NULL AND finished_at < ?
			AND state IN ('succeeded', 'failed', 'cancelled')
		ORDER BY finished_at LIMIT ?)`, projectID, ms(cutoff), limit)
}

// PruneDeletedJobs deletes up to limit of projectID's jobs deleted before
// cutoff that no run refers to, the earliest deleted first.
func (s *Store) PruneDeletedJobs(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	return s.prune(ctx, "deleted jobs", limit, `DELETE FROM jobs WHERE id IN (SELECT j.id FROM jobs j
		WHERE j.project_id = ? AND j.deleted_at IS NOT NULL AND j.deleted_at < ?
			AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.id)
		ORDER BY j.deleted_at LIMIT ?)`, projectID, ms(cutoff), limit)
}

// PruneRevokedTokens deletes up to limit of projectID's tokens revoked
// before cutoff, the earliest revoked first (on tokens_revoked, which holds
// the revoked tokens alone); live tokens stay.
func (s *Store) PruneRevokedTokens(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	return s.prune(ctx, "revoked tokens", limit, `DELETE FROM tokens WHERE id IN (SELECT id FROM tokens
		WHERE project_id = ? AND revoked_at IS NOT NULL AND revoked_at < ?
		ORDER BY revoked_at LIMIT ?)`, projectID, ms(cutoff), limit)
}

// PruneIdempotencyKeys deletes up to limit records with ExpiresAt ≤ now.
func (s *Store) PruneIdempotencyKeys(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.pruneExpired(ctx, "idempotency_keys", "rowid", now, limit)
}

// pruneExpired deletes up to limit rows of table (idempotency_keys or
// dashboard_sessions), found by their key column, whose expires_at ≤ now,
// the earliest first.
func (s *Store) pruneExpired(ctx context.Context, table, key string, now time.Time, limit int) (int, error) {
	return s.prune(ctx, table, limit, `DELETE FROM `+table+` WHERE `+key+` IN (
		SELECT `+key+` FROM `+table+` WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)`, ms(now), limit)
}

// prune runs one deleting statement of a batch of at most limit rows (what
// names them in its error) and returns how many it deleted; a limit ≤ 0
// deletes nothing.
func (s *Store) prune(ctx context.Context, what string, limit int, query string, args ...any) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int64
	err := s.write(ctx, func(t wtx) error {
		var err error
		n, err = changed(t.ExecContext(ctx, query, args...))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pruning %s: %w", what, err)
	}
	return int(n), nil
}

// QueueStats counts the runs claimable at now.
func (s *Store) QueueStats(ctx context.Context, now time.Time) (vibejobs.QueueStats, error) {
	var st vibejobs.QueueStats
	var oldest sql.NullInt64
	err := s.q.QueryRowContext(ctx, `SELECT count(*), min(next_attempt_at) FROM runs
		WHERE state IN ('scheduled', 'retrying') AND next_attempt_at <= ?1 AND deadline_at >= ?1`, ms(now)).
		Scan(&st.Due, &oldest)
	if err != nil {
		return st, fmt.Errorf("reading queue stats: %w", err)
	}
	if oldest.Valid {
		st.OldestDueAge = now.Sub(fromMS(oldest.Int64))
	}
	return st, nil
}
