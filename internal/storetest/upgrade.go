package storetest

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// LatestMigration returns the version of the last migration in dir, a
// directory of goose migrations named NNNNN_name.sql.
func LatestMigration(t testing.TB, dir fs.FS) int64 {
	t.Helper()
	names, err := fs.Glob(dir, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("listing migrations: %v", err)
	}
	var v int64
	if _, err := fmt.Sscanf(names[len(names)-1], "%05d_", &v); err != nil {
		t.Fatalf("migration %s: %v", names[len(names)-1], err)
	}
	return v
}

// Upgrade is the data of a database that an older vibejobs left behind when
// it was stopped at T0: a job with runs in every state (waiting, waiting
// for a retry, delivering under a lease the stopped process held, and
// finished), a deleted job with a run in flight, attempts, events, a
// subscription and an idempotency key. A store's upgrade test writes it
// with the plain SQL of an older schema version, migrates to the latest
// and hands the Store to CheckUpgrade, which drives the Store's API and
// checks that nothing was lost or doubled.
//
// Runs are listed in id order, which is also their insertion order. Every
// time is a whole millisecond. Events and Subscription are empty in the
// data of a version from before the event feed (see DropFeed).
type Upgrade struct {
	Project      vibejobs.Project
	Jobs         []UpgradeJob
	Runs         []UpgradeRun
	Events       []vibejobs.Event
	Subscription vibejobs.Subscription
	Idempotency  vibejobs.IdempotencyRecord
}

// UpgradeJob is a job as an older version stored it.
type UpgradeJob struct {
	vibejobs.Job
	DeletedAt *time.Time
}

// UpgradeRun is a run as an older version stored it. A run in delivering
// is leased to LeaseOwner until LeaseExpiresAt, its attempt started at
// AttemptStartedAt; DueAt is the due time the claim took it at (the
// NextAttemptAt it had before the claim), which a version that claims in
// place (PostgreSQL from 00005) keeps in next_attempt_at.
type UpgradeRun struct {
	vibejobs.Run
	LateDecided      bool
	DueAt            *time.Time
	AttemptStartedAt *time.Time
	LeaseOwner       string
	LeaseExpiresAt   *time.Time
}

// Ids of the upgrade data.
const (
	upProject  = "prj_up"
	upJob      = "job_up_1"
	upDeleted  = "job_up_2"
	upDue2     = "run_up_01" // scheduled, due at T0-4s
	upDue1     = "run_up_02" // scheduled, due at T0-5s
	upDue3     = "run_up_03" // retrying, due at T0-2s
	upLater    = "run_up_04" // retrying, due at T0+1h
	upFirst    = "run_up_05" // delivering its first attempt
	upRetry    = "run_up_06" // delivering its third attempt
	upOrphan   = "run_up_07" // delivering, of the deleted job
	upOK       = "run_up_08" // succeeded three days ago
	upRejected = "run_up_09" // failed two days ago
	upCancel   = "run_up_10" // cancelled an hour ago
	upExpired  = "run_up_11" // scheduled, past its deadline
	upSub      = "sub_up_1"
	upOldOwner = "old-replica"
	upNewOwner = "new-replica"
)

