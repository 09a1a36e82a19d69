package sqlite

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vibejobs/vibejobs"
)

// reader implements vibejobs.Reader on the reader pool or inside a write
// transaction.
type reader struct {
	q querier
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface {
	Scan(dest ...any) error
}

func (r reader) GetProject(ctx context.Context, id string) (*vibejobs.Project, error) {
	p, err := scanProject(r.q.QueryRowContext(ctx,
		`SELECT id, name, retention_days, created_at FROM projects WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("project")
	}
	if err != nil {
		return nil, fmt.Errorf("getting project: %w", err)
	}
	return p, nil
}

// ListProjects returns a page of the projects in id order.
func (r reader) ListProjects(ctx context.Context, p vibejobs.Page) ([]*vibejobs.Project, string, error) {
	limit, after, err := parsePage(p)
	if err != nil {
		return nil, "", err
	}
	rows, err := r.q.QueryContext(ctx, `SELECT id, name, retention_days, created_at FROM projects WHERE id > ?
		ORDER BY id LIMIT ?`, after, limit+1)
	return listPage(rows, err, limit, "listing projects", scanProject, func(v *vibejobs.Project) string { return v.ID })
}

func scanProject(sc scanner) (*vibejobs.Project, error) {
	var p vibejobs.Project
	var created int64
	if err := sc.Scan(&p.ID, &p.Name, &p.RetentionDays, &created); err != nil {
		return nil, err
	}
	p.CreatedAt = fromMS(created)
	return &p, nil
}

const tokenColumns = `id, project_id, name, role, installation, prefix, hash, created_at, revoked_at`

func scanToken(sc scanner) (*vibejobs.Token, error) {
	var t vibejobs.Token
	var created int64
	var revoked sql.NullInt64
	if err := sc.Scan(&t.ID, &t.ProjectID, &t.Name, &t.Role, &t.Installation, &t.Prefix, &t.Hash, &created, &revoked); err != nil {
		return nil, err
	}
	t.CreatedAt = fromMS(created)
	t.RevokedAt = fromNullMS(revoked)
	return &t, nil
}

func (r reader) getToken(ctx context.Context, where string, arg any) (*vibejobs.Token, error) {
	t, err := scanToken(r.q.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE `+where, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("token")
	}
	if err != nil {
		return nil, fmt.Errorf("getting token: %w", err)
	}
	return t, nil
}

func (r reader) TokenByHash(ctx context.Context, hash []byte) (*vibejobs.Token, error) {
	return r.getToken(ctx, `hash = ?`, hash)
}

func (r reader) GetToken(ctx context.Context, id string) (*vibejobs.Token, error) {
	return r.getToken(ctx, `id = ?`, id)
}

// ListTokens returns a page of projectID's tokens, revoked ones included,
// in id order.
func (r reader) ListTokens(ctx context.Context, projectID string, p vibejobs.Page) ([]*vibejobs.Token, string, error) {
	limit, after, err := parsePage(p)
	if err != nil {
		return nil, "", err
	}
	rows, err := r.q.QueryContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE project_id = ? AND id > ?
		ORDER BY id LIMIT ?`, projectID, after, limit+1)
	return listPage(rows, err, limit, "listing tokens", scanToken, func(v *vibejobs.Token) string { return v.ID })
}

// jobColumns are the columns scanJob reads, prefixed by the alias j.
const jobColumns = `j.id, j.project_id, j.name, j.schedule, j.at, j.timezone, j.url, j.enabled, j.state,
	j.max_attempts, j.min_backoff_ns, j.max_backoff_ns, j.timeout_ns, j.catch_up, j.schedule_anchor,
	j.next_run_at, j.skipped_runs, j.secret_key_id, j.secret_ciphertext, j.created_at, j.updated_at`

// jobWithLastRun selects a job and its last run: among the job's runs that
// have started an attempt or finished, the one with the latest scheduledFor
// (ties by id). Runs materialised ahead of time and not yet started are not
// shown, so lastRun never points into the future.
const jobWithLastRun = `SELECT ` + jobColumns + `, lr.id, lr.state, lr.scheduled_for
	FROM jobs j
	LEFT JOIN runs lr ON lr.seq = (
		SELECT r.seq FROM runs r
		WHERE r.job_id = j.id AND (r.attempt > 0 OR r.finished_at IS NOT NULL)
		ORDER BY r.scheduled_for DESC, r.id DESC LIMIT 1)`

func scanJob(sc scanner, withLastRun bool) (*vibejobs.Job, error) {
	var j vibejobs.Job
	var at, next sql.NullInt64
	var minB, maxB, timeout, anchor, created, updated int64
	dest := []any{&j.ID, &j.ProjectID, &j.Name, &j.Schedule, &at, &j.Timezone, &j.URL, &j.Enabled, &j.State,
		&j.Retry.MaxAttempts, &minB, &maxB, &timeout, &j.CatchUp, &anchor,
		&next, &j.SkippedRuns, &j.Secret.KeyID, &j.Secret.Ciphertext, &created, &updated}
	var lrID, lrState sql.NullString
	var lrScheduled sql.NullInt64
	if withLastRun {
		dest = append(dest, &lrID, &lrState, &lrScheduled)
	}
	if err := sc.Scan(dest...); err != nil {
		return nil, err
	}
	j.At = fromNullMS(at)
	j.NextRunAt = fromNullMS(next)
	j.Retry.MinBackoff = time.Duration(minB)
	j.Retry.MaxBackoff = time.Duration(maxB)
	j.Timeout = time.Duration(timeout)
	j.ScheduleAnchor = fromMS(anchor)
	j.CreatedAt = fromMS(created)
	j.UpdatedAt = fromMS(updated)
	if lrID.Valid {
		j.LastRun = &vibejobs.RunRef{ID: lrID.String, State: vibejobs.RunState(lrState.String), ScheduledFor: fromMS(lrScheduled.Int64)}
	}
	return &j, nil
}

func (r reader) GetJob(ctx context.Context, projectID, id string) (*vibejobs.Job, error) {
	j, err := scanJob(r.q.QueryRowContext(ctx,
		jobWithLastRun+` WHERE j.id = ? AND j.project_id = ? AND j.deleted_at IS NULL`, id, projectID), true)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("job")
	}
	if err != nil {
		return nil, fmt.Errorf("getting job: %w", err)
	}
	return j, nil
}

func (r reader) ListJobs(ctx context.Context, projectID string, p vibejobs.Page) ([]*vibejobs.Job, string, error) {
	limit, after, err := parsePage(p)
	if err != nil {
		return nil, "", err
	}
	q := jobWithLastRun + ` WHERE j.project_id = ? AND j.deleted_at IS NULL`
	args := []any{projectID}
	if after != "" {
		q += ` AND j.id > ?`
		args = append(args, after)
	}
	q += ` ORDER BY j.id LIMIT ?`
	args = append(args, limit+1)
	rows, err := r.q.QueryContext(ctx, q, args...)
	return listPage(rows, err, limit, "listing jobs", func(sc scanner) (*vibejobs.Job, error) { return scanJob(sc, true) }, func(v *vibejobs.Job) string { return v.ID })
}

func (r reader) CountJobs(ctx context.Context, projectID string) (int, error) {
	var n int
	err := r.q.QueryRowContext(ctx,
		`SELECT coalesce((SELECT live_jobs FROM project_job_counts WHERE project_id = ?), 0)`, projectID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting jobs: %w", err)
	}
	return n, nil
}

const runColumns = `id, job_id, project_id, trigger, scheduled_for, deadline_at, late, state, attempt,
	next_attempt_at, failure_reason, created_at, finished_at`

func scanRun(sc scanner) (*vibejobs.Run, error) {
	var run vibejobs.Run
	var scheduled, deadline, created int64
	var late sql.NullBool
	var next, finished sql.NullInt64
	if err := sc.Scan(&run.ID, &run.JobID, &run.ProjectID, &run.Trigger, &scheduled, &deadline, &late, &run.State,
		&run.Attempt, &next, &run.FailureReason, &created, &finished); err != nil {
		return nil, err
	}
	run.ScheduledFor = fromMS(scheduled)
	run.DeadlineAt = fromMS(deadline)
	run.Late = late.Valid && late.Bool
	run.NextAttemptAt = fromNullMS(next)
	run.CreatedAt = fromMS(created)
	run.FinishedAt = fromNullMS(finished)
	return &run, nil
}

func (r reader) GetRun(ctx context.Context, projectID, id string) (*vibejobs.Run, error) {
	run, err := scanRun(r.q.QueryRowContext(ctx,
		`SELECT `+runColumns+` FROM runs WHERE id = ? AND project_id = ?`, id, projectID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("run")
	}
	if err != nil {
		return nil, fmt.Errorf("getting run: %w", err)
	}
	rows, err := r.q.QueryContext(ctx, `SELECT number, started_at, finished_at, status_code, error_code,
		signature_timestamp, response_snippet FROM attempts
		WHERE run_seq = (SELECT seq FROM runs WHERE id = ?) ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("getting attempts of run: %w", err)
	}
	defer rows.Close()
	run.Attempts = []vibejobs.Attempt{}
	for rows.Next() {
		var a vibejobs.Attempt
		var started, finished int64
		if err := rows.Scan(&a.Number, &started, &finished, &a.StatusCode, &a.ErrorCode,
			&a.SignatureTimestamp, &a.ResponseSnippet); err != nil {
			return nil, fmt.Errorf("getting attempts of run: %w", err)
		}
		a.StartedAt = fromMS(started)
		a.FinishedAt = fromMS(finished)
		run.Attempts = append(run.Attempts, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("getting attempts of run: %w", err)
	}
	return run, nil
}

func (r reader) ListRuns(ctx context.Context, projectID string, f vibejobs.RunFilter, p vibejobs.Page) ([]*vibejobs.Run, string, error) {
	limit, before, err := parsePage(p)
	if err != nil {
		return nil, "", err
	}
	var q strings.Builder
	q.WriteString(`SELECT ` + runColumns + ` FROM runs WHERE project_id = ?`)
	args := []any{projectID}
	if f.JobID != "" {
		q.WriteString(` AND job_id = ?`)
		args = append(args, f.JobID)
	}
	if f.State != "" {
		q.WriteString(` AND state = ?`)
		args = append(args, string(f.State))
	}
	if before != "" {
		q.WriteString(` AND id < ?`)
		args = append(args, before)
	}
	q.WriteString(` ORDER BY id DESC LIMIT ?`)
	args = append(args, limit+1)
	rows, err := r.q.QueryContext(ctx, q.String(), args...)
	return listPage(rows, err, limit, "listing runs", scanRun, func(v *vibejobs.Run) string { return v.ID })
}

// GetIdempotencyKey returns the live record of key, or ENOTFOUND when there
// is none or it expired (ExpiresAt ≤ now). Its Age is now less CreatedAt:
// every writer of a SQLite file runs on one machine, so both were read
// from one clock.
func (r reader) GetIdempotencyKey(ctx context.Context, projectID, key string, now time.Time) (*vibejobs.IdempotencyRecord, error) {
	rec, err := scanIdempotencyRecord(r.q.QueryRowContext(ctx, `SELECT `+idempotencyColumns+`
		FROM idempotency_keys WHERE project_id = ? AND key = ? AND expires_at > ?`, projectID, key, ms(now)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("idempotency_key")
	}
	if err != nil {
		return nil, fmt.Errorf("getting idempotency key: %w", err)
	}
	rec.Age = now.Sub(rec.CreatedAt)
	return rec, nil
}

// idempotencyColumns are the columns scanIdempotencyRecord reads.
const idempotencyColumns = `project_id, key, request_hash, done, response_status, response_headers,
	response_body, created_at, expires_at`

func scanIdempotencyRecord(row scanner) (*vibejobs.IdempotencyRecord, error) {
	var (
		rec              vibejobs.IdempotencyRecord
		headers          string
		created, expires int64
	)
	if err := row.Scan(&rec.ProjectID, &rec.Key, &rec.RequestHash, &rec.Done, &rec.ResponseStatus, &headers,
		&rec.ResponseBody, &created, &expires); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(headers), &rec.ResponseHeaders); err != nil {
		return nil, fmt.Errorf("decoding headers: %w", err)
	}
	rec.CreatedAt, rec.ExpiresAt = fromMS(created), fromMS(expires)
	return &rec, nil
}

// Page limits.
const (
	defaultLimit = 50
	maxLimit     = 100
)

// parsePage validates p and returns its limit and the id its cursor points
// after ("" for the first page).
func parsePage(p vibejobs.Page) (limit int, id string, err error) {
	limit = p.Limit
	if limit == 0 {
		limit = defaultLimit
	}
	if limit < 1 || limit > maxLimit {
		return 0, "", vibejobs.FieldError("invalid_limit", "limit", "limit must be between 1 and %d", maxLimit)
	}
	if p.Cursor == "" {
		return limit, "", nil
	}
	id, ok := decodeCursor(p.Cursor)
	if !ok {
		return 0, "", vibejobs.FieldError("invalid_cursor", "cursor", "cursor is not one this API returned")
	}
	return limit, id, nil
}

// listPage reads a page of a list ordered by id (either way) from rows, the
// answer of a query asking for limit+1 rows (or its error err): the first
// limit, scanned with scan, and the cursor of the next page, from id of the
// last of them, or "" when this is the last page. what names the list in
// errors.
func listPage[T any](rows *sql.Rows, err error, limit int, what string, scan func(scanner) (T, error), id func(T) string) ([]T, string, error) {
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	items := make([]T, 0, limit)
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", what, err)
		}
		items = append(items, v)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("%s: %w", what, err)
	}
	var next string
	if len(items) > limit {
		items = items[:limit]
		next = encodeCursor(id(items[limit-1]))
	}
	return items, next, nil
}

// A cursor is the unpadded base64url of the last id of the previous page.
func encodeCursor(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

func decodeCursor(c string) (string, bool) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(c)
	if err != nil || len(b) == 0 || len(b) > 128 {
		return "", false
	}
	for _, ch := range b {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '-') {
			return "", false
		}
	}
	return string(b), true
}
