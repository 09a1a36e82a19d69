package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vibejobs/vibejobs"
)

// tx is the vibejobs.Tx of Store.Update.
// GetJob reads the job as Store.GetJob does and locks its row until the
// transaction ends. A transaction reads a job to change it (the API's
// edits write the whole row back): a scheduler step committed between the
// read and the write would be written over, its advance of NextRunAt undone
// and its skipped occurrences counted again. The scheduler skips a locked
// job (applyPlansSQL) and plans it afresh once this commits.
func (t *tx) GetJob(ctx context.Context, projectID, id string) (*vibejobs.Job, error) {
	return t.getJob(ctx, projectID, id, " FOR UPDATE OF j")
}

type tx struct {
	reader
	s *Store
	// notified is set once this transaction queued its NOTIFY.
	notified bool
	// jobDelta is the net change to each project's live jobs made so far,
	// written to project_job_counts by flushJobCounts before commit.
	jobDelta map[string]int64
	// ended counts the runs the transaction ended, told after it commits.
	ended vibejobs.RunsEnded
}

// addJobs notes n more (or fewer) live jobs in projectID.
func (t *tx) addJobs(projectID string, n int64) {
	if t.jobDelta == nil {
		t.jobDelta = map[string]int64{}
	}
	t.jobDelta[projectID] += n
}

// CountJobs returns the number of projectID's live jobs, this
// transaction's own creations and deletions included.
func (t *tx) CountJobs(ctx context.Context, projectID string) (int, error) {
	n, err := t.reader.CountJobs(ctx, projectID)
	return n + int(t.jobDelta[projectID]), err
}

// flushJobCounts writes the transaction's job count changes, in project
// order, as its last statement before commit: the counter rows are locked
// only from here to the commit, and two transactions take them in the same
// order.
func (t *tx) flushJobCounts(ctx context.Context) error {
	if len(t.jobDelta) == 0 {
		return nil
	}
	projects := make([]string, 0, len(t.jobDelta))
	for p, n := range t.jobDelta {
		if n != 0 {
			projects = append(projects, p)
		}
	}
	slices.Sort(projects)
	deltas := make([]int64, len(projects))
	for i, p := range projects {
		deltas[i] = t.jobDelta[p]
	}
	_, err := t.q.Exec(ctx, `INSERT INTO project_job_counts AS c (project_id, live_jobs)
		SELECT * FROM unnest($1::text[], $2::bigint[]) ORDER BY 1
		ON CONFLICT (project_id) DO UPDATE SET live_jobs = c.live_jobs + EXCLUDED.live_jobs`, projects, deltas)
	return mapError(err, "counting jobs")
}

var _ vibejobs.Tx = (*tx)(nil)

// notify announces, at commit, that runs became claimable. PostgreSQL folds
// identical notifications of one transaction; notified saves the round trip.
func (t *tx) notify(ctx context.Context) error {
	if t.notified {
		return nil
	}
	if _, err := t.q.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, t.s.schema); err != nil {
		return mapError(err, "notifying")
	}
	t.notified = true
	return nil
}

// CreateProject inserts p; an existing id gives ECONFLICT.
//
// Inserts that can meet an existing key use ON CONFLICT DO NOTHING and count
// the rows: a unique violation would abort the whole transaction, while the
// caller may want to carry on after ECONFLICT (as it can on SQLite).
func (t *tx) CreateProject(ctx context.Context, p *vibejobs.Project) error {
	tag, err := t.q.Exec(ctx, `INSERT INTO projects (id, name, retention_days, created_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT DO NOTHING`,
		p.ID, p.Name, p.RetentionDays, p.CreatedAt)
	if err != nil {
		return mapError(err, "creating a project")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "project_exists", "a project with this id exists")
	}
	return nil
}

// UpdateProject writes p's name and retention.
func (t *tx) UpdateProject(ctx context.Context, p *vibejobs.Project) error {
	tag, err := t.q.Exec(ctx, `UPDATE projects SET name = $2, retention_days = $3 WHERE id = $1`, p.ID, p.Name, p.RetentionDays)
	if err != nil {
		return mapError(err, "updating a project")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("project")
	}
	return nil
}

