package storetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// Projects every subtest may use after f.projects().
const (
	projectA = "prj_a"
	projectB = "prj_b"
)

// fixture builds data through the public Store API.
type fixture struct {
	t   *testing.T
	s   vibejobs.Store
	ctx context.Context

	mu  sync.Mutex
	seq int // ids: each new id is one millisecond later, so ids sort by creation
	// past hands out instants long before T0 at which claimOne claims a
	// single fresh run without touching the runs a test set up around T0.
	past int
}

// id returns a fresh id with prefix, greater than every id returned before.
func (f *fixture) id(prefix string) string {
	f.mu.Lock()
	f.seq++
	at := T0.Add(-time.Hour).Add(time.Duration(f.seq) * time.Millisecond)
	f.mu.Unlock()
	return vibejobs.NewID(prefix, at, rand.Reader)
}

// pastInstant returns a new instant ten hours before T0 (one minute apart).
func (f *fixture) pastInstant() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.past++
	return T0.Add(-10 * time.Hour).Add(time.Duration(f.past) * time.Minute)
}

func (f *fixture) update(fn func(tx vibejobs.Tx) error) {
	f.t.Helper()
	if err := f.s.Update(f.ctx, fn); err != nil {
		f.t.Fatalf("Update: %v", err)
	}
}

// projects creates projectA and projectB.
func (f *fixture) projects() {
	f.t.Helper()
	f.update(func(tx vibejobs.Tx) error {
		for _, id := range []string{projectA, projectB} {
			if err := tx.CreateProject(f.ctx, &vibejobs.Project{ID: id, Name: "project " + id, CreatedAt: T0.Add(-48 * time.Hour)}); err != nil {
				return err
			}
		}
		return nil
	})
}

// newJob returns a recurring job of projectID with every field set; mods
// adjust it before it is created.
func (f *fixture) newJob(projectID string, mods ...func(*vibejobs.Job)) *vibejobs.Job {
	next := T0
	secret := make([]byte, 60)
	_, _ = rand.Read(secret)
	secret[0], secret[1] = 0, 0 // zero bytes must survive
	j := &vibejobs.Job{
		ID:             f.id("job_"),
		ProjectID:      projectID,
		Name:           "nightly report",
		Schedule:       "*/5 * * * *",
		Timezone:       "UTC",
		URL:            "https://app.example.test/hooks/report",
		Enabled:        true,
		State:          vibejobs.JobActive,
		Retry:          vibejobs.DefaultRetryPolicy(),
		Timeout:        10 * time.Second,
		CatchUp:        vibejobs.CatchUpAll,
		ScheduleAnchor: T0.Add(-2 * time.Hour),
		NextRunAt:      &next,
		Secret:         vibejobs.SealedSecret{KeyID: "key1", Ciphertext: secret},
		CreatedAt:      T0.Add(-2 * time.Hour),
		UpdatedAt:      T0.Add(-90 * time.Minute),
	}
	for _, m := range mods {
		m(j)
	}
	return j
}

// job creates a job (see newJob) and returns it.
func (f *fixture) job(projectID string, mods ...func(*vibejobs.Job)) *vibejobs.Job {
	f.t.Helper()
	j := f.newJob(projectID, mods...)
	f.update(func(tx vibejobs.Tx) error { return tx.CreateJob(f.ctx, j) })
	return j
}

func (f *fixture) getJob(projectID, id string) *vibejobs.Job {
	f.t.Helper()
	j, err := f.s.GetJob(f.ctx, projectID, id)
	if err != nil {
		f.t.Fatalf("GetJob(%s): %v", id, err)
	}
	return j
}

