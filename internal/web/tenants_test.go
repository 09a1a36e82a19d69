package web_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// TestAnotherProjectOnEveryStore: logged in with project A's token, every
// page naming project B's job or run, with any filter or cursor, reads
// exactly as for an id that does not exist, and cursors minted in B show A's
// things only; on both stores.
func TestAnotherProjectOnEveryStore(t *testing.T) {
	onEveryStore(t, func(t *testing.T, e *env) {
		own := e.job(e.projectA)
		ownRun := e.run(own, t0.Add(time.Minute))
		other := e.job(e.projectB, named("beta job"), func(j *vibejobs.Job) { j.URL = "https://beta-target.example.test/hook" })
		e.clock.Advance(time.Millisecond)
		other2 := e.job(e.projectB, named("beta job two"))
		otherRun := e.deliver(other, t0.Add(-time.Hour), 200, "beta-snippet", vibejobs.Step{State: vibejobs.RunSucceeded})
		e.clock.Advance(time.Millisecond)
		otherRun2 := e.run(other, t0.Add(2*time.Hour))
		// Cursors minted in B.
		_, bJobs, err := e.store.ListJobs(e.ctx, e.projectB, vibejobs.Page{Limit: 1})
		if err != nil || bJobs == "" {
			t.Fatalf("B's jobs cursor: %q, %v", bJobs, err)
		}
		_, bRuns, err := e.store.ListRuns(e.ctx, e.projectB, vibejobs.RunFilter{}, vibejobs.Page{Limit: 1})
		if err != nil || bRuns == "" {
			t.Fatalf("B's runs cursor: %q, %v", bRuns, err)
		}

		b := e.browser()
		b.login(tokenA)
		const missingJob, missingRun = "job_00000000000000000000000000", "run_00000000000000000000000000"
		var bodies []string
		for _, c := range []struct{ theirs, missing string }{
			{"/jobs/" + other.ID, "/jobs/" + missingJob},
			{"/jobs/" + other2.ID, "/jobs/" + missingJob},
			{"/jobs/" + other.ID + "?state=succeeded", "/jobs/" + missingJob + "?state=succeeded"},
			{"/jobs/" + other.ID + "?state=bogus", "/jobs/" + missingJob + "?state=bogus"},
			{"/jobs/" + other.ID + "?cursor=" + bRuns, "/jobs/" + missingJob + "?cursor=" + bRuns},
			{"/runs/" + otherRun.ID, "/runs/" + missingRun},
			{"/runs/" + otherRun2.ID, "/runs/" + missingRun},
		} {
			theirs, missing := b.get(c.theirs), b.get(c.missing)
			bodies = append(bodies, theirs.body)
			if theirs.status != http.StatusNotFound || missing.status != http.StatusNotFound {
				t.Errorf("GET %s: %d, a missing id %d; want 404 for both", c.theirs, theirs.status, missing.status)
			}
			if theirs.body != missing.body {
				t.Errorf("GET %s reads differently from a missing id:\n%s\n---\n%s", c.theirs, theirs.body, missing.body)
			}
		}
		for _, p := range []string{"/", "/?cursor=" + bJobs, "/jobs/" + own.ID, "/jobs/" + own.ID + "?cursor=" + bRuns,
			"/jobs/" + own.ID + "?state=succeeded", "/runs/" + ownRun.ID} {
			a := b.get(p)
			if a.status != http.StatusOK && a.status != http.StatusBadRequest {
				t.Errorf("GET %s: %d", p, a.status)
			}
			bodies = append(bodies, a.body)
		}
		for _, body := range bodies {
			for _, f := range []string{other.ID, other2.ID, otherRun.ID, otherRun2.ID, "beta job", "beta-snippet", "beta-target", "Project Beta"} {
				if strings.Contains(body, f) {
					t.Errorf("a page shown to project A holds %q of project B", f)
				}
			}
		}
	})
}
