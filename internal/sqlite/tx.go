package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/vibejobs/vibejobs"
)

// tx is a vibejobs.Tx: a write transaction on the write connection.
type tx struct {
	reader
	t wtx
}

// changed returns the rows res changed.
func changed(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t *tx) CreateProject(ctx context.Context, p *vibejobs.Project) error {
	_, err := t.t.ExecContext(ctx, `INSERT INTO projects (id, name, retention_days, created_at) VALUES (?, ?, ?, ?)`,
		p.ID, p.Name, p.RetentionDays, ms(p.CreatedAt))
	if isUniqueViolation(err) {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "project_exists", "a project with this id exists")
	}
	if err != nil {
		return fmt.Errorf("creating project: %w", err)
	}
	return nil
}

func (t *tx) UpdateProject(ctx context.Context, p *vibejobs.Project) error {
	n, err := changed(t.t.ExecContext(ctx, `UPDATE projects SET name = ?, retention_days = ? WHERE id = ?`,
		p.Name, p.RetentionDays, p.ID))
	if err != nil {
		return fmt.Errorf("updating project: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("project")
	}
	return nil
}

// CreateToken counts and inserts under the single writer, so the limit
// holds against concurrent creations.
func (t *tx) CreateToken(ctx context.Context, tok *vibejobs.Token, limit int) error {
	var live int
	err := t.t.QueryRowContext(ctx, `SELECT count(*) FROM tokens WHERE project_id = ? AND revoked_at IS NULL`,
		tok.ProjectID).Scan(&live)
	if err != nil {
		return fmt.Errorf("creating token: %w", err)
	}
	if live >= limit {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "too_many_tokens",
			"this project has reached its limit of %d live tokens; revoke one first", limit)
	}
	_, err = t.t.ExecContext(ctx, `INSERT INTO tokens (`+tokenColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		tok.ID, tok.ProjectID, tok.Name, string(tok.Role), tok.Installation, tok.Prefix, nonNil(tok.Hash),
		ms(tok.CreatedAt), msPtr(tok.RevokedAt))
	switch {
	case isUniqueViolation(err):
		return vibejobs.Errorf(vibejobs.ECONFLICT, "token_exists", "a token with this id or hash exists")
	case isForeignKeyViolation(err):
		return vibejobs.ErrNotFound("project")
	case err != nil:
		return fmt.Errorf("creating token: %w", err)
	}
	return nil
}

