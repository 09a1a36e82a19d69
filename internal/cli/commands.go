package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/vibejobs/vibejobs/internal/display"
)

// resources maps "jobs", "runs", "events", "subscriptions", "projects" and
// "tokens" to their verbs.
var resources = map[string]map[string]command{
	"jobs": {
		"create": {summary: "Create a job; prints its signing secret, shown only this once.", post: true, flags: jobCreate},
		"list":   {summary: "List the project's jobs.", flags: jobList},
		"get":    {args: "<job-id> ", npos: 1, summary: "Show a job.", flags: jobGet},
		"update": {args: "<job-id> ", npos: 1, summary: "Change a job: only the flags given change.", flags: jobUpdate},
		"pause":  {args: "<job-id> ", npos: 1, summary: "Pause a job: occurrences while paused are skipped.", post: true, flags: jobAction("pause")},
		"resume": {args: "<job-id> ", npos: 1, summary: "Resume a paused job from its next occurrence.", post: true, flags: jobAction("resume")},
		"delete": {args: "<job-id> ", npos: 1, summary: "Delete a job and cancel its waiting runs.", flags: jobDelete},
		"trigger": {args: "<job-id> ", npos: 1, summary: "Run a job now (a manual run), even a paused one.",
			post: true, flags: jobTrigger},
		"rotate-secret": {args: "<job-id> ", npos: 1, summary: "Give a job a new signing secret; prints it, shown only this once.",
			post: true, flags: jobAction("rotate-secret")},
		"next": {args: "<job-id> ", npos: 1, summary: "Preview a job's next fire times.", flags: jobNext},
	},
	"runs": {
		"list": {summary: "List runs, newest first (of one job with --job).", flags: runList},
		"get":  {args: "<run-id> ", npos: 1, summary: "Show a run with its attempts.", flags: runGet},
	},
	"projects": {
		"create": {summary: "Create a project (installation token only).", post: true, flags: projectCreate},
		"list":   {summary: "List projects in id order: those created through the API oldest first, then default (installation token only).", flags: projectList},
	},
	"events": {
		"tail": {summary: "Print the project's event feed as it grows (--follow=false: up to now).", flags: eventsTail},
	},
	"subscriptions": {
		"create": {summary: "Send the feed to a URL from now on; prints its signing secret, shown only this once.", post: true, flags: subscriptionCreate},
		"list":   {summary: "List the project's subscriptions and their delivery state.", flags: subscriptionList},
		"get":    {args: "<subscription-id> ", npos: 1, summary: "Show a subscription.", flags: subscriptionGet},
		"update": {args: "<subscription-id> ", npos: 1, summary: "Change a subscription's URL or filters.", flags: subscriptionUpdate},
		"delete": {args: "<subscription-id> ", npos: 1, summary: "Delete a subscription.", flags: subscriptionDelete},
		"rotate-secret": {args: "<subscription-id> ", npos: 1, summary: "Give a subscription a new secret; the old one also signs for the grace window (24 h by default).",
			post: true, flags: subscriptionAction("rotate-secret")},
		"reset": {args: "<subscription-id> ", npos: 1, summary: "Jump a subscription's cursor to the head: the events in between are never sent.",
			post: true, flags: subscriptionAction("reset")},
	},
	"tokens": {
		"create": {summary: "Mint an API token for the project (the token's own unless --project); prints it, shown only this once.", post: true, flags: tokenCreate},
		"list":   {summary: "List the tokens of the project (the token's own unless --project), revoked ones included.", flags: tokenList},
		"revoke": {args: "<token-id> ", npos: 1, summary: "Revoke a token, at once.", flags: tokenRevoke},
	},
}

// jobFlags are the settings of jobs create and jobs update.
type jobFlags struct {
	name, schedule, at, timezone, url, minBackoff, maxBackoff, timeout, catchUp string
	maxAttempts                                                                 int
}

