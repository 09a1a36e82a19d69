package api

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/listcursor"
)

type projectJSON struct {
	ID            string  `json:"id"`
	Name          string  `json:"name"`
	RetentionDays *int    `json:"retentionDays"`
	CreatedAt     apiTime `json:"createdAt"`
}

type projectListJSON struct {
	Projects   []projectJSON `json:"projects"`
	NextCursor *string       `json:"nextCursor"`
}

func projectView(p *vibejobs.Project) projectJSON {
	v := projectJSON{ID: p.ID, Name: p.Name, CreatedAt: apiTime(p.CreatedAt)}
	if p.RetentionDays > 0 {
		d := p.RetentionDays
		v.RetentionDays = &d
	}
	return v
}

// tokenJSON never holds the token's value or hash; see tokenWithValue.
type tokenJSON struct {
	ID           string   `json:"id"`
	ProjectID    string   `json:"projectId"`
	Name         string   `json:"name"`
	Role         string   `json:"role"`
	Installation bool     `json:"installation"`
	Prefix       string   `json:"prefix"`
	CreatedAt    apiTime  `json:"createdAt"`
	RevokedAt    *apiTime `json:"revokedAt"`
}

// tokenWithValue is the answer that mints a token: the only time its value
// is shown.
type tokenWithValue struct {
	tokenJSON
	Token string `json:"token"`
}

type tokenListJSON struct {
	Tokens     []tokenJSON `json:"tokens"`
	NextCursor *string     `json:"nextCursor"`
}

func tokenView(t *vibejobs.Token) tokenJSON {
	return tokenJSON{ID: t.ID, ProjectID: t.ProjectID, Name: t.Name, Role: string(t.Role),
		Installation: t.Installation, Prefix: t.Prefix, CreatedAt: apiTime(t.CreatedAt), RevokedAt: timePtr(t.RevokedAt)}
}

// Retention limits of a project's history, in days.
const (
	minRetentionDays = 7
	maxRetentionDays = 3650
)

func (s *Server) createProject(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	o, e := decodeObject(c.body, "")
	if e != nil {
		return nil, e
	}
	if e := o.only("name", "retentionDays"); e != nil {
		return nil, e
	}
	name, e := o.str("name")
	if e != nil {
		return nil, e
	}
	days, e := o.integer("retentionDays")
	if e != nil {
		return nil, e
	}
	if name == nil {
		return nil, invalid("invalid_name", "name", "name is required")
	}
	if e := checkName(*name, "name"); e != nil {
		return nil, e
	}
	p := &vibejobs.Project{ID: vibejobs.NewID("prj_", c.now, s.rand), Name: *name, CreatedAt: c.now}
	if days != nil {
		if *days < minRetentionDays || *days > maxRetentionDays {
			return nil, invalid("invalid_retention_days", "retentionDays", "retentionDays must be 7 to 3650")
		}
		p.RetentionDays = *days
	}
	if err := tx.CreateProject(ctx, p); err != nil {
		return nil, err
	}
	return jsonResponse(http.StatusCreated, projectView(p)).with("Location", "/v1/projects/"+p.ID), nil
}

// listProjects answers a page of the installation's projects, oldest
// first, to the installation token; its cursors continue this list only.
func (s *Server) listProjects(ctx context.Context, c *call) (*response, error) {
	page, e := pageOf(c.r.URL.Query())
	if e != nil {
		return nil, e
	}
	sc := listcursor.Scope{Kind: listcursor.Projects}
	if err := s.openCursor(ctx, &page, sc); err != nil {
		return nil, err
	}
	ps, next, err := s.store.ListProjects(ctx, page)
	if err != nil {
		return nil, err
	}
	out := projectListJSON{Projects: make([]projectJSON, 0, len(ps)), NextCursor: boundCursor(next, sc)}
	for _, p := range ps {
		out.Projects = append(out.Projects, projectView(p))
	}
	return jsonResponse(http.StatusOK, out), nil
}

// getProject answers a project: an admin its own, the installation token
// any (the Location of a created project).
func (s *Server) getProject(ctx context.Context, c *call) (*response, error) {
	p, err := tokenProject(ctx, s.store, c)
	if err != nil {
		return nil, err
	}
	return jsonResponse(http.StatusOK, projectView(p)), nil
}

// tokenProject returns the project a token route names, if the caller may
// manage its tokens: an admin only its own, the installation token any.
// Another project answers 404 exactly like a missing one.
func tokenProject(ctx context.Context, r vibejobs.Reader, c *call) (*vibejobs.Project, error) {
	id := c.r.PathValue("id")
	if !c.token.Installation && id != c.projectID() {
		return nil, vibejobs.ErrNotFound("project")
	}
	return r.GetProject(ctx, id)
}

