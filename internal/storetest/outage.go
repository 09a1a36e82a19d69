package storetest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
)

// Outage is a Store whose database stops answering the calls named with
// Set (TokenByHash, GetSession, ListJobs, Update): they fail as the stores
// fail while the database is gone or takes no writes, an unavailable error
// wrapped with a cause (a driver message, a file path) that no answer may
// show. The other calls, and all of them after Set(), go to Store.
type Outage struct {
	vibejobs.Store
	mu   sync.Mutex
	down map[string]bool
}

// OutageCause is the text the failing calls' errors carry.
const OutageCause = "disk I/O error at /var/lib/vibejobs"

// Set makes exactly the calls named fail.
func (s *Outage) Set(calls ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = map[string]bool{}
	for _, c := range calls {
		s.down[c] = true
	}
}

func (s *Outage) fails(call string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.down[call] {
		return nil
	}
	return fmt.Errorf("sqlite: %s: %w: %s", call,
		&vibejobs.Error{Kind: vibejobs.EUNAVAILABLE, Code: "database_unavailable", Message: "database unavailable"}, OutageCause)
}

func (s *Outage) TokenByHash(ctx context.Context, hash []byte) (*vibejobs.Token, error) {
	if err := s.fails("TokenByHash"); err != nil {
		return nil, err
	}
	return s.Store.TokenByHash(ctx, hash)
}

func (s *Outage) GetSession(ctx context.Context, key []byte, now time.Time) (*vibejobs.DashboardSession, error) {
	if err := s.fails("GetSession"); err != nil {
		return nil, err
	}
	return s.Store.GetSession(ctx, key, now)
}

func (s *Outage) ListJobs(ctx context.Context, projectID string, p vibejobs.Page) ([]*vibejobs.Job, string, error) {
	if err := s.fails("ListJobs"); err != nil {
		return nil, "", err
	}
	return s.Store.ListJobs(ctx, projectID, p)
}

func (s *Outage) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	if err := s.fails("Update"); err != nil {
		return err
	}
	return s.Store.Update(ctx, fn)
}
