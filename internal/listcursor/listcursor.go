// Package listcursor ties the page cursors of a project's lists (its jobs,
// its runs, its tokens) and of the installation's list of projects to the
// list they page, so that a cursor continues only the list it came from. The API and the dashboard hand out the same cursors for the
// same list, and both refuse a cursor of another list rather than answer a
// page that starts somewhere else.
//
// A cursor is the store's position, a dot (which store cursors, base64url,
// never hold) and a digest of its list. The digest needs no key: it keeps a
// client from continuing one list with another's cursor by mistake, and a
// made-up cursor can still read only the caller's own project, to which
// every store query is confined (the projects list is the installation
// token's alone, which reads every project anyway).
package listcursor

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
)

// Kind is the kind of list a cursor pages.
type Kind string

const (
	Jobs     Kind = "jobs"
	Runs     Kind = "runs"
	Tokens   Kind = "tokens"
	Projects Kind = "projects"
)

// Scope is the list a cursor continues: its kind, its project and its
// filters; not the page size, which may change from page to page.
type Scope struct {
	Kind      Kind
	ProjectID string // "" for the projects list, the installation's
	JobID     string // runs: of this job only ("" for every job)
	State     string // runs: in this state only ("" for every state)
}

// tag is the digest of sc that the cursors of its list carry. Cursors
// already handed out carry it, so its input must not change.
func (sc Scope) tag() string {
	h := sha256.Sum256([]byte("vibejobs list cursor\x00" + string(sc.Kind) + "\x00" + sc.ProjectID + "\x00" +
		sc.JobID + "\x00" + sc.State))
	return base64.RawURLEncoding.EncodeToString(h[:9])
}

// Bind returns the cursor to hand out for next, the store's cursor of the
// page after this one of list sc; "" when next is "" (no next page).
func (sc Scope) Bind(next string) string {
	if next == "" {
		return ""
	}
	return next + "." + sc.tag()
}

// Reader is what Open needs of the store: to check the position of a
// cursor handed out before cursors were bound to their list.
type Reader interface {
	GetJob(ctx context.Context, projectID, id string) (*vibejobs.Job, error)
	GetRun(ctx context.Context, projectID, id string) (*vibejobs.Run, error)
}

// Open returns the store's position that cursor c continues in list sc, and
// ok false (with pos "") when c is not a cursor of sc: one of another
// project's list, of another kind of list or of other filters, or one
// changed by hand. err is a store error only. c must not be "".
//
// A bare position, as cursors were before they carried their list's tag,
// is accepted so that a client paging across the upgrade is not cut off,
// provided it is a live job of the project for a jobs list, or a run of
// the project (and of the filtered job) for a runs list. A state filter
// cannot be checked, nor a job deleted since. This can go once no such
// cursor can be in use. A tokens list and the projects list were paged
// only once cursors were bound: a bare position is never one of their
// cursors.
func (sc Scope) Open(ctx context.Context, r Reader, c string) (pos string, ok bool, err error) {
	pos, tag, bound := strings.Cut(c, ".")
	id, ok := sc.positionID(pos)
	if !ok {
		return "", false, nil
	}
	if bound {
		if tag != sc.tag() {
			return "", false, nil
		}
		return pos, true, nil
	}
	switch sc.Kind {
	case Tokens, Projects:
		return "", false, nil
	case Jobs:
		_, err = r.GetJob(ctx, sc.ProjectID, id)
	default:
		var run *vibejobs.Run
		if run, err = r.GetRun(ctx, sc.ProjectID, id); err == nil && sc.JobID != "" && run.JobID != sc.JobID {
			return "", false, nil
		}
	}
	switch {
	case vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND:
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return pos, true, nil
}

// positionID returns the id a store position names (the base64url of the
// last id listed), and false unless it is the id of a thing sc lists.
func (sc Scope) positionID(pos string) (string, bool) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(pos)
	if err != nil {
		return "", false
	}
	id := string(b)
	switch sc.Kind {
	case Jobs:
		return id, contract.ValidID(id, "job_")
	case Runs:
		return id, contract.ValidID(id, "run_")
	case Tokens:
		return id, contract.ValidID(id, "tok_")
	case Projects:
		return id, contract.ValidID(id, "prj_")
	}
	return "", false
}
