package subscriptions_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/subscriptions"
	"github.com/vibejobs/vibejobs/receiver"
)

// TestEachSubscriptionGetsItsOwnProjectsFeed: two projects, each with a
// subscription, append events whose sequence numbers overlap (every feed
// counts from 1). Each receiver gets its own project's events only, under
// its own project's event ids, signed with its own secret; and a project's
// feed moving on sends nothing to the other's caught-up subscription. On
// both stores.
func TestEachSubscriptionGetsItsOwnProjectsFeed(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		e := newEnv(t)
		eachSubscriptionGetsItsOwnProjectsFeed(t, e, e.store)
	})
	t.Run("postgres", func(t *testing.T) {
		e := newEnv(t) // for its clock, keyring and egress client
		st := postgres.MustOpenTestWith(t, postgres.Options{Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now})
		eachSubscriptionGetsItsOwnProjectsFeed(t, e, st)
	})
}

func eachSubscriptionGetsItsOwnProjectsFeed(t *testing.T, e *env, st vibejobs.Store) {
	ctx := context.Background()
	upd := func(fn func(tx vibejobs.Tx) error) {
		t.Helper()
		if err := st.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	type tenant struct {
		project string
		job     *vibejobs.Job
		recv    *recv
		sub     *vibejobs.Subscription
		secret  string
	}
	newTenant := func(project string) *tenant {
		now := e.clock.Now()
		tn := &tenant{project: project, recv: newRecv(t)}
		tn.job = &vibejobs.Job{ID: "job_" + project, ProjectID: project, Name: project, Schedule: "0 0 1 1 *",
			Timezone: "UTC", URL: "https://example.test/", Enabled: true, State: vibejobs.JobActive,
			Retry:   vibejobs.RetryPolicy{MaxAttempts: 1, MinBackoff: time.Second, MaxBackoff: time.Second},
			Timeout: 5 * time.Second, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: now, CreatedAt: now, UpdatedAt: now}
		tn.sub = &vibejobs.Subscription{ID: "sub_" + project, ProjectID: project, URL: tn.recv.srv.URL, CreatedAt: now, UpdatedAt: now}
		tn.secret, _ = contract.NewSecret(nil)
		tn.sub.Secret, _ = e.keys.Seal(tn.secret, tn.sub.ID)
		jobSecret, _ := contract.NewSecret(nil)
		tn.job.Secret, _ = e.keys.Seal(jobSecret, tn.job.ID)
		upd(func(tx vibejobs.Tx) error {
			if err := tx.CreateProject(ctx, &vibejobs.Project{ID: project, Name: project, CreatedAt: now}); err != nil {
				return err
			}
			if err := tx.CreateJob(ctx, tn.job); err != nil {
				return err
			}
			return tx.CreateSubscription(ctx, tn.sub, vibejobs.MaxSubscriptionsPerProject)
		})
		return tn
	}
	a, b := newTenant("prj_alpha"), newTenant("prj_beta")
	emit := func(tn *tenant, n int) {
		t.Helper()
		upd(func(tx vibejobs.Tx) error {
			var evs []*vibejobs.Event
			for range n {
				evs = append(evs, vibejobs.JobEvent(vibejobs.EventJobUpdated, tn.job, e.clock.Now()))
			}
			return tx.AppendEvents(ctx, evs...)
		})
	}
	d := subscriptions.New(subscriptions.Config{Store: st, Sender: e.client, Opener: e.keys, Owner: "w1",
		Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now, Rand: func() float64 { return 0.5 }})
	check := func(round string, tn, other *tenant, want []int) {
		t.Helper()
		got := tn.recv.drain()
		var ss []int
		for _, x := range got {
			ss = append(ss, x.seq())
			if id := x.header.Get(subscriptions.HeaderEventID); id != tn.project+":"+strconv.Itoa(x.seq()) || x.event["id"] != id {
				t.Errorf("%s: %s's receiver got event id %q (body id %v)", round, tn.project, id, x.event["id"])
			}
			if x.event["jobId"] != tn.job.ID {
				t.Errorf("%s: %s's receiver got an event of job %v", round, tn.project, x.event["jobId"])
			}
			if bytes.Contains(x.body, []byte(other.project)) || bytes.Contains(x.body, []byte(other.job.ID)) {
				t.Errorf("%s: %s's receiver got %s", round, tn.project, x.body)
			}
			if err := receiver.VerifyEvent(x.header.Get("Vibe-Signature"), x.body, e.clock.Now(), tn.secret); err != nil {
				t.Errorf("%s: %s's receiver: signature: %v", round, tn.project, err)
			}
		}
		if !slices.Equal(ss, want) {
			t.Errorf("%s: %s's receiver got sequences %v, want %v", round, tn.project, ss, want)
		}
	}

	emit(a, 3)
	emit(b, 2)
	if err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	check("first round", a, b, []int{1, 2, 3})
	check("first round", b, a, []int{1, 2})

	// Only A's feed moves: B, caught up at 2, is sent nothing, though A's
	// sequences now pass B's cursor.
	emit(a, 2)
	if err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	check("second round", a, b, []int{4, 5})
	check("second round", b, a, nil)
	for _, tn := range []*tenant{a, b} {
		s, err := st.GetSubscription(ctx, tn.project, tn.sub.ID)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[*tenant]int64{a: 5, b: 2}[tn]; s.Cursor != want || s.Failing() {
			t.Errorf("%s's subscription: cursor %d, failing %v; want cursor %d", tn.project, s.Cursor, s.Failing(), want)
		}
	}
}
