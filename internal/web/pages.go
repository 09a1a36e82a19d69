package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/display"
	"github.com/vibejobs/vibejobs/internal/listcursor"
)

// The view types below copy from the domain only what a page shows, so a
// template cannot reach a job's sealed secret even by mistake.

// when is an instant as the pages show it.
type when struct {
	ISO   string // RFC 3339, for <time datetime>
	UTC   string // 2006-01-02 15:04:05 UTC
	Local string // in the job's time zone, "" when that is UTC
	Rel   string // "in 4 min", "2 h 5 min ago"
}

func whenOf(t time.Time, now time.Time, tz string) *when {
	if t.IsZero() {
		return nil
	}
	w := &when{
		ISO: t.UTC().Format(time.RFC3339Nano),
		UTC: t.UTC().Format("2006-01-02 15:04:05 UTC"),
		Rel: relative(now, t),
	}
	if tz != "" && tz != "UTC" {
		if loc := location(tz); loc != nil {
			w.Local = t.In(loc).Format("2006-01-02 15:04:05 MST")
		}
	}
	return w
}

func whenPtr(t *time.Time, now time.Time, tz string) *when {
	if t == nil {
		return nil
	}
	return whenOf(*t, now, tz)
}

var locations sync.Map // time zone name → *time.Location (nil when unknown)

func location(name string) *time.Location {
	if l, ok := locations.Load(name); ok {
		return l.(*time.Location)
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		l = nil
	}
	locations.Store(name, l)
	return l
}

