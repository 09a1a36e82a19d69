package subscriptions_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// failN makes sub fail n times at its next event (2 h apart, so each is due).
func (e *env) failN(t *testing.T, r *recv, sub *vibejobs.Subscription, n int) {
	t.Helper()
	d := e.deliverer("w1", nil)
	for range n {
		r.answer(500)
		runOnce(t, d)
		e.clock.Add(2 * time.Hour)
	}
	r.drain()
	if s := e.get(sub.ID); s.Attempts != n {
		t.Fatalf("setup: %+v", s)
	}
}

// inFlight runs round in the background with r holding the request it
// receives; it returns that request once it is in flight, and finish, which
// lets it go (r holds no more requests after it) and waits for round to end.
func (r *recv) inFlight(t *testing.T, round func()) (request, func()) {
	t.Helper()
	hold := make(chan struct{})
	r.mu.Lock()
	r.hold = hold
	r.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(round)
	x := r.next(t)
	return x, func() {
		r.mu.Lock()
		r.hold = nil
		r.mu.Unlock()
		close(hold)
		wg.Wait()
	}
}

// TestResetWhileAFailingRequestIsInFlight: POST /reset clears the failure
// state and moves the cursor to the head. A refused retry of the old event
// in flight at that moment ends after the reset: its failure must not be
// recorded over it (the subscription would show failing again and wait out
// the backoff of its old attempt count before sending new events).
func TestResetWhileAFailingRequestIsInFlight(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL)
	e.emit(e.job, vibejobs.EventJobUpdated) // sequence 1, the receiver never accepts it
	e.failN(t, r, sub, 6)

	r.answer(500)
	x, finish := r.inFlight(t, func() { runOnce(t, e.deliverer("w1", nil)) })
	if x.seq() != 1 {
		t.Fatalf("in flight: %s", x.body)
	}
	// The operator resets (what POST /v1/subscriptions/{id}/reset runs).
	var reset *vibejobs.Subscription
	e.update(func(tx vibejobs.Tx) error {
		var err error
		reset, err = tx.ResetSubscription(context.Background(), e.project, sub.ID, e.clock.Now())
		return err
	})
	if reset.Cursor != 1 || reset.Failing() || reset.Attempts != 0 || reset.NextAttemptAt != nil {
		t.Fatalf("reset answered %+v", reset)
	}
	finish()

	e.emit(e.job, vibejobs.EventJobUpdated) // sequence 2, after the reset
	runOnce(t, e.deliverer("w1", nil))
	got := seqs(r.drain())
	s := e.get(sub.ID)
	if len(got) != 1 || got[0] != 2 || s.Failing() || s.Attempts != 0 {
		t.Fatalf("after the reset: sent %v; subscription cursor %d errorCode %q attempts %d nextAttemptAt %v",
			got, s.Cursor, s.ErrorCode, s.Attempts, s.NextAttemptAt)
	}
}

// TestNewURLWhileAFailingRequestIsInFlight: a new URL is tried at once,
// even by a subscription waiting for its next retry. A retry to the old URL
// in flight when the URL changed ends afterwards: its failure must not make
// the fixed subscription wait out the old backoff.
func TestNewURLWhileAFailingRequestIsInFlight(t *testing.T) {
	e := newEnv(t)
	bad, good := newRecv(t), newRecv(t)
	sub, _ := e.subscribe(bad.srv.URL)
	e.emit(e.job, vibejobs.EventJobUpdated)
	e.failN(t, bad, sub, 6)

	bad.answer(500)
	_, finish := bad.inFlight(t, func() { runOnce(t, e.deliverer("w1", nil)) })
	// What PATCH /v1/subscriptions/{id} {"url": good} runs.
	e.update(func(tx vibejobs.Tx) error {
		s, err := tx.GetSubscription(context.Background(), e.project, sub.ID)
		if err != nil {
			return err
		}
		s.URL, s.NextAttemptAt, s.UpdatedAt = good.srv.URL, nil, e.clock.Now()
		return tx.UpdateSubscription(context.Background(), s)
	})
	finish()

	runOnce(t, e.deliverer("w1", nil))
	if got := seqs(good.drain()); len(got) != 1 || got[0] != 1 {
		s := e.get(sub.ID)
		t.Fatalf("the new URL got %v; subscription errorCode %q attempts %d nextAttemptAt %v (now %v)",
			got, s.ErrorCode, s.Attempts, s.NextAttemptAt, e.clock.Now())
	}
}

// TestDeletedSubscriptionGetsNoMoreEvents: once DELETE has answered, the
// session streaming the subscription sends it no further event (it used to
// send the rest of its page, up to 99 events, until its next cursor write).
func TestDeletedSubscriptionGetsNoMoreEvents(t *testing.T) {
	e := newEnv(t)
	r := newRecv(t)
	sub, _ := e.subscribe(r.srv.URL)
	e.emit(e.job, e.updates(5)...)
	x, finish := r.inFlight(t, func() { runOnce(t, e.deliverer("w1", nil)) })
	if x.seq() != 1 {
		t.Fatalf("in flight: %s", x.body)
	}
	e.update(func(tx vibejobs.Tx) error { return tx.DeleteSubscription(context.Background(), e.project, sub.ID) })
	e.clock.Add(20 * time.Millisecond) // the request took 20 ms
	finish()
	if got := seqs(r.drain()); len(got) != 0 {
		t.Fatalf("after the subscription was deleted its URL received %v", got)
	}
}
