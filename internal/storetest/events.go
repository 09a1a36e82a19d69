package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// events reads every event of projectID after after (all pages).
func (f *fixture) events(projectID string, after int64) []*vibejobs.Event {
	f.t.Helper()
	var out []*vibejobs.Event
	for {
		p, err := f.s.ListEvents(f.ctx, projectID, vibejobs.EventFilter{After: after, Limit: 100})
		if err != nil {
			f.t.Fatalf("ListEvents(%s, after %d): %v", projectID, after, err)
		}
		out = append(out, p.Events...)
		if p.Next == after {
			return out
		}
		after = p.Next
	}
}

// head returns the project's head.
func (f *fixture) head(projectID string) int64 {
	f.t.Helper()
	p, err := f.s.ListEvents(f.ctx, projectID, vibejobs.EventFilter{After: 1 << 40})
	if err != nil {
		f.t.Fatalf("ListEvents: %v", err)
	}
	return p.Head
}

// eventLine is the short form tests compare: "type run attempt state reason error".
func eventLine(e *vibejobs.Event) string {
	return strings.TrimSpace(fmt.Sprintf("%s %s %d %s %s %s", e.Type, e.RunID, e.Attempt, e.State, e.Reason, e.ErrorCode))
}

func eventLines(es []*vibejobs.Event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = eventLine(e)
	}
	return out
}

// wantSequences checks that es are numbered from+1, from+2, … without gaps.
func wantSequences(t *testing.T, what string, es []*vibejobs.Event, from int64) {
	t.Helper()
	for i, e := range es {
		if e.Sequence != from+int64(i)+1 {
			t.Fatalf("%s: event %d has sequence %d, want %d (%v)", what, i, e.Sequence, from+int64(i)+1, eventLines(es))
		}
	}
}

func testEventsOfOutcomes(t *testing.T, f *fixture) {
	f.projects()
	if p, err := f.s.ListEvents(f.ctx, projectA, vibejobs.EventFilter{}); err != nil || p.Head != 0 || len(p.Events) != 0 || p.Next != 0 {
		t.Fatalf("empty feed: %+v, %v", p, err)
	}
	j := f.job(projectA)
	gone := f.job(projectA)
	a := f.run(j, T0.Add(-4*time.Minute))
	b := f.run(j, T0.Add(-3*time.Minute))
	c := f.run(j, T0.Add(-2*time.Minute))
	d := f.run(gone, T0.Add(-time.Minute))
	cs := f.claimIDs("w1", T0, 4, a, b, c, d)
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, gone.ID, T0) })

	next := T0.Add(40 * time.Second)
	oa := succeeded(cs[0], T0, T0.Add(time.Second))
	ob := failed(cs[1], T0, T0.Add(2*time.Second), 401, vibejobs.ReasonAppRejected)
	oc := retrying(cs[2], T0, T0.Add(3*time.Second), next)
	od := retrying(cs[3], T0, T0.Add(4*time.Second), next)
	f.record("w1", oa, ob, oc, od)
	f.record("w2", succeeded(cs[2], T0, T0.Add(time.Second))) // dropped: no event

	got := f.events(projectA, 0)
	wantSequences(t, "events of one batch", got, 0)
	wantEqual(t, "events of one batch", eventLines(got), []string{
		"run.succeeded " + a.ID + " 1 succeeded",
		"run.failed " + b.ID + " 1 failed app_rejected http_4xx",
		"run.retrying " + c.ID + " 1 retrying  http_5xx",
		"run.cancelled " + d.ID + " 1 cancelled job_deleted http_5xx",
	})
	for i, o := range []vibejobs.Outcome{oa, ob, oc, od} {
		e := got[i]
		if e.ProjectID != projectA || e.JobID == "" || !e.OccurredAt.Equal(o.Attempt.FinishedAt) || e.StatusCode != o.Attempt.StatusCode {
			t.Errorf("event %d: project %s job %q occurred %s status %d; want the attempt's end %s and status %d",
				i, e.ProjectID, e.JobID, e.OccurredAt, e.StatusCode, o.Attempt.FinishedAt, o.Attempt.StatusCode)
		}
	}
	if got[2].NextAt == nil || !got[2].NextAt.Equal(next) || got[0].NextAt != nil || got[3].NextAt != nil {
		t.Errorf("next attempt times: %v %v %v", got[0].NextAt, got[2].NextAt, got[3].NextAt)
	}
	if got[3].JobID != gone.ID || got[0].JobID != j.ID {
		t.Errorf("job ids: %s %s", got[0].JobID, got[3].JobID)
	}
	if p, _ := f.s.ListEvents(f.ctx, projectA, vibejobs.EventFilter{}); p.Head != 4 || p.Next != 4 {
		t.Errorf("head %d next %d, want 4 4", p.Head, p.Next)
	}
	if p, _ := f.s.ListEvents(f.ctx, projectB, vibejobs.EventFilter{}); p.Head != 0 || len(p.Events) != 0 {
		t.Errorf("another project's feed: %+v", p)
	}
}

