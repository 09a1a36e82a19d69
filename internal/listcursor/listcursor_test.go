package listcursor_test

import (
	"context"
	"testing"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/listcursor"
)

// noStore fails the test if Open looks anything up: a bound cursor is
// checked by its tag alone.
type noStore struct{ t *testing.T }

func (s noStore) GetJob(context.Context, string, string) (*vibejobs.Job, error) {
	s.t.Error("GetJob called")
	return nil, nil
}

func (s noStore) GetRun(context.Context, string, string) (*vibejobs.Run, error) {
	s.t.Error("GetRun called")
	return nil, nil
}

// TestBindKeepsItsFormat: cursors already handed out (by the API before the
// dashboard shared this package) carry this tag, so a change of what goes
// into it would refuse every cursor in use.
func TestBindKeepsItsFormat(t *testing.T) {
	const pos = "cnVuXzAxYTExZmFkMTg2OA" // base64url of run_01a11fad1868
	sc := listcursor.Scope{Kind: listcursor.Runs, ProjectID: "prj_a", JobID: "job_1", State: "failed"}
	if got, want := sc.Bind(pos), pos+".YKeclLBNljlo"; got != want {
		t.Errorf("Bind = %q, want %q", got, want)
	}
	if got := sc.Bind(""); got != "" {
		t.Errorf(`Bind("") = %q, want ""`, got)
	}
	got, ok, err := sc.Open(context.Background(), noStore{t}, sc.Bind(pos))
	if got != pos || !ok || err != nil {
		t.Errorf("Open(Bind(pos)) = %q, %v, %v; want the position", got, ok, err)
	}
}