// register defines the flags on fs. The API's defaults are named for jobs
// create only: jobs update changes just the flags given, and a "default"
// there would read as what an omitted flag resets to.
func (f *jobFlags) register(fs *flag.FlagSet, create bool) {
	def := func(v string) string {
		if create {
			return " (default " + v + ")"
		}
		return ""
	}
	fs.StringVar(&f.name, "name", "", "job `name` (1–200 characters)")
	fs.StringVar(&f.schedule, "schedule", "", "cron (5 or 6 fields), @daily…, or \"@every 10m\"")
	fs.StringVar(&f.at, "at", "", "one-off: an RFC 3339 `instant` instead of a schedule")
	fs.StringVar(&f.timezone, "timezone", "", "IANA time `zone` of the schedule"+def("UTC"))
	fs.StringVar(&f.url, "url", "", "target `URL` the runs are POSTed to")
	fs.IntVar(&f.maxAttempts, "max-attempts", 0, "attempts per run, 1–4"+def("4"))
	fs.StringVar(&f.minBackoff, "min-backoff", "", "first retry delay, 1s–1h"+def("30s"))
	fs.StringVar(&f.maxBackoff, "max-backoff", "", "longest retry delay, up to 24h"+def("1h"))
	fs.StringVar(&f.timeout, "timeout", "", "attempt timeout, 1s–30s"+def("10s"))
	fs.StringVar(&f.catchUp, "catch-up", "", "after downtime: all, latest or none"+def("all"))
}

// body is the JSON of the flags given.
func (f *jobFlags) body(set map[string]bool) map[string]any {
	b := map[string]any{}
	for flagName, v := range map[string]struct {
		key string
		val string
	}{
		"name": {"name", f.name}, "schedule": {"schedule", f.schedule}, "at": {"at", f.at},
		"timezone": {"timezone", f.timezone}, "url": {"url", f.url}, "timeout": {"timeout", f.timeout},
		"catch-up": {"catchUp", f.catchUp},
	} {
		if set[flagName] {
			b[v.key] = v.val
		}
	}
	retry := map[string]any{}
	if set["max-attempts"] {
		retry["maxAttempts"] = f.maxAttempts
	}
	if set["min-backoff"] {
		retry["minBackoff"] = f.minBackoff
	}
	if set["max-backoff"] {
		retry["maxBackoff"] = f.maxBackoff
	}
	if len(retry) > 0 {
		b["retry"] = retry
	}
	return b
}

func jobCreate(fs *flag.FlagSet) func(*call) error {
	var f jobFlags
	f.register(fs, true)
	paused := fs.Bool("paused", false, "create the job paused")
	return func(c *call) error {
		if !c.set["name"] || !c.set["url"] {
			return usagef("jobs create needs --name and --url")
		}
		switch {
		case c.set["schedule"] && c.set["at"]:
			return usagef("jobs create takes --schedule or --at, not both: --at is a one-off job's instant")
		case !c.set["schedule"] && !c.set["at"]:
			return usagef("jobs create needs one of --schedule and --at")
		}
		b := f.body(c.set)
		if *paused {
			b["enabled"] = false
		}
		rep, err := c.client.do(c.ctx, "POST", "/v1/jobs", b, c.key)
		if err != nil {
			return err
		}
		return c.printJob(rep, true)
	}
}

func jobUpdate(fs *flag.FlagSet) func(*call) error {
	var f jobFlags
	f.register(fs, false)
	enabled := fs.String("enabled", "", "true to resume, false to pause")
	return func(c *call) error {
		b := f.body(c.set)
		if c.set["enabled"] {
			v, err := strconv.ParseBool(*enabled)
			if err != nil {
				return usagef("--enabled must be true or false")
			}
			b["enabled"] = v
		}
		if len(b) == 0 {
			return usagef("jobs update needs at least one flag to change")
		}
		rep, err := c.client.do(c.ctx, "PATCH", "/v1/jobs/"+url.PathEscape(c.pos[0]), b, "")
		if err != nil {
			return err
		}
		return c.printJob(rep, false)
	}
}

func jobGet(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		rep, err := c.client.do(c.ctx, "GET", "/v1/jobs/"+url.PathEscape(c.pos[0]), nil, "")
		if err != nil {
			return err
		}
		return c.printJob(rep, false)
	}
}