func testEventsOfCancellationsAndRecovery(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) { j.Timeout = 10 * time.Second })
	k := f.job(projectA, func(j *vibejobs.Job) { j.Timeout = 10 * time.Second })
	waiting := f.run(k, T0.Add(time.Hour))
	released := f.run(k, T0.Add(-2*time.Second))
	c := f.claimIDs("w1", T0.Add(-time.Second), 1, released)[0]
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, k.ID, T0) })
	got := f.events(projectA, 0)
	wantEqual(t, "DeleteJob", eventLines(got), []string{"run.cancelled " + waiting.ID + " 0 cancelled job_deleted"})
	if !got[0].OccurredAt.Equal(T0) {
		t.Errorf("cancellation at %s, want %s", got[0].OccurredAt, T0)
	}
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{c}, T0.Add(time.Second), T0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	got = f.events(projectA, 1)
	wantEqual(t, "ReleaseClaims of a deleted job's run", eventLines(got), []string{"run.cancelled " + released.ID + " 0 cancelled job_deleted"})
	wantSequences(t, "ReleaseClaims", got, 1)

	first := f.run(j, T0)
	expired := f.run(j, T0.Add(-vibejobs.DeliveryLifetime+5*time.Second), dueAt(T0.Add(-time.Millisecond)))
	f.claimIDs("w1", T0, 2, expired, first)
	now := T0.Add(time.Minute)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, now, 10); err != nil || n != 2 {
		t.Fatalf("RecoverExpiredLeases = %d, %v", n, err)
	}
	got = f.events(projectA, 2)
	wantSequences(t, "RecoverExpiredLeases", got, 2)
	want := []string{
		"run.retrying " + first.ID + " 1 scheduled  interrupted",
		"run.failed " + expired.ID + " 1 failed deadline_exceeded interrupted",
	}
	if first.ID > expired.ID {
		want[0], want[1] = want[1], want[0]
	}
	wantEqual(t, "RecoverExpiredLeases", eventLines(got), want)
	for _, e := range got {
		if !e.OccurredAt.Equal(now) {
			t.Errorf("%s at %s, want %s", e.Type, e.OccurredAt, now)
		}
		if e.Type == vibejobs.EventRunRetrying && (e.NextAt == nil || !e.NextAt.Equal(now)) {
			t.Errorf("recovered run due again at %v, want %s", e.NextAt, now)
		}
	}

	late := f.run(j, T0.Add(-vibejobs.DeliveryLifetime-time.Hour), dueAt(T0.Add(-vibejobs.DeliveryLifetime-time.Hour)))
	if n, err := f.s.FailExpiredRuns(f.ctx, T0.Add(2*time.Minute), 10); err != nil || n < 1 {
		t.Fatalf("FailExpiredRuns = %d, %v", n, err)
	}
	got = f.events(projectA, 4)
	var lines []string
	for _, e := range got {
		if e.RunID == late.ID {
			lines = append(lines, eventLine(e))
		}
	}
	wantEqual(t, "FailExpiredRuns", lines, []string{"run.failed " + late.ID + " 0 failed deadline_exceeded"})
	wantSequences(t, "FailExpiredRuns", got, 4)
}

func testEventsAppendedAtomically(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	boom := errors.New("boom")
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if err := tx.AppendEvents(f.ctx, vibejobs.JobEvent(vibejobs.EventJobUpdated, j, T0)); err != nil {
			return err
		}
		p, err := tx.ListEvents(f.ctx, projectA, vibejobs.EventFilter{})
		if err != nil || len(p.Events) != 1 || p.Head != 1 {
			t.Errorf("the transaction does not read its own event: %+v %v", p, err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update = %v", err)
	}
	if h := f.head(projectA); h != 0 {
		t.Fatalf("rolled back event left head %d", h)
	}
	// A rolled back DeleteJob leaves no cancellation either.
	f.run(j, T0.Add(time.Hour))
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if err := tx.DeleteJob(f.ctx, projectA, j.ID, T0); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || f.head(projectA) != 0 {
		t.Fatalf("rolled back DeleteJob: %v, head %d", err, f.head(projectA))
	}

	k := f.job(projectB)
	next := T0.Add(time.Hour)
	j.NextRunAt = &next
	evs := []*vibejobs.Event{
		vibejobs.JobEvent(vibejobs.EventJobCreated, j, T0),
		vibejobs.JobEvent(vibejobs.EventJobCreated, k, T0),
		vibejobs.JobEvent(vibejobs.EventJobPaused, j, T0.Add(time.Second)),
		vibejobs.JobEvent(vibejobs.EventJobDeleted, j, T0.Add(2*time.Second)),
	}
	f.update(func(tx vibejobs.Tx) error { return tx.AppendEvents(f.ctx, evs...) })
	if evs[0].Sequence != 1 || evs[1].Sequence != 1 || evs[2].Sequence != 2 || evs[3].Sequence != 3 {
		t.Fatalf("sequences %d %d %d %d, want 1 1 2 3 (no gap after the rollbacks; per project)",
			evs[0].Sequence, evs[1].Sequence, evs[2].Sequence, evs[3].Sequence)
	}
	got := f.events(projectA, 0)
	wantSequences(t, "job events", got, 0)
	want := []*vibejobs.Event{evs[0], evs[2], evs[3]}
	wantEqual(t, "job events read back", got, want)
	if got[2].State != vibejobs.JobStateDeleted || got[2].NextAt != nil || got[0].NextAt == nil {
		t.Errorf("job.deleted %+v", got[2])
	}
	wantEqual(t, "the other project's feed", f.events(projectB, 0), []*vibejobs.Event{evs[1]})
	if err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.AppendEvents(f.ctx) }); err != nil {
		t.Errorf("AppendEvents of nothing: %v", err)
	}
}