// UpgradeData returns the data an older version left behind at T0.
func UpgradeData() *Upgrade {
	at := func(d time.Duration) *time.Time { t := T0.Add(d); return &t }
	secret := func(b byte) vibejobs.SealedSecret {
		c := make([]byte, 44)
		for i := range c {
			c[i] = b + byte(i)
		}
		c[0], c[1] = 0, 0 // zero bytes must survive
		return vibejobs.SealedSecret{KeyID: "key_up", Ciphertext: c}
	}
	job := func(id string, b byte) vibejobs.Job {
		return vibejobs.Job{
			ID: id, ProjectID: upProject, Name: "job " + id, Schedule: "@every 1m", Timezone: "UTC",
			URL: "https://app.example.test/hooks/" + id, Enabled: true, State: vibejobs.JobActive,
			Retry:   vibejobs.RetryPolicy{MaxAttempts: 5, MinBackoff: time.Second, MaxBackoff: time.Minute},
			Timeout: 10 * time.Second, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: T0.Add(-30 * 24 * time.Hour),
			NextRunAt: at(time.Minute), Secret: secret(b),
			CreatedAt: T0.Add(-30 * 24 * time.Hour), UpdatedAt: T0.Add(-24 * time.Hour),
		}
	}
	attempt := func(n int, start time.Duration, status int, code string) vibejobs.Attempt {
		return vibejobs.Attempt{Number: n, StartedAt: T0.Add(start), FinishedAt: T0.Add(start + time.Second),
			StatusCode: status, ErrorCode: code, SignatureTimestamp: T0.Add(start).Unix(),
			ResponseSnippet: fmt.Sprintf("answer %d\x00", status)}
	}
	run := func(id, jobID, trigger string, scheduledFor time.Duration, state vibejobs.RunState, n int) UpgradeRun {
		sf := T0.Add(scheduledFor)
		return UpgradeRun{Run: vibejobs.Run{
			ID: id, JobID: jobID, ProjectID: upProject, Trigger: trigger, ScheduledFor: sf,
			DeadlineAt: sf.Add(vibejobs.DeliveryLifetime), State: state, Attempt: n,
			CreatedAt: sf.Add(-time.Minute), Attempts: []vibejobs.Attempt{},
		}}
	}
	waiting := func(r UpgradeRun, due time.Duration) UpgradeRun {
		r.NextAttemptAt = at(due)
		return r
	}
	leased := func(r UpgradeRun, due, started time.Duration) UpgradeRun {
		r.DueAt, r.AttemptStartedAt = at(due), at(started)
		r.LeaseOwner, r.LeaseExpiresAt = upOldOwner, at(started+10*time.Second+35*time.Second)
		r.LateDecided = true
		return r
	}
	finished := func(r UpgradeRun, reason string) UpgradeRun {
		r.FinishedAt = at(r.ScheduledFor.Sub(T0) + 2*time.Second)
		r.FailureReason = reason
		r.LateDecided = r.Attempt > 0
		return r
	}

	u := &Upgrade{
		Project: vibejobs.Project{ID: upProject, Name: "upgraded", RetentionDays: 1, CreatedAt: T0.Add(-30 * 24 * time.Hour)},
		Jobs:    []UpgradeJob{{Job: job(upJob, 1)}, {Job: job(upDeleted, 101), DeletedAt: at(-time.Hour)}},
	}
	u.Jobs[1].NextRunAt = nil

	due3 := waiting(run(upDue3, upJob, "schedule", -63*time.Second, vibejobs.RunRetrying, 1), -2*time.Second)
	due3.LateDecided = true
	due3.Attempts = []vibejobs.Attempt{attempt(1, -62*time.Second, 500, "http_5xx")}
	later := waiting(run(upLater, upJob, "schedule", -4*time.Minute, vibejobs.RunRetrying, 2), time.Hour)
	later.LateDecided = true
	later.Attempts = []vibejobs.Attempt{attempt(1, -4*time.Minute, 502, "http_5xx"), attempt(2, -3*time.Minute, 503, "http_5xx")}
	retry := leased(run(upRetry, upJob, "schedule", -5*time.Minute, vibejobs.RunDelivering, 3), -20*time.Second, -20*time.Second)
	retry.Attempts = []vibejobs.Attempt{attempt(1, -5*time.Minute, 500, "http_5xx"), attempt(2, -2*time.Minute, 0, "timeout")}
	ok := finished(run(upOK, upJob, "schedule", -72*time.Hour, vibejobs.RunSucceeded, 1), "")
	ok.Attempts = []vibejobs.Attempt{attempt(1, -72*time.Hour, 200, "")}
	rejected := finished(run(upRejected, upJob, "manual", -48*time.Hour, vibejobs.RunFailed, 1), vibejobs.ReasonAppRejected)
	rejected.Attempts = []vibejobs.Attempt{attempt(1, -48*time.Hour, 401, "http_4xx")}
	expired := waiting(run(upExpired, upJob, "manual", -vibejobs.DeliveryLifetime-time.Hour, vibejobs.RunScheduled, 0),
		-vibejobs.DeliveryLifetime-time.Hour)
	u.Runs = []UpgradeRun{
		waiting(run(upDue2, upJob, "schedule", -4*time.Second, vibejobs.RunScheduled, 0), -4*time.Second),
		waiting(run(upDue1, upJob, "manual", -5*time.Second, vibejobs.RunScheduled, 0), -5*time.Second),
		due3,
		later,
		leased(run(upFirst, upJob, "schedule", -40*time.Second, vibejobs.RunDelivering, 1), -40*time.Second, -30*time.Second),
		retry,
		leased(run(upOrphan, upDeleted, "schedule", -2*time.Hour, vibejobs.RunDelivering, 1), -2*time.Hour, -10*time.Second),
		ok,
		rejected,
		finished(run(upCancel, upDeleted, "manual", -time.Hour-time.Minute, vibejobs.RunCancelled, 0), vibejobs.ReasonJobDeleted),
		expired,
	}

	ev := func(seq int64, typ vibejobs.EventType, occurred time.Duration, jobID, runID, state string) vibejobs.Event {
		return vibejobs.Event{ProjectID: upProject, Sequence: seq, Type: typ, OccurredAt: T0.Add(occurred),
			JobID: jobID, RunID: runID, State: state}
	}
	e2 := ev(2, vibejobs.EventRunRetrying, -61*time.Second, upJob, upDue3, string(vibejobs.RunRetrying))
	e2.Attempt, e2.ErrorCode, e2.StatusCode, e2.NextAt = 1, "http_5xx", 500, at(-2*time.Second)
	e3 := ev(3, vibejobs.EventJobDeleted, -time.Hour, upDeleted, "", vibejobs.JobStateDeleted)
	u.Events = []vibejobs.Event{ev(1, vibejobs.EventJobCreated, -30*24*time.Hour, upJob, "", string(vibejobs.JobActive)), e2, e3}

	u.Subscription = vibejobs.Subscription{
		ID: upSub, ProjectID: upProject, URL: "https://app.example.test/feed",
		Types: []vibejobs.EventType{vibejobs.EventRunFailed}, JobIDs: []string{},
		Secret: secret(201), Cursor: 2,
		CreatedAt: T0.Add(-24 * time.Hour), UpdatedAt: T0.Add(-time.Hour),
	}
	u.Idempotency = vibejobs.IdempotencyRecord{
		ProjectID: upProject, Key: "key-up-1", RequestHash: []byte{0, 1, 2, 3}, Done: true, ResponseStatus: 201,
		ResponseHeaders: map[string]string{"Content-Type": "application/json"}, ResponseBody: []byte(`{"id":"run_up_01"}`),
		CreatedAt: T0.Add(-time.Hour), ExpiresAt: T0.Add(23 * time.Hour),
	}
	return u
}

