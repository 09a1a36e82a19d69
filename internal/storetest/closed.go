package storetest

import (
	"testing"

	"github.com/vibejobs/vibejobs"
)

// testClosed: every call on a closed Store is EUNAVAILABLE
// database_unavailable, the error of a database that does not answer,
// which the API answers 503 and the loops wait out: a server stopping
// closes its store under the requests that outlasted its drain. Reads
// whose statements were used before the Close included. A SQLite store
// answered these with its driver's "database is closed", an internal
// error: 500.
func testClosed(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	read := map[string]func() error{
		"GetJob":      func() error { _, err := f.s.GetJob(f.ctx, projectA, j.ID); return err },
		"ListJobs":    func() error { _, _, err := f.s.ListJobs(f.ctx, projectA, vibejobs.Page{}); return err },
		"TokenByHash": func() error { _, err := f.s.TokenByHash(f.ctx, []byte("no such token")); return err },
		"GetSession":  func() error { _, err := f.s.GetSession(f.ctx, []byte("no such session"), T0); return err },
	}
	for name, call := range read {
		if err := call(); err != nil && vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
			t.Fatalf("%s before Close: %v", name, err)
		}
	}
	if err := f.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	calls := map[string]func() error{
		"Update": func() error {
			return f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
				_, err := tx.GetJob(f.ctx, projectA, j.ID)
				return err
			})
		},
		"ClaimDueRuns": func() error { _, err := f.s.ClaimDueRuns(f.ctx, "owner", T0, 10, Margin); return err },
		"DueJobs":      func() error { _, err := f.s.DueJobs(f.ctx, T0, vibejobs.DuePosition{}, 10); return err },
		"Ping":         func() error { return f.s.Ping(f.ctx) },
	}
	for name, call := range read {
		calls[name] = call
	}
	for name, call := range calls {
		err := call()
		if err == nil {
			t.Errorf("%s after Close: no error", name)
			continue
		}
		if e := asError(err); e == nil || e.Kind != vibejobs.EUNAVAILABLE || e.Code != "database_unavailable" {
			t.Errorf("%s after Close: %v (kind %q), want EUNAVAILABLE database_unavailable", name, err, vibejobs.ErrorKind(err))
		}
	}
}
