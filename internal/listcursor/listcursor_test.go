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

// TestTokenCursors: a tokens list takes only its own bound cursors. It
// was paged only once cursors were bound, so a bare position is never one
// of its cursors and is refused without a look-up; a cursor of the same
// project's jobs or runs, or of another project's tokens, is refused too.
func TestTokenCursors(t *testing.T) {
	ctx := context.Background()
	const pos = "dG9rXzAxYTExZmFkMTg2OA" // base64url of tok_01a11fad1868
	sc := listcursor.Scope{Kind: listcursor.Tokens, ProjectID: "prj_a"}
	if got, ok, err := sc.Open(ctx, noStore{t}, sc.Bind(pos)); got != pos || !ok || err != nil {
		t.Errorf("Open(Bind(pos)) = %q, %v, %v; want the position", got, ok, err)
	}
	for name, c := range map[string]string{
		"a bare position":                  pos,
		"a jobs cursor of the project":     listcursor.Scope{Kind: listcursor.Jobs, ProjectID: "prj_a"}.Bind(pos),
		"a runs cursor of the project":     listcursor.Scope{Kind: listcursor.Runs, ProjectID: "prj_a"}.Bind(pos),
		"another project's tokens cursor":  listcursor.Scope{Kind: listcursor.Tokens, ProjectID: "prj_b"}.Bind(pos),
		"a bound position of another kind": sc.Bind("am9iXzAxYTExZmFkMTg2OA"), // job_01a11fad1868
	} {
		if got, ok, err := sc.Open(ctx, noStore{t}, c); got != "" || ok || err != nil {
			t.Errorf("Open(%s) = %q, %v, %v; want it refused", name, got, ok, err)
		}
	}
}

// TestProjectCursors: the installation's list of projects takes only its
// own bound cursors: never a bare position (it was paged only once cursors
// were bound), nor a cursor of a project's jobs, runs or tokens, whose
// position names no project.
func TestProjectCursors(t *testing.T) {
	ctx := context.Background()
	const pos = "cHJqXzAxYTExZmFkMTg2OA" // base64url of prj_01a11fad1868
	sc := listcursor.Scope{Kind: listcursor.Projects}
	if got, ok, err := sc.Open(ctx, noStore{t}, sc.Bind(pos)); got != pos || !ok || err != nil {
		t.Errorf("Open(Bind(pos)) = %q, %v, %v; want the position", got, ok, err)
	}
	for name, c := range map[string]string{
		"a bare position":                  pos,
		"a jobs cursor":                    listcursor.Scope{Kind: listcursor.Jobs, ProjectID: "prj_a"}.Bind(pos),
		"a tokens cursor":                  listcursor.Scope{Kind: listcursor.Tokens, ProjectID: "prj_a"}.Bind(pos),
		"a tokens cursor of no project":    listcursor.Scope{Kind: listcursor.Tokens}.Bind(pos),
		"a bound position of another kind": sc.Bind("dG9rXzAxYTExZmFkMTg2OA"), // tok_01a11fad1868
	} {
		if got, ok, err := sc.Open(ctx, noStore{t}, c); got != "" || ok || err != nil {
			t.Errorf("Open(%s) = %q, %v, %v; want it refused", name, got, ok, err)
		}
	}
}
