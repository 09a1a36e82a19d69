package web_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

var (
	jobsNext  = regexp.MustCompile(`href="([^"]+)">Next page`)
	runsNext  = regexp.MustCompile(`href="([^"]+)">Older runs`)
	jobLinks  = regexp.MustCompile(`<td><a href="/jobs/(job_[a-z0-9]+)">`)
	runLinkRE = regexp.MustCompile(`<td><a href="/runs/(run_[a-z0-9]+)">`)
)

// manyJobs creates n jobs of projectID, one per millisecond (ids sort by
// creation), and returns them in the order the jobs list shows them.
func (e *env) manyJobs(projectID string, n int) []string {
	e.t.Helper()
	var ids []string
	e.update(func(tx vibejobs.Tx) error {
		for i := range n {
			e.clock.Advance(time.Millisecond)
			j := e.newJob(projectID, named(fmt.Sprintf("job %03d", i)))
			if err := tx.CreateJob(e.ctx, j); err != nil {
				return err
			}
			ids = append(ids, j.ID)
		}
		return nil
	})
	slices.Sort(ids)
	return ids
}

// manyRuns creates n scheduled runs of j, one per millisecond, and returns
// them newest first, as the job page lists them.
func (e *env) manyRuns(j *vibejobs.Job, n int) []string {
	e.t.Helper()
	var ids []string
	e.update(func(tx vibejobs.Tx) error {
		for i := range n {
			e.clock.Advance(time.Millisecond)
			r := vibejobs.NewRun(vibejobs.NewID("run_", e.clock.Now(), nil), j, vibejobs.TriggerManual,
				t0.Add(time.Duration(i+1)*time.Minute), e.clock.Now())
			if err := tx.CreateRun(e.ctx, r); err != nil {
				return err
			}
			ids = append(ids, r.ID)
		}
		return nil
	})
	slices.Sort(ids)
	slices.Reverse(ids)
	return ids
}

// nextCursor returns the cursor of the next-page link of the page at path.
func (b *browser) nextCursor(path string, link *regexp.Regexp) string {
	b.t.Helper()
	a := b.get(path)
	m := link.FindStringSubmatch(a.body)
	if a.status != http.StatusOK || m == nil {
		b.t.Fatalf("GET %s: %d, no next-page link", path, a.status)
	}
	u, err := url.Parse(htmlUnescape(m[1]))
	if err != nil || u.Query().Get("cursor") == "" {
		b.t.Fatalf("GET %s: next-page link %q holds no cursor", path, m[1])
	}
	return u.Query().Get("cursor")
}

