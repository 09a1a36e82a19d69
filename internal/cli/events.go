package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vibejobs/vibejobs/internal/display"
)

// apiEvent is an item of GET /v1/events.
type apiEvent struct {
	Sequence   int64   `json:"sequence"`
	Type       string  `json:"type"`
	OccurredAt string  `json:"occurredAt"`
	JobID      *string `json:"jobId"`
	RunID      *string `json:"runId"`
	Data       struct {
		State         string  `json:"state"`
		Attempt       *int    `json:"attempt"`
		Reason        *string `json:"reason"`
		ErrorCode     *string `json:"errorCode"`
		StatusCode    *int    `json:"statusCode"`
		NextAttemptAt *string `json:"nextAttemptAt"`
		NextRunAt     *string `json:"nextRunAt"`
	} `json:"data"`
}

// line is the event in one line: sequence, time, type, job, run and what
// changed, each text escaped by display.Escape.
func (e *apiEvent) line() string {
	d := e.Data
	parts := []string{d.State}
	if d.Attempt != nil {
		parts = append(parts, "attempt "+strconv.Itoa(*d.Attempt))
	}
	if d.Reason != nil {
		parts = append(parts, *d.Reason)
	}
	if d.ErrorCode != nil {
		parts = append(parts, *d.ErrorCode)
	}
	if d.StatusCode != nil {
		parts = append(parts, "status "+strconv.Itoa(*d.StatusCode))
	}
	if d.NextAttemptAt != nil {
		parts = append(parts, "next attempt "+*d.NextAttemptAt)
	}
	if d.NextRunAt != nil {
		parts = append(parts, "next run "+*d.NextRunAt)
	}
	return fmt.Sprintf("%-8d %s  %s %s %s %s", e.Sequence, display.Escape(e.OccurredAt), padRight(display.Escape(e.Type), 18),
		padRight(display.Escape(dash(e.JobID)), 32), padRight(display.Escape(dash(e.RunID)), 32), display.Escape(strings.Join(parts, ", ")))
}

// eventsTail prints the feed from a point on and, with --follow (the
// default), waits for new events until interrupted. Reading on with the
// feed's own cursor, it never misses or repeats an event.
func eventsTail(fs *flag.FlagSet) func(*call) error {
	after := fs.Int64("after", -1, "start after this `sequence` (0: the whole feed; left out: the head, new events only)")
	types := fs.String("type", "", "only these event `types`, comma-separated (run.failed,job.paused,…)")
	jobID := fs.String("job", "", "only the events of this `job-id`")
	follow := fs.Bool("follow", true, "wait for new events (default true); --follow=false stops at the head")
	interval := fs.Duration("interval", time.Second, "how often to ask for new events while caught up (default 1s)")
	return func(c *call) error {
		if *interval < 100*time.Millisecond {
			return usagef("--interval must be at least 100ms")
		}
		// Left out, --after starts at the head; given, it is a sequence.
		if c.set["after"] && *after < 0 {
			return usagef("--after must be a sequence, 0 or more (leave it out to start at the head)")
		}
		// A filter given empty (an unset shell variable) is sent as given,
		// and refused: dropped, it followed the events of every job or type.
		q := url.Values{"limit": {"100"}}
		if c.set["type"] {
			q.Set("type", *types)
		}
		if c.set["job"] {
			q.Set("jobId", *jobID)
		}
		cursor := *after
		if cursor < 0 {
			page, err := c.eventPage(url.Values{"limit": {"1"}}, 0)
			if err != nil {
				return err
			}
			cursor = page.Head
		}
		for {
			page, err := c.eventPage(q, cursor)
			if err != nil {
				return err
			}
			if cursor+1 < page.Oldest {
				// Said on stderr, so that --json output stays one event per line.
				fmt.Fprintf(c.stderr, "events %d to %d were pruned by retention before they were read\n", cursor+1, page.Oldest-1)
			}
			for _, raw := range page.Items {
				if c.json {
					if _, err := fmt.Fprintf(c.stdout, "%s\n", raw); err != nil {
						return err
					}
					continue
				}
				var e apiEvent
				if err := json.Unmarshal(raw, &e); err != nil {
					return fmt.Errorf("unexpected answer from the server: %v", err)
				}
				if _, err := fmt.Fprintln(c.stdout, e.line()); err != nil {
					return err
				}
			}
			cursor = max(cursor, page.Next)
			if cursor < page.Head {
				continue
			}
			if !*follow {
				return nil
			}
			if err := sleepCtx(c.ctx, *interval); err != nil {
				if c.ctx.Err() == context.Canceled {
					return nil // interrupted: the normal end of a tail
				}
				return err
			}
		}
	}
}