// newRun returns a manual run of j for scheduledFor, due then, created an
// hour before T0 or at scheduledFor if that is earlier: a run is created
// before it is claimed, and so before it finishes (PruneRuns may rely on it).
func (f *fixture) newRun(j *vibejobs.Job, scheduledFor time.Time) *vibejobs.Run {
	return vibejobs.NewRun(f.id("run_"), j, vibejobs.TriggerManual, scheduledFor, earliest(scheduledFor, T0.Add(-time.Hour)))
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// run creates a manual run of j for scheduledFor, due then.
func (f *fixture) run(j *vibejobs.Job, scheduledFor time.Time, mods ...func(*vibejobs.Run)) *vibejobs.Run {
	f.t.Helper()
	r := f.newRun(j, scheduledFor)
	for _, m := range mods {
		m(r)
	}
	f.update(func(tx vibejobs.Tx) error { return tx.CreateRun(f.ctx, r) })
	return r
}

// dueAt makes a run due at t (its NextAttemptAt).
func dueAt(t time.Time) func(*vibejobs.Run) {
	return func(r *vibejobs.Run) { r.NextAttemptAt = &t }
}

func (f *fixture) getRun(projectID, id string) *vibejobs.Run {
	f.t.Helper()
	r, err := f.s.GetRun(f.ctx, projectID, id)
	if err != nil {
		f.t.Fatalf("GetRun(%s): %v", id, err)
	}
	return r
}

func (f *fixture) claim(owner string, now time.Time, limit int) []*vibejobs.Claim {
	f.t.Helper()
	cs, err := f.s.ClaimDueRuns(f.ctx, owner, now, limit, Margin)
	if err != nil {
		f.t.Fatalf("ClaimDueRuns(%s, %s, %d): %v", owner, now.Format(time.RFC3339Nano), limit, err)
	}
	return cs
}

// claimIDs claims and checks that exactly the runs want were claimed, in that order.
func (f *fixture) claimIDs(owner string, now time.Time, limit int, want ...*vibejobs.Run) []*vibejobs.Claim {
	f.t.Helper()
	cs := f.claim(owner, now, limit)
	if got, w := claimedIDs(cs), runIDs(want); !slices.Equal(got, w) {
		f.t.Fatalf("ClaimDueRuns(%s, %s, %d) claimed %v, want %v", owner, now.Format(time.RFC3339Nano), limit, got, w)
	}
	return cs
}

// claimOne creates a manual run of j scheduled at a fresh instant long before
// T0 and claims it alone at that instant as owner.
func (f *fixture) claimOne(j *vibejobs.Job, owner string) *vibejobs.Claim {
	f.t.Helper()
	at := f.pastInstant()
	r := f.run(j, at)
	return f.claimIDs(owner, at, 1, r)[0]
}

// claimAt creates a manual run of j scheduled at "at" and claims it alone at
// that instant. No other run may be due then.
func (f *fixture) claimAt(j *vibejobs.Job, owner string, at time.Time) *vibejobs.Claim {
	f.t.Helper()
	r := f.run(j, at)
	return f.claimIDs(owner, at, 1, r)[0]
}

func (f *fixture) record(owner string, outcomes ...vibejobs.Outcome) {
	f.t.Helper()
	if err := f.s.RecordOutcomes(f.ctx, owner, outcomes); err != nil {
		f.t.Fatalf("RecordOutcomes: %v", err)
	}
}

// outcome returns the outcome of claim c's attempt, started at started and
// finished at finished, moving the run to step.
func outcome(c *vibejobs.Claim, started, finished time.Time, status int, step vibejobs.Step) vibejobs.Outcome {
	a := vibejobs.Attempt{
		Number: c.Run.Attempt, StartedAt: started, FinishedAt: finished,
		StatusCode: status, SignatureTimestamp: started.Unix(),
	}
	switch {
	case status >= 200 && status < 300:
		a.ResponseSnippet = `{"ok":true}`
	case status >= 500:
		a.ErrorCode = "http_5xx"
		a.ResponseSnippet = "upstream broke"
	case status >= 400:
		a.ErrorCode = "http_4xx"
		a.ResponseSnippet = "denied"
	default:
		a.ErrorCode = "timeout"
	}
	return vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Attempt: a, Step: step}
}

func succeeded(c *vibejobs.Claim, started, finished time.Time) vibejobs.Outcome {
	return outcome(c, started, finished, 200, vibejobs.Step{State: vibejobs.RunSucceeded})
}

func retrying(c *vibejobs.Claim, started, finished, next time.Time) vibejobs.Outcome {
	return outcome(c, started, finished, 503, vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next})
}

func failed(c *vibejobs.Claim, started, finished time.Time, status int, reason string) vibejobs.Outcome {
	return outcome(c, started, finished, status, vibejobs.Step{State: vibejobs.RunFailed, FailureReason: reason})
}

// retryingRun returns a run of j in retrying at attempt 1, due again at next.
func (f *fixture) retryingRun(j *vibejobs.Job, next time.Time) *vibejobs.Run {
	f.t.Helper()
	c := f.claimOne(j, "setup")
	at := c.Run.ScheduledFor
	f.record("setup", retrying(c, at, at.Add(time.Second), next))
	return c.Run
}

// finishedRun returns a run of j that succeeded at finished.
func (f *fixture) finishedRun(j *vibejobs.Job, finished time.Time) *vibejobs.Run {
	f.t.Helper()
	c := f.claimOne(j, "setup")
	f.record("setup", succeeded(c, c.Run.ScheduledFor, finished))
	return c.Run
}

