package storetest

import (
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

func testProjects(t *testing.T, f *fixture) {
	a := &vibejobs.Project{ID: "prj_one", Name: "One", RetentionDays: 30, CreatedAt: T0}
	b := &vibejobs.Project{ID: "prj_two", Name: "Two", CreatedAt: T0.Add(time.Minute)}
	f.update(func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(f.ctx, a); err != nil {
			return err
		}
		return tx.CreateProject(f.ctx, b)
	})

	got, err := f.s.GetProject(f.ctx, a.ID)
	if err != nil {
		t.Fatalf("GetProject: %v", err)
	}
	wantEqual(t, "GetProject", got, a)

	list, next, err := f.s.ListProjects(f.ctx, vibejobs.Page{})
	if err != nil || next != "" {
		t.Fatalf("ListProjects: next %q, %v; want no next page", next, err)
	}
	wantEqual(t, "ListProjects", list, []*vibejobs.Project{a, b})

	a.Name, a.RetentionDays = "One renamed", 7
	f.update(func(tx vibejobs.Tx) error { return tx.UpdateProject(f.ctx, a) })
	got, err = f.s.GetProject(f.ctx, a.ID)
	if err != nil {
		t.Fatalf("GetProject after update: %v", err)
	}
	wantEqual(t, "GetProject after update", got, a)

	_, err = f.s.GetProject(f.ctx, "prj_missing")
	wantNotFound(t, "GetProject of a missing project", err, "project")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		return tx.UpdateProject(f.ctx, &vibejobs.Project{ID: "prj_missing", Name: "x"})
	})
	wantNotFound(t, "UpdateProject of a missing project", err, "project")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		return tx.CreateProject(f.ctx, &vibejobs.Project{ID: a.ID, Name: "dup", CreatedAt: T0})
	})
	wantError(t, "CreateProject with a taken id", err, vibejobs.ECONFLICT, "")
}

func testTokens(t *testing.T, f *fixture) {
	f.projects()
	hash := func(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }
	t1 := &vibejobs.Token{ID: f.id("tok_"), ProjectID: projectA, Name: "ci", Role: vibejobs.RoleWrite,
		Prefix: "vjt_1a2b", Hash: hash("one"), CreatedAt: T0}
	t2 := &vibejobs.Token{ID: f.id("tok_"), ProjectID: projectA, Name: "admin", Role: vibejobs.RoleAdmin,
		Installation: true, Prefix: "vjt_3c4d", Hash: hash("two"), CreatedAt: T0.Add(time.Second)}
	t3 := &vibejobs.Token{ID: f.id("tok_"), ProjectID: projectB, Name: "reader", Role: vibejobs.RoleRead,
		Prefix: "vjt_5e6f", Hash: hash("three"), CreatedAt: T0.Add(2 * time.Second)}
	f.update(func(tx vibejobs.Tx) error {
		for _, tok := range []*vibejobs.Token{t1, t2, t3} {
			if err := tx.CreateToken(f.ctx, tok, vibejobs.MaxTokensPerProject); err != nil {
				return err
			}
		}
		return nil
	})

	got, err := f.s.GetToken(f.ctx, t1.ID)
	if err != nil {
		t.Fatalf("GetToken: %v", err)
	}
	wantEqual(t, "GetToken", got, t1)
	got, err = f.s.TokenByHash(f.ctx, hash("two"))
	if err != nil {
		t.Fatalf("TokenByHash: %v", err)
	}
	wantEqual(t, "TokenByHash", got, t2)

	list, _, err := f.s.ListTokens(f.ctx, projectA, vibejobs.Page{})
	if err != nil {
		t.Fatalf("ListTokens: %v", err)
	}
	slices.SortFunc(list, func(x, y *vibejobs.Token) int { return cmpString(x.ID, y.ID) })
	wantEqual(t, "ListTokens of project A", list, []*vibejobs.Token{t1, t2})

	f.update(func(tx vibejobs.Tx) error { return tx.RevokeToken(f.ctx, t1.ID, T0.Add(time.Hour)) })
	t1.RevokedAt = ptr(T0.Add(time.Hour))
	got, err = f.s.TokenByHash(f.ctx, hash("one"))
	if err != nil {
		t.Fatalf("TokenByHash of a revoked token: %v", err)
	}
	wantEqual(t, "TokenByHash of a revoked token", got, t1)
	got, err = f.s.GetToken(f.ctx, t1.ID)
	if err != nil {
		t.Fatalf("GetToken of a revoked token: %v", err)
	}
	wantEqual(t, "GetToken of a revoked token", got, t1)

	_, err = f.s.GetToken(f.ctx, "tok_missing")
	wantNotFound(t, "GetToken of a missing token", err, "token")
	_, err = f.s.TokenByHash(f.ctx, hash("unknown"))
	wantNotFound(t, "TokenByHash of an unknown hash", err, "token")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.RevokeToken(f.ctx, "tok_missing", T0) })
	wantNotFound(t, "RevokeToken of a missing token", err, "token")
}

