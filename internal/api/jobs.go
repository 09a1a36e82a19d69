package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/listcursor"
	"github.com/vibejobs/vibejobs/internal/schedule"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// jobJSON is the wire form of a job. It never holds the secret; see jobWithSecret.
type jobJSON struct {
	ID          string      `json:"id"`
	Name        string      `json:"name"`
	Schedule    *string     `json:"schedule"`
	At          *apiTime    `json:"at"`
	Timezone    string      `json:"timezone"`
	URL         string      `json:"url"`
	Enabled     bool        `json:"enabled"`
	State       string      `json:"state"`
	Retry       retryJSON   `json:"retry"`
	Timeout     string      `json:"timeout"`
	CatchUp     string      `json:"catchUp"`
	NextRunAt   *apiTime    `json:"nextRunAt"`
	LastRun     *runRefJSON `json:"lastRun"`
	SkippedRuns int64       `json:"skippedRuns"`
	CreatedAt   apiTime     `json:"createdAt"`
	UpdatedAt   apiTime     `json:"updatedAt"`
}

// jobWithSecret is the answer of create and rotate-secret: the only two
// answers that carry a job's secret.
type jobWithSecret struct {
	jobJSON
	Secret string `json:"secret"`
}

type retryJSON struct {
	MaxAttempts int    `json:"maxAttempts"`
	MinBackoff  string `json:"minBackoff"`
	MaxBackoff  string `json:"maxBackoff"`
}

type runRefJSON struct {
	ID           string  `json:"id"`
	State        string  `json:"state"`
	ScheduledFor apiTime `json:"scheduledFor"`
}

func jobView(j *vibejobs.Job) jobJSON {
	v := jobJSON{
		ID:       j.ID,
		Name:     j.Name,
		At:       timePtr(j.At),
		Timezone: j.Timezone,
		URL:      j.URL,
		Enabled:  j.Enabled,
		State:    string(j.State),
		Retry: retryJSON{
			MaxAttempts: j.Retry.MaxAttempts,
			MinBackoff:  formatDuration(j.Retry.MinBackoff),
			MaxBackoff:  formatDuration(j.Retry.MaxBackoff),
		},
		Timeout:     formatDuration(j.Timeout),
		CatchUp:     string(j.CatchUp),
		NextRunAt:   timePtr(j.NextRunAt),
		SkippedRuns: j.SkippedRuns,
		CreatedAt:   apiTime(j.CreatedAt),
		UpdatedAt:   apiTime(j.UpdatedAt),
	}
	if j.At == nil {
		sch := j.Schedule
		v.Schedule = &sch
	}
	if j.LastRun != nil {
		v.LastRun = &runRefJSON{ID: j.LastRun.ID, State: string(j.LastRun.State), ScheduledFor: apiTime(j.LastRun.ScheduledFor)}
	}
	return v
}

type jobListJSON struct {
	Jobs       []jobJSON `json:"jobs"`
	NextCursor *string   `json:"nextCursor"`
}

// nextJSON is the preview of a job's next fire times. Times are its
// schedule's, whatever its state; State is the job's, and WillRun is false
// while it is paused: none of the times runs then, and those that pass
// before a resume are skipped for good.
type nextJSON struct {
	JobID   string    `json:"jobId"`
	State   string    `json:"state"`
	WillRun bool      `json:"willRun"`
	Times   []apiTime `json:"times"`
}

func errJobCompleted() *vibejobs.Error {
	return &vibejobs.Error{Kind: vibejobs.ECONFLICT, Code: "job_completed", Field: "enabled",
		Message: "this one-off job has run; give it a new at (or a schedule) to run it again"}
}

// jobSchedule is the schedule a job follows now.
func jobSchedule(j *vibejobs.Job) (schedule.Schedule, error) {
	if j.At != nil {
		return schedule.At(*j.At), nil
	}
	return schedule.Parse(j.Schedule, j.Timezone, j.ScheduleAnchor)
}