// lockProject locks the project's row until the transaction ends, or gives
// ENOTFOUND; doing names the operation in an error. A capped creation
// (tokens, subscriptions) takes it first and counts in a later statement,
// whose snapshot sees every row committed before the lock was granted, so
// concurrent creations cannot pass the limit together. FOR NO KEY UPDATE
// leaves the foreign-key checks of other inserts free to go on.
func (t *tx) lockProject(ctx context.Context, projectID, doing string) error {
	var one int
	err := t.q.QueryRow(ctx, `SELECT 1 FROM projects WHERE id = $1 FOR NO KEY UPDATE`, projectID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return vibejobs.ErrNotFound("project")
	}
	return mapError(err, doing)
}

// CreateToken counts the project's live tokens under lockProject and
// refuses one past limit. An existing id or hash gives ECONFLICT, a missing
// project ENOTFOUND.
func (t *tx) CreateToken(ctx context.Context, tok *vibejobs.Token, limit int) error {
	if err := t.lockProject(ctx, tok.ProjectID, "creating a token"); err != nil {
		return err
	}
	var live int
	err := t.q.QueryRow(ctx, `SELECT count(*) FROM tokens WHERE project_id = $1 AND revoked_at IS NULL`,
		tok.ProjectID).Scan(&live)
	if err != nil {
		return mapError(err, "creating a token")
	}
	if live >= limit {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "too_many_tokens",
			"this project has reached its limit of %d live tokens; revoke one first", limit)
	}
	tag, err := t.q.Exec(ctx, `INSERT INTO tokens (id, project_id, name, role, installation, prefix, hash, created_at, revoked_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT DO NOTHING`,
		tok.ID, tok.ProjectID, tok.Name, string(tok.Role), tok.Installation, tok.Prefix, nonNil(tok.Hash), tok.CreatedAt, tok.RevokedAt)
	switch {
	case pgCode(err) == foreignKeyViolation:
		return vibejobs.ErrNotFound("project")
	case err != nil:
		return mapError(err, "creating a token")
	case tag.RowsAffected() == 0:
		return vibejobs.Errorf(vibejobs.ECONFLICT, "token_exists", "a token with this id or hash exists")
	}
	return nil
}

// RevokeToken marks the token revoked at at; a token revoked earlier keeps
// its first revocation time.
func (t *tx) RevokeToken(ctx context.Context, id string, at time.Time) error {
	tag, err := t.q.Exec(ctx, `UPDATE tokens SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1`, id, at)
	if err != nil {
		return mapError(err, "revoking a token")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("token")
	}
	return nil
}

// CreateJob inserts j; an existing id gives ECONFLICT, a missing project
// ENOTFOUND.
func (t *tx) CreateJob(ctx context.Context, j *vibejobs.Job) error {
	tag, err := t.q.Exec(ctx, `INSERT INTO jobs (id, project_id, name, schedule, at, timezone, url, enabled, state,
			max_attempts, min_backoff_ns, max_backoff_ns, timeout_ns, catch_up, schedule_anchor, next_run_at,
			skipped_runs, secret_key_id, secret_ciphertext, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
		ON CONFLICT DO NOTHING`,
		j.ID, j.ProjectID, j.Name, j.Schedule, j.At, j.Timezone, j.URL, j.Enabled, string(j.State),
		j.Retry.MaxAttempts, int64(j.Retry.MinBackoff), int64(j.Retry.MaxBackoff), int64(j.Timeout),
		string(j.CatchUp), j.ScheduleAnchor, j.NextRunAt, j.SkippedRuns, j.Secret.KeyID, nonNil(j.Secret.Ciphertext),
		j.CreatedAt, j.UpdatedAt)
	switch {
	case pgCode(err) == foreignKeyViolation:
		return vibejobs.ErrNotFound("project")
	case err != nil:
		return mapError(err, "creating a job")
	case tag.RowsAffected() == 0:
		return vibejobs.Errorf(vibejobs.ECONFLICT, "job_exists", "a job with this id exists")
	}
	t.addJobs(j.ProjectID, 1)
	return nil
}