// testListTokensPagination: ListTokens pages through a project's tokens,
// revoked ones included, in id order, each once, and no other project's.
func testListTokensPagination(t *testing.T, f *fixture) {
	f.projects()
	var want []string
	for i := range 7 {
		tok := f.newToken(projectA)
		if err := f.createToken(tok, vibejobs.MaxTokensPerProject); err != nil {
			t.Fatalf("CreateToken: %v", err)
		}
		if i%2 == 1 {
			f.update(func(tx vibejobs.Tx) error { return tx.RevokeToken(f.ctx, tok.ID, T0) })
		}
		want = append(want, tok.ID)
		if i%3 == 0 { // interleaved tokens of another project
			if err := f.createToken(f.newToken(projectB), vibejobs.MaxTokensPerProject); err != nil {
				t.Fatalf("CreateToken: %v", err)
			}
		}
	}
	got := pageIDs(t, "ListTokens", func(p vibejobs.Page) ([]string, string, error) {
		tokens, next, err := f.s.ListTokens(f.ctx, projectA, p)
		ids := make([]string, len(tokens))
		for i, tok := range tokens {
			ids[i] = tok.ID
		}
		return ids, next, err
	})
	if !slices.Equal(got, want) {
		t.Fatalf("ListTokens pages: got %v, want %v (ascending id)", got, want)
	}
	// A page that reaches the last token has no next cursor.
	tokens, next, err := f.s.ListTokens(f.ctx, projectA, vibejobs.Page{Limit: 7})
	if err != nil || len(tokens) != 7 || next != "" {
		t.Errorf("ListTokens with limit 7 of 7: %d tokens, next %q, %v; want 7 and no cursor", len(tokens), next, err)
	}
}

// testListProjectsPagination: ListProjects pages through every project of
// the installation in id order, each once; a page that reaches the last
// project has no next cursor.
func testListProjectsPagination(t *testing.T, f *fixture) {
	var want []string
	for range 7 {
		want = append(want, f.project().ID)
	}
	got := pageIDs(t, "ListProjects", func(p vibejobs.Page) ([]string, string, error) {
		projects, next, err := f.s.ListProjects(f.ctx, p)
		ids := make([]string, len(projects))
		for i, p := range projects {
			ids[i] = p.ID
		}
		return ids, next, err
	})
	if !slices.Equal(got, want) {
		t.Fatalf("ListProjects pages: got %v, want %v (ascending id)", got, want)
	}
	projects, next, err := f.s.ListProjects(f.ctx, vibejobs.Page{Limit: 7})
	if err != nil || len(projects) != 7 || next != "" {
		t.Errorf("ListProjects with limit 7 of 7: %d projects, next %q, %v; want 7 and no cursor", len(projects), next, err)
	}
	// In a transaction too, which sees its own projects.
	f.update(func(tx vibejobs.Tx) error {
		p := &vibejobs.Project{ID: f.id("prj_"), Name: "in tx", CreatedAt: T0}
		if err := tx.CreateProject(f.ctx, p); err != nil {
			return err
		}
		cursor := ""
		if projects, next, err := tx.ListProjects(f.ctx, vibejobs.Page{Limit: 7}); err != nil || len(projects) != 7 || next == "" {
			t.Errorf("ListProjects in a transaction: %d projects, next %q, %v; want 7 and a cursor", len(projects), next, err)
		} else {
			cursor = next
		}
		if projects, next, err := tx.ListProjects(f.ctx, vibejobs.Page{Cursor: cursor}); err != nil || len(projects) != 1 ||
			projects[0].ID != p.ID || next != "" {
			t.Errorf("ListProjects in a transaction, page 2: %d projects, next %q, %v; want the one it created", len(projects), next, err)
		}
		return nil
	})
}