// DropFeed empties u's events and subscription: what a version from
// before the event feed (00002 on both stores) left behind has neither.
func (u *Upgrade) DropFeed() {
	u.Events, u.Subscription = nil, vibejobs.Subscription{}
}

// CheckUpgrade drives s, opened (and migrated) on the data of UpgradeData
// with its clock at T0, as a server started at T0 would, and checks that
// every waiting run is claimed once in due order, every run in flight is
// recovered at its lease expiry and sent again once under its attempt
// number, finished runs stay finished and are pruned, events keep their
// sequence and the sealed secrets come back byte for byte.
func CheckUpgrade(t *testing.T, s vibejobs.Store, u *Upgrade) {
	t.Helper()
	ctx := context.Background()
	byID := map[string]UpgradeRun{}
	for _, r := range u.Runs {
		byID[r.ID] = r
	}
	get := func(id string) *vibejobs.Run {
		t.Helper()
		r, err := s.GetRun(ctx, upProject, id)
		if err != nil {
			t.Fatalf("GetRun(%s): %v", id, err)
		}
		return r
	}

	// Every run reads as it was, with its attempts.
	for _, want := range u.Runs {
		got := get(want.ID)
		w := want.Run
		if want.LeaseOwner != "" {
			w.NextAttemptAt = nil // readers show no next attempt while delivering
		}
		if msg := diffRun(got, &w); msg != "" {
			t.Errorf("after the upgrade, run %s: %s", want.ID, msg)
		}
	}
	runs, _, err := s.ListRuns(ctx, upProject, vibejobs.RunFilter{}, vibejobs.Page{Limit: 100})
	if err != nil || len(runs) != len(u.Runs) {
		t.Fatalf("ListRuns after the upgrade = %d runs, %v; want %d", len(runs), err, len(u.Runs))
	}
	delivering, _, err := s.ListRuns(ctx, upProject, vibejobs.RunFilter{State: vibejobs.RunDelivering}, vibejobs.Page{Limit: 100})
	if got := runIDs(delivering); err != nil || !slices.Equal(got, []string{upOrphan, upRetry, upFirst}) {
		t.Errorf("ListRuns(delivering) after the upgrade = %v, %v; want the three runs in flight", got, err)
	}
	if n, err := s.CountJobs(ctx, upProject); err != nil || n != 1 {
		t.Errorf("CountJobs after the upgrade = %d, %v; want 1 live job", n, err)
	}
	j, err := s.GetJob(ctx, upProject, upJob)
	if err != nil {
		t.Fatalf("GetJob(%s): %v", upJob, err)
	}
	if j.Secret.KeyID != u.Jobs[0].Secret.KeyID || string(j.Secret.Ciphertext) != string(u.Jobs[0].Secret.Ciphertext) {
		t.Errorf("the job's sealed secret changed across the upgrade")
	}
	_, err = s.GetJob(ctx, upProject, upDeleted)
	wantNotFound(t, "GetJob(deleted job) after the upgrade", err, "job")
	subs := 0
	if u.Subscription.ID != "" {
		subs = 1
		sub, err := s.GetSubscription(ctx, upProject, upSub)
		if err != nil {
			t.Fatalf("GetSubscription: %v", err)
		}
		if sub.Secret.KeyID != u.Subscription.Secret.KeyID || string(sub.Secret.Ciphertext) != string(u.Subscription.Secret.Ciphertext) ||
			sub.Cursor != u.Subscription.Cursor || !slices.Equal(sub.Types, u.Subscription.Types) {
			t.Errorf("the subscription changed across the upgrade: cursor %d, types %v", sub.Cursor, sub.Types)
		}
	}
	// What a server does at start (checkMasterKey): a database from before
	// the master key was recorded takes the first server's, and finds every
	// stored secret, a deleted job's too, for the server to open or re-seal.
	err = s.Update(ctx, func(tx vibejobs.Tx) error {
		keyID := u.Jobs[0].Secret.KeyID
		if id, err := tx.RecordMasterKey(ctx, keyID); err != nil || id != keyID {
			return fmt.Errorf("RecordMasterKey(%s) = %q, %v", keyID, id, err)
		}
		jobs, err := tx.SecretsNotUnder(ctx, "key_new", 10)
		if err != nil || len(jobs) != len(u.Jobs) {
			return fmt.Errorf("SecretsNotUnder(another key) = %d jobs, %v; want %d", len(jobs), err, len(u.Jobs))
		}
		if jobs, err := tx.SecretsNotUnder(ctx, keyID, 10); err != nil || len(jobs) != 0 {
			return fmt.Errorf("SecretsNotUnder(their key) = %d jobs, %v; want none", len(jobs), err)
		}
		found, err := tx.SubscriptionSecretsNotUnder(ctx, "key_new", 10)
		if err != nil || len(found) != subs ||
			(subs == 1 && string(found[0].Secret.Ciphertext) != string(u.Subscription.Secret.Ciphertext)) {
			return fmt.Errorf("SubscriptionSecretsNotUnder(another key) = %d, %v; want %d", len(found), err, subs)
		}
		return nil
	})
	if err != nil {
		t.Errorf("checking the master key after the upgrade: %v", err)
	}
	rec, err := s.GetIdempotencyKey(ctx, upProject, u.Idempotency.Key, T0)
	if err != nil || !rec.Done || rec.ResponseStatus != u.Idempotency.ResponseStatus ||
		string(rec.ResponseBody) != string(u.Idempotency.ResponseBody) ||
		rec.ResponseHeaders["Content-Type"] != "application/json" {
		t.Errorf("GetIdempotencyKey after the upgrade = %+v, %v; want the stored answer", rec, err)
	}

	// The queue: three runs due, the earliest five seconds ago; the run
	// past its deadline is not claimable, and fails.
	if next, ok, err := s.NextDueAt(ctx); err != nil || !ok || !next.Equal(T0.Add(-5*time.Second)) {
		t.Errorf("NextDueAt after the upgrade = %v, %v, %v; want T0-5s", next, ok, err)
	}
	if st, err := s.QueueStats(ctx, T0); err != nil || st.Due != 3 || st.OldestDueAge != 5*time.Second {
		t.Errorf("QueueStats(T0) after the upgrade = %+v, %v; want 3 due, the oldest 5s", st, err)
	}
	if n, err := s.FailExpiredRuns(ctx, T0, 10); err != nil || n != 1 {
		t.Errorf("FailExpiredRuns(T0) = %d, %v; want the run past its deadline", n, err)
	}
	if n, err := s.RecoverExpiredLeases(ctx, T0, 10); err != nil || n != 0 {
		t.Errorf("RecoverExpiredLeases(T0) = %d, %v; want none: every lease still holds", n, err)
	}

	claims, err := s.ClaimDueRuns(ctx, upNewOwner, T0, 10, Margin)
	if err != nil {
		t.Fatalf("ClaimDueRuns(T0): %v", err)
	}
	if got := claimIDs(claims); !slices.Equal(got, []string{upDue1, upDue2, upDue3}) {
		t.Fatalf("ClaimDueRuns(T0) after the upgrade = %v; want the waiting runs in due order", got)
	}
	for i, wantN := range []int{1, 1, 2} {
		c := claims[i]
		if c.Run.Attempt != wantN || !c.DueAt.Equal(*byID[c.Run.ID].NextAttemptAt) ||
			c.Secret.KeyID != j.Secret.KeyID || string(c.Secret.Ciphertext) != string(j.Secret.Ciphertext) ||
			c.URL != j.URL || c.Timeout != j.Timeout {
			t.Errorf("claim of %s: attempt %d, due %v; want attempt %d, due %v, the job's settings and secret",
				c.Run.ID, c.Run.Attempt, c.DueAt, wantN, *byID[c.Run.ID].NextAttemptAt)
		}
	}
	succeed(t, s, claims, T0)
	if again, err := s.ClaimDueRuns(ctx, upNewOwner, T0.Add(time.Minute), 10, Margin); err != nil || len(again) != 0 {
		t.Fatalf("ClaimDueRuns(T0+1m) before the leases expire = %v, %v; want none", claimIDs(again), err)
	}

	// The runs in flight come back at their lease expiry, once each.
	if n, err := s.RecoverExpiredLeases(ctx, T0.Add(time.Minute), 10); err != nil || n != 3 {
		t.Fatalf("RecoverExpiredLeases(T0+1m) = %d, %v; want the three runs in flight", n, err)
	}
	if n, err := s.RecoverExpiredLeases(ctx, T0.Add(time.Hour-time.Second), 10); err != nil || n != 0 {
		t.Errorf("RecoverExpiredLeases again = %d, %v; want none", n, err)
	}
	if r := get(upOrphan); r.State != vibejobs.RunCancelled || r.FailureReason != vibejobs.ReasonJobDeleted {
		t.Errorf("the deleted job's run in flight after recovery: %s %q; want cancelled job_deleted", r.State, r.FailureReason)
	}
	claims, err = s.ClaimDueRuns(ctx, upNewOwner, T0.Add(time.Minute), 10, Margin)
	if err != nil {
		t.Fatalf("ClaimDueRuns(T0+1m): %v", err)
	}
	if got := claimIDs(claims); !slices.Equal(got, []string{upFirst, upRetry}) {
		t.Fatalf("ClaimDueRuns(T0+1m) after recovery = %v; want the two recovered runs of the live job", got)
	}
	for i, wantN := range []int{1, 3} {
		if c := claims[i]; c.Run.Attempt != wantN || !c.LateDecided {
			t.Errorf("redelivery of %s: attempt %d (late decided %v); want attempt %d again, lateness kept",
				c.Run.ID, c.Run.Attempt, c.LateDecided, wantN)
		}
	}
	succeed(t, s, claims, T0.Add(time.Minute))
	if again, err := s.ClaimDueRuns(ctx, upNewOwner, T0.Add(time.Hour-time.Second), 10, Margin); err != nil || len(again) != 0 {
		t.Fatalf("ClaimDueRuns(T0+1h-1s) = %v, %v; want none", claimIDs(again), err)
	}
	if st, err := s.QueueStats(ctx, T0.Add(time.Hour-time.Second)); err != nil || st.Due != 0 {
		t.Errorf("QueueStats(T0+1h-1s) = %+v, %v; want none due", st, err)
	}
	if next, ok, err := s.NextDueAt(ctx); err != nil || !ok || !next.Equal(T0.Add(time.Hour)) {
		t.Errorf("NextDueAt at the end = %v, %v, %v; want the retry due at T0+1h", next, ok, err)
	}

	// Each run's attempts: the old ones kept, an interrupted one for each
	// run in flight, and the attempt sent again under its number.
	wantAttempts := map[string][]string{
		upDue1:     {"1 200 "},
		upDue2:     {"1 200 "},
		upDue3:     {"1 500 http_5xx", "2 200 "},
		upLater:    {"1 502 http_5xx", "2 503 http_5xx"},
		upFirst:    {"1 0 interrupted", "1 200 "},
		upRetry:    {"1 500 http_5xx", "2 0 timeout", "3 0 interrupted", "3 200 "},
		upOrphan:   {"1 0 interrupted"},
		upOK:       {"1 200 "},
		upRejected: {"1 401 http_4xx"},
		upCancel:   nil,
		upExpired:  nil,
	}
	wantState := map[string]vibejobs.RunState{
		upDue1: vibejobs.RunSucceeded, upDue2: vibejobs.RunSucceeded, upDue3: vibejobs.RunSucceeded,
		upLater: vibejobs.RunRetrying, upFirst: vibejobs.RunSucceeded, upRetry: vibejobs.RunSucceeded,
		upOrphan: vibejobs.RunCancelled, upOK: vibejobs.RunSucceeded, upRejected: vibejobs.RunFailed,
		upCancel: vibejobs.RunCancelled, upExpired: vibejobs.RunFailed,
	}
	for _, want := range u.Runs {
		r := get(want.ID)
		var got []string
		for _, a := range r.Attempts {
			got = append(got, fmt.Sprintf("%d %d %s", a.Number, a.StatusCode, a.ErrorCode))
		}
		if !slices.Equal(got, wantAttempts[want.ID]) || r.State != wantState[want.ID] {
			t.Errorf("run %s at the end: %s, attempts %q; want %s, attempts %q",
				want.ID, r.State, got, wantState[want.ID], wantAttempts[want.ID])
		}
	}

	// The feed goes on from the sequence it had, without a gap or a repeat.
	page, err := s.ListEvents(ctx, upProject, vibejobs.EventFilter{Limit: 100})
	if err != nil {
		t.Fatalf("ListEvents: %v", err)
	}
	var got []string
	for i, e := range page.Events {
		if e.Sequence != int64(i+1) {
			t.Errorf("event %d has sequence %d", i+1, e.Sequence)
		}
		got = append(got, string(e.Type)+" "+e.RunID)
	}
	// The events the old version wrote, then those of the checks above.
	var want []string
	for _, e := range u.Events {
		want = append(want, string(e.Type)+" "+e.RunID)
	}
	old := len(want)
	want = append(want, "run.failed "+upExpired,
		"run.succeeded "+upDue1, "run.succeeded "+upDue2, "run.succeeded "+upDue3)
	recovered := []string{"run.cancelled " + upOrphan, "run.retrying " + upFirst, "run.retrying " + upRetry}
	if len(got) >= old+7 {
		slices.Sort(got[old+4 : old+7]) // recovered in one statement: their order is the store's
	}
	want = append(append(want, recovered...), "run.succeeded "+upFirst, "run.succeeded "+upRetry)
	if !slices.Equal(got, want) || page.Head != int64(len(want)) {
		t.Errorf("the feed after the upgrade (head %d):\n%q\nwant (head %d):\n%q", page.Head, got, len(want), want)
	}
	for i, e := range page.Events[:min(old, len(page.Events))] {
		w := u.Events[i]
		if !e.OccurredAt.Equal(w.OccurredAt) || e.JobID != w.JobID || e.State != w.State ||
			e.Attempt != w.Attempt || e.StatusCode != w.StatusCode || (e.NextAt == nil) != (w.NextAt == nil) {
			t.Errorf("event %d changed across the upgrade: %+v, want %+v", i+1, e, w)
		}
	}

	// Finished runs stay prunable, the oldest first; the waiting one is kept.
	if n, err := s.PruneRuns(ctx, upProject, T0.Add(-24*time.Hour), 100); err != nil || n != 2 {
		t.Errorf("PruneRuns(T0-24h) = %d, %v; want the two runs finished days ago", n, err)
	}
	if n, err := s.PruneRuns(ctx, upProject, T0.Add(2*time.Minute), 100); err != nil || n != 8 {
		t.Errorf("PruneRuns(T0+2m) = %d, %v; want the eight other finished runs", n, err)
	}
	runs, _, err = s.ListRuns(ctx, upProject, vibejobs.RunFilter{}, vibejobs.Page{Limit: 100})
	if ids := runIDs(runs); err != nil || !slices.Equal(ids, []string{upLater}) {
		t.Errorf("runs left after pruning = %v, %v; want the waiting retry alone", ids, err)
	}
	if n, err := s.PruneDeletedJobs(ctx, upProject, T0, 10); err != nil || n != 1 {
		t.Errorf("PruneDeletedJobs(T0) = %d, %v; want the deleted job, its runs gone", n, err)
	}
}