// jobAction is a POST /v1/jobs/{id}/<action> that answers the job.
func jobAction(action string) func(fs *flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		return func(c *call) error {
			rep, err := c.client.do(c.ctx, "POST", "/v1/jobs/"+url.PathEscape(c.pos[0])+"/"+action, nil, c.key)
			if err != nil {
				return err
			}
			return c.printJob(rep, action == "rotate-secret")
		}
	}
}

func jobDelete(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		if _, err := c.client.do(c.ctx, "DELETE", "/v1/jobs/"+url.PathEscape(c.pos[0]), nil, ""); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"id": c.pos[0], "deleted": true})
		}
		fmt.Fprintf(c.stdout, "deleted job %s\n", display.Escape(c.pos[0]))
		return nil
	}
}

func jobTrigger(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		rep, err := c.client.do(c.ctx, "POST", "/v1/jobs/"+url.PathEscape(c.pos[0])+"/runs", nil, c.key)
		if err != nil {
			return err
		}
		return c.printRun(rep)
	}
}

func jobNext(fs *flag.FlagSet) func(*call) error {
	count := fs.Int("count", 5, "how many fire times, 1–100 (default 5)")
	return func(c *call) error {
		rep, err := c.client.do(c.ctx, "GET", "/v1/jobs/"+url.PathEscape(c.pos[0])+"/next?count="+strconv.Itoa(*count), nil, "")
		if err != nil {
			return err
		}
		if c.json {
			return c.raw(rep)
		}
		var n struct {
			JobID string   `json:"jobId"`
			Times []string `json:"times"`
			// WillRun is nil from a server that predates it.
			WillRun *bool `json:"willRun"`
		}
		if err := decode(rep, &n); err != nil {
			return err
		}
		if n.WillRun != nil && !*n.WillRun {
			fmt.Fprintln(c.stderr, "the job is paused: none of these times runs while it is, and those that pass before a resume are skipped")
		}
		t := c.table("#", "FIRE TIME (UTC)")
		for i, tm := range n.Times {
			t.row(strconv.Itoa(i+1), tm)
		}
		if len(n.Times) == 0 {
			fmt.Fprintln(c.stdout, "no more fire times")
			return nil
		}
		return t.flush()
	}
}

// pageFlags select a page of a list; --all walks every page.
type pageFlags struct {
	limit  int
	cursor string
	all    bool
}

func (p *pageFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&p.limit, "limit", 0, "page size, 1–100 (default 50)")
	fs.StringVar(&p.cursor, "cursor", "", "`cursor` of the page to show (nextCursor of the previous one)")
	fs.BoolVar(&p.all, "all", false, "follow every page")
}

