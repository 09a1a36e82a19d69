package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/vibejobs/vibejobs"
)

// MaxBatchJobs is the most jobs one POST /v1/jobs/batch creates.
const MaxBatchJobs = 100

// MaxBatchBodyBytes bounds the body of POST /v1/jobs/batch (unless the
// server's MaxBodyBytes is larger): room for MaxBatchJobs jobs each with a
// URL of the longest length, as JSON encoders write it (Go's escapes & as
// \u0026). Under the 64 KiB of a single job's request, 100 jobs with URLs
// of 700 bytes (signed URLs are often longer) were refused.
const MaxBatchBodyBytes = 2 << 20

// createJobs creates up to MaxBatchJobs jobs in one transaction, all or none:
// the way to register many jobs fast. Each job is validated as by POST
// /v1/jobs; an error names its field as jobs[i].field.
func (s *Server) createJobs(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	o, e := decodeObject(c.body, "")
	if e != nil {
		return nil, e
	}
	if e := o.only("jobs"); e != nil {
		return nil, e
	}
	raw, ok := o.get("jobs")
	if !ok {
		return nil, invalid("invalid_batch", "jobs", "jobs is required: an array of 1 to "+strconv.Itoa(MaxBatchJobs)+" jobs")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return nil, invalid("invalid_json", "jobs", "must be an array of job objects")
	}
	if len(items) == 0 || len(items) > MaxBatchJobs {
		return nil, invalid("invalid_batch", "jobs", "must hold 1 to "+strconv.Itoa(MaxBatchJobs)+" jobs")
	}
	inputs := make([]*jobInput, len(items))
	for i, item := range items {
		if t := bytes.TrimSpace(item); len(t) == 0 || t[0] != '{' {
			return nil, invalid("invalid_json", "jobs["+strconv.Itoa(i)+"]", "must be a JSON object")
		}
		in, e := parseJobInput(item)
		if e != nil {
			return nil, prefixField(e, "jobs["+strconv.Itoa(i)+"]")
		}
		inputs[i] = in
	}
	out := struct {
		Jobs []jobWithSecret `json:"jobs"`
	}{Jobs: make([]jobWithSecret, 0, len(inputs))}
	events := make([]*vibejobs.Event, 0, len(inputs))
	for i, in := range inputs {
		j, secret, err := s.insertJob(ctx, c, tx, in)
		if err != nil {
			var ve *vibejobs.Error
			if errors.As(err, &ve) {
				return nil, prefixField(ve, "jobs["+strconv.Itoa(i)+"]")
			}
			return nil, err
		}
		out.Jobs = append(out.Jobs, jobWithSecret{jobView(j), secret})
		events = append(events, vibejobs.JobEvent(vibejobs.EventJobCreated, j, c.now))
	}
	if err := tx.AppendEvents(ctx, events...); err != nil {
		return nil, err
	}
	if err := s.checkJobLimit(ctx, c, tx); err != nil {
		return nil, err
	}
	c.wake = true
	return jsonResponse(http.StatusCreated, out), nil
}

// prefixField returns e with its field placed under prefix.
func prefixField(e *vibejobs.Error, prefix string) *vibejobs.Error {
	cp := *e
	if cp.Field == "" {
		cp.Field = prefix
	} else {
		cp.Field = prefix + "." + cp.Field
	}
	return &cp
}