// succeed records a 200 for each claim, sent at now and answered a second
// later.
func succeed(t *testing.T, s vibejobs.Store, claims []*vibejobs.Claim, now time.Time) {
	t.Helper()
	outcomes := make([]vibejobs.Outcome, len(claims))
	for i, c := range claims {
		outcomes[i] = vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
			Attempt: vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: now, FinishedAt: now.Add(time.Second),
				StatusCode: 200, SignatureTimestamp: now.Unix()},
			Step: vibejobs.Step{State: vibejobs.RunSucceeded}}
	}
	if err := s.RecordOutcomes(context.Background(), upNewOwner, outcomes); err != nil {
		t.Fatalf("RecordOutcomes: %v", err)
	}
	for _, c := range claims {
		r, err := s.GetRun(context.Background(), upProject, c.Run.ID)
		if err != nil || r.State != vibejobs.RunSucceeded {
			t.Fatalf("run %s after its outcome: %v, %v; want succeeded", c.Run.ID, r, err)
		}
	}
}

func claimIDs(claims []*vibejobs.Claim) []string {
	ids := make([]string, len(claims))
	for i, c := range claims {
		ids[i] = c.Run.ID
	}
	return ids
}

// diffRun tells how got differs from want in the fields a store keeps, or
// "".
func diffRun(got, want *vibejobs.Run) string {
	eqTime := func(a, b *time.Time) bool { return (a == nil) == (b == nil) && (a == nil || a.Equal(*b)) }
	switch {
	case got.JobID != want.JobID || got.Trigger != want.Trigger:
		return fmt.Sprintf("job %s %s, want %s %s", got.JobID, got.Trigger, want.JobID, want.Trigger)
	case got.State != want.State || got.Attempt != want.Attempt || got.FailureReason != want.FailureReason:
		return fmt.Sprintf("%s attempt %d %q, want %s attempt %d %q",
			got.State, got.Attempt, got.FailureReason, want.State, want.Attempt, want.FailureReason)
	case !got.ScheduledFor.Equal(want.ScheduledFor) || !got.DeadlineAt.Equal(want.DeadlineAt) ||
		!got.CreatedAt.Equal(want.CreatedAt):
		return fmt.Sprintf("times %v %v %v, want %v %v %v", got.ScheduledFor, got.DeadlineAt, got.CreatedAt,
			want.ScheduledFor, want.DeadlineAt, want.CreatedAt)
	case !eqTime(got.NextAttemptAt, want.NextAttemptAt) || !eqTime(got.FinishedAt, want.FinishedAt):
		return fmt.Sprintf("next %v finished %v, want %v %v", got.NextAttemptAt, got.FinishedAt,
			want.NextAttemptAt, want.FinishedAt)
	case len(got.Attempts) != len(want.Attempts):
		return fmt.Sprintf("%d attempts, want %d", len(got.Attempts), len(want.Attempts))
	}
	for i, a := range got.Attempts {
		w := want.Attempts[i]
		if a.Number != w.Number || !a.StartedAt.Equal(w.StartedAt) || !a.FinishedAt.Equal(w.FinishedAt) ||
			a.StatusCode != w.StatusCode || a.ErrorCode != w.ErrorCode ||
			a.SignatureTimestamp != w.SignatureTimestamp || a.ResponseSnippet != w.ResponseSnippet {
			return fmt.Sprintf("attempt %d is %+v, want %+v", i+1, a, w)
		}
	}
	return ""
}