type eventPageJSON struct {
	Items  []json.RawMessage `json:"items"`
	Head   int64             `json:"head"`
	Oldest int64             `json:"oldest"`
	Next   int64             `json:"next"`
}

func (c *call) eventPage(q url.Values, after int64) (*eventPageJSON, error) {
	q.Set("after", strconv.FormatInt(after, 10))
	rep, err := c.client.do(c.ctx, "GET", "/v1/events?"+q.Encode(), nil, "")
	if err != nil {
		return nil, err
	}
	var p eventPageJSON
	if err := decode(rep, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// apiSubscription is a subscription as the API shows it.
type apiSubscription struct {
	ID                      string   `json:"id"`
	URL                     string   `json:"url"`
	Types                   []string `json:"types"`
	JobIDs                  []string `json:"jobIds"`
	Cursor                  int64    `json:"cursor"`
	Failing                 bool     `json:"failing"`
	ErrorCode               *string  `json:"errorCode"`
	Attempts                int      `json:"attempts"`
	NextAttemptAt           *string  `json:"nextAttemptAt"`
	LastSuccessAt           *string  `json:"lastSuccessAt"`
	PreviousSecretExpiresAt *string  `json:"previousSecretExpiresAt"`
	CreatedAt               string   `json:"createdAt"`
	UpdatedAt               string   `json:"updatedAt"`
	Secret                  string   `json:"secret"`
	// Skipped is in the answer of a reset: the events it skipped.
	Skipped *struct {
		After   int64 `json:"after"`
		Through int64 `json:"through"`
	} `json:"skipped"`
}

func orAll(s []string) string {
	if len(s) == 0 {
		return "all"
	}
	return strings.Join(s, ",")
}

func (s *apiSubscription) status() string {
	if !s.Failing {
		return "ok"
	}
	st := "failing (" + dash(s.ErrorCode) + ", " + strconv.Itoa(s.Attempts) + " attempts"
	if s.NextAttemptAt != nil {
		st += ", next " + *s.NextAttemptAt
	}
	return st + ")"
}

// printSubscription prints a subscription; withSecret adds the secret of a
// create or rotate answer with a warning.
func (c *call) printSubscription(rep *reply, withSecret bool) error {
	if c.json {
		return c.raw(rep)
	}
	var s apiSubscription
	if err := decode(rep, &s); err != nil {
		return err
	}
	t := c.table("FIELD", "VALUE")
	t.row("id", s.ID)
	t.row("url", s.URL)
	t.row("types", orAll(s.Types))
	t.row("jobs", orAll(s.JobIDs))
	t.row("cursor", strconv.FormatInt(s.Cursor, 10))
	t.row("status", s.status())
	t.row("last success", dash(s.LastSuccessAt))
	if s.PreviousSecretExpiresAt != nil {
		t.row("old secret signs until", *s.PreviousSecretExpiresAt)
	}
	t.row("created", s.CreatedAt)
	t.row("updated", s.UpdatedAt)
	if err := t.flush(); err != nil {
		return err
	}
	if withSecret && s.Secret != "" {
		fmt.Fprintf(c.stdout, "\nsecret: %s\n(shown only this once: store it now; verify requests with receiver.VerifyEvent)\n", display.Escape(s.Secret))
	}
	if k := s.Skipped; k != nil {
		fmt.Fprintf(c.stdout, "\nskipped events %d to %d: they are never sent; read them with\n  vibejobs events tail --after %d --follow=false\n",
			k.After+1, k.Through, k.After)
	}
	return nil
}

// subscriptionFlags are the settings of subscriptions create and update.
type subscriptionFlags struct {
	url, types, jobs string
}

func (f *subscriptionFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "url", "", "`URL` the events are POSTed to")
	fs.StringVar(&f.types, "types", "", "only these event `types`, comma-separated (default: all; \"\" clears)")
	fs.StringVar(&f.jobs, "jobs", "", "only the events of these `job-ids`, comma-separated (default: all; \"\" clears)")
}

func splitList(s string) []string {
	out := []string{}
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func (f *subscriptionFlags) body(set map[string]bool) map[string]any {
	b := map[string]any{}
	if set["url"] {
		b["url"] = f.url
	}
	if set["types"] {
		b["types"] = splitList(f.types)
	}
	if set["jobs"] {
		b["jobIds"] = splitList(f.jobs)
	}
	return b
}

func subscriptionCreate(fs *flag.FlagSet) func(*call) error {
	var f subscriptionFlags
	f.register(fs)
	return func(c *call) error {
		if !c.set["url"] {
			return usagef("subscriptions create needs --url")
		}
		rep, err := c.client.do(c.ctx, "POST", "/v1/subscriptions", f.body(c.set), c.key)
		if err != nil {
			return err
		}
		return c.printSubscription(rep, true)
	}
}

func subscriptionUpdate(fs *flag.FlagSet) func(*call) error {
	var f subscriptionFlags
	f.register(fs)
	return func(c *call) error {
		rep, err := c.client.do(c.ctx, "PATCH", "/v1/subscriptions/"+url.PathEscape(c.pos[0]), f.body(c.set), "")
		if err != nil {
			return err
		}
		return c.printSubscription(rep, false)
	}
}

func subscriptionList(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		rep, err := c.client.do(c.ctx, "GET", "/v1/subscriptions", nil, "")
		if err != nil {
			return err
		}
		if c.json {
			return c.raw(rep)
		}
		var l struct {
			Subscriptions []apiSubscription `json:"subscriptions"`
		}
		if err := decode(rep, &l); err != nil {
			return err
		}
		t := c.table("ID", "URL", "TYPES", "JOBS", "CURSOR", "STATUS", "LAST SUCCESS")
		for _, s := range l.Subscriptions {
			t.row(s.ID, s.URL, orAll(s.Types), orAll(s.JobIDs), strconv.FormatInt(s.Cursor, 10), s.status(), dash(s.LastSuccessAt))
		}
		return t.flush()
	}
}

func subscriptionGet(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		rep, err := c.client.do(c.ctx, "GET", "/v1/subscriptions/"+url.PathEscape(c.pos[0]), nil, "")
		if err != nil {
			return err
		}
		return c.printSubscription(rep, false)
	}
}

// subscriptionAction is a POST /v1/subscriptions/{id}/<action> that
// answers the subscription.
func subscriptionAction(action string) func(fs *flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		return func(c *call) error {
			rep, err := c.client.do(c.ctx, "POST", "/v1/subscriptions/"+url.PathEscape(c.pos[0])+"/"+action, nil, c.key)
			if err != nil {
				return err
			}
			return c.printSubscription(rep, action == "rotate-secret")
		}
	}
}

func subscriptionDelete(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		if _, err := c.client.do(c.ctx, "DELETE", "/v1/subscriptions/"+url.PathEscape(c.pos[0]), nil, ""); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"id": c.pos[0], "deleted": true})
		}
		fmt.Fprintf(c.stdout, "deleted subscription %s\n", display.Escape(c.pos[0]))
		return nil
	}
}