// project creates a project with a fresh id, greater than every id before.
func (f *fixture) project() *vibejobs.Project {
	f.t.Helper()
	p := &vibejobs.Project{ID: f.id("prj_"), Name: "project", CreatedAt: T0}
	f.update(func(tx vibejobs.Tx) error { return tx.CreateProject(f.ctx, p) })
	return p
}

// newToken returns a live token of projectID with a fresh id and hash.
func (f *fixture) newToken(projectID string) *vibejobs.Token {
	id := f.id("tok_")
	h := sha256.Sum256([]byte(id))
	return &vibejobs.Token{ID: id, ProjectID: projectID, Name: "t " + id, Role: vibejobs.RoleRead,
		Prefix: "vjt_" + id[len(id)-4:], Hash: h[:], CreatedAt: T0}
}

// createToken creates tok with limit and returns the store's answer.
func (f *fixture) createToken(tok *vibejobs.Token, limit int) error {
	return f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CreateToken(f.ctx, tok, limit) })
}

// testTokenLimit: CreateToken refuses a token beyond the project's limit of
// live tokens (too_many_tokens), counting installation tokens, not revoked
// ones nor another project's; revoking one makes room again.
func testTokenLimit(t *testing.T, f *fixture) {
	f.projects()
	const limit = 3
	var live []*vibejobs.Token
	for i := range limit {
		tok := f.newToken(projectA)
		tok.Installation = i == 0
		if err := f.createToken(tok, limit); err != nil {
			t.Fatalf("token %d of %d: %v", i+1, limit, err)
		}
		live = append(live, tok)
	}
	over := f.newToken(projectA)
	wantError(t, "a token beyond the limit", f.createToken(over, limit), vibejobs.ECONFLICT, "too_many_tokens")
	if _, err := f.s.GetToken(f.ctx, over.ID); vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
		t.Errorf("the refused token was stored: %v", err)
	}
	if e := asError(f.createToken(over, limit)); e == nil || !strings.Contains(e.Message, "3") {
		t.Errorf("the refusal does not name the limit: %v", e)
	}
	// Per project.
	if err := f.createToken(f.newToken(projectB), limit); err != nil {
		t.Errorf("another project's token: %v", err)
	}
	// A revoked token does not count.
	f.update(func(tx vibejobs.Tx) error { return tx.RevokeToken(f.ctx, live[1].ID, T0) })
	if err := f.createToken(over, limit); err != nil {
		t.Fatalf("a token once one was revoked: %v", err)
	}
	wantError(t, "a token beyond the limit again", f.createToken(f.newToken(projectA), limit),
		vibejobs.ECONFLICT, "too_many_tokens")
	// The limit is decided in the transaction: its own tokens count (B has
	// one, room for one more under a limit of 2).
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateToken(f.ctx, f.newToken(projectB), 2); err != nil {
			return err
		}
		return tx.CreateToken(f.ctx, f.newToken(projectB), 2)
	})
	wantError(t, "two tokens in one transaction past the limit", err, vibejobs.ECONFLICT, "too_many_tokens")
	list, _, err := f.s.ListTokens(f.ctx, projectB, vibejobs.Page{})
	if err != nil || len(list) != 1 {
		t.Errorf("project B after the refused transaction: %d tokens, %v; want 1", len(list), err)
	}
	// A missing project is not found, limit or not.
	err = f.createToken(f.newToken("prj_missing"), limit)
	wantNotFound(t, "a token of a missing project", err, "project")
}

