package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/feed"
)

// eventListJSON is the answer of GET /v1/events.
type eventListJSON struct {
	Items  []feed.Item `json:"items"`
	Head   int64       `json:"head"`
	Oldest int64       `json:"oldest"`
	Next   int64       `json:"next"`
}

// listEvents reads the project's feed after a sequence: at most limit
// events of the given types and job among the next 1000 sequences. next is
// the after of the following read; a reader that is caught up has next =
// head. oldest is the first sequence retention has kept: a read after an
// earlier sequence starts there, and its reader missed the ones before.
func (s *Server) listEvents(ctx context.Context, c *call) (*response, error) {
	q := c.r.URL.Query()
	var f vibejobs.EventFilter
	if v, ok := q["after"]; ok {
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil || len(v) != 1 || n < 0 {
			return nil, invalid("invalid_after", "after", "after must be a sequence number (an integer ≥ 0)")
		}
		f.After = n
	}
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || len(v) != 1 || n < 1 || n > 100 {
			return nil, invalid("invalid_limit", "limit", "limit must be an integer from 1 to 100")
		}
		f.Limit = n
	}
	types, e := eventTypes(q["type"])
	if e != nil {
		return nil, e
	}
	f.Types = types
	if v, ok := q["jobId"]; ok {
		// Its shape only: a deleted job's events stay in the feed.
		if len(v) != 1 || !contract.ValidID(v[0], "job_") {
			return nil, invalid("invalid_job_id", "jobId", "jobId must be one job id (job_…)")
		}
		f.JobID = v[0]
		c.info.job = v[0]
	}
	page, err := s.store.ListEvents(ctx, c.projectID(), f)
	if err != nil {
		return nil, err
	}
	if f.After > page.Head {
		// Sequences are never reused and the head never goes back: this
		// cursor is not from this feed (another project's, or from before
		// the database was restored). Answered as caught up, its reader
		// would wait for ever.
		return nil, invalid("invalid_after", "after", fmt.Sprintf("after (%d) is beyond the feed's head (%d): the cursor is not from this feed", f.After, page.Head))
	}
	out := eventListJSON{Items: make([]feed.Item, 0, len(page.Events)), Head: page.Head, Oldest: page.Oldest, Next: page.Next}
	for _, ev := range page.Events {
		out.Items = append(out.Items, feed.ItemOf(ev))
	}
	return jsonResponse(http.StatusOK, out), nil
}

// eventTypes parses type filters given repeated or comma-separated.
func eventTypes(values []string) ([]vibejobs.EventType, *vibejobs.Error) {
	var out []vibejobs.EventType
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			if !vibejobs.ValidEventType(t) {
				return nil, invalid("invalid_type", "type", "type must be one of "+eventTypeList())
			}
			if !containsType(out, vibejobs.EventType(t)) {
				out = append(out, vibejobs.EventType(t))
			}
		}
	}
	return out, nil
}

func containsType(ts []vibejobs.EventType, t vibejobs.EventType) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

func eventTypeList() string {
	names := make([]string, len(vibejobs.EventTypes))
	for i, t := range vibejobs.EventTypes {
		names[i] = string(t)
	}
	return strings.Join(names, ", ")
}