func testListEventsFilters(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	k := f.job(projectA)
	var evs []*vibejobs.Event
	for i := range vibejobs.EventScanWindow + 10 {
		e := vibejobs.JobEvent(vibejobs.EventJobUpdated, j, T0.Add(time.Duration(i)*time.Millisecond))
		switch i {
		case 3, vibejobs.EventScanWindow + 5:
			e = vibejobs.JobEvent(vibejobs.EventJobPaused, k, e.OccurredAt)
		case 4:
			e = vibejobs.JobEvent(vibejobs.EventJobPaused, j, e.OccurredAt)
		}
		evs = append(evs, e)
	}
	f.update(func(tx vibejobs.Tx) error { return tx.AppendEvents(f.ctx, evs...) })
	head := int64(len(evs))

	list := func(flt vibejobs.EventFilter) vibejobs.EventPage {
		t.Helper()
		p, err := f.s.ListEvents(f.ctx, projectA, flt)
		if err != nil {
			t.Fatalf("ListEvents(%+v): %v", flt, err)
		}
		if p.Head != head {
			t.Fatalf("head %d, want %d", p.Head, head)
		}
		return p
	}
	seqs := func(p vibejobs.EventPage) []int64 {
		var s []int64
		for _, e := range p.Events {
			s = append(s, e.Sequence)
		}
		return s
	}
	p := list(vibejobs.EventFilter{})
	if len(p.Events) != 50 || p.Next != 50 {
		t.Errorf("default page: %d events, next %d; want 50, 50", len(p.Events), p.Next)
	}
	p = list(vibejobs.EventFilter{After: 2, Limit: 3})
	wantEqual(t, "page after 2", seqs(p), []int64{3, 4, 5})
	if p.Next != 5 {
		t.Errorf("next %d, want 5", p.Next)
	}
	p = list(vibejobs.EventFilter{Types: []vibejobs.EventType{vibejobs.EventJobPaused}})
	wantEqual(t, "paused events in the first window", seqs(p), []int64{4, 5})
	if p.Next != vibejobs.EventScanWindow {
		t.Errorf("a filtered page that is not full moves on to the end of its window: next %d, want %d", p.Next, vibejobs.EventScanWindow)
	}
	p = list(vibejobs.EventFilter{After: p.Next, Types: []vibejobs.EventType{vibejobs.EventJobPaused}})
	wantEqual(t, "paused events in the second window", seqs(p), []int64{vibejobs.EventScanWindow + 6})
	if p.Next != head {
		t.Errorf("next %d, want the head %d", p.Next, head)
	}
	p = list(vibejobs.EventFilter{After: head})
	if len(p.Events) != 0 || p.Next != head {
		t.Errorf("after the head: %d events, next %d", len(p.Events), p.Next)
	}
	p = list(vibejobs.EventFilter{JobID: k.ID, Types: []vibejobs.EventType{vibejobs.EventJobPaused, vibejobs.EventJobCreated}})
	wantEqual(t, "k's pause", seqs(p), []int64{4})
	p = list(vibejobs.EventFilter{JobID: "job_none", Limit: 1})
	if len(p.Events) != 0 || p.Next != vibejobs.EventScanWindow {
		t.Errorf("no match: %d events, next %d", len(p.Events), p.Next)
	}
	if _, err := f.s.ListEvents(f.ctx, projectA, vibejobs.EventFilter{Limit: 101}); vibejobs.ErrorKind(err) != vibejobs.EINVALID {
		t.Errorf("limit 101: %v", err)
	}
	if len(f.events(projectA, 0)) != len(evs) {
		t.Errorf("reading on with Next saw %d events, want %d", len(f.events(projectA, 0)), len(evs))
	}
}