// UpdateJob writes every mutable field of the live job j. When its delivery
// settings (URL, secret, timeout, retry policy) changed, it notifies
// JobsChannel at commit.
func (t *tx) UpdateJob(ctx context.Context, j *vibejobs.Job) error {
	var n int
	err := t.q.QueryRow(ctx, `WITH old AS (
			SELECT url, secret_key_id, secret_ciphertext, timeout_ns, max_attempts, min_backoff_ns, max_backoff_ns
			FROM jobs WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL
			FOR UPDATE
		), updated AS (
			UPDATE jobs j SET name = $3, schedule = $4, at = $5, timezone = $6, url = $7,
				enabled = $8, state = $9, max_attempts = $10, min_backoff_ns = $11, max_backoff_ns = $12,
				timeout_ns = $13, catch_up = $14, schedule_anchor = $15, next_run_at = $16,
				secret_key_id = $17, secret_ciphertext = $18, updated_at = $19
			FROM old
			WHERE j.id = $1
			RETURNING (old.url, old.secret_key_id, old.secret_ciphertext, old.timeout_ns, old.max_attempts,
				old.min_backoff_ns, old.max_backoff_ns) IS DISTINCT FROM (j.url, j.secret_key_id,
				j.secret_ciphertext, j.timeout_ns, j.max_attempts, j.min_backoff_ns, j.max_backoff_ns) AS changed
		)
		SELECT count(*), CASE WHEN bool_or(changed) THEN pg_notify($20, $21) END FROM updated`,
		j.ID, j.ProjectID, j.Name, j.Schedule, j.At, j.Timezone, j.URL, j.Enabled, string(j.State),
		j.Retry.MaxAttempts, int64(j.Retry.MinBackoff), int64(j.Retry.MaxBackoff), int64(j.Timeout),
		string(j.CatchUp), j.ScheduleAnchor, j.NextRunAt, j.Secret.KeyID, nonNil(j.Secret.Ciphertext), j.UpdatedAt,
		JobsChannel, t.s.jobPayload(j.ID)).Scan(&n, nil)
	if err != nil {
		return mapError(err, "updating a job")
	}
	if n == 0 {
		return vibejobs.ErrNotFound("job")
	}
	return nil
}

