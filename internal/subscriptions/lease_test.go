package subscriptions_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/subscriptions"
)

// stallFirstWrite holds the first cursor write that carries a delivery
// until resume is closed, telling stalled when it starts to wait: a
// database that answers that write late.
type stallFirstWrite struct {
	subscriptions.Store
	once    sync.Once
	stalled chan struct{}
	resume  chan struct{}
}

func (s *stallFirstWrite) RecordSubscriptionStep(ctx context.Context, owner string, st vibejobs.SubscriptionStep) (*vibejobs.Subscription, error) {
	if st.Delivered {
		s.once.Do(func() {
			close(s.stalled)
			<-s.resume
		})
	}
	return s.Store.RecordSubscriptionStep(ctx, owner, st)
}

// TestReclaimedSubscriptionEndsTheFormerSession: a session whose lease
// expired while a cursor write of its was slow is taken over by a new
// claim, here by its own process. The former session must stop at that
// write instead of sending on next to the new one: the receiver would get
// the subscription's events twice over, two at a time.
func TestReclaimedSubscriptionEndsTheFormerSession(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		e.clock.Add(100 * time.Millisecond) // each request takes 100 ms: a cursor write after each
		r.srv.Config.Handler.ServeHTTP(w, req)
	}))
	defer slow.Close()
	e.subscribe(slow.URL)
	e.emit(e.job, e.updates(3)...)
	st := &stallFirstWrite{Store: e.store, stalled: make(chan struct{}), resume: make(chan struct{})}
	d := e.deliverer("w1", st)

	first := make(chan struct{})
	go func() { runOnce(t, d); close(first) }()
	<-st.stalled // event 1 accepted; its cursor write waits
	if got := seqs(r.drain()); len(got) != 1 || got[0] != 1 {
		t.Fatalf("before the stall: %v", got)
	}
	e.clock.Add(subscriptions.DefaultLease + time.Second) // the lease expires meanwhile

	x, finish := r.inFlight(t, func() { runOnce(t, d) }) // the subscription is claimed again
	if x.seq() != 1 {
		t.Fatalf("the new session sent %d first, want 1 (its cursor was not written)", x.seq())
	}
	close(st.resume) // the late write lands while the new session's request is in flight
	select {
	case y := <-r.got:
		t.Errorf("event %d was sent while the new session's request was in flight: two sessions work the subscription", y.seq())
	case <-first:
	}
	finish()
	<-first
	var all []int
	all = append(all, 1, x.seq())
	all = append(all, seqs(r.drain())...)
	if want := []int{1, 1, 2, 3}; len(all) != len(want) || all[2] != 2 || all[3] != 3 {
		t.Errorf("received %v, want %v (event 1 again, as its cursor write came too late)", all, want)
	}
}

// slowCalls is a database that takes 9 s of the clock to answer each claim,
// read of the feed and read of a subscription: slow, yet within
// DefaultStoreTimeout.
type slowCalls struct {
	subscriptions.Store
	e *env
}

func (s slowCalls) ClaimSubscriptions(ctx context.Context, owner string, now time.Time, limit int, lease time.Duration) ([]*vibejobs.Subscription, error) {
	defer s.e.clock.Add(9 * time.Second)
	return s.Store.ClaimSubscriptions(ctx, owner, now, limit, lease)
}

func (s slowCalls) ListEvents(ctx context.Context, projectID string, f vibejobs.EventFilter) (vibejobs.EventPage, error) {
	defer s.e.clock.Add(9 * time.Second)
	return s.Store.ListEvents(ctx, projectID, f)
}

func (s slowCalls) GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error) {
	defer s.e.clock.Add(9 * time.Second)
	return s.Store.GetSubscription(ctx, projectID, id)
}

// TestLeaseCoversEveryRequest: a request is sent only while the session's
// lease covers its whole budget. Here slow database calls used 27 s of the
// 30 s lease before the first request: sent as it was, the request could
// still be in flight when the lease ended, and another replica, claiming
// the subscription then, would send the same event alongside it.
func TestLeaseCoversEveryRequest(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL)
	e.emit(e.job, vibejobs.EventJobUpdated)
	a := e.deliverer("a", slowCalls{Store: e.store, e: e})

	x, finish := r.inFlight(t, func() { runOnce(t, a) })
	if x.seq() != 1 {
		t.Fatalf("in flight: %d", x.seq())
	}
	// 4 s later, within the request's 10 s budget, replica b looks.
	e.clock.Add(4 * time.Second)
	b := make(chan struct{})
	go func() { runOnce(t, e.deliverer("b", nil)); close(b) }()
	select {
	case y := <-r.got:
		t.Errorf("replica b sent event %d while replica a's request for event 1 was in flight", y.seq())
	case <-b:
	}
	finish()
	<-b
	if s := e.get(sub.ID); s.Cursor != 1 || s.Failing() {
		t.Errorf("after the request: cursor %d, error %q", s.Cursor, s.ErrorCode)
	}
}