// newSubscription returns a subscription of projectID with every field set.
func (f *fixture) newSubscription(projectID string, mods ...func(*vibejobs.Subscription)) *vibejobs.Subscription {
	exp := T0.Add(24 * time.Hour)
	s := &vibejobs.Subscription{
		ID: f.id("sub_"), ProjectID: projectID, URL: "https://hooks.example.test/vibejobs",
		Types:             []vibejobs.EventType{vibejobs.EventRunFailed, vibejobs.EventRunSucceeded},
		JobIDs:            []string{"job_a", "job_b"},
		Secret:            vibejobs.SealedSecret{KeyID: "key1", Ciphertext: []byte{0, 1, 2, 0}},
		PreviousSecret:    vibejobs.SealedSecret{KeyID: "key0", Ciphertext: []byte{9, 0, 9}},
		PreviousExpiresAt: &exp,
		CreatedAt:         T0, UpdatedAt: T0,
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func (f *fixture) subscription(projectID string, mods ...func(*vibejobs.Subscription)) *vibejobs.Subscription {
	f.t.Helper()
	s := f.newSubscription(projectID, mods...)
	f.update(func(tx vibejobs.Tx) error {
		return tx.CreateSubscription(f.ctx, s, vibejobs.MaxSubscriptionsPerProject)
	})
	return s
}

func (f *fixture) getSubscription(projectID, id string) *vibejobs.Subscription {
	f.t.Helper()
	s, err := f.s.GetSubscription(f.ctx, projectID, id)
	if err != nil {
		f.t.Fatalf("GetSubscription(%s): %v", id, err)
	}
	return s
}

// appendJobEvents appends n job.updated events of j that occurred at T0.
func (f *fixture) appendJobEvents(j *vibejobs.Job, n int) {
	f.t.Helper()
	f.appendJobEventsAt(j, n, T0)
}

func testSubscriptions(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	f.appendJobEvents(j, 3)

	s := f.subscription(projectA)
	if s.Cursor != 3 {
		t.Fatalf("a new subscription starts at the head: cursor %d, want 3", s.Cursor)
	}
	wantEqual(t, "subscription read back", f.getSubscription(projectA, s.ID), s)
	plain := f.subscription(projectA, func(s *vibejobs.Subscription) {
		s.Types, s.JobIDs, s.PreviousSecret, s.PreviousExpiresAt = nil, nil, vibejobs.SealedSecret{}, nil
	})
	got := f.getSubscription(projectA, plain.ID)
	if len(got.Types) != 0 || len(got.JobIDs) != 0 || got.PreviousSecret.KeyID != "" || got.PreviousExpiresAt != nil || got.Failing() {
		t.Errorf("subscription without filters or previous secret: %+v", got)
	}
	if _, err := f.s.GetSubscription(f.ctx, projectB, s.ID); vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
		t.Errorf("another project's subscription: %v", err)
	}
	list, err := f.s.ListSubscriptions(f.ctx, projectA)
	if err != nil || len(list) != 2 || list[0].ID != s.ID || list[1].ID != plain.ID {
		t.Fatalf("ListSubscriptions: %v %v", list, err)
	}
	if list, err := f.s.ListSubscriptions(f.ctx, projectB); err != nil || len(list) != 0 {
		t.Errorf("ListSubscriptions of another project: %v %v", list, err)
	}

	s.URL = "https://other.example.test/"
	s.Types = []vibejobs.EventType{vibejobs.EventJobDeleted}
	s.JobIDs = nil
	s.UpdatedAt = T0.Add(time.Minute)
	f.update(func(tx vibejobs.Tx) error { return tx.UpdateSubscription(f.ctx, s) })
	wantEqual(t, "updated subscription", f.getSubscription(projectA, s.ID), s)
	// Every change moves updatedAt, though it came in the same millisecond
	// or from a clock stepped back: sessions notice a change by it.
	for _, at := range []time.Time{T0.Add(time.Minute), T0} {
		before := f.getSubscription(projectA, s.ID).UpdatedAt
		s.UpdatedAt = at
		f.update(func(tx vibejobs.Tx) error { return tx.UpdateSubscription(f.ctx, s) })
		got := f.getSubscription(projectA, s.ID)
		if !got.UpdatedAt.Equal(before.Add(time.Millisecond)) || !s.UpdatedAt.Equal(got.UpdatedAt) {
			t.Errorf("an update at %v over updatedAt %v: stored %v, returned %v, want a millisecond later",
				at, before, got.UpdatedAt, s.UpdatedAt)
		}
		var reset *vibejobs.Subscription
		f.update(func(tx vibejobs.Tx) error {
			var err error
			reset, err = tx.ResetSubscription(f.ctx, projectA, s.ID, at)
			return err
		})
		if !reset.UpdatedAt.Equal(got.UpdatedAt.Add(time.Millisecond)) {
			t.Errorf("a reset at %v over updatedAt %v: %v, want a millisecond later", at, got.UpdatedAt, reset.UpdatedAt)
		}
		s.UpdatedAt = reset.UpdatedAt
	}
	other := *s
	other.ProjectID = projectB
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.UpdateSubscription(f.ctx, &other) })
	wantNotFound(t, "UpdateSubscription of another project's", err, "subscription")

	// Limit.
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		return tx.CreateSubscription(f.ctx, f.newSubscription(projectA), 2)
	})
	wantError(t, "a third subscription with limit 2", err, vibejobs.ECONFLICT, "too_many_subscriptions")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		return tx.CreateSubscription(f.ctx, f.newSubscription(projectB), 2)
	})
	if err != nil {
		t.Errorf("the limit is per project: %v", err)
	}

	// Secrets for master key rotation.
	f.update(func(tx vibejobs.Tx) error {
		subs, err := tx.SubscriptionSecretsNotUnder(f.ctx, "key1", 10)
		if err != nil {
			return err
		}
		if len(subs) != 2 || subs[0].ID != s.ID {
			t.Errorf("SubscriptionSecretsNotUnder(key1) = %d subscriptions, want the two with a previous secret under key0", len(subs))
		}
		subs, err = tx.SubscriptionSecretsNotUnder(f.ctx, "key9", 10)
		if err != nil || len(subs) != 3 {
			t.Errorf("SubscriptionSecretsNotUnder(key9) = %d, %v; want 3", len(subs), err)
		}
		return tx.SetSubscriptionSecrets(f.ctx, s.ID, vibejobs.SealedSecret{KeyID: "key9", Ciphertext: []byte{1}},
			vibejobs.SealedSecret{KeyID: "key9", Ciphertext: []byte{2}})
	})
	got = f.getSubscription(projectA, s.ID)
	if got.Secret.KeyID != "key9" || string(got.PreviousSecret.Ciphertext) != "\x02" || !got.UpdatedAt.Equal(s.UpdatedAt) ||
		got.PreviousExpiresAt == nil || !got.PreviousExpiresAt.Equal(*s.PreviousExpiresAt) {
		t.Errorf("after SetSubscriptionSecrets: %+v", got)
	}
	// A previous secret dropped (one that no longer opens) takes its
	// expiry along.
	f.update(func(tx vibejobs.Tx) error {
		return tx.SetSubscriptionSecrets(f.ctx, s.ID, vibejobs.SealedSecret{KeyID: "key9", Ciphertext: []byte{1}}, vibejobs.SealedSecret{})
	})
	got = f.getSubscription(projectA, s.ID)
	if got.Secret.KeyID != "key9" || got.PreviousSecret.KeyID != "" || len(got.PreviousSecret.Ciphertext) != 0 || got.PreviousExpiresAt != nil {
		t.Errorf("after SetSubscriptionSecrets without a previous secret: %+v", got)
	}

	f.update(func(tx vibejobs.Tx) error { return tx.DeleteSubscription(f.ctx, projectA, plain.ID) })
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.DeleteSubscription(f.ctx, projectA, plain.ID) })
	wantNotFound(t, "deleting a deleted subscription", err, "subscription")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.DeleteSubscription(f.ctx, projectB, s.ID) })
	wantNotFound(t, "deleting another project's subscription", err, "subscription")
	all, err := f.s.AllSubscriptions(f.ctx)
	if err != nil || len(all) != 2 {
		t.Errorf("AllSubscriptions: %d, %v; want 2", len(all), err)
	}
}

