package api_test

import (
	"testing"

	"github.com/vibejobs/vibejobs"
)

// TestRunsOfADeletedJobStayListable: a deleted job's runs stay in the run
// history until retention prunes them (SEMANTICS.md section 5), each
// readable by its id and in the project's list; the jobId filter of
// /v1/runs finds them too, as /v1/events' finds the job's events. The job
// itself is gone: its own paths, /v1/jobs/{id}/runs included, answer 404,
// and so does the filter for a job the project never had, or had no run of
// left, or another project's.
func TestRunsOfADeletedJobStayListable(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, nil)["id"].(string)
	run := e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)["id"].(string)
	empty := e.createJob(e.admin, nil)["id"].(string)
	e.must(204, "DELETE", "/v1/jobs/"+id, e.admin, nil)
	e.must(204, "DELETE", "/v1/jobs/"+empty, e.admin, nil)

	got := e.must(200, "GET", "/v1/runs?jobId="+id, e.admin, nil)
	if ids := pageIDs(got, "runs"); len(ids) != 1 || ids[0] != run {
		t.Fatalf("runs of the deleted job: %v, want [%s]", ids, run)
	}
	checkFields(t, "the deleted job's run", got["runs"].([]any)[0].(map[string]any),
		map[string]any{"state": "cancelled", "failureReason": "job_deleted"})
	if ids := pageIDs(e.must(200, "GET", "/v1/runs?jobId="+id+"&state=succeeded", e.admin, nil), "runs"); len(ids) != 0 {
		t.Errorf("succeeded runs of the deleted job: %v, want none", ids)
	}

	_, other := e.newProject("other")
	for _, c := range []struct{ what, path, token string }{
		{"the deleted job's own runs path", "/v1/jobs/" + id + "/runs", e.admin},
		{"a deleted job without runs", "/v1/runs?jobId=" + empty, e.admin},
		{"a job never created", "/v1/runs?jobId=job_missing", e.admin},
		{"another project's deleted job", "/v1/runs?jobId=" + id, other[vibejobs.RoleAdmin]},
	} {
		res := e.do("GET", c.path, c.token, nil)
		if code, _ := res.errorCode(t); res.status != 404 || code != "job_not_found" {
			t.Errorf("%s: %s, want 404 job_not_found", c.what, res)
		}
	}
}