// testTokenLimitConcurrent: creations at once on one project never pass
// the limit together.
func testTokenLimitConcurrent(t *testing.T, f *fixture) {
	f.projects()
	const limit, tries = 4, 16
	var (
		wg               sync.WaitGroup
		mu               sync.Mutex
		created, refused int
		start            = make(chan struct{})
	)
	for range tries {
		tok := f.newToken(projectA)
		wg.Go(func() {
			<-start
			err := f.createToken(tok, limit)
			mu.Lock()
			defer mu.Unlock()
			switch e := asError(err); {
			case err == nil:
				created++
			case e != nil && e.Code == "too_many_tokens":
				refused++
			default:
				t.Errorf("CreateToken: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if created != limit || refused != tries-limit {
		t.Errorf("%d creations at once with limit %d: %d created, %d refused", tries, limit, created, refused)
	}
	list, _, err := f.s.ListTokens(f.ctx, projectA, vibejobs.Page{})
	if err != nil || len(list) != limit {
		t.Errorf("ListTokens: %d tokens, %v; want %d", len(list), err, limit)
	}
}

// testPruneRevokedTokens: PruneRevokedTokens deletes a project's tokens
// revoked before the cutoff, in batches of at most limit, and nothing else:
// not a token revoked at or after it, not a live token however old, not
// another project's. The live tokens the limit counts stay as they were:
// at the limit before, at the limit after.
func testPruneRevokedTokens(t *testing.T, f *fixture) {
	f.projects()
	const limit = 3
	newToken := func(projectID string, revokedAt *time.Time) *vibejobs.Token {
		t.Helper()
		tok := f.newToken(projectID)
		tok.CreatedAt = T0.Add(-400 * 24 * time.Hour) // created long before any cutoff
		if err := f.createToken(tok, vibejobs.MaxTokensPerProject); err != nil {
			t.Fatalf("CreateToken: %v", err)
		}
		if revokedAt != nil {
			f.update(func(tx vibejobs.Tx) error { return tx.RevokeToken(f.ctx, tok.ID, *revokedAt) })
		}
		return tok
	}
	var old []*vibejobs.Token
	for i := range 3 {
		old = append(old, newToken(projectA, ptr(T0.Add(-time.Duration(i+1)*time.Hour))))
	}
	atCutoff := newToken(projectA, ptr(T0))
	recent := newToken(projectA, ptr(T0.Add(time.Second)))
	var live []*vibejobs.Token
	for range limit {
		live = append(live, newToken(projectA, nil))
	}
	otherOld := newToken(projectB, ptr(T0.Add(-time.Hour)))
	wantError(t, "a token beyond the limit before pruning", f.createToken(f.newToken(projectA), limit),
		vibejobs.ECONFLICT, "too_many_tokens")

	prune := func(projectID string, limit, want int) {
		t.Helper()
		if n, err := f.s.PruneRevokedTokens(f.ctx, projectID, T0, limit); err != nil || n != want {
			t.Fatalf("PruneRevokedTokens(%s, limit %d) = %d, %v; want %d", projectID, limit, n, err, want)
		}
	}
	prune(projectA, 0, 0)
	prune(projectA, 2, 2)
	prune(projectA, 10, 1)
	prune(projectA, 10, 0)
	for _, tok := range old {
		_, err := f.s.GetToken(f.ctx, tok.ID)
		wantNotFound(t, "GetToken of a pruned token", err, "token")
		_, err = f.s.TokenByHash(f.ctx, tok.Hash)
		wantNotFound(t, "TokenByHash of a pruned token", err, "token")
	}
	for _, tok := range append([]*vibejobs.Token{atCutoff, recent, otherOld}, live...) {
		if _, err := f.s.GetToken(f.ctx, tok.ID); err != nil {
			t.Errorf("GetToken of a token not to prune (revoked at %v): %v", tok.RevokedAt, err)
		}
	}
	list, _, err := f.s.ListTokens(f.ctx, projectA, vibejobs.Page{})
	if err != nil || len(list) != 2+limit {
		t.Errorf("ListTokens after pruning: %d tokens, %v; want %d", len(list), err, 2+limit)
	}
	wantError(t, "a token beyond the limit after pruning", f.createToken(f.newToken(projectA), limit),
		vibejobs.ECONFLICT, "too_many_tokens")
	prune(projectB, 10, 1)
}

var errRollback = errors.New("storetest: roll back")

func testUpdateRollsBack(t *testing.T, f *fixture) {
	f.projects()
	j := f.newJob(projectA)
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(f.ctx, &vibejobs.Project{ID: "prj_c", Name: "C", CreatedAt: T0}); err != nil {
			return err
		}
		if err := tx.CreateJob(f.ctx, j); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the error of fn", err)
	}
	_, err = f.s.GetProject(f.ctx, "prj_c")
	wantNotFound(t, "project of a rolled back transaction", err, "project")
	_, err = f.s.GetJob(f.ctx, projectA, j.ID)
	wantNotFound(t, "job of a rolled back transaction", err, "job")

	// An *Error from a Tx method reaches the caller with its kind.
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, j) })
	wantNotFound(t, "UpdateJob of a missing job through Update", err, "job")
}