// DeleteJob marks the job deleted, cancels its waiting runs, and notifies
// JobsChannel at commit (replicas withdraw their claims of it). The job row
// is updated first: its row lock orders DeleteJob after (or before) a
// concurrent ApplyRunPlans or CreateRun, and the cancelling statement, with
// a fresh READ COMMITTED snapshot, then sees every run they committed.
//
// A run with an attempt in flight is left to the statement that ends the
// attempt (recording a retrying outcome, a release, a lease recovery),
// which cancels it instead of putting it back to wait. Each of those reads
// the job under a share lock, which conflicts with the update here: either
// it waits for the deletion to commit and then sees it (a locking read
// returns the latest version), or this update waits for it, and the
// cancelling statement then finds the run waiting. Read from a snapshot
// alone, a deletion committed in between was missed by both, and the run
// of the deleted job was sent again.
func (t *tx) DeleteJob(ctx context.Context, projectID, id string, at time.Time) error {
	tag, err := t.q.Exec(ctx, `UPDATE jobs SET deleted_at = $3 WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL`,
		id, projectID, at)
	if err != nil {
		return mapError(err, "deleting a job")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("job")
	}
	t.addJobs(projectID, -1)
	var n int
	// The runs to cancel are those whose deadline is not past: scheduled at
	// most DeliveryLifetime ago ($6), a range of runs_job_occurrence_idx,
	// not the whole history of the job (see vibejobs.Store.DeleteJob).
	// Each is locked, then its waiting queue row: a run whose row a claim
	// leased (or holds now, and then leases) is in flight, and left to the
	// statement that ends its attempt. The locked queue row is the version
	// this snapshot sees: another one would have needed the run's lock, or
	// the job's, to move it back to waiting (see requeueSQL).
	err = t.q.QueryRow(ctx, `WITH waiting AS (
		SELECT l.tid, lq.qtid FROM runs w
		CROSS JOIN LATERAL (
			SELECT r.ctid AS tid, r.id, r.next_attempt_at FROM runs r
			WHERE r.id = w.id AND r.state IN ('scheduled', 'retrying')
			FOR UPDATE) l
		CROSS JOIN LATERAL (
			SELECT q.ctid AS qtid FROM run_queue q WHERE `+waitingRowOf("l")+`
			FOR UPDATE) lq
		WHERE w.job_id = $1 AND w.scheduled_for >= $6 AND w.state IN ('scheduled', 'retrying')
	), cancelled AS (
		UPDATE runs r SET state = 'cancelled', failure_reason = $2, finished_at = $3,
			next_attempt_at = NULL, redeliver = false
		FROM waiting w WHERE r.ctid = w.tid AND r.ctid = ANY(ARRAY(SELECT tid FROM waiting))
		RETURNING r.id, r.project_id, r.job_id, r.attempt, w.qtid, r.next_attempt_at
	)`+requeueSQL("cancelled", "next_attempt_at")+`, ev AS (
		SELECT project_id, id AS ord, 'run.cancelled' AS type, $3::timestamptz AS occurred_at, job_id,
			id AS run_id, 'cancelled' AS state, $2::text AS reason, attempt, '' AS error_code, 0 AS status_code,
			NULL::timestamptz AS next_at
		FROM cancelled
	)`+appendEventsTail+`
	SELECT count(*), pg_notify($4, $5) FROM cancelled`,
		id, vibejobs.ReasonJobDeleted, at, JobsChannel, t.s.jobPayload(id), at.Add(-vibejobs.DeliveryLifetime)).Scan(&n, nil)
	if err != nil {
		return mapError(err, "cancelling the runs of a deleted job")
	}
	if t.ended == nil {
		t.ended = vibejobs.RunsEnded{}
	}
	t.ended.Add(vibejobs.RunCancelled, vibejobs.ReasonJobDeleted, n)
	return nil
}

// dequeue deletes the waiting run_queue rows of the runs ids, which this
// transaction has locked, with their queue rows, and taken out of the
// queue; dues are their queue keys (their due times before, nil for a run
// without one). It is a statement of its own: its snapshot, taken after
// the locks, sees the queue rows as they were locked.
func (t *tx) dequeue(ctx context.Context, ids []string, dues []*time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := t.q.Exec(ctx, `DELETE FROM run_queue WHERE ctid = ANY(ARRAY(
		SELECT q.ctid FROM unnest($1::text[], $2::timestamptz[]) AS d(run_id, due_at)
		JOIN run_queue q ON q.leased = false AND q.due_at = d.due_at AND q.run_id = d.run_id))`, ids, dues)
	return mapError(err, "dequeueing runs")
}

// futureRunSQL matches, in a statement on runs, the schedule-triggered runs
// of job $1 ($2 is vibejobs.TriggerSchedule) scheduled after $3 that wait in
// scheduled, held or not (a leased run keeps the state, see migration
// 00005), with no attempt recorded: DeleteFutureRuns's candidates.
const futureRunSQL = `job_id = $1 AND trigger = $2 AND scheduled_for > $3 AND state = 'scheduled'
	AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = runs.id)`