// TestCursorsBelongToTheirList: the cursor of a next-page link continues
// only the list it came from: the jobs list or one job's runs, with the
// same state filter, of the same project. A cursor from any other list, or
// one changed by hand, answers 400 with a page that says so, rather than a
// page that starts somewhere else (often empty); on both stores. A bare
// store position, as links held before, still pages its own list.
func TestCursorsBelongToTheirList(t *testing.T) {
	onEveryStore(t, func(t *testing.T, e *env) {
		e.manyJobs(e.projectA, 51)
		e.manyJobs(e.projectB, 51)
		j1, j2, bJob := e.job(e.projectA, named("one")), e.job(e.projectA, named("two")), e.job(e.projectB, named("theirs"))
		e.manyRuns(j1, 51)
		e.manyRuns(j2, 51)
		e.manyRuns(bJob, 51)

		b := e.browser()
		b.login(tokenB)
		bJobs := b.nextCursor("/", jobsNext)
		bRuns := b.nextCursor("/jobs/"+bJob.ID, runsNext)

		b = e.browser()
		b.login(tokenA)
		aJobs := b.nextCursor("/", jobsNext)
		j1Runs := b.nextCursor("/jobs/"+j1.ID, runsNext)
		j1Scheduled := b.nextCursor("/jobs/"+j1.ID+"?state=scheduled", runsNext)
		j2Runs := b.nextCursor("/jobs/"+j2.ID, runsNext)

		jobs := func(c string) string { return "/?cursor=" + url.QueryEscape(c) }
		runs := func(j *vibejobs.Job, state, c string) string {
			q := url.Values{"cursor": {c}}
			if state != "" {
				q.Set("state", state)
			}
			return "/jobs/" + j.ID + "?" + q.Encode()
		}
		// A cursor is a position, a dot and its list's tag: change either
		// part and it is not one a page made.
		bare, tag, ok := strings.Cut(j1Runs, ".")
		if !ok {
			t.Errorf("a next-page cursor %q carries no list tag", j1Runs)
		}
		flipped := []byte(j1Runs)
		flipped[len(flipped)-1] ^= 1
		for _, c := range []struct {
			path string
			want int
		}{
			// Their own lists go on.
			{jobs(aJobs), 200},
			{runs(j1, "", j1Runs), 200},
			{runs(j1, "scheduled", j1Scheduled), 200},
			{runs(j2, "", j2Runs), 200},
			// Another kind of list.
			{jobs(j1Runs), 400},
			{runs(j1, "", aJobs), 400},
			// Another job's runs.
			{runs(j2, "", j1Runs), 400},
			{runs(j1, "", j2Runs), 400},
			// Another state filter.
			{runs(j1, "scheduled", j1Runs), 400},
			{runs(j1, "", j1Scheduled), 400},
			{runs(j1, "failed", j1Scheduled), 400},
			// Another project's lists.
			{jobs(bJobs), 400},
			{runs(j1, "", bRuns), 400},
			// A bare position, as links held before cursors carried their
			// list: its own job's runs only.
			{runs(j1, "", bare), 200},
			{runs(j2, "", bare), 400},
			{jobs(bare), 400},
			// Changed by hand.
			{runs(j1, "", string(flipped)), 400},
			{runs(j1, "", "."+tag), 400},
			{runs(j1, "", j1Runs+"x"), 400},
			{runs(j1, "", "!!."+tag), 400},
		} {
			a := b.get(c.path)
			if a.status != c.want {
				t.Errorf("GET %s: %d, want %d (%d runs, %d jobs listed)", c.path, a.status, c.want,
					len(runLinkRE.FindAllString(a.body, -1)), len(jobLinks.FindAllString(a.body, -1)))
				continue
			}
			if c.want == 400 && !strings.Contains(a.body, "continues only the list it came from") {
				t.Errorf("GET %s: the error page does not say why:\n%s", c.path, a.body)
			}
		}
	})
}

// TestNextLinksWalkEveryPage: following the next-page links from the first
// page lists every job, and every run of a job (filtered or not), exactly
// once and in order.
func TestNextLinksWalkEveryPage(t *testing.T) {
	onEveryStore(t, func(t *testing.T, e *env) {
		e.manyJobs(e.projectB, 3) // another project's, never listed
		j := e.job(e.projectA)
		failed := e.deliver(j, t0.Add(-time.Hour), 500, "boom",
			vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAttemptsExhausted})
		scheduled := e.manyRuns(j, 121)
		other := e.job(e.projectA, named("other"))
		e.manyRuns(other, 7) // another job's, never listed with j's
		wantJobs := append(e.manyJobs(e.projectA, 121), j.ID, other.ID)
		slices.Sort(wantJobs)
		b := e.browser()
		b.login(tokenA)

		walk := func(first string, link, item *regexp.Regexp) (ids []string, pages int) {
			t.Helper()
			for path := first; path != ""; pages++ {
				if pages > 10 {
					t.Fatalf("walking from %s: more than 10 pages", first)
				}
				a := b.get(path)
				if a.status != http.StatusOK {
					t.Fatalf("GET %s: %d", path, a.status)
				}
				for _, m := range item.FindAllStringSubmatch(a.body, -1) {
					ids = append(ids, m[1])
				}
				path = ""
				if m := link.FindStringSubmatch(a.body); m != nil {
					path = htmlUnescape(m[1])
				}
			}
			return ids, pages
		}
		jobsListed, pages := walk("/", jobsNext, jobLinks)
		if !slices.Equal(jobsListed, wantJobs) || pages != 3 {
			t.Errorf("the jobs list in %d pages: %d jobs, want %d in 3 pages, each once in order", pages, len(jobsListed), len(wantJobs))
		}
		runsListed, pages := walk("/jobs/"+j.ID, runsNext, runLinkRE)
		if want := append(slices.Clone(scheduled), failed.ID); !slices.Equal(runsListed, want) || pages != 3 {
			t.Errorf("the job's runs in %d pages: %d runs, want %d in 3 pages, each once in order", pages, len(runsListed), len(want))
		}
		runsListed, pages = walk("/jobs/"+j.ID+"?state=scheduled", runsNext, runLinkRE)
		if !slices.Equal(runsListed, scheduled) || pages != 3 {
			t.Errorf("the job's scheduled runs in %d pages: %d runs, want %d in 3 pages, each once in order", pages, len(runsListed), len(scheduled))
		}
	})
}