// RevokeToken sets the token's RevokedAt; a token already revoked keeps its
// first revocation time.
func (t *tx) RevokeToken(ctx context.Context, id string, at time.Time) error {
	n, err := changed(t.t.ExecContext(ctx, `UPDATE tokens SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, ms(at), id))
	if err != nil {
		return fmt.Errorf("revoking token: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("token")
	}
	return nil
}

func (t *tx) CreateJob(ctx context.Context, j *vibejobs.Job) error {
	_, err := t.t.ExecContext(ctx, `INSERT INTO jobs (id, project_id, name, schedule, at, timezone, url, enabled, state,
		max_attempts, min_backoff_ns, max_backoff_ns, timeout_ns, catch_up, schedule_anchor, next_run_at, skipped_runs,
		secret_key_id, secret_ciphertext, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		j.ID, j.ProjectID, j.Name, j.Schedule, msPtr(j.At), j.Timezone, j.URL, j.Enabled, string(j.State),
		j.Retry.MaxAttempts, int64(j.Retry.MinBackoff), int64(j.Retry.MaxBackoff), int64(j.Timeout), string(j.CatchUp),
		ms(j.ScheduleAnchor), msPtr(j.NextRunAt), j.SkippedRuns, j.Secret.KeyID, nonNil(j.Secret.Ciphertext),
		ms(j.CreatedAt), ms(j.UpdatedAt))
	switch {
	case isUniqueViolation(err):
		return vibejobs.Errorf(vibejobs.ECONFLICT, "job_exists", "a job with this id exists")
	case isForeignKeyViolation(err):
		return vibejobs.ErrNotFound("project")
	case err != nil:
		return fmt.Errorf("creating job: %w", err)
	}
	return t.addJobs(ctx, j.ProjectID, 1)
}

// addJobs adds n (or removes -n) live jobs to projectID's count.
func (t *tx) addJobs(ctx context.Context, projectID string, n int) error {
	_, err := t.t.ExecContext(ctx, `INSERT INTO project_job_counts (project_id, live_jobs) VALUES (?, ?)
		ON CONFLICT (project_id) DO UPDATE SET live_jobs = live_jobs + excluded.live_jobs`, projectID, n)
	if err != nil {
		return fmt.Errorf("counting jobs: %w", err)
	}
	return nil
}

func (t *tx) UpdateJob(ctx context.Context, j *vibejobs.Job) error {
	n, err := changed(t.t.ExecContext(ctx, `UPDATE jobs SET name = ?, schedule = ?, at = ?, timezone = ?, url = ?,
		enabled = ?, state = ?, max_attempts = ?, min_backoff_ns = ?, max_backoff_ns = ?, timeout_ns = ?, catch_up = ?,
		schedule_anchor = ?, next_run_at = ?, secret_key_id = ?, secret_ciphertext = ?, updated_at = ?
		WHERE id = ? AND project_id = ? AND deleted_at IS NULL`,
		j.Name, j.Schedule, msPtr(j.At), j.Timezone, j.URL,
		j.Enabled, string(j.State), j.Retry.MaxAttempts, int64(j.Retry.MinBackoff), int64(j.Retry.MaxBackoff), int64(j.Timeout), string(j.CatchUp),
		ms(j.ScheduleAnchor), msPtr(j.NextRunAt), j.Secret.KeyID, nonNil(j.Secret.Ciphertext), ms(j.UpdatedAt),
		j.ID, j.ProjectID))
	if err != nil {
		return fmt.Errorf("updating job: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("job")
	}
	return nil
}

// cancelJobRunsSQL cancels the waiting runs of a deleted job whose deadline
// is not past (see vibejobs.Store.DeleteJob): those scheduled at most
// DeliveryLifetime before, found by (job_id, scheduled_for) in the
// occurrence key, not among the whole history of the job.
const cancelJobRunsSQL = `UPDATE runs SET state = 'cancelled', failure_reason = ?, finished_at = ?,
	next_attempt_at = NULL, redeliver = 0
	WHERE job_id = ? AND scheduled_for >= ? AND state IN ('scheduled', 'retrying')
	RETURNING ` + runEventColumns

// DeleteJob marks the job deleted (its row stays, so its runs remain visible)
// and cancels its runs waiting in scheduled or retrying whose deadline is not
// past at, finished at at (see cancelJobRunsSQL).
func (t *tx) DeleteJob(ctx context.Context, projectID, id string, at time.Time) error {
	n, err := changed(t.t.ExecContext(ctx,
		`UPDATE jobs SET deleted_at = ? WHERE id = ? AND project_id = ? AND deleted_at IS NULL`, ms(at), id, projectID))
	if err != nil {
		return fmt.Errorf("deleting job: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("job")
	}
	if err := t.addJobs(ctx, projectID, -1); err != nil {
		return err
	}
	rows, err := t.t.QueryContext(ctx, cancelJobRunsSQL, vibejobs.ReasonJobDeleted, ms(at), id, ms(at.Add(-vibejobs.DeliveryLifetime)))
	if err != nil {
		return fmt.Errorf("deleting job: cancelling its runs: %w", err)
	}
	events, err := scanRunEvents(rows, at, "")
	if err != nil {
		return fmt.Errorf("deleting job: cancelling its runs: %w", err)
	}
	return appendEvents(ctx, t.t, events)
}

// futureRunSQL matches, in a statement on runs, the schedule-triggered runs
// of job ?1 (?3 is vibejobs.TriggerSchedule) scheduled after ?2 with no
// attempt recorded: DeleteFutureRuns's candidates, held or not.
const futureRunSQL = `job_id = ?1 AND scheduled_for > ?2 AND trigger = ?3
	AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_seq = runs.seq)`

// DeleteFutureRuns deletes the job's schedule-triggered runs in scheduled
// after t that have no recorded attempt (never claimed, or claimed and
// released without being sent). Those held (delivering, no attempt
// recorded) are marked withdrawn instead, for ReleaseClaims to delete.
func (t *tx) DeleteFutureRuns(ctx context.Context, jobID string, after time.Time) (int, error) {
	if _, err := t.t.ExecContext(ctx, `UPDATE runs SET withdrawn = 1
		WHERE `+futureRunSQL+` AND state = 'delivering' AND attempt <= 1 AND withdrawn = 0`,
		jobID, ms(after), vibejobs.TriggerSchedule); err != nil {
		return 0, fmt.Errorf("withdrawing held future runs: %w", err)
	}
	n, err := changed(t.t.ExecContext(ctx, `DELETE FROM runs WHERE `+futureRunSQL+` AND state = 'scheduled'`,
		jobID, ms(after), vibejobs.TriggerSchedule))
	if err != nil {
		return 0, fmt.Errorf("deleting future runs: %w", err)
	}
	return int(n), nil
}

// AddSkippedRuns adds n to the skipped occurrences of the live job id of
// projectID.
func (t *tx) AddSkippedRuns(ctx context.Context, projectID, id string, n int64) error {
	changedRows, err := changed(t.t.ExecContext(ctx, `UPDATE jobs SET skipped_runs = skipped_runs + ?
		WHERE id = ? AND project_id = ? AND deleted_at IS NULL`, n, id, projectID))
	if err != nil {
		return fmt.Errorf("adding skipped runs: %w", err)
	}
	if changedRows == 0 {
		return vibejobs.ErrNotFound("job")
	}
	return nil
}

// insertRunSQL inserts a run; a schedule-triggered run that exists for its
// (job, scheduledFor) is skipped.
const insertRunSQL = `INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, occurrence, deadline_at,
	late, state, attempt, next_attempt_at, failure_reason, created_at, finished_at)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

func insertRunArgs(r *vibejobs.Run) []any {
	var occurrence, late any
	if r.Trigger == vibejobs.TriggerSchedule {
		occurrence = 1
	}
	if r.Attempt > 0 {
		late = r.Late // decided already; otherwise the first claim decides
	}
	return []any{r.ID, r.JobID, r.ProjectID, r.Trigger, ms(r.ScheduledFor), occurrence, ms(r.DeadlineAt),
		late, string(r.State), r.Attempt, msPtr(r.NextAttemptAt), r.FailureReason, ms(r.CreatedAt), msPtr(r.FinishedAt)}
}

// CreateRun inserts r for its live job: ENOTFOUND when the job is deleted
// or of another project than r's (the foreign key checks the job's id
// only, and a run of one project naming another's job would show that job
// to the run's project). A manual run is never merged; a
// schedule-triggered one that exists for its (job, scheduledFor) gives
// ECONFLICT. Late is decided by the first claim unless r already has an
// attempt.
func (t *tx) CreateRun(ctx context.Context, r *vibejobs.Run) error {
	if err := r.CheckDue(); err != nil {
		return err
	}
	// The single writer keeps the job as read here until the insert.
	var live int
	err := t.t.QueryRowContext(ctx, `SELECT count(*) FROM jobs WHERE id = ? AND project_id = ? AND deleted_at IS NULL`,
		r.JobID, r.ProjectID).Scan(&live)
	if err != nil {
		return fmt.Errorf("creating run: %w", err)
	}
	if live == 0 {
		return vibejobs.ErrNotFound("job")
	}
	_, err = t.t.ExecContext(ctx, insertRunSQL, insertRunArgs(r)...)
	switch {
	case isUniqueViolation(err):
		return vibejobs.Errorf(vibejobs.ECONFLICT, "run_exists", "a run with this id or occurrence exists")
	case err != nil:
		return fmt.Errorf("creating run: %w", err)
	}
	return nil
}

func (t *tx) InsertIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	headers, err := encodeHeaders(rec.ResponseHeaders)
	if err != nil {
		return err
	}
	// An expired record (expires_at ≤ the new record's creation) is replaced;
	// a live one makes the upsert change nothing.
	n, err := changed(t.t.ExecContext(ctx, `INSERT INTO idempotency_keys (project_id, key, request_hash, done,
		response_status, response_headers, response_body, created_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (project_id, key) DO UPDATE SET request_hash = excluded.request_hash, done = excluded.done,
			response_status = excluded.response_status, response_headers = excluded.response_headers,
			response_body = excluded.response_body, created_at = excluded.created_at, expires_at = excluded.expires_at
		WHERE idempotency_keys.expires_at <= excluded.created_at`,
		rec.ProjectID, rec.Key, nonNil(rec.RequestHash), rec.Done, rec.ResponseStatus, headers, rec.ResponseBody,
		ms(rec.CreatedAt), ms(rec.ExpiresAt)))
	switch {
	case isForeignKeyViolation(err):
		return vibejobs.ErrNotFound("project")
	case err != nil:
		return fmt.Errorf("inserting idempotency key: %w", err)
	case n == 0:
		return vibejobs.Errorf(vibejobs.ECONFLICT, "idempotency_key_exists", "a live record of this idempotency key exists")
	}
	return nil
}

func (t *tx) CompleteIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	headers, err := encodeHeaders(rec.ResponseHeaders)
	if err != nil {
		return err
	}
	n, err := changed(t.t.ExecContext(ctx, `UPDATE idempotency_keys SET done = 1, response_status = ?,
		response_headers = ?, response_body = ?
		WHERE project_id = ? AND key = ? AND created_at = ? AND done = 0`,
		rec.ResponseStatus, headers, rec.ResponseBody, rec.ProjectID, rec.Key, ms(rec.CreatedAt)))
	if err != nil {
		return fmt.Errorf("completing idempotency key: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	rec.Done = true
	return nil
}

// CompletedIdempotencyKeys lists completed records after (afterProject,
// afterKey), in key order.
func (t *tx) CompletedIdempotencyKeys(ctx context.Context, afterProject, afterKey string, limit int) ([]*vibejobs.IdempotencyRecord, error) {
	rows, err := t.t.QueryContext(ctx, `SELECT `+idempotencyColumns+`
		FROM idempotency_keys WHERE done AND (project_id, key) > (?, ?)
		ORDER BY project_id, key LIMIT ?`, afterProject, afterKey, limit)
	if err != nil {
		return nil, fmt.Errorf("listing idempotency keys: %w", err)
	}
	defer rows.Close()
	var recs []*vibejobs.IdempotencyRecord
	for rows.Next() {
		rec, err := scanIdempotencyRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("listing idempotency keys: %w", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing idempotency keys: %w", err)
	}
	return recs, nil
}

// SetIdempotencyAnswer replaces the answer of the completed record of rec's
// claim.
func (t *tx) SetIdempotencyAnswer(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	headers, err := encodeHeaders(rec.ResponseHeaders)
	if err != nil {
		return err
	}
	n, err := changed(t.t.ExecContext(ctx, `UPDATE idempotency_keys SET response_headers = ?, response_body = ?
		WHERE project_id = ? AND key = ? AND created_at = ? AND done`,
		headers, rec.ResponseBody, rec.ProjectID, rec.Key, ms(rec.CreatedAt)))
	if err != nil {
		return fmt.Errorf("replacing an idempotency answer: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	return nil
}

func (t *tx) DeleteIdempotencyKey(ctx context.Context, projectID, key string, createdAt time.Time) error {
	n, err := changed(t.t.ExecContext(ctx, `DELETE FROM idempotency_keys
		WHERE project_id = ? AND key = ? AND created_at = ? AND NOT done`,
		projectID, key, ms(createdAt)))
	if err != nil {
		return fmt.Errorf("deleting idempotency key: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	return nil
}

func encodeHeaders(h map[string]string) (string, error) {
	if h == nil {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("encoding idempotency response headers: %w", err)
	}
	return string(b), nil
}

// SecretsNotUnder returns up to limit jobs, deleted ones included, in id
// order, whose secret is sealed under another key than keyID. LastRun is not
// filled.
func (t *tx) SecretsNotUnder(ctx context.Context, keyID string, limit int) ([]*vibejobs.Job, error) {
	rows, err := t.t.QueryContext(ctx, `SELECT `+jobColumns+` FROM jobs j WHERE j.secret_key_id <> ? ORDER BY j.id LIMIT ?`,
		keyID, limit)
	if err != nil {
		return nil, fmt.Errorf("listing secrets to reseal: %w", err)
	}
	defer rows.Close()
	var jobs []*vibejobs.Job
	for rows.Next() {
		j, err := scanJob(rows, false)
		if err != nil {
			return nil, fmt.Errorf("listing secrets to reseal: %w", err)
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing secrets to reseal: %w", err)
	}
	return jobs, nil
}

// SetJobSecret replaces the sealed secret of a job, deleted or not; it leaves
// UpdatedAt alone (a key rotation is no change of the job).
func (t *tx) SetJobSecret(ctx context.Context, jobID string, s vibejobs.SealedSecret) error {
	n, err := changed(t.t.ExecContext(ctx, `UPDATE jobs SET secret_key_id = ?, secret_ciphertext = ? WHERE id = ?`,
		s.KeyID, nonNil(s.Ciphertext), jobID))
	if err != nil {
		return fmt.Errorf("setting job secret: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("job")
	}
	return nil
}

// RecordMasterKey records keyID unless a master key is recorded, and
// returns the recorded one (SQLite has one writer at a time).
func (t *tx) RecordMasterKey(ctx context.Context, keyID string) (string, error) {
	if _, err := t.t.ExecContext(ctx, `INSERT INTO master_key (singleton, key_id) VALUES (1, ?) ON CONFLICT DO NOTHING`, keyID); err != nil {
		return "", fmt.Errorf("recording the master key: %w", err)
	}
	var id string
	if err := t.t.QueryRowContext(ctx, `SELECT key_id FROM master_key`).Scan(&id); err != nil {
		return "", fmt.Errorf("reading the master key: %w", err)
	}
	return id, nil
}

// SetMasterKey records keyID as the master key.
func (t *tx) SetMasterKey(ctx context.Context, keyID string) error {
	if _, err := t.t.ExecContext(ctx, `INSERT INTO master_key (singleton, key_id) VALUES (1, ?)
		ON CONFLICT (singleton) DO UPDATE SET key_id = excluded.key_id`, keyID); err != nil {
		return fmt.Errorf("recording the master key: %w", err)
	}
	return nil
}

// nonNil makes a nil slice an empty BLOB (a nil one binds NULL).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