func (s *Server) createToken(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	o, e := decodeObject(c.body, "")
	if e != nil {
		return nil, e
	}
	if e := o.only("name", "role", "installation"); e != nil {
		return nil, e
	}
	name, e := o.str("name")
	if e != nil {
		return nil, e
	}
	role, e := o.str("role")
	if e != nil {
		return nil, e
	}
	inst, e := o.boolean("installation")
	if e != nil {
		return nil, e
	}
	p, err := tokenProject(ctx, tx, c)
	if err != nil {
		return nil, err
	}
	if name == nil {
		return nil, invalid("invalid_name", "name", "name is required")
	}
	if e := checkName(*name, "name"); e != nil {
		return nil, e
	}
	if role == nil {
		return nil, invalid("invalid_role", "role", "role is required: admin, write or read")
	}
	switch vibejobs.Role(*role) {
	case vibejobs.RoleAdmin, vibejobs.RoleWrite, vibejobs.RoleRead:
	default:
		return nil, invalid("invalid_role", "role", "role must be admin, write or read")
	}
	installation := inst != nil && *inst
	if installation {
		if !c.token.Installation {
			return nil, errForbidden("only the installation administrator token mints installation tokens")
		}
		if vibejobs.Role(*role) != vibejobs.RoleAdmin {
			return nil, invalid("invalid_role", "role", "an installation token has the admin role")
		}
	}
	t, value, err := newToken(s.rand, p.ID, *name, vibejobs.Role(*role), installation, c.now)
	if err != nil {
		return nil, err
	}
	if err := tx.CreateToken(ctx, t, vibejobs.MaxTokensPerProject); err != nil {
		return nil, err
	}
	return jsonResponse(http.StatusCreated, tokenWithValue{tokenView(t), value}), nil
}

func newToken(r io.Reader, projectID, name string, role vibejobs.Role, installation bool, now time.Time) (*vibejobs.Token, string, error) {
	value, hash, err := newTokenValue(r)
	if err != nil {
		return nil, "", err
	}
	return &vibejobs.Token{
		ID: vibejobs.NewID("tok_", now, r), ProjectID: projectID, Name: name, Role: role,
		Installation: installation, Prefix: value[:tokenPrefixLen], Hash: hash, CreatedAt: now,
	}, value, nil
}

// listTokens answers a page of the tokens of the project the path names,
// revoked ones included, oldest first; its cursors continue that project's
// list only.
func (s *Server) listTokens(ctx context.Context, c *call) (*response, error) {
	page, e := pageOf(c.r.URL.Query())
	if e != nil {
		return nil, e
	}
	p, err := tokenProject(ctx, s.store, c)
	if err != nil {
		return nil, err
	}
	// After the project's check: another project answers 404, whatever
	// the cursor, as a project that does not exist.
	sc := listcursor.Scope{Kind: listcursor.Tokens, ProjectID: p.ID}
	if err := s.openCursor(ctx, &page, sc); err != nil {
		return nil, err
	}
	ts, next, err := s.store.ListTokens(ctx, p.ID, page)
	if err != nil {
		return nil, err
	}
	out := tokenListJSON{Tokens: make([]tokenJSON, 0, len(ts)), NextCursor: boundCursor(next, sc)}
	for _, t := range ts {
		out.Tokens = append(out.Tokens, tokenView(t))
	}
	return jsonResponse(http.StatusOK, out), nil
}

// getCallerToken answers the token the request carries: its project, role
// and whether it is the installation's, so that a client holding nothing but
// the token's value (the CLI) can name its project in the token routes. Any
// role may ask; the answer never holds the value.
func (s *Server) getCallerToken(ctx context.Context, c *call) (*response, error) {
	return jsonResponse(http.StatusOK, tokenView(c.token)), nil
}

// revokeToken revokes a token at once. A project admin revokes its own
// project's tokens, except an installation token; revoking a revoked token
// changes nothing.
func (s *Server) revokeToken(ctx context.Context, c *call) (*response, error) {
	id := c.r.PathValue("id")
	err := s.update(ctx, func(tx vibejobs.Tx) error {
		t, err := tx.GetToken(ctx, id)
		if err != nil {
			return err
		}
		if !c.token.Installation {
			if t.ProjectID != c.projectID() {
				return vibejobs.ErrNotFound("token")
			}
			if t.Installation {
				return errForbidden("only the installation administrator token revokes an installation token")
			}
		}
		if t.RevokedAt != nil {
			return nil
		}
		return tx.RevokeToken(ctx, id, c.now)
	})
	if err != nil {
		return nil, err
	}
	return emptyResponse(http.StatusNoContent), nil
}

// Bootstrap prepares an empty installation: when the store holds no project,
// it creates the project "default" and an installation administrator token
// and returns the token's value, the only time it is available. On a store
// that has a project it does nothing (created false).
func Bootstrap(ctx context.Context, store vibejobs.Store, now time.Time, r io.Reader) (token string, created bool, err error) {
	if r == nil {
		r = cryptoRand
	}
	now = now.UTC().Truncate(time.Millisecond)
	err = store.Update(ctx, func(tx vibejobs.Tx) error {
		token, created = "", false
		ps, _, err := tx.ListProjects(ctx, vibejobs.Page{Limit: 1})
		if err != nil {
			return err
		}
		if len(ps) > 0 {
			return nil
		}
		// A fixed id: replicas starting together on one empty database
		// race here, and the primary key lets exactly one of them win.
		p := &vibejobs.Project{ID: BootstrapProjectID, Name: "default", CreatedAt: now}
		if err := tx.CreateProject(ctx, p); err != nil {
			return err
		}
		t, value, err := newToken(r, p.ID, "bootstrap", vibejobs.RoleAdmin, true, now)
		if err != nil {
			return err
		}
		if err := tx.CreateToken(ctx, t, vibejobs.MaxTokensPerProject); err != nil {
			return err
		}
		token, created = value, true
		return nil
	})
	if err != nil {
		// Lost the race to another replica: its project is there now.
		if ps, _, lerr := store.ListProjects(ctx, vibejobs.Page{Limit: 1}); lerr == nil && len(ps) > 0 {
			return "", false, nil
		}
		return "", false, err
	}
	return token, created, nil
}

// BootstrapProjectID is the id of the project created on first start.
const BootstrapProjectID = "prj_default"
