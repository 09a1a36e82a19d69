package api_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

// unavailableStore is a store whose database stops answering the calls
// named in down, with the error the stores give for an outage.
type unavailableStore struct {
	vibejobs.Store
	mu   sync.Mutex
	down map[string]bool
}

func (s *unavailableStore) set(calls ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = map[string]bool{}
	for _, c := range calls {
		s.down[c] = true
	}
}

func (s *unavailableStore) fails(call string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.down[call] {
		return nil
	}
	// Wrapped, as the stores wrap theirs, with a cause that must not be shown.
	return fmt.Errorf("sqlite: %s: %w: disk I/O error at /var/lib/vibejobs", call,
		&vibejobs.Error{Kind: vibejobs.EUNAVAILABLE, Code: "database_unavailable", Message: "database unavailable"})
}

func (s *unavailableStore) TokenByHash(ctx context.Context, hash []byte) (*vibejobs.Token, error) {
	if err := s.fails("TokenByHash"); err != nil {
		return nil, err
	}
	return s.Store.TokenByHash(ctx, hash)
}

func (s *unavailableStore) ListJobs(ctx context.Context, projectID string, p vibejobs.Page) ([]*vibejobs.Job, string, error) {
	if err := s.fails("ListJobs"); err != nil {
		return nil, "", err
	}
	return s.Store.ListJobs(ctx, projectID, p)
}

func (s *unavailableStore) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	if err := s.fails("Update"); err != nil {
		return err
	}
	return s.Store.Update(ctx, fn)
}

// TestDatabaseUnavailableIs503: while the database does not answer or takes
// no writes (a failover), the API answers 503 database_unavailable, as the
// README and the OpenAPI document say, not 500 internal: the fault is
// passing, and a client or a load balancer should try again. The answer
// names no cause; the log does. A POST refused so is not the answer to its
// Idempotency-Key: sent again once the database answers, it does its work.
func TestDatabaseUnavailableIs503(t *testing.T) {
	var st *unavailableStore
	e := newEnv(t, func(c *api.Config) {
		st = &unavailableStore{Store: c.Store}
		c.Store = st
	})
	doc := loadOpenAPI(t, e)
	post := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "during-outage", body: jobBody(nil)}
	for _, tc := range []struct {
		name string
		down string
		r    req
	}{
		{"token lookup", "TokenByHash", req{method: "GET", path: "/v1/jobs", token: e.admin}},
		{"read", "ListJobs", req{method: "GET", path: "/v1/jobs", token: e.admin}},
		{"write", "Update", post},
	} {
		st.set(tc.down)
		res := e.send(tc.r)
		if code, _ := res.errorCode(t); res.status != 503 || code != "database_unavailable" {
			t.Errorf("%s while the database is down: %s, want 503 database_unavailable", tc.name, res)
		}
		if h := res.header.Get("Retry-After"); h != "2" {
			t.Errorf("%s: a 503 with Retry-After %q, want 2", tc.name, h)
		}
		if strings.Contains(string(res.body), "/var/lib") || strings.Contains(string(res.body), "I/O") {
			t.Errorf("%s: the answer shows the cause: %s", tc.name, res.body)
		}
		if h := res.header.Get("WWW-Authenticate"); h != "" {
			t.Errorf("%s: a 503 challenges the token: WWW-Authenticate %q", tc.name, h)
		}
		route := tc.r.method + " " + tc.r.path
		if responses, _ := doc.operation(route)["responses"].(map[string]any); responses["503"] == nil {
			t.Errorf("the OpenAPI document does not give %s a 503", route)
		}
	}
	if !strings.Contains(e.logs.String(), "disk I/O error") {
		t.Error("the cause of a 503 is not logged")
	}
	st.set()
	if res := e.send(post); res.status != 201 || res.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the POST sent again once the database answers: %s", res)
	}
}
