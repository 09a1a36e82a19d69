package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"

	"github.com/vibejobs/vibejobs/internal/display"
	"golang.org/x/text/width"
)

// The API's objects, as far as the tables show them.
type apiJob struct {
	ID       string  `json:"id"`
	Name     string  `json:"name"`
	Schedule *string `json:"schedule"`
	At       *string `json:"at"`
	Timezone string  `json:"timezone"`
	URL      string  `json:"url"`
	Enabled  bool    `json:"enabled"`
	State    string  `json:"state"`
	Retry    struct {
		MaxAttempts int    `json:"maxAttempts"`
		MinBackoff  string `json:"minBackoff"`
		MaxBackoff  string `json:"maxBackoff"`
	} `json:"retry"`
	Timeout   string  `json:"timeout"`
	CatchUp   string  `json:"catchUp"`
	NextRunAt *string `json:"nextRunAt"`
	LastRun   *struct {
		ID           string `json:"id"`
		State        string `json:"state"`
		ScheduledFor string `json:"scheduledFor"`
	} `json:"lastRun"`
	SkippedRuns int64  `json:"skippedRuns"`
	CreatedAt   string `json:"createdAt"`
	UpdatedAt   string `json:"updatedAt"`
	Secret      string `json:"secret"`
}

func (j *apiJob) when() string {
	if j.At != nil {
		return "at " + *j.At
	}
	if j.Schedule != nil {
		return *j.Schedule
	}
	return "-"
}

func (j *apiJob) lastRun() string {
	if j.LastRun == nil {
		return "-"
	}
	return j.LastRun.State + " " + j.LastRun.ScheduledFor
}

type apiRun struct {
	ID            string       `json:"id"`
	JobID         string       `json:"jobId"`
	Trigger       string       `json:"trigger"`
	ScheduledFor  string       `json:"scheduledFor"`
	DeadlineAt    string       `json:"deadlineAt"`
	Late          bool         `json:"late"`
	State         string       `json:"state"`
	Attempt       int          `json:"attempt"`
	NextAttemptAt *string      `json:"nextAttemptAt"`
	FailureReason *string      `json:"failureReason"`
	CreatedAt     string       `json:"createdAt"`
	FinishedAt    *string      `json:"finishedAt"`
	Attempts      []apiAttempt `json:"attempts"`
}

func (r *apiRun) stateText() string {
	if r.FailureReason != nil {
		return r.State + " (" + *r.FailureReason + ")"
	}
	return r.State
}

type apiAttempt struct {
	Number             int     `json:"number"`
	StartedAt          string  `json:"startedAt"`
	FinishedAt         *string `json:"finishedAt"`
	DurationMs         *int64  `json:"durationMs"`
	StatusCode         *int    `json:"statusCode"`
	ErrorCode          *string `json:"errorCode"`
	SignatureTimestamp *int64  `json:"signatureTimestamp"`
	ResponseSnippet    *string `json:"responseSnippet"`
}

type apiProject struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	RetentionDays *int   `json:"retentionDays"`
	CreatedAt     string `json:"createdAt"`
}

type apiToken struct {
	ID           string  `json:"id"`
	ProjectID    string  `json:"projectId"`
	Name         string  `json:"name"`
	Role         string  `json:"role"`
	Installation bool    `json:"installation"`
	Prefix       string  `json:"prefix"`
	CreatedAt    string  `json:"createdAt"`
	RevokedAt    *string `json:"revokedAt"`
	Token        string  `json:"token"`
}

func decode(rep *reply, v any) error {
	if err := json.Unmarshal(rep.body, v); err != nil {
		return fmt.Errorf("unexpected answer from the server (status %d): %v", rep.status, err)
	}
	return nil
}

// raw prints the API's answer as it came.
func (c *call) raw(rep *reply) error {
	_, err := c.stdout.Write(rep.body)
	if len(rep.body) > 0 && rep.body[len(rep.body)-1] != '\n' {
		fmt.Fprintln(c.stdout)
	}
	return err
}

func (c *call) printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}

// displayWidth is the number of terminal columns printable text takes:
// east-asian wide and fullwidth characters take two, combining marks none.
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		switch {
		case r < 0x300:
			n++ // Latin and the ASCII of ids and times: no table needed
		case unicode.In(r, unicode.Mn, unicode.Me):
			// a combining mark shares the cell of the character before it
		default:
			switch width.LookupRune(r).Kind() {
			case width.EastAsianWide, width.EastAsianFullwidth:
				n += 2
			default:
				n++
			}
		}
	}
	return n
}

// padRight pads printable text with spaces to n terminal columns.
func padRight(s string, n int) string {
	if w := displayWidth(s); w < n {
		return s + strings.Repeat(" ", n-w)
	}
	return s
}

// table writes aligned columns: each cell escaped by printable, so that a
// row is one line whatever the data holds, and padded by terminal columns
// rather than bytes or runes, so that wide characters keep the columns
// straight. Rows are held until flush.
type table struct {
	w    io.Writer
	rows [][]string
}

