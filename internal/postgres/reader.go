package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/vibejobs/vibejobs"
)

// querier is what reads and writes need: a pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// rowScanner is a pgx.Row or pgx.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// reader implements vibejobs.Reader on a pool (Store) or a transaction (tx).
type reader struct {
	q   querier
	now func() time.Time
}

const projectColumns = `id, name, retention_days, created_at`

func scanProject(row rowScanner) (*vibejobs.Project, error) {
	var p vibejobs.Project
	if err := row.Scan(&p.ID, &p.Name, &p.RetentionDays, &p.CreatedAt); err != nil {
		return nil, err
	}
	return &p, nil
}

// GetProject returns the project id, or ENOTFOUND.
func (r reader) GetProject(ctx context.Context, id string) (*vibejobs.Project, error) {
	p, err := scanProject(r.q.QueryRow(ctx, `SELECT `+projectColumns+` FROM projects WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("project")
	}
	return p, mapError(err, "reading a project")
}

// ListProjects returns a page of the projects in id (creation) order.
func (r reader) ListProjects(ctx context.Context, p vibejobs.Page) ([]*vibejobs.Project, string, error) {
	limit, err := pageLimit(p)
	if err != nil {
		return nil, "", err
	}
	after, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, "", err
	}
	rows, err := r.q.Query(ctx, `SELECT `+projectColumns+` FROM projects WHERE id > $1 ORDER BY id LIMIT $2`,
		after, limit+1)
	return listPage(rows, err, limit, "listing projects", scanProject, func(v *vibejobs.Project) string { return v.ID })
}

const tokenColumns = `id, project_id, name, role, installation, prefix, hash, created_at, revoked_at`

func scanToken(row rowScanner) (*vibejobs.Token, error) {
	var t vibejobs.Token
	var role string
	if err := row.Scan(&t.ID, &t.ProjectID, &t.Name, &role, &t.Installation, &t.Prefix, &t.Hash, &t.CreatedAt, &t.RevokedAt); err != nil {
		return nil, err
	}
	t.Role = vibejobs.Role(role)
	return &t, nil
}

// TokenByHash returns a token, revoked or not, by the SHA-256 of its value.
func (r reader) TokenByHash(ctx context.Context, hash []byte) (*vibejobs.Token, error) {
	t, err := scanToken(r.q.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("token")
	}
	return t, mapError(err, "reading a token by hash")
}

// ListTokens returns a page of projectID's tokens, revoked ones included,
// in id order.
func (r reader) ListTokens(ctx context.Context, projectID string, p vibejobs.Page) ([]*vibejobs.Token, string, error) {
	limit, err := pageLimit(p)
	if err != nil {
		return nil, "", err
	}
	after, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, "", err
	}
	rows, err := r.q.Query(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE project_id = $1 AND id > $2
		ORDER BY id LIMIT $3`, projectID, after, limit+1)
	return listPage(rows, err, limit, "listing tokens", scanToken, func(v *vibejobs.Token) string { return v.ID })
}

// GetToken returns the token id, or ENOTFOUND.
func (r reader) GetToken(ctx context.Context, id string) (*vibejobs.Token, error) {
	t, err := scanToken(r.q.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("token")
	}
	return t, mapError(err, "reading a token")
}

// jobColumns are read from jobs j with the last run lr (see lastRunJoin, or
// noLastRun where the last run is not wanted).
const jobColumns = `j.id, j.project_id, j.name, j.schedule, j.at, j.timezone, j.url, j.enabled, j.state,
	j.max_attempts, j.min_backoff_ns, j.max_backoff_ns, j.timeout_ns, j.catch_up, j.schedule_anchor,
	j.next_run_at, j.skipped_runs, j.secret_key_id, j.secret_ciphertext, j.created_at, j.updated_at,
	lr.id, lr.state, lr.scheduled_for`

// lastRunJoin reads the job's last run (see the package doc).
var lastRunJoin = ` LEFT JOIN LATERAL (
	SELECT r.id, ` + runState + ` AS state, r.scheduled_for FROM runs r
	WHERE r.job_id = j.id AND (r.attempt > 0 OR r.finished_at IS NOT NULL OR ` + runHeld + `)
	ORDER BY r.scheduled_for DESC, r.id DESC
	LIMIT 1) lr ON true`

const noLastRun = ` CROSS JOIN (SELECT NULL::text AS id, NULL::text AS state, NULL::timestamptz AS scheduled_for) lr`

func scanJob(row rowScanner) (*vibejobs.Job, error) {
	var (
		j                               vibejobs.Job
		state, catchUp                  string
		minBackoff, maxBackoff, timeout int64
		lastID, lastState               *string
		lastScheduledFor                *time.Time
	)
	err := row.Scan(&j.ID, &j.ProjectID, &j.Name, &j.Schedule, &j.At, &j.Timezone, &j.URL, &j.Enabled, &state,
		&j.Retry.MaxAttempts, &minBackoff, &maxBackoff, &timeout, &catchUp, &j.ScheduleAnchor,
		&j.NextRunAt, &j.SkippedRuns, &j.Secret.KeyID, &j.Secret.Ciphertext, &j.CreatedAt, &j.UpdatedAt,
		&lastID, &lastState, &lastScheduledFor)
	if err != nil {
		return nil, err
	}
	j.State = vibejobs.JobState(state)
	j.CatchUp = vibejobs.CatchUp(catchUp)
	j.Retry.MinBackoff = time.Duration(minBackoff)
	j.Retry.MaxBackoff = time.Duration(maxBackoff)
	j.Timeout = time.Duration(timeout)
	if lastID != nil {
		j.LastRun = &vibejobs.RunRef{ID: *lastID, State: vibejobs.RunState(*lastState), ScheduledFor: *lastScheduledFor}
	}
	return &j, nil
}

// GetJob returns the live job id of projectID with its last run, or ENOTFOUND.
func (r reader) GetJob(ctx context.Context, projectID, id string) (*vibejobs.Job, error) {
	return r.getJob(ctx, projectID, id, "")
}

// getJob is GetJob; lock, when set, is a locking clause for the job's row.
func (r reader) getJob(ctx context.Context, projectID, id, lock string) (*vibejobs.Job, error) {
	j, err := scanJob(r.q.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs j`+lastRunJoin+`
		WHERE j.id = $1 AND j.project_id = $2 AND j.deleted_at IS NULL`+lock, id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("job")
	}
	return j, mapError(err, "reading a job")
}

// ListJobs returns a page of projectID's live jobs in id order, with their last runs.
func (r reader) ListJobs(ctx context.Context, projectID string, p vibejobs.Page) ([]*vibejobs.Job, string, error) {
	limit, err := pageLimit(p)
	if err != nil {
		return nil, "", err
	}
	after, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, "", err
	}
	rows, err := r.q.Query(ctx, `SELECT `+jobColumns+` FROM jobs j`+lastRunJoin+`
		WHERE j.project_id = $1 AND j.deleted_at IS NULL AND j.id > $2
		ORDER BY j.id LIMIT $3`, projectID, after, limit+1)
	return listPage(rows, err, limit, "listing jobs", scanJob, func(v *vibejobs.Job) string { return v.ID })
}

// CountJobs returns the number of projectID's live jobs (committed ones;
// see project_job_counts).
func (r reader) CountJobs(ctx context.Context, projectID string) (int, error) {
	var n int
	err := r.q.QueryRow(ctx, `SELECT coalesce((SELECT live_jobs FROM project_job_counts WHERE project_id = $1), 0)`,
		projectID).Scan(&n)
	return n, mapError(err, "counting jobs")
}

// runHeld says run r is delivering: it waits in scheduled or retrying with
// a due time, and its queue row is leased (see migration 00015), so the
// row it would have while waiting, keyed (false, next_attempt_at, id), is
// not there.
var runHeld = `(r.state IN ('scheduled', 'retrying') AND r.next_attempt_at IS NOT NULL
	AND NOT EXISTS (SELECT 1 FROM run_queue q WHERE ` + waitingRowOf("r") + `))`

// runState is the state of run r as readers see it: a run under a lease is
// delivering, though its state column keeps the waiting state it was
// claimed from (see migration 00005).
var runState = `CASE WHEN ` + runHeld + ` THEN 'delivering' ELSE r.state END`

// runLate is run r's lateness as readers see it: while a first attempt is
// in flight, the claim decided it (see claimSQL) but only the outcome writes
// it, so it is decided again here from the claim time, which the leased
// queue row keeps (see migration 00015). The lookup walks the leases (the
// key leads with leased), as many as attempts are in flight, and only for a
// run held before its lateness was decided.
var runLate = `CASE WHEN ` + runHeld + ` THEN COALESCE(` +
	lateSQL(`(SELECT q.due_at FROM run_queue q WHERE q.leased = true AND q.run_id = r.id)`) +
	`, false) ELSE r.late END`

// runColumns are read from runs r; a delivering run has no NextAttemptAt,
// and its attempt and lateness are the ones in flight (see claimSQL).
var runColumns = `r.id, r.job_id, r.project_id, r.trigger, r.scheduled_for, r.deadline_at, ` + runLate + `,
	` + runState + `,
	CASE WHEN ` + runHeld + ` THEN ` + sentAttemptSQL + ` ELSE r.attempt END,
	CASE WHEN NOT ` + runHeld + ` THEN r.next_attempt_at END, r.failure_reason, r.created_at,
	r.finished_at`

func scanRun(row rowScanner, extra ...any) (*vibejobs.Run, error) {
	var run vibejobs.Run
	var state string
	dest := append([]any{&run.ID, &run.JobID, &run.ProjectID, &run.Trigger, &run.ScheduledFor, &run.DeadlineAt,
		&run.Late, &state, &run.Attempt, &run.NextAttemptAt, &run.FailureReason, &run.CreatedAt, &run.FinishedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	run.State = vibejobs.RunState(state)
	return &run, nil
}

// GetRun returns the run id of projectID with its attempts in the order they
// were recorded, or ENOTFOUND. Runs of deleted jobs stay readable.
func (r reader) GetRun(ctx context.Context, projectID, id string) (*vibejobs.Run, error) {
	run, err := scanRun(r.q.QueryRow(ctx, `SELECT `+runColumns+` FROM runs r WHERE r.id = $1 AND r.project_id = $2`, id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("run")
	}
	if err != nil {
		return nil, mapError(err, "reading a run")
	}
	rows, err := r.q.Query(ctx, `SELECT number, started_at, finished_at, status_code, error_code, signature_timestamp, response_snippet
		FROM attempts WHERE run_id = $1 ORDER BY seq`, id)
	if err != nil {
		return nil, mapError(err, "reading attempts")
	}
	run.Attempts, err = collect(rows, func(row rowScanner) (vibejobs.Attempt, error) {
		var a vibejobs.Attempt
		var snippet []byte
		err := row.Scan(&a.Number, &a.StartedAt, &a.FinishedAt, &a.StatusCode, &a.ErrorCode, &a.SignatureTimestamp, &snippet)
		a.ResponseSnippet = string(snippet)
		return a, err
	})
	if err != nil {
		return nil, mapError(err, "reading attempts")
	}
	if run.Attempts == nil {
		run.Attempts = []vibejobs.Attempt{}
	}
	return run, nil
}

// ListRuns returns a page of projectID's runs newest (highest id) first,
// without attempts. A filter on a job of another project finds nothing.
func (r reader) ListRuns(ctx context.Context, projectID string, f vibejobs.RunFilter, p vibejobs.Page) ([]*vibejobs.Run, string, error) {
	limit, err := pageLimit(p)
	if err != nil {
		return nil, "", err
	}
	before, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, "", err
	}
	// The statement is built per filter combination (a few shapes, each
	// prepared once) so the planner picks the index that fits each.
	var sb strings.Builder
	args := []any{projectID}
	sb.WriteString(`SELECT ` + runColumns + ` FROM runs r WHERE r.project_id = $1`)
	if f.JobID != "" {
		args = append(args, f.JobID)
		sb.WriteString(` AND r.job_id = $` + strconv.Itoa(len(args)))
	}
	switch f.State {
	case "":
	case vibejobs.RunDelivering:
		sb.WriteString(` AND ` + runHeld)
	case vibejobs.RunScheduled, vibejobs.RunRetrying:
		args = append(args, string(f.State))
		sb.WriteString(` AND r.state = $` + strconv.Itoa(len(args)) + ` AND NOT ` + runHeld)
	default:
		args = append(args, string(f.State))
		sb.WriteString(` AND r.state = $` + strconv.Itoa(len(args)))
	}
	if before != "" {
		args = append(args, before)
		sb.WriteString(` AND r.id < $` + strconv.Itoa(len(args)))
	}
	args = append(args, limit+1)
	sb.WriteString(` ORDER BY r.id DESC LIMIT $` + strconv.Itoa(len(args)))
	rows, err := r.q.Query(ctx, sb.String(), args...)
	return listPage(rows, err, limit, "listing runs", func(row rowScanner) (*vibejobs.Run, error) { return scanRun(row) }, func(v *vibejobs.Run) string { return v.ID })
}

// GetIdempotencyKey returns the live record of key, or ENOTFOUND when there
// is none or it expired (ExpiresAt ≤ now). Its Age is the database
// server's clock now less claimed_at, which InsertIdempotencyKey set from
// the same clock: now, the calling replica's clock, plays no part in it.
func (r reader) GetIdempotencyKey(ctx context.Context, projectID, key string, now time.Time) (*vibejobs.IdempotencyRecord, error) {
	var ageMicros int64
	rec, err := scanIdempotencyRow(r.q.QueryRow(ctx, `SELECT `+idempotencyColumns+`,
			(extract(epoch FROM clock_timestamp() - claimed_at) * 1000000)::bigint
		FROM idempotency_keys WHERE project_id = $1 AND key = $2 AND expires_at > $3`, projectID, key, now), &ageMicros)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("idempotency_key")
	}
	if err != nil {
		return nil, mapError(err, "reading an idempotency key")
	}
	rec.Age = time.Duration(ageMicros) * time.Microsecond
	return rec, nil
}

// idempotencyColumns are the columns scanIdempotencyRecord reads.
const idempotencyColumns = `project_id, key, request_hash, done, response_status, response_headers,
	response_body, created_at, expires_at`

func scanIdempotencyRecord(row rowScanner) (*vibejobs.IdempotencyRecord, error) {
	return scanIdempotencyRow(row)
}

// scanIdempotencyRow scans idempotencyColumns and then the columns of extra.
func scanIdempotencyRow(row rowScanner, extra ...any) (*vibejobs.IdempotencyRecord, error) {
	var (
		rec     vibejobs.IdempotencyRecord
		headers []byte
	)
	dest := append([]any{&rec.ProjectID, &rec.Key, &rec.RequestHash, &rec.Done, &rec.ResponseStatus, &headers,
		&rec.ResponseBody, &rec.CreatedAt, &rec.ExpiresAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(headers, &rec.ResponseHeaders); err != nil {
		return nil, fmt.Errorf("postgres: decoding the stored response headers: %w", err)
	}
	return &rec, nil
}

// collect scans every row with scan and closes rows.
// listPage reads a page of a list ordered by id (either way) from rows, the
// answer of a query asking for limit+1 rows (or its error err): the first
// limit, scanned with scan, and the cursor of the next page, from id of the
// last of them, or "" when this is the last page. what names the list in
// errors.
func listPage[T any](rows pgx.Rows, err error, limit int, what string, scan func(rowScanner) (T, error), id func(T) string) ([]T, string, error) {
	if err != nil {
		return nil, "", mapError(err, what)
	}
	items, err := collect(rows, scan)
	if err != nil {
		return nil, "", mapError(err, what)
	}
	var next string
	if len(items) > limit {
		items = items[:limit]
		next = encodeCursor(id(items[limit-1]))
	}
	return items, next, nil
}

func collect[T any](rows pgx.Rows, scan func(rowScanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