func testSubscriptionDelivery(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	s := f.subscription(projectA)
	idle := f.subscription(projectB)
	lease := 30 * time.Second
	claim := func(owner string, now time.Time, want ...*vibejobs.Subscription) []*vibejobs.Subscription {
		t.Helper()
		got, err := f.s.ClaimSubscriptions(f.ctx, owner, now, 10, lease)
		if err != nil {
			t.Fatalf("ClaimSubscriptions: %v", err)
		}
		var ids, wantIDs []string
		for _, g := range got {
			ids = append(ids, g.ID)
		}
		for _, w := range want {
			wantIDs = append(wantIDs, w.ID)
		}
		if !slices.Equal(ids, wantIDs) {
			t.Fatalf("ClaimSubscriptions(%s, %s) = %v, want %v", owner, now.Format(time.TimeOnly), ids, wantIDs)
		}
		return got
	}
	step := func(owner string, st vibejobs.SubscriptionStep) *vibejobs.Subscription {
		t.Helper()
		got, err := f.s.RecordSubscriptionStep(f.ctx, owner, st)
		if err != nil {
			t.Fatalf("RecordSubscriptionStep: %v", err)
		}
		return got
	}

	claim("w1", T0) // nothing after any cursor
	f.appendJobEvents(j, 3)
	claim("w1", T0, s)
	claim("w2", T0.Add(lease)) // leased until T0+lease

	if got := step("w2", vibejobs.SubscriptionStep{ID: s.ID, At: T0, Cursor: 1, Delivered: true}); got != nil {
		t.Fatalf("a step of another owner applied: %+v", got)
	}
	got := step("w1", vibejobs.SubscriptionStep{ID: s.ID, At: T0.Add(time.Second), Cursor: 1, Delivered: true, LeaseUntil: T0.Add(time.Minute)})
	if got == nil || got.Cursor != 1 || got.LastSuccessAt == nil || !got.LastSuccessAt.Equal(T0.Add(time.Second)) || got.Failing() {
		t.Fatalf("after a delivery: %+v", got)
	}
	claim("w2", T0.Add(lease+time.Second)) // the lease was extended

	next := T0.Add(12 * time.Second)
	got = step("w1", vibejobs.SubscriptionStep{ID: s.ID, At: T0.Add(2 * time.Second), Cursor: 2, ErrorCode: "http_5xx", NextAttemptAt: next})
	if got == nil || got.Cursor != 2 || got.ErrorCode != "http_5xx" || got.Attempts != 1 || got.NextAttemptAt == nil || !got.NextAttemptAt.Equal(next) {
		t.Fatalf("after a failure: %+v", got)
	}
	if got := step("w1", vibejobs.SubscriptionStep{ID: s.ID, At: T0, Cursor: 3}); got != nil {
		t.Fatalf("a failed step released the lease, yet a later step applied: %+v", got)
	}
	claim("w2", next.Add(-time.Millisecond)) // waiting for its retry
	claim("w2", next, s)
	got = step("w2", vibejobs.SubscriptionStep{ID: s.ID, At: next, Cursor: 2, ErrorCode: "timeout", NextAttemptAt: next.Add(24 * time.Second)})
	if got.Attempts != 2 || got.ErrorCode != "timeout" {
		t.Fatalf("second failure: %+v", got)
	}
	// An edit writes the count of failed attempts (a new URL or secret
	// restarts it) and keeps the rest of the failure state.
	f.update(func(tx vibejobs.Tx) error {
		cur, err := tx.GetSubscription(f.ctx, projectA, s.ID)
		if err != nil {
			return err
		}
		cur.Attempts = 0
		return tx.UpdateSubscription(f.ctx, cur)
	})
	if got := f.getSubscription(projectA, s.ID); got.Attempts != 0 || got.ErrorCode != "timeout" ||
		got.NextAttemptAt == nil || !got.NextAttemptAt.Equal(next.Add(24*time.Second)) {
		t.Fatalf("an edit restarting the count of failed attempts: %+v", got)
	}
	claim("w1", next.Add(24*time.Second), s)
	got = step("w1", vibejobs.SubscriptionStep{ID: s.ID, At: next.Add(25 * time.Second), Cursor: 1, Delivered: true, LeaseUntil: next.Add(time.Minute)})
	if got.Cursor != 2 || got.Failing() || got.Attempts != 0 || got.NextAttemptAt != nil || !got.LastSuccessAt.Equal(next.Add(25*time.Second)) {
		t.Fatalf("recovered (the cursor never moves back): %+v", got)
	}
	got = step("w1", vibejobs.SubscriptionStep{ID: s.ID, At: next.Add(26 * time.Second), Cursor: 3})
	if got.Cursor != 3 || !got.LastSuccessAt.Equal(next.Add(25*time.Second)) {
		t.Fatalf("cursor moved past a filtered event without a delivery: %+v", got)
	}
	claim("w2", next.Add(27*time.Second)) // caught up and released

	// Reset jumps to the head and clears the failure state.
	f.appendJobEvents(j, 2)
	claim("w2", next.Add(time.Minute), s)
	step("w2", vibejobs.SubscriptionStep{ID: s.ID, At: next.Add(time.Minute), Cursor: 3, ErrorCode: "http_4xx", NextAttemptAt: next.Add(time.Hour)})
	var reset *vibejobs.Subscription
	f.update(func(tx vibejobs.Tx) error {
		var err error
		reset, err = tx.ResetSubscription(f.ctx, projectA, s.ID, next.Add(2*time.Minute))
		return err
	})
	if reset.Cursor != 5 || reset.Failing() || reset.Attempts != 0 || reset.NextAttemptAt != nil || !reset.UpdatedAt.Equal(next.Add(2*time.Minute)) {
		t.Fatalf("after reset: %+v", reset)
	}
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		_, err := tx.ResetSubscription(f.ctx, projectB, s.ID, T0)
		return err
	})
	wantNotFound(t, "resetting another project's subscription", err, "subscription")
	claim("w1", next.Add(time.Hour))

	// A deleted subscription takes no step.
	f.appendJobEvents(j, 1)
	claim("w1", next.Add(time.Hour), s)
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteSubscription(f.ctx, projectA, s.ID) })
	if got := step("w1", vibejobs.SubscriptionStep{ID: s.ID, At: T0, Cursor: 6, Delivered: true}); got != nil {
		t.Fatalf("step of a deleted subscription: %+v", got)
	}

	// Past a failed event without sending it (its filters changed), the
	// failure at it is over; a failure after moving on is the first at its
	// event.
	f.appendJobEvents(f.job(projectB), 3)
	claim("w3", T0, idle)
	step("w3", vibejobs.SubscriptionStep{ID: idle.ID, At: T0, Cursor: 0, ErrorCode: "http_5xx", NextAttemptAt: T0.Add(time.Second)})
	claim("w3", T0.Add(time.Second), idle)
	got = step("w3", vibejobs.SubscriptionStep{ID: idle.ID, At: T0.Add(time.Second), Cursor: 0, ErrorCode: "http_5xx", NextAttemptAt: T0.Add(time.Hour)})
	if got.Attempts != 2 {
		t.Fatalf("second failure at one event: %+v", got)
	}
	claim("w3", T0.Add(time.Hour), idle)
	got = step("w3", vibejobs.SubscriptionStep{ID: idle.ID, At: T0.Add(time.Hour), Cursor: 1, LeaseUntil: T0.Add(2 * time.Hour)})
	if got.Cursor != 1 || got.Failing() || got.Attempts != 0 || got.NextAttemptAt != nil || got.LastSuccessAt != nil {
		t.Fatalf("past the failed event without a delivery: %+v", got)
	}
	got = step("w3", vibejobs.SubscriptionStep{ID: idle.ID, At: T0.Add(time.Hour), Cursor: 2, ErrorCode: "timeout", NextAttemptAt: T0.Add(2 * time.Hour)})
	if got.Cursor != 2 || got.ErrorCode != "timeout" || got.Attempts != 1 {
		t.Fatalf("a failure after passing over an event: %+v", got)
	}

	// A failure of ours that left the event unsent shows, and waits, like
	// the receiver's, without counting as one of the receiver's.
	claim("w3", T0.Add(2*time.Hour), idle)
	got = step("w3", vibejobs.SubscriptionStep{ID: idle.ID, At: T0.Add(2 * time.Hour), Cursor: 2,
		ErrorCode: "secret_unavailable", Unsent: true, NextAttemptAt: T0.Add(3 * time.Hour)})
	if got.Cursor != 2 || got.ErrorCode != "secret_unavailable" || got.Attempts != 1 || !got.NextAttemptAt.Equal(T0.Add(3*time.Hour)) {
		t.Fatalf("an unsent event: %+v", got)
	}
	claim("w3", T0.Add(3*time.Hour-time.Millisecond)) // waiting for its retry
	claim("w3", T0.Add(3*time.Hour), idle)
	got = step("w3", vibejobs.SubscriptionStep{ID: idle.ID, At: T0.Add(3 * time.Hour), Cursor: 3,
		ErrorCode: "secret_unavailable", Unsent: true, NextAttemptAt: T0.Add(4 * time.Hour)})
	if got.Cursor != 3 || got.ErrorCode != "secret_unavailable" || got.Attempts != 0 {
		t.Fatalf("an unsent event after moving on: %+v", got)
	}
}