func (f *fixture) idempotencyRecord(projectID, key string, created time.Time) *vibejobs.IdempotencyRecord {
	h := sha256.Sum256([]byte(key + created.String()))
	return &vibejobs.IdempotencyRecord{
		ProjectID: projectID, Key: key, RequestHash: h[:],
		CreatedAt: created, ExpiresAt: created.Add(24 * time.Hour),
	}
}

func claimedIDs(cs []*vibejobs.Claim) []string {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.Run.ID
	}
	return ids
}

func runIDs(rs []*vibejobs.Run) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

func jobIDs(js []*vibejobs.Job) []string {
	ids := make([]string, len(js))
	for i, j := range js {
		ids[i] = j.ID
	}
	return ids
}

func ptr[T any](v T) *T { return &v }

// wantError checks that err is a *vibejobs.Error of kind and, when code is
// not "", of code.
func wantError(t *testing.T, what string, err error, kind, code string) {
	t.Helper()
	var e *vibejobs.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: error %v, want a *vibejobs.Error of kind %s", what, err, kind)
	}
	if e.Kind != kind || (code != "" && e.Code != code) {
		t.Fatalf("%s: error kind %s code %s (%v), want kind %s code %q", what, e.Kind, e.Code, err, kind, code)
	}
}

func asError(err error) *vibejobs.Error {
	var e *vibejobs.Error
	errors.As(err, &e)
	return e
}

func wantNotFound(t *testing.T, what string, err error, thing string) {
	t.Helper()
	wantError(t, what, err, vibejobs.ENOTFOUND, thing+"_not_found")
}

// wantEqual compares got and want field by field; times compare with Equal
// (any location), and nil and empty slices and maps are equal.
func wantEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if d := diff(reflect.ValueOf(got), reflect.ValueOf(want), ""); d != "" {
		t.Fatalf("%s: %s", what, d)
	}
}

var timeType = reflect.TypeFor[time.Time]()

func diff(got, want reflect.Value, path string) string {
	if !got.IsValid() || !want.IsValid() {
		if got.IsValid() == want.IsValid() {
			return ""
		}
		return fmt.Sprintf("%s: got %v, want %v", pathOr(path), got, want)
	}
	if got.Type() != want.Type() {
		return fmt.Sprintf("%s: got type %s, want %s", pathOr(path), got.Type(), want.Type())
	}
	if got.Type() == timeType {
		g, w := got.Interface().(time.Time), want.Interface().(time.Time)
		if !g.Equal(w) {
			return fmt.Sprintf("%s: got %s, want %s", pathOr(path), g.Format(time.RFC3339Nano), w.Format(time.RFC3339Nano))
		}
		return ""
	}
	switch got.Kind() {
	case reflect.Pointer, reflect.Interface:
		if got.IsNil() || want.IsNil() {
			if got.IsNil() == want.IsNil() {
				return ""
			}
			return fmt.Sprintf("%s: got %s, want %s", pathOr(path), show(got), show(want))
		}
		return diff(got.Elem(), want.Elem(), path)
	case reflect.Struct:
		for i := range got.NumField() {
			if d := diff(got.Field(i), want.Field(i), path+"."+got.Type().Field(i).Name); d != "" {
				return d
			}
		}
		return ""
	case reflect.Slice, reflect.Array:
		if got.Len() != want.Len() {
			return fmt.Sprintf("%s: got %d elements %s, want %d %s", pathOr(path), got.Len(), show(got), want.Len(), show(want))
		}
		for i := range got.Len() {
			if d := diff(got.Index(i), want.Index(i), fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	case reflect.Map:
		if got.Len() != want.Len() {
			return fmt.Sprintf("%s: got %s, want %s", pathOr(path), show(got), show(want))
		}
		for _, k := range want.MapKeys() {
			if d := diff(got.MapIndex(k), want.MapIndex(k), fmt.Sprintf("%s[%v]", path, k)); d != "" {
				return d
			}
		}
		return ""
	default:
		if !got.Equal(want) {
			return fmt.Sprintf("%s: got %s, want %s", pathOr(path), show(got), show(want))
		}
		return ""
	}
}

func pathOr(p string) string {
	if p == "" {
		return "value"
	}
	return strings.TrimPrefix(p, ".")
}

func show(v reflect.Value) string {
	for v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() == reflect.Pointer {
		return "nil"
	}
	if v.Type() == timeType {
		return v.Interface().(time.Time).Format(time.RFC3339Nano)
	}
	if v.Kind() == reflect.String && v.Len() > 60 {
		return fmt.Sprintf("%q… (%d bytes)", v.String()[:40], v.Len())
	}
	if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
		return fmt.Sprintf("%x", v.Bytes())
	}
	return fmt.Sprintf("%+v", v.Interface())
}
