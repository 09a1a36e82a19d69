// Package feed is the wire form of the event feed: the items of GET
// /v1/events and the body a subscription sends. Both render an event the
// same way, so a receiver can handle what it polls and what it is sent
// with one decoder. An event carries ids, states, reasons, error codes and
// times only: never a secret, a URL or a body.
package feed

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/vibejobs/vibejobs"
)

// TimeLayout is how instants are written: RFC 3339, UTC, milliseconds (as
// everywhere in the API).
const TimeLayout = "2006-01-02T15:04:05.000Z"

// Time marshals as TimeLayout.
type Time time.Time

// MarshalJSON writes t in TimeLayout.
func (t Time) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(TimeLayout)+2)
	b = append(b, '"')
	b = time.Time(t).UTC().AppendFormat(b, TimeLayout)
	return append(b, '"'), nil
}

func timePtr(t *time.Time) *Time {
	if t == nil {
		return nil
	}
	v := Time(*t)
	return &v
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Data is what an event says changed. A run event has state and attempt,
// with reason (failed, cancelled), errorCode and statusCode (of the attempt
// that ended, if any) and nextAttemptAt (retrying); a job event has state
// (active, paused, completed or deleted) and nextRunAt when the job has one.
type Data struct {
	State         string  `json:"state"`
	Attempt       *int    `json:"attempt,omitempty"`
	Reason        *string `json:"reason,omitempty"`
	ErrorCode     *string `json:"errorCode,omitempty"`
	StatusCode    *int    `json:"statusCode,omitempty"`
	NextAttemptAt *Time   `json:"nextAttemptAt,omitempty"`
	NextRunAt     *Time   `json:"nextRunAt,omitempty"`
}

// DataOf returns the data of e.
func DataOf(e *vibejobs.Event) Data {
	d := Data{State: e.State}
	if e.RunID == "" {
		d.NextRunAt = timePtr(e.NextAt)
		return d
	}
	attempt := e.Attempt
	d.Attempt = &attempt
	d.Reason = strPtr(e.Reason)
	d.ErrorCode = strPtr(e.ErrorCode)
	if e.StatusCode != 0 {
		sc := e.StatusCode
		d.StatusCode = &sc
	}
	d.NextAttemptAt = timePtr(e.NextAt)
	return d
}

// Item is an event as GET /v1/events lists it.
type Item struct {
	Sequence   int64   `json:"sequence"`
	Type       string  `json:"type"`
	OccurredAt Time    `json:"occurredAt"`
	JobID      *string `json:"jobId"`
	RunID      *string `json:"runId"`
	Data       Data    `json:"data"`
}

// ItemOf returns the list item of e.
func ItemOf(e *vibejobs.Event) Item {
	return Item{
		Sequence: e.Sequence, Type: string(e.Type), OccurredAt: Time(e.OccurredAt),
		JobID: strPtr(e.JobID), RunID: strPtr(e.RunID), Data: DataOf(e),
	}
}

// EventID is the id a subscription sends an event under,
// "<project>:<sequence>": the same on every delivery of the event, so a
// receiver dedupes on it.
func EventID(e *vibejobs.Event) string {
	return e.ProjectID + ":" + strconv.FormatInt(e.Sequence, 10)
}

// delivery is the body a subscription sends: the item with its id first.
type delivery struct {
	ID         string  `json:"id"`
	Type       string  `json:"type"`
	Sequence   int64   `json:"sequence"`
	OccurredAt Time    `json:"occurredAt"`
	JobID      *string `json:"jobId"`
	RunID      *string `json:"runId"`
	Data       Data    `json:"data"`
}

// Body returns the JSON body a subscription sends for e:
// {"id","type","sequence","occurredAt","jobId","runId","data"}, compact,
// without a trailing newline.
func Body(e *vibejobs.Event) []byte {
	it := ItemOf(e)
	b, err := json.Marshal(delivery{ID: EventID(e), Type: it.Type, Sequence: it.Sequence, OccurredAt: it.OccurredAt,
		JobID: it.JobID, RunID: it.RunID, Data: it.Data})
	if err != nil {
		panic("feed: encoding an event: " + err.Error()) // plain strings, numbers and times always encode
	}
	return b
}