// testSubscriptionClaimOrder: under overload (a claim with room for one),
// the subscription served least recently goes first, so neither the
// lowest id nor a healthy subscription that keeps getting events holds
// the others back: never leased first, then by when the last lease ended,
// whether released (the step's At) or expired, a failing subscription
// whose retry is due included.
func testSubscriptionClaimOrder(t *testing.T, f *fixture) {
	f.projects()
	subs := []*vibejobs.Subscription{f.subscription(projectA), f.subscription(projectA), f.subscription(projectB)}
	slices.SortFunc(subs, func(a, b *vibejobs.Subscription) int { return strings.Compare(a.ID, b.ID) })
	lo, mid, hi := subs[0], subs[1], subs[2]
	name := map[string]string{lo.ID: "lo", mid.ID: "mid", hi.ID: "hi"}
	// Every one of them has work throughout: nothing moves a cursor.
	f.appendJobEvents(f.job(projectA), 3)
	f.appendJobEvents(f.job(projectB), 3)
	lease := 30 * time.Second
	claimOne := func(at time.Duration, want *vibejobs.Subscription) string {
		t.Helper()
		owner := "w" + strconv.Itoa(int(at/time.Second))
		got, err := f.s.ClaimSubscriptions(f.ctx, owner, T0.Add(at), 1, lease)
		if err != nil {
			t.Fatalf("ClaimSubscriptions at T0+%v: %v", at, err)
		}
		if len(got) != 1 || got[0].ID != want.ID {
			var ids []string
			for _, g := range got {
				ids = append(ids, name[g.ID])
			}
			t.Fatalf("ClaimSubscriptions at T0+%v with room for one = %v, want %s", at, ids, name[want.ID])
		}
		return owner
	}
	step := func(owner string, st vibejobs.SubscriptionStep) {
		t.Helper()
		if got, err := f.s.RecordSubscriptionStep(f.ctx, owner, st); err != nil || got == nil {
			t.Fatalf("RecordSubscriptionStep(%s): %v, %v", name[st.ID], got, err)
		}
	}
	// serve claims want at T0+at and releases it at once, still with work.
	serve := func(at time.Duration, want *vibejobs.Subscription) {
		t.Helper()
		owner := claimOne(at, want)
		step(owner, vibejobs.SubscriptionStep{ID: want.ID, At: T0.Add(at), Cursor: want.Cursor})
	}

	serve(1*time.Second, lo)  // never leased, the lowest id
	serve(2*time.Second, mid) // never leased goes before served
	owner := claimOne(3*time.Second, hi)
	step(owner, vibejobs.SubscriptionStep{ID: hi.ID, At: T0.Add(3 * time.Second), Cursor: hi.Cursor,
		ErrorCode: "http_5xx", NextAttemptAt: T0.Add(30 * time.Second)})
	serve(4*time.Second, lo) // released at 1 s, before mid at 2 s; hi waits for its retry
	serve(5*time.Second, mid)
	serve(6*time.Second, lo)
	// hi's retry is due: last served at 3 s, before lo (6 s) and mid (5 s),
	// it goes first though they are healthy.
	serve(30*time.Second, hi)
	serve(31*time.Second, mid)
	serve(32*time.Second, lo)

	// A lease that expired counts as served until it ended: hi, leased at
	// 33 s and never released, ends at 63 s, after mid and lo were served.
	claimOne(33*time.Second, hi)
	serve(40*time.Second, mid)
	serve(41*time.Second, lo)
	serve(64*time.Second, mid)
	serve(65*time.Second, lo)
	serve(66*time.Second, hi)
}

