package subscriptions_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/subscriptions"
)

// TestResetWhileAFailingRequestIsInFlightPostgres is
// TestResetWhileAFailingRequestIsInFlight on PostgreSQL.
func TestResetWhileAFailingRequestIsInFlightPostgres(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t) // for its clock, keyring and egress client
	st := postgres.MustOpenTestWith(t, postgres.Options{Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now})
	upd := func(fn func(tx vibejobs.Tx) error) {
		t.Helper()
		if err := st.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	upd(func(tx vibejobs.Tx) error {
		return tx.CreateProject(ctx, &vibejobs.Project{ID: e.project, Name: "test", CreatedAt: t0})
	})
	r := newRecv(t)
	now := e.clock.Now()
	sub := &vibejobs.Subscription{ID: "sub_pg", ProjectID: e.project, URL: r.srv.URL, CreatedAt: now, UpdatedAt: now}
	secret, _ := contract.NewSecret(nil)
	sub.Secret, _ = e.keys.Seal(secret, sub.ID)
	upd(func(tx vibejobs.Tx) error { return tx.CreateSubscription(ctx, sub, 16) })
	emit := func() {
		upd(func(tx vibejobs.Tx) error {
			return tx.AppendEvents(ctx, &vibejobs.Event{ProjectID: e.project, Type: vibejobs.EventJobUpdated,
				OccurredAt: e.clock.Now(), JobID: "job_a", State: "active"})
		})
	}
	d := subscriptions.New(subscriptions.Config{Store: st, Sender: e.client, Opener: e.keys, Owner: "w1",
		Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now, Rand: func() float64 { return 0.5 }})
	emit() // sequence 1, never accepted
	for range 6 {
		r.answer(500)
		if err := d.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		e.clock.Add(2 * time.Hour)
	}
	r.drain()

	r.answer(500)
	_, finish := r.inFlight(t, func() { _ = d.RunOnce(ctx) })
	upd(func(tx vibejobs.Tx) error {
		_, err := tx.ResetSubscription(ctx, e.project, sub.ID, e.clock.Now())
		return err
	})
	finish()

	emit() // sequence 2
	if err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := seqs(r.drain())
	s, _ := st.GetSubscription(ctx, e.project, sub.ID)
	if len(got) != 1 || got[0] != 2 || s.Failing() {
		t.Fatalf("after the reset: sent %v; errorCode %q attempts %d nextAttemptAt %v", got, s.ErrorCode, s.Attempts, s.NextAttemptAt)
	}
}