// DeleteFutureRuns deletes the job's schedule-triggered runs in scheduled,
// scheduled after after, that have no recorded attempt (never claimed, or
// claimed and released without being sent). Those some process holds
// (leased: their state column stays scheduled, see migration 00015) are
// marked withdrawn instead (see migration 00011), and JobsChannel is
// notified at commit so that every replica gives back its held ones.
//
// The runs are locked first, then the waiting queue rows of those not
// held, each in a statement of its own: a claim takes a run by its queue
// row alone, so the rows this transaction holds are the runs no claim can
// take before it ends, and the others are held. The marking and the
// deletion then go by that one list: each taking its own look at the
// queue, a run claimed between the two was unheld for the one and held
// for the other, neither marked nor deleted, and went out while its job
// was paused.
func (t *tx) DeleteFutureRuns(ctx context.Context, jobID string, after time.Time) (int, error) {
	if _, err := t.q.Exec(ctx, `SELECT 1 FROM runs WHERE `+futureRunSQL+` FOR UPDATE`,
		jobID, vibejobs.TriggerSchedule, after); err != nil {
		return 0, mapError(err, "locking future runs")
	}
	var unheld []string
	if err := t.q.QueryRow(ctx, `SELECT COALESCE(array_agg(runs.id), '{}') FROM runs CROSS JOIN LATERAL (
			SELECT 1 FROM run_queue q WHERE `+waitingRowOf("runs")+`
			FOR UPDATE) lq
		WHERE `+futureRunSQL, jobID, vibejobs.TriggerSchedule, after).Scan(&unheld); err != nil {
		return 0, mapError(err, "locking the queue rows of future runs")
	}
	if _, err := t.q.Exec(ctx, `WITH marked AS (
			UPDATE runs SET withdrawn = true
			WHERE `+futureRunSQL+` AND NOT (id = ANY($6::text[])) AND NOT withdrawn
			RETURNING 1
		)
		SELECT CASE WHEN count(*) > 0 THEN pg_notify($4, $5) END FROM marked`,
		jobID, vibejobs.TriggerSchedule, after, JobsChannel, t.s.jobPayload(jobID), unheld); err != nil {
		return 0, mapError(err, "withdrawing held future runs")
	}
	if len(unheld) == 0 {
		return 0, nil
	}
	rows, err := t.q.Query(ctx, `DELETE FROM runs WHERE id = ANY($1::text[]) RETURNING id, next_attempt_at`, unheld)
	if err != nil {
		return 0, mapError(err, "deleting future runs")
	}
	var (
		ids  []string
		dues []*time.Time
		id   string
		due  *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &due}, func() error {
		ids, dues = append(ids, id), append(dues, due)
		return nil
	})
	if err != nil {
		return 0, mapError(err, "deleting future runs")
	}
	return len(ids), t.dequeue(ctx, ids, dues)
}

// AddSkippedRuns adds n to the skipped occurrences of the live job id of
// projectID, to the row as stored: what ApplyRunPlans added is kept.
func (t *tx) AddSkippedRuns(ctx context.Context, projectID, id string, n int64) error {
	tag, err := t.q.Exec(ctx, `UPDATE jobs SET skipped_runs = skipped_runs + $3
		WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL`, id, projectID, n)
	if err != nil {
		return mapError(err, "adding skipped runs")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("job")
	}
	return nil
}

// CreateRun inserts run for its live job: ENOTFOUND when the job is deleted
// or of another project, ECONFLICT for a second schedule-triggered run of one
// occurrence (a manual run is never merged). It share-locks the job row, so
// a concurrent DeleteJob either sees this run and cancels it or is seen here
// first. Late is decided by the first claim unless run already has an attempt.
func (t *tx) CreateRun(ctx context.Context, run *vibejobs.Run) error {
	if err := run.CheckDue(); err != nil {
		return err
	}
	var jobs, created int
	err := t.q.QueryRow(ctx, `WITH job AS (
			SELECT id FROM jobs WHERE id = $2 AND project_id = $3 AND deleted_at IS NULL FOR SHARE
		), ins AS (
			INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, occurrence_at, deadline_at, late,
				late_decided, state, attempt, next_attempt_at, failure_reason, created_at, finished_at)
			SELECT $1, job.id, $3, $4, $5, CASE WHEN $4 = 'schedule' THEN $5::timestamptz END, $6, $7,
				$8, $9, $10, $11, $12, $13, $14
			FROM job
			ON CONFLICT DO NOTHING
			RETURNING id, state, next_attempt_at, deadline_at
		)`+enqueueSQL("ins")+`
		SELECT (SELECT count(*) FROM job), (SELECT count(*) FROM ins)`,
		run.ID, run.JobID, run.ProjectID, run.Trigger, run.ScheduledFor, run.DeadlineAt, run.Late,
		run.Attempt > 0, string(run.State), run.Attempt, run.NextAttemptAt, run.FailureReason, run.CreatedAt,
		run.FinishedAt).Scan(&jobs, &created)
	switch {
	case err != nil:
		return mapError(err, "creating a run")
	case jobs == 0:
		return vibejobs.ErrNotFound("job")
	case created == 0:
		return vibejobs.Errorf(vibejobs.ECONFLICT, "run_exists", "a run with this id or occurrence exists")
	}
	if run.State == vibejobs.RunScheduled || run.State == vibejobs.RunRetrying {
		return t.notify(ctx)
	}
	return nil
}

