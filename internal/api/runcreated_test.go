package api_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

// retryingStore runs a transaction's function a second time, as the
// PostgreSQL store does after a serialization failure or a deadlock (40001,
// 40P01): once armed, the function of the Update call numbered at runs, its
// transaction is rolled back as if the commit had failed, between() runs
// (what a concurrent request committed meanwhile), and the function runs
// again.
type retryingStore struct {
	vibejobs.Store
	mu      sync.Mutex
	calls   int
	at      int // 0: disarmed
	between func()
}

var errSimulatedDeadlock = errors.New("simulated deadlock (40P01)")

func (s *retryingStore) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	s.mu.Lock()
	s.calls++
	hit := s.at != 0 && s.calls == s.at
	s.mu.Unlock()
	if hit {
		err := s.Store.Update(ctx, func(tx vibejobs.Tx) error {
			if err := fn(tx); err != nil {
				return err
			}
			return errSimulatedDeadlock
		})
		if !errors.Is(err, errSimulatedDeadlock) {
			return err
		}
		s.between()
	}
	return s.Store.Update(ctx, fn)
}

// TestRunCreatedNotCountedForARetriedRefusal: POST /v1/jobs/{id}/runs
// whose transaction is retried (PostgreSQL) and whose retry is refused (the
// job was deleted meanwhile) created no run, yet RunCreated (the
// vibejobs_runs_created_total{trigger="manual"} metric) is called: the
// effect loop in idempotent() reset wake and changedJob before each attempt
// and after a refusal, but not runCreated.
func TestRunCreatedNotCountedForARetriedRefusal(t *testing.T) {
	var created atomic.Int32
	var rs *retryingStore
	e := newEnv(t, func(c *api.Config) {
		rs = &retryingStore{Store: c.Store}
		c.Store = rs
		c.RunCreated = func() { created.Add(1) }
	})
	id := e.createJob(e.admin, nil)["id"].(string)

	rs.mu.Lock()
	// Calls of the trigger: 1 claims the key, 2 is the effect.
	rs.calls, rs.at = 0, 2
	rs.between = func() {
		if err := e.store.Update(context.Background(), func(tx vibejobs.Tx) error {
			return tx.DeleteJob(context.Background(), e.project, id, e.clock.Now())
		}); err != nil {
			t.Errorf("deleting the job between the attempts: %v", err)
		}
	}
	rs.mu.Unlock()

	r := e.do("POST", "/v1/jobs/"+id+"/runs", e.admin, nil)
	if r.status != 404 {
		t.Fatalf("trigger after the job was deleted: %s, want 404", r)
	}
	runs, _, err := e.store.ListRuns(context.Background(), e.project, vibejobs.RunFilter{JobID: id}, vibejobs.Page{Limit: 10})
	if err == nil && len(runs) != 0 {
		t.Fatalf("runs of the job: %d, want none", len(runs))
	}
	if n := created.Load(); n != 0 {
		t.Errorf("RunCreated called %d times for a trigger answered 404 that created no run", n)
	}
}