func (p *pageFlags) query(q url.Values, cursor string) string {
	if p.limit != 0 {
		q.Set("limit", strconv.Itoa(p.limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// pages fetches path's pages (one, or every one with --all) and returns the
// items under key, with the last page's nextCursor.
func (c *call) pages(p *pageFlags, path string, q url.Values, key string) (items []json.RawMessage, next string, err error) {
	// Given out of range or empty, they were dropped: --limit 0 showed 50
	// and --cursor "" (an unset shell variable) the first page.
	if c.set["limit"] && (p.limit < 1 || p.limit > 100) {
		return nil, "", usagef("--limit must be from 1 to 100")
	}
	if c.set["cursor"] && p.cursor == "" {
		return nil, "", usagef("--cursor is empty: give the nextCursor of the previous page, or leave it out for the first")
	}
	cursor := p.cursor
	for {
		rep, err := c.client.do(c.ctx, "GET", path+p.query(q, cursor), nil, "")
		if err != nil {
			return nil, "", err
		}
		var page map[string]json.RawMessage
		if err := decode(rep, &page); err != nil {
			return nil, "", err
		}
		var some []json.RawMessage
		if err := json.Unmarshal(page[key], &some); err != nil {
			return nil, "", fmt.Errorf("unexpected answer from the server: %v", err)
		}
		items = append(items, some...)
		next = ""
		if nc, ok := page["nextCursor"]; ok {
			_ = json.Unmarshal(nc, &next)
		}
		if !p.all || next == "" {
			return items, next, nil
		}
		cursor = next
	}
}

// printPage prints a list as JSON ({key: items, nextCursor}) or hands each
// item to the table.
func (c *call) printPage(key string, items []json.RawMessage, next string, tbl func(items []json.RawMessage) error) error {
	if c.json {
		var nc any
		if next != "" {
			nc = next
		}
		if items == nil {
			items = []json.RawMessage{}
		}
		return c.printJSON(map[string]any{key: items, "nextCursor": nc})
	}
	if err := tbl(items); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(c.stderr, "more: --cursor %s (or --all)\n", display.Escape(next))
	}
	return nil
}

// decodeItems decodes each item of a list's page as a T.
func decodeItems[T any](items []json.RawMessage) ([]T, error) {
	out := make([]T, 0, len(items))
	for _, raw := range items {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func jobList(fs *flag.FlagSet) func(*call) error {
	var p pageFlags
	p.register(fs)
	return func(c *call) error {
		items, next, err := c.pages(&p, "/v1/jobs", url.Values{}, "jobs")
		if err != nil {
			return err
		}
		return c.printPage("jobs", items, next, func(items []json.RawMessage) error {
			js, err := decodeItems[apiJob](items)
			if err != nil {
				return err
			}
			t := c.table("ID", "NAME", "SCHEDULE", "TZ", "STATE", "NEXT RUN", "LAST RUN")
			for _, j := range js {
				t.row(j.ID, j.Name, j.when(), j.Timezone, j.State, dash(j.NextRunAt), j.lastRun())
			}
			return t.flush()
		})
	}
}

func runList(fs *flag.FlagSet) func(*call) error {
	var p pageFlags
	p.register(fs)
	jobID := fs.String("job", "", "only the runs of this `job-id`")
	state := fs.String("state", "", "only runs in this state: scheduled, delivering, retrying, succeeded, failed, cancelled")
	return func(c *call) error {
		// A filter given empty (an unset shell variable) is sent as given,
		// and refused: dropped, it listed the runs of every job or state.
		q := url.Values{}
		if c.set["state"] {
			q.Set("state", *state)
		}
		// By the list's jobId filter, not the job's own runs path: a
		// deleted job's runs stay listed while the history keeps them.
		if c.set["job"] {
			q.Set("jobId", *jobID)
		}
		items, next, err := c.pages(&p, "/v1/runs", q, "runs")
		if err != nil {
			return err
		}
		return c.printPage("runs", items, next, func(items []json.RawMessage) error {
			rs, err := decodeItems[apiRun](items)
			if err != nil {
				return err
			}
			t := c.table("ID", "JOB", "TRIGGER", "SCHEDULED FOR", "STATE", "ATTEMPT", "LATE", "FINISHED")
			for _, r := range rs {
				t.row(r.ID, r.JobID, r.Trigger, r.ScheduledFor, r.stateText(), strconv.Itoa(r.Attempt), yesNo(r.Late), dash(r.FinishedAt))
			}
			return t.flush()
		})
	}
}

func runGet(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		rep, err := c.client.do(c.ctx, "GET", "/v1/runs/"+url.PathEscape(c.pos[0]), nil, "")
		if err != nil {
			return err
		}
		return c.printRun(rep)
	}
}

func projectCreate(fs *flag.FlagSet) func(*call) error {
	name := fs.String("name", "", "project `name`")
	days := fs.Int("retention-days", 0, "keep finished runs this many `days` (7–3650; default: the installation's)")
	return func(c *call) error {
		if !c.set["name"] {
			return usagef("projects create needs --name")
		}
		b := map[string]any{"name": *name}
		if c.set["retention-days"] {
			b["retentionDays"] = *days
		}
		rep, err := c.client.do(c.ctx, "POST", "/v1/projects", b, c.key)
		if err != nil {
			return err
		}
		if c.json {
			return c.raw(rep)
		}
		var p apiProject
		if err := decode(rep, &p); err != nil {
			return err
		}
		return c.projectTable([]apiProject{p})
	}
}

func projectList(fs *flag.FlagSet) func(*call) error {
	var p pageFlags
	p.register(fs)
	return func(c *call) error {
		items, next, err := c.pages(&p, "/v1/projects", url.Values{}, "projects")
		if err != nil {
			return err
		}
		return c.printPage("projects", items, next, func(items []json.RawMessage) error {
			ps, err := decodeItems[apiProject](items)
			if err != nil {
				return err
			}
			return c.projectTable(ps)
		})
	}
}

// projectFlag is the --project of the token commands. Like every other
// command, they act on the project of the token they are given unless
// --project names another (which only the installation token may).
func projectFlag(fs *flag.FlagSet, usage string) *string {
	return fs.String("project", "", "`project-id` "+usage+" (default: the token's own project)")
}

// tokenProject returns --project, or else asks the server which project the
// call's token belongs to. A server that cannot say (one from before GET
// /v1/token) makes --project necessary, and the error says so.
func (c *call) tokenProject(projectID, command string) (string, error) {
	if c.set["project"] {
		if projectID == "" {
			return "", usagef("--project must name a project")
		}
		return projectID, nil
	}
	rep, err := c.client.do(c.ctx, "GET", "/v1/token", nil, "")
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return "", usagef("%s needs --project: this server does not say which project the token belongs to", command)
	}
	if err != nil {
		return "", err
	}
	var t apiToken
	if err := decode(rep, &t); err != nil {
		return "", err
	}
	if t.ProjectID == "" {
		return "", usagef("%s needs --project: this server does not say which project the token belongs to", command)
	}
	return t.ProjectID, nil
}

func tokenCreate(fs *flag.FlagSet) func(*call) error {
	projectID := projectFlag(fs, "the token belongs to")
	name := fs.String("name", "", "token `name`")
	role := fs.String("role", "", "admin, write or read")
	installation := fs.Bool("installation", false, "an installation administrator token (installation token only)")
	return func(c *call) error {
		if !c.set["name"] || !c.set["role"] {
			return usagef("tokens create needs --name and --role")
		}
		project, err := c.tokenProject(*projectID, "tokens create")
		if err != nil {
			return err
		}
		b := map[string]any{"name": *name, "role": *role}
		if *installation {
			b["installation"] = true
		}
		rep, err := c.client.do(c.ctx, "POST", "/v1/projects/"+url.PathEscape(project)+"/tokens", b, c.key)
		if err != nil {
			return err
		}
		if c.json {
			return c.raw(rep)
		}
		var t apiToken
		if err := decode(rep, &t); err != nil {
			return err
		}
		if err := c.tokenTable([]apiToken{t}); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "\ntoken: %s\n(shown only this once: store it now)\n", display.Escape(t.Token))
		return nil
	}
}

func tokenList(fs *flag.FlagSet) func(*call) error {
	projectID := projectFlag(fs, "whose tokens to list")
	var p pageFlags
	p.register(fs)
	return func(c *call) error {
		project, err := c.tokenProject(*projectID, "tokens list")
		if err != nil {
			return err
		}
		items, next, err := c.pages(&p, "/v1/projects/"+url.PathEscape(project)+"/tokens", url.Values{}, "tokens")
		if err != nil {
			return err
		}
		return c.printPage("tokens", items, next, func(items []json.RawMessage) error {
			ts, err := decodeItems[apiToken](items)
			if err != nil {
				return err
			}
			return c.tokenTable(ts)
		})
	}
}

func tokenRevoke(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		if _, err := c.client.do(c.ctx, "DELETE", "/v1/tokens/"+url.PathEscape(c.pos[0]), nil, ""); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"id": c.pos[0], "revoked": true})
		}
		fmt.Fprintf(c.stdout, "revoked token %s\n", display.Escape(c.pos[0]))
		return nil
	}
}