// plan sets a job's state and NextRunAt after it was created or changed at
// now. before is the job as it was (nil when creating); changed says that its
// schedule, time zone or at changed. It reports whether runs materialised
// ahead of time are withdrawn (a pause or a schedule change): the caller
// deletes them after writing the job, since the write locks the job row and
// only then can no scheduler add runs behind the delete.
func plan(j, before *vibejobs.Job, changed bool, now time.Time) (withdraw bool, err error) {
	if changed {
		// The change takes effect from the next occurrence after now;
		// @every counts from here.
		j.ScheduleAnchor = now
	}
	// A one-off job is completed once its run is created, up to the
	// scheduler's lookahead before its instant; until that instant it has
	// not run, and a pause withdraws the run like any occurrence ahead.
	ranOut := before != nil && before.State == vibejobs.JobCompleted &&
		!(before.At != nil && before.At.After(now) && before.Enabled && !j.Enabled)
	if ranOut && !changed {
		// A one-off job that has run stays completed; only a new at (or a
		// schedule) revives it. Disabling it changes nothing else.
		if j.Enabled && !before.Enabled {
			return false, errJobCompleted()
		}
		return false, nil
	}
	withdraw = before != nil && before.Enabled && (!j.Enabled || changed)
	if !j.Enabled {
		j.State, j.NextRunAt = vibejobs.JobPaused, nil
		return withdraw, nil
	}
	if before != nil && before.Enabled && before.State == vibejobs.JobActive && !changed {
		return withdraw, nil // running on as it was
	}
	// Created, resumed or rescheduled: the next occurrence after now
	// (occurrences while paused are skipped for good).
	sch, err := jobSchedule(j)
	if err != nil {
		return false, err
	}
	j.State, j.NextRunAt = vibejobs.JobActive, nil
	if next := sch.Next(now); !next.IsZero() {
		next = next.UTC()
		j.NextRunAt = &next
	} else if j.At != nil {
		// A one-off whose instant passed while it was paused.
		j.State = vibejobs.JobCompleted
	}
	return withdraw, nil
}

func (s *Server) createJob(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	in, e := parseJobInput(c.body)
	if e != nil {
		return nil, e
	}
	j, secret, err := s.insertJob(ctx, c, tx, in)
	if err != nil {
		return nil, err
	}
	if err := tx.AppendEvents(ctx, vibejobs.JobEvent(vibejobs.EventJobCreated, j, c.now)); err != nil {
		return nil, err
	}
	if err := s.checkJobLimit(ctx, c, tx); err != nil {
		return nil, err
	}
	c.info.job, c.wake = j.ID, true
	return jsonResponse(http.StatusCreated, jobWithSecret{jobView(j), secret}).with("Location", "/v1/jobs/"+j.ID), nil
}

// checkJobLimit refuses the transaction's new jobs when they take the
// project beyond its limit; the caller's effect then rolls back. It is
// called once the jobs are inserted and their job.created events appended:
// appending takes the project's feed counter until the transaction ends, so
// the transactions that add or delete a project's jobs pass this point one
// at a time, and each counts the jobs of those before it. Checked before
// the inserts, two requests at once on PostgreSQL each saw room for one
// and both committed.
func (s *Server) checkJobLimit(ctx context.Context, c *call, tx vibejobs.Tx) error {
	have, err := tx.CountJobs(ctx, c.projectID()) // this transaction's jobs included
	if err != nil {
		return err
	}
	if have > s.maxJobs {
		return &vibejobs.Error{Kind: vibejobs.ECONFLICT, Code: "too_many_jobs",
			Message: "this project has reached its limit of " + strconv.Itoa(s.maxJobs) + " jobs; delete some first"}
	}
	return nil
}

// insertJob validates in, seals a fresh secret and inserts the job; it
// returns the job and its secret in clear (for the answer only).
func (s *Server) insertJob(ctx context.Context, c *call, tx vibejobs.Tx, in *jobInput) (*vibejobs.Job, string, error) {
	j := newJobDefaults(c.projectID())
	if _, e := s.applyJobInput(j, in, c.now, true); e != nil {
		return nil, "", e
	}
	j.ID = vibejobs.NewID("job_", c.now, s.rand)
	secret, err := contract.NewSecret(s.rand)
	if err != nil {
		return nil, "", err
	}
	if j.Secret, err = s.sealer.Seal(secret, j.ID); err != nil {
		return nil, "", err
	}
	j.CreatedAt, j.UpdatedAt = c.now, c.now
	if _, err := plan(j, nil, true, c.now); err != nil {
		return nil, "", err
	}
	if err := tx.CreateJob(ctx, j); err != nil {
		return nil, "", err
	}
	return j, secret, nil
}

func (s *Server) getJob(ctx context.Context, c *call) (*response, error) {
	id := c.r.PathValue("id")
	c.info.job = loggedID(id, "job_")
	j, err := s.store.GetJob(ctx, c.projectID(), id)
	if err != nil {
		return nil, err
	}
	return jsonResponse(http.StatusOK, jobView(j)), nil
}

func (s *Server) listJobs(ctx context.Context, c *call) (*response, error) {
	p, e := pageOf(c.r.URL.Query())
	if e != nil {
		return nil, e
	}
	sc := listcursor.Scope{Kind: listcursor.Jobs, ProjectID: c.projectID()}
	if err := s.openCursor(ctx, &p, sc); err != nil {
		return nil, err
	}
	jobs, next, err := s.store.ListJobs(ctx, c.projectID(), p)
	if err != nil {
		return nil, err
	}
	out := jobListJSON{Jobs: make([]jobJSON, 0, len(jobs)), NextCursor: boundCursor(next, sc)}
	for _, j := range jobs {
		out.Jobs = append(out.Jobs, jobView(j))
	}
	return jsonResponse(http.StatusOK, out), nil
}

