package api

import (
	"context"
	"net/http"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/listcursor"
)

// runJSON is the wire form of a run in lists and in the trigger answer.
type runJSON struct {
	ID            string   `json:"id"`
	JobID         string   `json:"jobId"`
	Trigger       string   `json:"trigger"`
	ScheduledFor  apiTime  `json:"scheduledFor"`
	DeadlineAt    apiTime  `json:"deadlineAt"`
	Late          bool     `json:"late"`
	State         string   `json:"state"`
	Attempt       int      `json:"attempt"`
	NextAttemptAt *apiTime `json:"nextAttemptAt"`
	FailureReason *string  `json:"failureReason"`
	CreatedAt     apiTime  `json:"createdAt"`
	FinishedAt    *apiTime `json:"finishedAt"`
}

// runDetailJSON is a run with its attempts (GET /v1/runs/{id}).
type runDetailJSON struct {
	runJSON
	Attempts []attemptJSON `json:"attempts"`
}

type attemptJSON struct {
	Number             int      `json:"number"`
	StartedAt          apiTime  `json:"startedAt"`
	FinishedAt         *apiTime `json:"finishedAt"`
	DurationMs         *int64   `json:"durationMs"`
	StatusCode         *int     `json:"statusCode"`
	ErrorCode          *string  `json:"errorCode"`
	SignatureTimestamp *int64   `json:"signatureTimestamp"`
	ResponseSnippet    *string  `json:"responseSnippet"`
}

type runListJSON struct {
	Runs       []runJSON `json:"runs"`
	NextCursor *string   `json:"nextCursor"`
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func runView(r *vibejobs.Run) runJSON {
	return runJSON{
		ID:            r.ID,
		JobID:         r.JobID,
		Trigger:       r.Trigger,
		ScheduledFor:  apiTime(r.ScheduledFor),
		DeadlineAt:    apiTime(r.DeadlineAt),
		Late:          r.Late,
		State:         string(r.State),
		Attempt:       r.Attempt,
		NextAttemptAt: timePtr(r.NextAttemptAt),
		FailureReason: strPtr(r.FailureReason),
		CreatedAt:     apiTime(r.CreatedAt),
		FinishedAt:    timePtr(r.FinishedAt),
	}
}

func runDetailView(r *vibejobs.Run) runDetailJSON {
	out := runDetailJSON{runJSON: runView(r), Attempts: make([]attemptJSON, 0, len(r.Attempts))}
	for _, a := range r.Attempts {
		v := attemptJSON{
			Number:          a.Number,
			StartedAt:       apiTime(a.StartedAt),
			FinishedAt:      timePtr(&a.FinishedAt),
			ErrorCode:       strPtr(a.ErrorCode),
			ResponseSnippet: strPtr(a.ResponseSnippet),
		}
		if !a.FinishedAt.IsZero() {
			ms := a.Duration().Milliseconds()
			v.DurationMs = &ms
		}
		if a.StatusCode != 0 {
			sc := a.StatusCode
			v.StatusCode = &sc
		}
		if a.SignatureTimestamp != 0 {
			ts := a.SignatureTimestamp
			v.SignatureTimestamp = &ts
		}
		out.Attempts = append(out.Attempts, v)
	}
	return out
}

// triggerRun creates a manual run due now (SEMANTICS.md section 3): never
// merged with another run, whatever the job's state.
func (s *Server) triggerRun(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	if e := decodeEmpty(c.body); e != nil {
		return nil, e
	}
	id := c.r.PathValue("id")
	c.info.job = loggedID(id, "job_")
	j, err := tx.GetJob(ctx, c.projectID(), id)
	if err != nil {
		return nil, err
	}
	r := vibejobs.NewRun(vibejobs.NewID("run_", c.now, s.rand), j, vibejobs.TriggerManual, c.now, c.now)
	if err := tx.CreateRun(ctx, r); err != nil {
		return nil, err
	}
	c.info.run, c.wake, c.runCreated = r.ID, true, true
	return jsonResponse(http.StatusAccepted, runView(r)).with("Location", "/v1/runs/"+r.ID), nil
}

func (s *Server) getRun(ctx context.Context, c *call) (*response, error) {
	id := c.r.PathValue("id")
	c.info.run = loggedID(id, "run_")
	r, err := s.store.GetRun(ctx, c.projectID(), id)
	if err != nil {
		return nil, err
	}
	c.info.job = r.JobID
	return jsonResponse(http.StatusOK, runDetailView(r)), nil
}

func (s *Server) listJobRuns(ctx context.Context, c *call) (*response, error) {
	return s.runList(ctx, c, c.r.PathValue("id"), false)
}

func (s *Server) listRuns(ctx context.Context, c *call) (*response, error) {
	jobID := ""
	if v, ok := c.r.URL.Query()["jobId"]; ok {
		if len(v) != 1 || v[0] == "" {
			return nil, invalid("invalid_job_id", "jobId", "jobId must be one job id")
		}
		jobID = v[0]
	}
	return s.runList(ctx, c, jobID, true)
}

// runList lists a project's runs, newest first; jobID (when set) must be a
// job of the project, or the answer is 404 as for any other missing job.
// With deleted, a deleted job of the project whose runs the history still
// holds is one too: its runs are kept until retention prunes them, each
// readable by id and in the unfiltered list, and the filter finds them
// (a job's own path, /v1/jobs/{id}/runs, answers 404 once it is deleted).
func (s *Server) runList(ctx context.Context, c *call, jobID string, deleted bool) (*response, error) {
	q := c.r.URL.Query()
	f := vibejobs.RunFilter{JobID: jobID}
	if v, ok := q["state"]; ok {
		if len(v) != 1 || !vibejobs.ValidRunState(v[0]) {
			return nil, invalid("invalid_state", "state", "state must be one of scheduled, delivering, retrying, succeeded, failed, cancelled")
		}
		f.State = vibejobs.RunState(v[0])
	}
	p, e := pageOf(q)
	if e != nil {
		return nil, e
	}
	if jobID != "" {
		c.info.job = loggedID(jobID, "job_")
		if err := s.checkRunsJob(ctx, c.projectID(), jobID, deleted); err != nil {
			return nil, err
		}
	}
	// After the job's check: another project's job answers 404, whatever
	// the cursor, as a job that does not exist.
	sc := listcursor.Scope{Kind: listcursor.Runs, ProjectID: c.projectID(), JobID: jobID, State: string(f.State)}
	if err := s.openCursor(ctx, &p, sc); err != nil {
		return nil, err
	}
	runs, next, err := s.store.ListRuns(ctx, c.projectID(), f, p)
	if err != nil {
		return nil, err
	}
	out := runListJSON{Runs: make([]runJSON, 0, len(runs)), NextCursor: boundCursor(next, sc)}
	for _, r := range runs {
		out.Runs = append(out.Runs, runView(r))
	}
	return jsonResponse(http.StatusOK, out), nil
}

// checkRunsJob answers nil when jobID is a live job of projectID or, with
// deleted, a deleted one of which a run of the project remains, and the
// not-found error of GetJob otherwise. Runs carry their project, so
// another project's job, deleted or not, is not found, as one that never
// existed.
func (s *Server) checkRunsJob(ctx context.Context, projectID, jobID string, deleted bool) error {
	_, err := s.store.GetJob(ctx, projectID, jobID)
	if !deleted || vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
		return err
	}
	runs, _, lerr := s.store.ListRuns(ctx, projectID, vibejobs.RunFilter{JobID: jobID}, vibejobs.Page{Limit: 1})
	if lerr != nil {
		return lerr
	}
	if len(runs) == 0 {
		return err
	}
	return nil
}