// relative says how far t is from now, roughly.
func relative(now, t time.Time) string {
	d := t.Sub(now)
	future := d > 0
	if d < 0 {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		s = fmt.Sprintf("%d s", d/time.Second)
	case d < time.Hour:
		s = fmt.Sprintf("%d min", d/time.Minute)
	case d < 48*time.Hour:
		h, m := d/time.Hour, (d%time.Hour)/time.Minute
		s = fmt.Sprintf("%d h", h)
		if m > 0 {
			s += fmt.Sprintf(" %d min", m)
		}
	default:
		s = fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// setting formats a configured duration as the API does ("5m", "1h").
func setting(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// elapsed formats how long an attempt took.
func elapsed(d time.Duration) string {
	switch {
	case d < 0:
		return "—"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d/time.Millisecond)
	case d < time.Minute:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return d.Round(time.Second).String()
}

type runRef struct {
	ID    string
	State string
	When  *when
}

type jobRow struct {
	ID       string
	Name     string
	Schedule string // "" for a one-off job
	OnceAt   *when  // the instant of a one-off job
	Timezone string
	State    string
	NextRun  *when
	LastRun  *runRef
	Skipped  int64
}

func jobRowOf(j *vibejobs.Job, now time.Time) jobRow {
	row := jobRow{
		ID: j.ID, Name: display.EscapeKeepingLayout(j.Name), Schedule: display.EscapeKeepingLayout(j.Schedule), OnceAt: whenPtr(j.At, now, j.Timezone),
		Timezone: display.EscapeKeepingLayout(j.Timezone), State: string(j.State), NextRun: whenPtr(j.NextRunAt, now, j.Timezone),
		Skipped: j.SkippedRuns,
	}
	if j.At != nil {
		row.Schedule = ""
	}
	if lr := j.LastRun; lr != nil {
		row.LastRun = &runRef{ID: lr.ID, State: string(lr.State), When: whenOf(lr.ScheduledFor, now, j.Timezone)}
	}
	return row
}

type jobsData struct {
	Count     int
	Jobs      []jobRow
	NextPage  string
	FirstPage string // "" on the first page
}

// pageQuery parses the query of a page's address, and reports false when
// url.ParseQuery would drop part of it (a bad %-escape, a ';' or more than
// 10,000 parameters): read as missing, a dropped filter or cursor would
// show another list than the one asked for. The API refuses such a query
// too (invalid_query).
func pageQuery(r *http.Request) (url.Values, bool) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	return q, err == nil
}

// badQuery answers a page whose query pageQuery refused.
func (d *dashboard) badQuery(w http.ResponseWriter, r *http.Request, v *viewer) {
	d.renderError(w, r, v, http.StatusBadRequest, "Bad request",
		"The query of this address could not be read: parameters go between &, escapes are %XX, and there may be at most 10,000 of them.")
}

// repeated returns the first of names that q holds more than once. The
// page would read the first value and drop the others, showing another
// list than one of those asked for; the API refuses it too.
func repeated(q url.Values, names ...string) string {
	for _, n := range names {
		if len(q[n]) > 1 {
			return n
		}
	}
	return ""
}

// badRepeat answers a page whose query gives the parameter name twice.
func (d *dashboard) badRepeat(w http.ResponseWriter, r *http.Request, v *viewer, name string) {
	d.renderError(w, r, v, http.StatusBadRequest, "Bad request",
		"The parameter "+name+" is given more than once in the address of this page: give it once.")
}

// openCursor returns the store's position from which the page's cursor
// continues list sc ("" for the first page), or answers the request and
// returns false: a cursor of another list (the jobs list or another job's
// runs, another state filter, another project's) or one changed by hand
// would show a page that starts somewhere else, often an empty one.
func (d *dashboard) openCursor(w http.ResponseWriter, r *http.Request, v *viewer, q url.Values, sc listcursor.Scope) (string, bool) {
	c := q.Get("cursor")
	if c == "" {
		return "", true
	}
	// A link cannot need more than this.
	if len(c) > 512 {
		d.badCursor(w, r, v)
		return "", false
	}
	pos, ok, err := sc.Open(r.Context(), d.store, c)
	if err != nil {
		d.internalError(w, r, v, err)
		return "", false
	}
	if !ok {
		d.badCursor(w, r, v)
		return "", false
	}
	return pos, true
}

// badCursor answers a page whose cursor openCursor refused.
func (d *dashboard) badCursor(w http.ResponseWriter, r *http.Request, v *viewer) {
	d.renderError(w, r, v, http.StatusBadRequest, "Bad request",
		"The page position (cursor) in this address is not one of this list: it comes from another job's runs, another state filter, the jobs list or another project, or was changed. A cursor continues only the list it came from; start again from the first page.")
}

func (d *dashboard) jobsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	query, ok := pageQuery(r)
	if !ok {
		d.badQuery(w, r, v)
		return
	}
	if name := repeated(query, "cursor"); name != "" {
		d.badRepeat(w, r, v, name)
		return
	}
	sc := listcursor.Scope{Kind: listcursor.Jobs, ProjectID: v.projectID()}
	pos, ok := d.openCursor(w, r, v, query, sc)
	if !ok {
		return
	}
	ctx := r.Context()
	jobs, next, err := d.store.ListJobs(ctx, v.projectID(), vibejobs.Page{Limit: pageSize, Cursor: pos})
	if err != nil {
		d.fail(w, r, v, "", err)
		return
	}
	count, err := d.store.CountJobs(ctx, v.projectID())
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	data := jobsData{Count: count, Jobs: make([]jobRow, 0, len(jobs))}
	for _, j := range jobs {
		data.Jobs = append(data.Jobs, jobRowOf(j, v.now))
	}
	if next != "" {
		data.NextPage = "/?cursor=" + url.QueryEscape(sc.Bind(next))
	}
	if pos != "" {
		data.FirstPage = "/"
	}
	d.render(w, r, http.StatusOK, "jobs", page{Title: "Jobs", Viewer: viewerOf(v), Refresh: true, Body: data})
}

// pathID returns the id a page's path names, and false when it can name
// nothing: an id holding a NUL byte or invalid UTF-8. Such an id is not
// found, as on SQLite; asked for it, PostgreSQL (whose text refuses those
// bytes) would report invalid input instead.
func pathID(r *http.Request) (string, bool) {
	id := r.PathValue("id")
	return id, vibejobs.StorableText(id)
}

type runRow struct {
	ID            string
	Trigger       string
	State         string
	FailureReason string
	ScheduledFor  *when
	Attempt       int
	Late          bool
	NextAttempt   *when
	Finished      *when
}

func runRowOf(run *vibejobs.Run, now time.Time, tz string) runRow {
	row := runRow{
		ID: run.ID, Trigger: run.Trigger, State: string(run.State), FailureReason: run.FailureReason,
		ScheduledFor: whenOf(run.ScheduledFor, now, tz), Attempt: run.Attempt, Late: run.Late,
		Finished: whenPtr(run.FinishedAt, now, tz),
	}
	if !run.State.Finished() {
		row.NextAttempt = whenPtr(run.NextAttemptAt, now, tz)
	}
	return row
}

type stateLink struct {
	Label    string
	Href     string
	Selected bool
}

type jobData struct {
	jobRow
	URL         string
	Enabled     bool
	MaxAttempts int
	MinBackoff  string
	MaxBackoff  string
	Timeout     string
	CatchUp     string
	Created     *when
	Updated     *when

	Runs      []runRow
	Filter    string
	States    []stateLink
	NextPage  string
	FirstPage string
}

var runStates = []vibejobs.RunState{
	vibejobs.RunScheduled, vibejobs.RunDelivering, vibejobs.RunRetrying,
	vibejobs.RunSucceeded, vibejobs.RunFailed, vibejobs.RunCancelled,
}

func (d *dashboard) jobPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	ctx := r.Context()
	id, ok := pathID(r)
	if !ok {
		d.notFound(w, r, v, "job")
		return
	}
	query, ok := pageQuery(r)
	if !ok {
		d.badQuery(w, r, v)
		return
	}
	j, err := d.store.GetJob(ctx, v.projectID(), id)
	if err != nil {
		d.fail(w, r, v, "job", err)
		return
	}
	if name := repeated(query, "state", "cursor"); name != "" {
		d.badRepeat(w, r, v, name)
		return
	}
	state := query.Get("state")
	if state != "" && !vibejobs.ValidRunState(state) {
		d.renderError(w, r, v, http.StatusBadRequest, "Bad request", "There is no run state of this name.")
		return
	}
	// After the job's check: another project's job reads as a missing
	// one, whatever the cursor.
	sc := listcursor.Scope{Kind: listcursor.Runs, ProjectID: v.projectID(), JobID: j.ID, State: state}
	pos, ok := d.openCursor(w, r, v, query, sc)
	if !ok {
		return
	}
	runs, next, err := d.store.ListRuns(ctx, v.projectID(),
		vibejobs.RunFilter{JobID: j.ID, State: vibejobs.RunState(state)},
		vibejobs.Page{Limit: pageSize, Cursor: pos})
	if err != nil {
		d.fail(w, r, v, "", err)
		return
	}
	base := "/jobs/" + url.PathEscape(j.ID)
	link := func(state, cursor string) string {
		q := url.Values{}
		if state != "" {
			q.Set("state", state)
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		if len(q) == 0 {
			return base
		}
		return base + "?" + q.Encode()
	}
	data := jobData{
		jobRow:      jobRowOf(j, v.now),
		URL:         display.EscapeKeepingLayout(j.URL),
		Enabled:     j.Enabled,
		MaxAttempts: j.Retry.MaxAttempts,
		MinBackoff:  setting(j.Retry.MinBackoff),
		MaxBackoff:  setting(j.Retry.MaxBackoff),
		Timeout:     setting(j.Timeout),
		CatchUp:     string(j.CatchUp),
		Created:     whenOf(j.CreatedAt, v.now, j.Timezone),
		Updated:     whenOf(j.UpdatedAt, v.now, j.Timezone),
		Runs:        make([]runRow, 0, len(runs)),
		Filter:      state,
		States:      []stateLink{{Label: "all", Href: link("", ""), Selected: state == ""}},
	}
	for _, s := range runStates {
		data.States = append(data.States, stateLink{Label: string(s), Href: link(string(s), ""), Selected: state == string(s)})
	}
	for _, run := range runs {
		data.Runs = append(data.Runs, runRowOf(run, v.now, j.Timezone))
	}
	if next != "" {
		data.NextPage = link(state, sc.Bind(next))
	}
	if pos != "" {
		data.FirstPage = link(state, "")
	}
	d.render(w, r, http.StatusOK, "job", page{Title: data.Name, Viewer: viewerOf(v), Refresh: true, Body: data})
}

type attemptRow struct {
	Number             int
	Started            *when
	Duration           string
	StatusCode         int
	ErrorCode          string
	SignatureTimestamp int64
	SignedAt           string
	Snippet            string
}

type runData struct {
	runRow
	JobID    string
	JobName  string // "" when the job was deleted
	Deadline *when
	Created  *when
	Attempts []attemptRow
}

func (d *dashboard) runPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	ctx := r.Context()
	id, ok := pathID(r)
	if !ok {
		d.notFound(w, r, v, "run")
		return
	}
	run, err := d.store.GetRun(ctx, v.projectID(), id)
	if err != nil {
		d.fail(w, r, v, "run", err)
		return
	}
	var tz, jobName string
	switch j, err := d.store.GetJob(ctx, v.projectID(), run.JobID); {
	case err == nil:
		tz, jobName = j.Timezone, display.EscapeKeepingLayout(j.Name)
	case vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND: // a deleted job keeps its runs
		d.internalError(w, r, v, err)
		return
	}
	data := runData{
		runRow:   runRowOf(run, v.now, tz),
		JobID:    run.JobID,
		JobName:  jobName,
		Deadline: whenOf(run.DeadlineAt, v.now, tz),
		Created:  whenOf(run.CreatedAt, v.now, tz),
		Attempts: make([]attemptRow, 0, len(run.Attempts)),
	}
	for _, a := range run.Attempts {
		row := attemptRow{
			Number: a.Number, Started: whenOf(a.StartedAt, v.now, tz), StatusCode: a.StatusCode,
			ErrorCode: a.ErrorCode, SignatureTimestamp: a.SignatureTimestamp,
			// Shown as text (html/template escapes it); never logged.
			Snippet: display.EscapeKeepingLayout(a.ResponseSnippet),
		}
		if !a.FinishedAt.IsZero() {
			row.Duration = elapsed(a.Duration())
		}
		if a.SignatureTimestamp > 0 {
			row.SignedAt = time.Unix(a.SignatureTimestamp, 0).UTC().Format("2006-01-02 15:04:05 UTC")
		}
		data.Attempts = append(data.Attempts, row)
	}
	refresh := !run.State.Finished()
	d.render(w, r, http.StatusOK, "run", page{Title: "Run " + run.ID, Viewer: viewerOf(v), Refresh: refresh, Body: data})
}