// changeJob reads job id, lets change alter it, and writes it back with its
// state and next run planned, in one transaction, with its events:
// job.updated when a setting changed, job.paused or job.resumed when it was
// disabled or enabled (a request that changes nothing appends nothing). It
// answers the job as stored.
func (s *Server) changeJob(ctx context.Context, c *call, tx vibejobs.Tx, change func(j *vibejobs.Job) (changed bool, e *vibejobs.Error)) (*vibejobs.Job, error) {
	id := c.r.PathValue("id")
	c.info.job = loggedID(id, "job_")
	j, err := tx.GetJob(ctx, c.projectID(), id)
	if err != nil {
		return nil, err
	}
	before := *j
	changed, e := change(j)
	if e != nil {
		return nil, e
	}
	withdraw, err := plan(j, &before, changed, c.now)
	if err != nil {
		return nil, err
	}
	j.UpdatedAt = c.now
	if err := tx.UpdateJob(ctx, j); err != nil {
		return nil, err
	}
	if j.URL != before.URL || j.Timeout != before.Timeout || j.Retry != before.Retry {
		c.changedJob = j.ID
	}
	if withdraw {
		if _, err := tx.DeleteFutureRuns(ctx, j.ID, c.now); err != nil {
			return nil, err
		}
		// The runs held ahead of their time are the holders' to give back
		// (see vibejobs.Tx.DeleteFutureRuns).
		c.changedJob = j.ID
		// The occurrences before now that the scheduler, behind, had not
		// reached are skipped for good: counted, as catch-up counts those
		// it skips.
		if n := scheduler.Unplanned(&before, c.now); n > 0 {
			if err := tx.AddSkippedRuns(ctx, c.projectID(), j.ID, n); err != nil {
				return nil, err
			}
			c.skipped = n
		}
	}
	var events []*vibejobs.Event
	if settingsChanged(&before, j) {
		events = append(events, vibejobs.JobEvent(vibejobs.EventJobUpdated, j, c.now))
	}
	switch {
	case before.Enabled && !j.Enabled:
		events = append(events, vibejobs.JobEvent(vibejobs.EventJobPaused, j, c.now))
	case !before.Enabled && j.Enabled:
		events = append(events, vibejobs.JobEvent(vibejobs.EventJobResumed, j, c.now))
	}
	if err := tx.AppendEvents(ctx, events...); err != nil {
		return nil, err
	}
	c.wake = true
	return tx.GetJob(ctx, c.projectID(), id)
}

// settingsChanged reports whether a setting of the job other than enabled
// differs between a and b.
func settingsChanged(a, b *vibejobs.Job) bool {
	return a.Name != b.Name || a.Schedule != b.Schedule || !sameTime(a.At, b.At) || a.Timezone != b.Timezone ||
		a.URL != b.URL || a.Retry != b.Retry || a.Timeout != b.Timeout || a.CatchUp != b.CatchUp
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func (s *Server) patchJob(ctx context.Context, c *call) (*response, error) {
	in, e := parseJobInput(c.body)
	if e != nil {
		return nil, e
	}
	var out *vibejobs.Job
	err := s.update(ctx, func(tx vibejobs.Tx) error {
		// What an attempt rolled back and run again noted is not this
		// attempt's (as idempotent does for the other effects).
		c.dropEffects()
		j, err := s.changeJob(ctx, c, tx, func(j *vibejobs.Job) (bool, *vibejobs.Error) {
			wasCompleted := j.State == vibejobs.JobCompleted
			changed, e := s.applyJobInput(j, in, c.now, false)
			if e == nil && wasCompleted && !changed && in.enabled != nil && *in.enabled {
				e = errJobCompleted()
			}
			return changed, e
		})
		out = j
		return err
	})
	if err != nil {
		return nil, err
	}
	return jsonResponse(http.StatusOK, jobView(out)), nil
}

func (s *Server) setEnabled(enabled bool) func(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	return func(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
		if e := decodeEmpty(c.body); e != nil {
			return nil, e
		}
		j, err := s.changeJob(ctx, c, tx, func(j *vibejobs.Job) (bool, *vibejobs.Error) {
			if enabled && j.State == vibejobs.JobCompleted {
				return false, errJobCompleted()
			}
			j.Enabled = enabled
			return false, nil
		})
		if err != nil {
			return nil, err
		}
		return jsonResponse(http.StatusOK, jobView(j)), nil
	}
}

func (s *Server) pauseJob(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	return s.setEnabled(false)(ctx, c, tx)
}

func (s *Server) resumeJob(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	return s.setEnabled(true)(ctx, c, tx)
}

func (s *Server) deleteJob(ctx context.Context, c *call) (*response, error) {
	id := c.r.PathValue("id")
	c.info.job = loggedID(id, "job_")
	err := s.update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.DeleteJob(ctx, c.projectID(), id, c.now); err != nil {
			return err
		}
		gone := &vibejobs.Job{ID: id, ProjectID: c.projectID()}
		return tx.AppendEvents(ctx, vibejobs.JobEvent(vibejobs.EventJobDeleted, gone, c.now))
	})
	if err != nil {
		return nil, err
	}
	c.changedJob = id
	return emptyResponse(http.StatusNoContent), nil
}