// InsertIdempotencyKey stores rec, replacing an expired record of the same
// key (expired as of rec.CreatedAt); a live one gives ECONFLICT and leaves
// the transaction usable. The claim's age counts from the database
// server's clock now (claimed_at), whatever rec.CreatedAt says.
func (t *tx) InsertIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	headers, err := encodeHeaders(rec.ResponseHeaders)
	if err != nil {
		return err
	}
	tag, err := t.q.Exec(ctx, `INSERT INTO idempotency_keys AS k (project_id, key, request_hash, done, response_status,
			response_headers, response_body, created_at, expires_at, claimed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, clock_timestamp())
		ON CONFLICT (project_id, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, done = EXCLUDED.done,
			response_status = EXCLUDED.response_status, response_headers = EXCLUDED.response_headers,
			response_body = EXCLUDED.response_body, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
			claimed_at = EXCLUDED.claimed_at
		WHERE k.expires_at <= EXCLUDED.created_at`,
		rec.ProjectID, rec.Key, nonNil(rec.RequestHash), rec.Done, rec.ResponseStatus, headers, rec.ResponseBody,
		rec.CreatedAt, rec.ExpiresAt)
	if pgCode(err) == foreignKeyViolation {
		return vibejobs.ErrNotFound("project")
	}
	if err != nil {
		return mapError(err, "inserting an idempotency key")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "idempotency_key_exists", "a live record of this idempotency key exists")
	}
	return nil
}

// CompleteIdempotencyKey stores rec's response and marks it done, while the
// record is still the claim in progress made at rec.CreatedAt.
func (t *tx) CompleteIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	headers, err := encodeHeaders(rec.ResponseHeaders)
	if err != nil {
		return err
	}
	tag, err := t.q.Exec(ctx, `UPDATE idempotency_keys SET done = true, response_status = $3, response_headers = $4,
			response_body = $5
		WHERE project_id = $1 AND key = $2 AND created_at = $6 AND NOT done`,
		rec.ProjectID, rec.Key, rec.ResponseStatus, headers, rec.ResponseBody, rec.CreatedAt)
	if err != nil {
		return mapError(err, "completing an idempotency key")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	rec.Done = true
	return nil
}

// CompletedIdempotencyKeys lists completed records after (afterProject,
// afterKey), in key order.
func (t *tx) CompletedIdempotencyKeys(ctx context.Context, afterProject, afterKey string, limit int) ([]*vibejobs.IdempotencyRecord, error) {
	rows, err := t.q.Query(ctx, `SELECT `+idempotencyColumns+`
		FROM idempotency_keys WHERE done AND (project_id, key) > ($1, $2)
		ORDER BY project_id, key LIMIT $3`, afterProject, afterKey, limit)
	if err != nil {
		return nil, mapError(err, "listing idempotency keys")
	}
	recs, err := collect(rows, scanIdempotencyRecord)
	return recs, mapError(err, "listing idempotency keys")
}