// tableGap is the space between two columns.
const tableGap = 2

func (c *call) table(header ...string) *table {
	t := &table{w: c.stdout}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	r := make([]string, len(cells))
	for i, s := range cells {
		r[i] = display.Escape(s)
	}
	t.rows = append(t.rows, r)
}

// flush writes the rows; the last cell of a row is not padded.
func (t *table) flush() error {
	var widths []int
	for _, r := range t.rows {
		for i := 0; i < len(r)-1; i++ {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], displayWidth(r[i]))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, cell := range r {
			if i == len(r)-1 {
				b.WriteString(cell)
				break
			}
			b.WriteString(padRight(cell, widths[i]+tableGap))
		}
		b.WriteByte('\n')
	}
	t.rows = nil
	_, err := io.WriteString(t.w, b.String())
	return err
}

func dash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printJob prints a job as JSON or as a two-column table; withSecret adds
// the secret of a create or rotate answer with a warning.
func (c *call) printJob(rep *reply, withSecret bool) error {
	if c.json {
		return c.raw(rep)
	}
	var j apiJob
	if err := decode(rep, &j); err != nil {
		return err
	}
	state := j.State
	if !j.Enabled && j.State != "paused" {
		state += " (disabled)"
	}
	t := c.table("FIELD", "VALUE")
	t.row("id", j.ID)
	t.row("name", j.Name)
	if j.At != nil {
		t.row("at", *j.At)
	} else {
		t.row("schedule", j.when())
	}
	t.row("timezone", j.Timezone)
	t.row("url", j.URL)
	t.row("state", state)
	t.row("next run", dash(j.NextRunAt))
	t.row("last run", j.lastRun())
	t.row("retry", fmt.Sprintf("%d attempts, backoff %s to %s", j.Retry.MaxAttempts, j.Retry.MinBackoff, j.Retry.MaxBackoff))
	t.row("timeout", j.Timeout)
	t.row("catch-up", j.CatchUp)
	t.row("skipped runs", strconv.FormatInt(j.SkippedRuns, 10))
	t.row("created", j.CreatedAt)
	t.row("updated", j.UpdatedAt)
	if err := t.flush(); err != nil {
		return err
	}
	if withSecret && j.Secret != "" {
		fmt.Fprintf(c.stdout, "\nsecret: %s\n(shown only this once: store it now; \"vibejobs jobs rotate-secret\" makes a new one)\n", display.Escape(j.Secret))
	}
	return nil
}

// printRun prints a run, with its attempts when the answer has them.
func (c *call) printRun(rep *reply) error {
	if c.json {
		return c.raw(rep)
	}
	var r apiRun
	if err := decode(rep, &r); err != nil {
		return err
	}
	t := c.table("FIELD", "VALUE")
	t.row("id", r.ID)
	t.row("job", r.JobID)
	t.row("trigger", r.Trigger)
	t.row("scheduled for", r.ScheduledFor)
	t.row("state", r.stateText())
	t.row("attempt", strconv.Itoa(r.Attempt))
	t.row("late", yesNo(r.Late))
	t.row("next attempt", dash(r.NextAttemptAt))
	t.row("deadline", r.DeadlineAt)
	t.row("created", r.CreatedAt)
	t.row("finished", dash(r.FinishedAt))
	if err := t.flush(); err != nil {
		return err
	}
	if len(r.Attempts) == 0 {
		return nil
	}
	fmt.Fprintln(c.stdout)
	at := c.table("#", "STARTED", "DURATION", "STATUS", "ERROR", "SIGNED AT")
	for _, a := range r.Attempts {
		dur, status, sig := "-", "-", "-"
		if a.DurationMs != nil {
			dur = strconv.FormatInt(*a.DurationMs, 10) + "ms"
		}
		if a.StatusCode != nil {
			status = strconv.Itoa(*a.StatusCode)
		}
		if a.SignatureTimestamp != nil {
			sig = strconv.FormatInt(*a.SignatureTimestamp, 10)
		}
		at.row(strconv.Itoa(a.Number), a.StartedAt, dur, status, dash(a.ErrorCode), sig)
	}
	return at.flush()
}

func (c *call) projectTable(ps []apiProject) error {
	t := c.table("ID", "NAME", "RETENTION", "CREATED")
	for _, p := range ps {
		ret := "default"
		if p.RetentionDays != nil {
			ret = strconv.Itoa(*p.RetentionDays) + " days"
		}
		t.row(p.ID, p.Name, ret, p.CreatedAt)
	}
	return t.flush()
}

func (c *call) tokenTable(ts []apiToken) error {
	t := c.table("ID", "NAME", "ROLE", "PREFIX", "CREATED", "REVOKED")
	for _, tk := range ts {
		role := tk.Role
		if tk.Installation {
			role += " (installation)"
		}
		t.row(tk.ID, tk.Name, role, tk.Prefix+"…", tk.CreatedAt, dash(tk.RevokedAt))
	}
	return t.flush()
}