func testTxReadsItsWrites(t *testing.T, f *fixture) {
	f.projects()
	j := f.newJob(projectA)
	r := f.newRun(j, T0)
	f.update(func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(f.ctx, &vibejobs.Project{ID: "prj_c", Name: "C", CreatedAt: T0}); err != nil {
			return err
		}
		if _, err := tx.GetProject(f.ctx, "prj_c"); err != nil {
			t.Errorf("GetProject in the transaction that created it: %v", err)
		}
		if err := tx.CreateJob(f.ctx, j); err != nil {
			return err
		}
		if got, err := tx.GetJob(f.ctx, projectA, j.ID); err != nil {
			t.Errorf("GetJob in the transaction that created it: %v", err)
		} else {
			wantEqual(t, "GetJob in the transaction", got, j)
		}
		if jobs, _, err := tx.ListJobs(f.ctx, projectA, vibejobs.Page{}); err != nil || len(jobs) != 1 {
			t.Errorf("ListJobs in the transaction: %d jobs, %v; want 1", len(jobs), err)
		}
		if n, err := tx.CountJobs(f.ctx, projectA); err != nil || n != 1 {
			t.Errorf("CountJobs in the transaction: %d, %v; want 1", n, err)
		}
		if err := tx.CreateRun(f.ctx, r); err != nil {
			return err
		}
		if _, err := tx.GetRun(f.ctx, projectA, r.ID); err != nil {
			t.Errorf("GetRun in the transaction that created it: %v", err)
		}
		if runs, _, err := tx.ListRuns(f.ctx, projectA, vibejobs.RunFilter{}, vibejobs.Page{}); err != nil || len(runs) != 1 {
			t.Errorf("ListRuns in the transaction: %d runs, %v; want 1", len(runs), err)
		}
		rec := f.idempotencyRecord(projectA, "key", T0)
		if err := tx.InsertIdempotencyKey(f.ctx, rec); err != nil {
			return err
		}
		if _, err := tx.GetIdempotencyKey(f.ctx, projectA, "key", T0); err != nil {
			t.Errorf("GetIdempotencyKey in the transaction that inserted it: %v", err)
		}
		tok := &vibejobs.Token{ID: f.id("tok_"), ProjectID: projectA, Name: "t", Role: vibejobs.RoleRead,
			Prefix: "vjt_", Hash: []byte{1, 2, 3}, CreatedAt: T0}
		if err := tx.CreateToken(f.ctx, tok, vibejobs.MaxTokensPerProject); err != nil {
			return err
		}
		if _, err := tx.TokenByHash(f.ctx, []byte{1, 2, 3}); err != nil {
			t.Errorf("TokenByHash in the transaction that created it: %v", err)
		}
		return nil
	})
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
