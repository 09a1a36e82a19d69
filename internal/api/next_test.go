package api_test

import (
	"slices"
	"testing"
)

// TestNextSaysWhetherTheTimesRun: the preview of a job's next fire times
// gives the job's state, and willRun false while it is paused: its
// schedule's times are listed (they are the ones a resume before them
// would run), but none of them runs while the job stays paused, and those
// that pass meanwhile are skipped for good (SEMANTICS.md section 4). A
// paused job's preview read like an active one's, times a user then waited
// for in vain.
func TestNextSaysWhetherTheTimesRun(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, map[string]any{"schedule": "*/5 * * * *"})["id"].(string)
	times := []any{"2026-10-09T08:05:00.000Z", "2026-10-09T08:10:00.000Z", "2026-10-09T08:15:00.000Z"}
	check := func(what, path, state string, willRun bool, times []any) {
		t.Helper()
		n := e.must(200, "GET", path, e.admin, nil)
		if n["state"] != state || n["willRun"] != willRun || !slices.Equal(n["times"].([]any), times) {
			t.Errorf("next of %s: %v; want state %s, willRun %v, times %v", what, n, state, willRun, times)
		}
	}
	check("an active job", "/v1/jobs/"+id+"/next?count=3", "active", true, times)
	e.must(200, "POST", "/v1/jobs/"+id+"/pause", e.admin, nil)
	check("a paused job", "/v1/jobs/"+id+"/next?count=3", "paused", false, times)
	e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"enabled": true})
	check("a resumed job", "/v1/jobs/"+id+"/next?count=3", "active", true, times)

	// A one-off paused before its instant: its run is withdrawn and waits
	// for a resume.
	once := e.createJob(e.admin, map[string]any{"schedule": nil, "at": "2026-10-09T09:00:00Z", "enabled": false})["id"].(string)
	check("a paused one-off", "/v1/jobs/"+once+"/next", "paused", false, []any{"2026-10-09T09:00:00.000Z"})
}