func (s *Server) rotateSecret(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	if e := decodeEmpty(c.body); e != nil {
		return nil, e
	}
	id := c.r.PathValue("id")
	c.info.job = loggedID(id, "job_")
	j, err := tx.GetJob(ctx, c.projectID(), id)
	if err != nil {
		return nil, err
	}
	secret, err := contract.NewSecret(s.rand)
	if err != nil {
		return nil, err
	}
	sealed, err := s.sealer.Seal(secret, j.ID)
	if err != nil {
		return nil, err
	}
	j.Secret, j.UpdatedAt = sealed, c.now
	if err := tx.UpdateJob(ctx, j); err != nil {
		return nil, err
	}
	c.changedJob = j.ID
	if err := tx.AppendEvents(ctx, vibejobs.JobEvent(vibejobs.EventJobSecretRotated, j, c.now)); err != nil {
		return nil, err
	}
	return jsonResponse(http.StatusOK, jobWithSecret{jobView(j), secret}), nil
}

func (s *Server) nextFireTimes(ctx context.Context, c *call) (*response, error) {
	n := 5
	if v, ok := c.r.URL.Query()["count"]; ok {
		var err error
		n, err = strconv.Atoi(v[0])
		if err != nil || len(v) != 1 || n < 1 || n > 100 {
			return nil, invalid("invalid_count", "count", "count must be an integer from 1 to 100")
		}
	}
	id := c.r.PathValue("id")
	c.info.job = loggedID(id, "job_")
	j, err := s.store.GetJob(ctx, c.projectID(), id)
	if err != nil {
		return nil, err
	}
	// A completed one-off job is previewed too: it is completed once its
	// run exists, up to the scheduler's lookahead before its instant, and
	// until that instant the run has yet to fire. Past it, At has none.
	sch, err := jobSchedule(j)
	if err != nil {
		return nil, err
	}
	// A paused job's times are listed still: they are the ones a resume
	// before them would run.
	out := nextJSON{JobID: j.ID, State: string(j.State), WillRun: j.State != vibejobs.JobPaused, Times: []apiTime{}}
	for _, t := range schedule.NextN(sch, c.now, n) {
		out.Times = append(out.Times, apiTime(t))
	}
	return jsonResponse(http.StatusOK, out), nil
}

// pageOf reads limit and cursor. The cursor is only checked for shape:
// openCursor then checks that it continues the list asked for.
func pageOf(q url.Values) (vibejobs.Page, *vibejobs.Error) {
	var p vibejobs.Page
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || len(v) != 1 || n < 1 || n > 100 {
			return p, invalid("invalid_limit", "limit", "limit must be an integer from 1 to 100")
		}
		p.Limit = n
	}
	if v, ok := q["cursor"]; ok {
		if len(v) != 1 || v[0] == "" || len(v[0]) > 512 {
			return p, errInvalidCursor()
		}
		p.Cursor = v[0]
	}
	return p, nil
}

func errInvalidCursor() *vibejobs.Error {
	return invalid("invalid_cursor", "cursor",
		"cursor is not one this list returned: a cursor continues only the list (project, filters) it came from")
}

// boundCursor is the API's cursor for the store's next cursor of list sc
// (nil when there is no next page).
func boundCursor(next string, sc listcursor.Scope) *string {
	if next == "" {
		return nil
	}
	c := sc.Bind(next)
	return &c
}

// openCursor checks that p's cursor continues list sc and replaces it with
// the store's position; a cursor of another project's list, of another
// kind of list or of other filters is refused (invalid_cursor) rather
// than answered with a page that starts somewhere else.
func (s *Server) openCursor(ctx context.Context, p *vibejobs.Page, sc listcursor.Scope) error {
	if p.Cursor == "" {
		return nil
	}
	pos, ok, err := sc.Open(ctx, s.store, p.Cursor)
	if err != nil {
		return err
	}
	if !ok {
		return errInvalidCursor()
	}
	p.Cursor = pos
	return nil
}
