package listcursor_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/listcursor"
)

// oneOfEach is a store holding job_a and job_b in project prj_a, and run_a
// of job_a; it counts its look-ups.
type oneOfEach struct{ lookups int }

func (s *oneOfEach) GetJob(_ context.Context, projectID, id string) (*vibejobs.Job, error) {
	s.lookups++
	if projectID == "prj_a" && (id == "job_a" || id == "job_b") {
		return &vibejobs.Job{ID: id, ProjectID: projectID}, nil
	}
	return nil, vibejobs.ErrNotFound("job")
}

func (s *oneOfEach) GetRun(_ context.Context, projectID, id string) (*vibejobs.Run, error) {
	s.lookups++
	if projectID == "prj_a" && id == "run_a" {
		return &vibejobs.Run{ID: id, JobID: "job_a", ProjectID: projectID}, nil
	}
	return nil, vibejobs.ErrNotFound("run")
}

// holds reports whether s holds the thing a position of list sc names, in
// sc's project and, for runs of one job, of that job.
func (s *oneOfEach) holds(sc listcursor.Scope, id string) bool {
	switch sc.Kind {
	case listcursor.Jobs:
		return sc.ProjectID == "prj_a" && (id == "job_a" || id == "job_b")
	case listcursor.Tokens, listcursor.Projects:
		return false // a tokens or projects list takes no bare position
	default:
		return sc.ProjectID == "prj_a" && id == "run_a" && (sc.JobID == "" || sc.JobID == "job_a")
	}
}

// scopes are lists the API and the dashboard page: their project comes from
// the caller's token, their job from a job the store found, their state
// from the run states.
var scopes = []listcursor.Scope{
	{Kind: listcursor.Jobs, ProjectID: "prj_a"},
	{Kind: listcursor.Jobs, ProjectID: "prj_b"},
	{Kind: listcursor.Runs, ProjectID: "prj_a"},
	{Kind: listcursor.Runs, ProjectID: "prj_b"},
	{Kind: listcursor.Runs, ProjectID: "prj_a", JobID: "job_a"},
	{Kind: listcursor.Runs, ProjectID: "prj_a", JobID: "job_b"},
	{Kind: listcursor.Runs, ProjectID: "prj_a", State: "failed"},
	{Kind: listcursor.Runs, ProjectID: "prj_a", JobID: "job_a", State: "failed"},
	{Kind: listcursor.Runs, ProjectID: "prj_a", JobID: "job_a", State: "succeeded"},
	{Kind: listcursor.Tokens, ProjectID: "prj_a"},
	{Kind: listcursor.Tokens, ProjectID: "prj_b"},
	{Kind: listcursor.Projects},
}

// FuzzOpen feeds Open whatever a client could send as a cursor, for list
// scopes[i]. A cursor Open takes is the list's own (Bind of a position of
// it, checked without the store) or a bare position of a thing the store
// holds in that list; the position it returns opens again when bound; and a
// bound cursor continues one list only.
func FuzzOpen(f *testing.F) {
	job := base64.RawURLEncoding.EncodeToString([]byte("job_a"))
	run := base64.RawURLEncoding.EncodeToString([]byte("run_a"))
	tok := base64.RawURLEncoding.EncodeToString([]byte("tok_a"))
	prj := base64.RawURLEncoding.EncodeToString([]byte("prj_a"))
	for i, sc := range scopes {
		for _, pos := range []string{job, run, tok, prj} {
			f.Add(sc.Bind(pos), uint8(i), uint8(i+1))
			f.Add(pos, uint8(i), uint8(i+1))
		}
	}
	f.Add("", uint8(0), uint8(0))
	f.Add(".", uint8(0), uint8(0))
	f.Add(job+"=", uint8(0), uint8(0))
	f.Add(job+"."+strings.Repeat("A", 12)+".x", uint8(0), uint8(0))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, cursor string, i, j uint8) {
		if cursor == "" {
			return // Open's callers never pass one
		}
		sc := scopes[int(i)%len(scopes)]
		store := &oneOfEach{}
		pos, ok, err := sc.Open(ctx, store, cursor)
		if err != nil {
			t.Fatalf("Open(%q) in %+v: %v (the store failed nothing)", cursor, sc, err)
		}
		if !ok {
			if pos != "" {
				t.Fatalf("Open(%q) in %+v refused it but gave position %q", cursor, sc, pos)
			}
			return
		}
		raw, derr := base64.RawURLEncoding.Strict().DecodeString(pos)
		prefix := map[listcursor.Kind]string{listcursor.Jobs: "job_", listcursor.Runs: "run_", listcursor.Tokens: "tok_",
			listcursor.Projects: "prj_"}[sc.Kind]
		if derr != nil || !contract.ValidID(string(raw), prefix) {
			t.Fatalf("Open(%q) in %+v gave %q, no position of a %s list", cursor, sc, pos, sc.Kind)
		}
		switch cursor {
		case sc.Bind(pos):
			if store.lookups != 0 {
				t.Fatalf("Open(%q) in %+v looked up the store for a bound cursor", cursor, sc)
			}
		case pos:
			if !store.holds(sc, string(raw)) {
				t.Fatalf("Open(%q) in %+v took a bare position the list does not hold (%q)", cursor, sc, raw)
			}
		default:
			t.Fatalf("Open(%q) in %+v gave %q: the cursor is neither it nor it bound", cursor, sc, pos)
		}

		again, ok, err := sc.Open(ctx, &oneOfEach{}, sc.Bind(pos))
		if again != pos || !ok || err != nil {
			t.Fatalf("Open(Bind(%q)) in %+v = %q, %v, %v", pos, sc, again, ok, err)
		}
		if other := scopes[int(j)%len(scopes)]; other != sc {
			if _, ok, _ := other.Open(ctx, &oneOfEach{}, sc.Bind(pos)); ok {
				t.Fatalf("the cursor %q of %+v continues %+v too", sc.Bind(pos), sc, other)
			}
		}
	})
}