// SetIdempotencyAnswer replaces the answer of the completed record of rec's
// claim.
func (t *tx) SetIdempotencyAnswer(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	headers, err := encodeHeaders(rec.ResponseHeaders)
	if err != nil {
		return err
	}
	tag, err := t.q.Exec(ctx, `UPDATE idempotency_keys SET response_headers = $3, response_body = $4
		WHERE project_id = $1 AND key = $2 AND created_at = $5 AND done`,
		rec.ProjectID, rec.Key, headers, rec.ResponseBody, rec.CreatedAt)
	if err != nil {
		return mapError(err, "replacing an idempotency answer")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	return nil
}

// DeleteIdempotencyKey deletes the claim of key made at createdAt while it
// is in progress, or answers ENOTFOUND. A delete that waited for a
// completing transaction rechecks the row once that commits, and leaves the
// completed record alone.
func (t *tx) DeleteIdempotencyKey(ctx context.Context, projectID, key string, createdAt time.Time) error {
	tag, err := t.q.Exec(ctx, `DELETE FROM idempotency_keys
		WHERE project_id = $1 AND key = $2 AND created_at = $3 AND NOT done`,
		projectID, key, createdAt)
	if err != nil {
		return mapError(err, "deleting an idempotency key")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	return nil
}

// encodeHeaders stores nil as {} (read back as an empty map, like SQLite).
func encodeHeaders(h map[string]string) ([]byte, error) {
	if h == nil {
		return []byte("{}"), nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("postgres: encoding response headers: %w", err)
	}
	return b, nil
}

// SecretsNotUnder lists up to limit jobs, deleted ones included, whose
// secret is sealed under another key than keyID, in id order (without
// LastRun).
func (t *tx) SecretsNotUnder(ctx context.Context, keyID string, limit int) ([]*vibejobs.Job, error) {
	// Locked: the caller re-seals and writes the secret back in this
	// transaction, and a secret rotated through the API meanwhile must not
	// be written over with the one read before (a locking read returns the
	// version that rotation committed).
	rows, err := t.q.Query(ctx, `SELECT `+jobColumns+` FROM jobs j`+noLastRun+`
		WHERE j.secret_key_id <> $1 ORDER BY j.id LIMIT $2 FOR UPDATE OF j`, keyID, limit)
	if err != nil {
		return nil, mapError(err, "listing secrets to re-seal")
	}
	jobs, err := collect(rows, scanJob)
	return jobs, mapError(err, "listing secrets to re-seal")
}

// SetJobSecret replaces the sealed secret of the job, deleted or not.
func (t *tx) SetJobSecret(ctx context.Context, jobID string, s vibejobs.SealedSecret) error {
	tag, err := t.q.Exec(ctx, `UPDATE jobs SET secret_key_id = $2, secret_ciphertext = $3 WHERE id = $1`,
		jobID, s.KeyID, nonNil(s.Ciphertext))
	if err != nil {
		return mapError(err, "setting a job secret")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("job")
	}
	return nil
}

// RecordMasterKey records keyID unless a master key is recorded, and
// returns the recorded one. An insert racing another waits for it to commit
// and then does nothing; the SELECT, a later statement, sees the winner.
func (t *tx) RecordMasterKey(ctx context.Context, keyID string) (string, error) {
	if _, err := t.q.Exec(ctx, `INSERT INTO master_key (key_id) VALUES ($1) ON CONFLICT DO NOTHING`, keyID); err != nil {
		return "", mapError(err, "recording the master key")
	}
	var id string
	err := t.q.QueryRow(ctx, `SELECT key_id FROM master_key`).Scan(&id)
	return id, mapError(err, "reading the master key")
}

// SetMasterKey records keyID as the master key.
func (t *tx) SetMasterKey(ctx context.Context, keyID string) error {
	_, err := t.q.Exec(ctx, `INSERT INTO master_key (key_id) VALUES ($1)
		ON CONFLICT (singleton) DO UPDATE SET key_id = excluded.key_id`, keyID)
	return mapError(err, "recording the master key")
}

// nonNil makes a nil slice an empty bytea (pgx sends a nil slice as NULL).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