// appendJobEventsAt appends n job.updated events of j that occurred at "at".
func (f *fixture) appendJobEventsAt(j *vibejobs.Job, n int, at time.Time) {
	f.t.Helper()
	f.update(func(tx vibejobs.Tx) error {
		for range n {
			if err := tx.AppendEvents(f.ctx, vibejobs.JobEvent(vibejobs.EventJobUpdated, j, at)); err != nil {
				return err
			}
		}
		return nil
	})
}

// testPruneEvents: retention deletes the start of a feed, never past a
// subscription's cursor nor past the first recent event, and a read from
// before the start learns what it missed.
func testPruneEvents(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	k := f.job(projectB)
	day := 24 * time.Hour
	old, recent, cutoff := T0.Add(-20*day), T0.Add(-day), T0.Add(-7*day)

	empty, err := f.s.ListEvents(f.ctx, projectA, vibejobs.EventFilter{})
	if err != nil || empty.Head != 0 || empty.Oldest != 1 || empty.Next != 0 {
		t.Fatalf("empty feed: head %d oldest %d next %d, %v; want 0 1 0", empty.Head, empty.Oldest, empty.Next, err)
	}
	f.appendJobEventsAt(j, 3, old) // 1–3
	s := f.subscription(projectA)  // cursor 3
	f.appendJobEventsAt(j, 2, old) // 4–5
	f.appendJobEventsAt(j, 1, recent)
	f.appendJobEventsAt(j, 2, old) // 7–8, old but after a recent one
	f.appendJobEventsAt(k, 2, old)

	prune := func(projectID string, limit, want int, oldest int64) {
		t.Helper()
		if n, err := f.s.PruneEvents(f.ctx, projectID, cutoff, limit); err != nil || n != want {
			t.Fatalf("PruneEvents(%s, limit %d) = %d, %v; want %d", projectID, limit, n, err, want)
		}
		p, err := f.s.ListEvents(f.ctx, projectID, vibejobs.EventFilter{})
		if err != nil || p.Oldest != oldest {
			t.Fatalf("after PruneEvents(%s, limit %d): oldest %d, %v; want %d", projectID, limit, p.Oldest, err, oldest)
		}
	}
	prune(projectA, 2, 2, 3)
	prune(projectA, 10, 1, 4) // the subscription has not passed event 4
	f.update(func(tx vibejobs.Tx) error {
		_, err := tx.ResetSubscription(f.ctx, projectA, s.ID, T0)
		return err
	})
	prune(projectA, 10, 2, 6) // event 6 is recent: it and all after it stay
	prune(projectA, 10, 0, 6)

	p, err := f.s.ListEvents(f.ctx, projectA, vibejobs.EventFilter{After: 1})
	if err != nil {
		t.Fatal(err)
	}
	wantSequences(t, "the feed read from before its start", p.Events, 5)
	if len(p.Events) != 3 || p.Head != 8 || p.Next != 8 {
		t.Errorf("read after 1: %d events, head %d, next %d; want 3 events, head 8, next 8", len(p.Events), p.Head, p.Next)
	}
	if p.Oldest != 6 {
		t.Errorf("read after 1: oldest %d, want 6 (the reader missed 2–5)", p.Oldest)
	}
	if p, err := f.s.ListEvents(f.ctx, projectA, vibejobs.EventFilter{After: 5}); err != nil || len(p.Events) != 3 {
		t.Errorf("read after 5: %d events, %v; want 3", len(p.Events), err)
	}

	// The other project's feed was untouched; pruned whole, it holds
	// nothing and its head stays.
	if got := f.events(projectB, 0); len(got) != 2 {
		t.Fatalf("project B: %d events, want 2", len(got))
	}
	prune(projectB, 10, 2, 3)
	p, err = f.s.ListEvents(f.ctx, projectB, vibejobs.EventFilter{})
	if err != nil || len(p.Events) != 0 || p.Head != 2 || p.Next != 2 {
		t.Errorf("pruned feed: %d events, head %d, next %d, %v; want none, 2, 2", len(p.Events), p.Head, p.Next, err)
	}
	if p.Oldest != 3 {
		t.Errorf("pruned feed: oldest %d, want 3 (head + 1)", p.Oldest)
	}
	f.appendJobEventsAt(k, 1, T0)
	if got := f.events(projectB, 0); len(got) != 1 || got[0].Sequence != 3 {
		t.Errorf("after pruning the whole feed, the next event is %v; want sequence 3", eventLines(got))
	}
}
