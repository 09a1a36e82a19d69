package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/dispatcher"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

// clock is a fake clock the test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// plainOpener "decrypts" secrets stored in the clear: the store never sees
// plaintext in production (secretbox); here the key id marks the test.
type plainOpener struct{}

func (plainOpener) Open(s vibejobs.SealedSecret, _ string) (string, error) {
	return string(s.Ciphertext), nil
}

// sent is one request the sender saw.
type sent struct {
	url     string
	header  http.Header
	payload map[string]any
	body    []byte
	timeout time.Duration
}

// sender answers from a script and reports every request; a host listed in
// block waits until its channel closes.
type sender struct {
	got    chan sent
	mu     sync.Mutex
	answer map[string][]egress.Result // by URL; default 200
	block  map[string]chan struct{}
}

func newSender() *sender {
	return &sender{got: make(chan sent, 100), answer: map[string][]egress.Result{}, block: map[string]chan struct{}{}}
}

func (s *sender) Post(_ context.Context, url string, h http.Header, body []byte, timeout time.Duration) egress.Result {
	var p map[string]any
	_ = json.Unmarshal(body, &p)
	s.got <- sent{url: url, header: h, payload: p, body: body, timeout: timeout}
	s.mu.Lock()
	b := s.block[url]
	res := egress.Result{StatusCode: 200}
	if a := s.answer[url]; len(a) > 0 {
		res, s.answer[url] = a[0], a[1:]
	}
	s.mu.Unlock()
	if b != nil {
		<-b
	}
	return res
}

func (s *sender) next(t *testing.T) sent {
	t.Helper()
	select {
	case x := <-s.got:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no request sent")
		return sent{}
	}
}

type env struct {
	store   *sqlite.Store
	clock   *clock
	sender  *sender
	project string
	// unblocks end the blocks of blockHost; a dispatcher started by
	// startWith calls them before it stops, which waits for its attempts.
	unblocks []func()
}

// wantNothingSent fails if an attempt was sent, with what and the
// attempt's run id.
func (e *env) wantNothingSent(t *testing.T, what string) {
	t.Helper()
	select {
	case x := <-e.sender.got:
		t.Fatalf("%s: sent %v attempt %v", what, x.payload["runId"], x.payload["attempt"])
	default:
	}
}

// blockHost makes attempts to url wait until the returned func is called
// (more calls do nothing).
func (e *env) blockHost(url string) (unblock func()) {
	release := make(chan struct{})
	e.sender.block[url] = release
	var once sync.Once
	unblock = func() { once.Do(func() { close(release) }) }
	e.unblocks = append(e.unblocks, unblock)
	return unblock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"), sqlite.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{store: st, clock: c, sender: newSender(), project: "prj_test"}
	e.update(t, func(tx vibejobs.Tx) error {
		return tx.CreateProject(context.Background(), &vibejobs.Project{ID: e.project, Name: "test", CreatedAt: c.Now()})
	})
	return e
}

func (e *env) update(t *testing.T, fn func(tx vibejobs.Tx) error) {
	t.Helper()
	if err := e.store.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func (e *env) job(t *testing.T, id, url string) *vibejobs.Job {
	t.Helper()
	now := e.clock.Now()
	j := &vibejobs.Job{ID: id, ProjectID: e.project, Name: id, Schedule: "0 0 1 1 *", Timezone: "UTC", URL: url,
		Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(), Timeout: 10 * time.Second,
		CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: now, CreatedAt: now, UpdatedAt: now,
		Secret: vibejobs.SealedSecret{KeyID: "plain", Ciphertext: []byte("vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8")}}
	e.update(t, func(tx vibejobs.Tx) error { return tx.CreateJob(context.Background(), j) })
	return j
}

func (e *env) run(t *testing.T, j *vibejobs.Job, id string, scheduledFor time.Time) *vibejobs.Run {
	t.Helper()
	r := vibejobs.NewRun(id, j, vibejobs.TriggerManual, scheduledFor, e.clock.Now())
	e.update(t, func(tx vibejobs.Tx) error { return tx.CreateRun(context.Background(), r) })
	return r
}

// scheduledRun creates a job and plans its schedule-triggered run due in
// in, as the scheduler would.
func (e *env) scheduledRun(t *testing.T, in time.Duration) (*vibejobs.Job, *vibejobs.Run) {
	t.Helper()
	ctx := context.Background()
	j := e.job(t, "job_a", "https://a.example/")
	later := e.clock.Now().Add(time.Hour)
	j.NextRunAt = &later
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(ctx, j) })
	r := vibejobs.NewRun("run_a", j, vibejobs.TriggerSchedule, e.clock.Now().Add(in), e.clock.Now())
	if n, _, err := e.store.ApplyRunPlans(ctx, []vibejobs.RunPlan{{JobID: j.ID, From: *j.NextRunAt, Anchor: j.ScheduleAnchor,
		Next: j.NextRunAt, Runs: []*vibejobs.Run{r}}}, e.clock.Now()); err != nil || n != 1 {
		t.Fatalf("ApplyRunPlans = %d, %v", n, err)
	}
	return j, r
}

// pause pauses j as the API does: disabled, its future runs withdrawn.
func (e *env) pause(j *vibejobs.Job) error {
	ctx := context.Background()
	j.Enabled, j.State, j.NextRunAt = false, vibejobs.JobPaused, nil
	return e.store.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.UpdateJob(ctx, j); err != nil {
			return err
		}
		_, err := tx.DeleteFutureRuns(ctx, j.ID, e.clock.Now())
		return err
	})
}

// waitGone waits until run id is deleted.
func (e *env) waitGone(t *testing.T, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		_, err := e.store.GetRun(context.Background(), e.project, id)
		if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is still there: %v", id, err)
		}
	}
}

// start starts a dispatcher on e's store (see startOn).
func (e *env) start(t *testing.T, perHost int) (*dispatcher.Dispatcher, context.CancelFunc, chan struct{}) {
	t.Helper()
	return e.startOn(t, e.store, func(c *dispatcher.Config) { c.PerHost = perHost })
}

// waitRun polls the store (the dispatcher records asynchronously) until cond holds.
func (e *env) waitRun(t *testing.T, id string, cond func(*vibejobs.Run) bool) *vibejobs.Run {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := e.store.GetRun(context.Background(), e.project, id)
		if err != nil {
			t.Fatal(err)
		}
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s stuck in %s (attempt %d)", id, r.State, r.Attempt)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDeliversSignedRequestAndRetries(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/hook")
	e.sender.answer[j.URL] = []egress.Result{{StatusCode: 503, ErrorCode: egress.CodeHTTP5xx}}
	// Caught up two minutes late: late is decided at the first attempt and kept.
	r := e.run(t, j, "run_a", e.clock.Now().Add(-2*time.Minute))
	e.start(t, 8)

	x := e.sender.next(t)
	if x.payload["attempt"] != 1.0 || x.payload["late"] != true || x.payload["runId"] != "run_a" {
		t.Fatalf("first attempt %v", x.payload)
	}
	if err := contract.Verify("vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8", x.header.Get("Vibe-Signature"), x.body, e.clock.Now().Unix()); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if x.header.Get("Idempotency-Key") != "run_a" || x.header.Get("X-Vibe-Caller-Kind") != "schedule" {
		t.Fatalf("headers %v", x.header)
	}
	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunRetrying })
	// Jitter fixed at the middle: exactly the 30 s default backoff.
	if got.NextAttemptAt == nil || !got.NextAttemptAt.Equal(e.clock.Now().Add(30*time.Second)) {
		t.Fatalf("next attempt at %v", got.NextAttemptAt)
	}
	e.wantNothingSent(t, "retried before its time")
	e.clock.Add(30 * time.Second)
	x = e.sender.next(t)
	if x.payload["attempt"] != 2.0 || x.payload["late"] != true {
		t.Fatalf("second attempt %v", x.payload)
	}
	got = e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
	if got.State != vibejobs.RunSucceeded || len(got.Attempts) != 2 || got.Attempts[0].ErrorCode != "http_5xx" || got.Attempts[1].StatusCode != 200 {
		t.Fatalf("run %+v", got)
	}
}

// TestLoweredMaxAttemptsSendsNoMore: a job's maxAttempts lowered while its
// run waits to retry ends the run at its next turn, attempts_exhausted,
// without another attempt going out (SEMANTICS §2: attempts used up).
func TestLoweredMaxAttemptsSendsNoMore(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/hook")
	e.sender.answer[j.URL] = []egress.Result{
		{StatusCode: 503, ErrorCode: egress.CodeHTTP5xx}, {StatusCode: 503, ErrorCode: egress.CodeHTTP5xx}}
	r := e.run(t, j, "run_a", e.clock.Now())
	e.start(t, 8)

	e.sender.next(t)
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunRetrying })
	e.clock.Add(30 * time.Second)
	e.sender.next(t)
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunRetrying && r.Attempt == 2 })
	j.Retry.MaxAttempts = 2
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(context.Background(), j) })

	e.clock.Add(5 * time.Minute)
	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
	if got.State != vibejobs.RunFailed || got.FailureReason != vibejobs.ReasonAttemptsExhausted ||
		got.Attempt != 2 || len(got.Attempts) != 2 {
		t.Fatalf("run after its limit went down: %s %q attempt %d, %d attempts; want failed attempts_exhausted at attempt 2",
			got.State, got.FailureReason, got.Attempt, len(got.Attempts))
	}
	e.wantNothingSent(t, "attempt beyond the lowered limit")
}

func TestOnTimeRunIsNotLate(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/hook")
	e.run(t, j, "run_a", e.clock.Now().Add(-59*time.Second))
	e.start(t, 8)
	if x := e.sender.next(t); x.payload["late"] != false {
		t.Fatalf("late %v", x.payload["late"])
	}
}

func TestSlowHostDoesNotHoldUpOthers(t *testing.T) {
	e := newEnv(t)
	slow := e.job(t, "job_slow", "https://slow.example/")
	fast := e.job(t, "job_fast", "https://fast.example/")
	release := make(chan struct{})
	e.sender.block[slow.URL] = release
	for i := 0; i < 5; i++ {
		e.run(t, slow, "run_slow"+string(rune('a'+i)), e.clock.Now())
	}
	e.start(t, 2)
	// Two slow attempts hold the host's two slots.
	for i := 0; i < 2; i++ {
		if x := e.sender.next(t); x.url != slow.URL {
			t.Fatalf("unexpected %s", x.url)
		}
	}
	r := e.run(t, fast, "run_fast", e.clock.Now())
	for {
		x := e.sender.next(t)
		if x.url == fast.URL {
			break
		}
		t.Fatalf("a third slow attempt started while the host was full")
	}
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	// The slow runs waiting for a slot kept attempt 0 → still their first attempt.
	close(release)
	for i := 0; i < 3; i++ {
		if x := e.sender.next(t); x.payload["attempt"] != 1.0 {
			t.Fatalf("released run came back as attempt %v", x.payload["attempt"])
		}
	}
}

func TestShutdownLetsAttemptInFlightFinish(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	release := make(chan struct{})
	e.sender.block[j.URL] = release
	r := e.run(t, j, "run_a", e.clock.Now())
	_, cancel, done := e.start(t, 8)
	e.sender.next(t)
	cancel()
	select {
	case <-done:
		t.Fatal("Run returned with an attempt in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-done
	got, err := e.store.GetRun(context.Background(), e.project, r.ID)
	if err != nil || got.State != vibejobs.RunSucceeded {
		t.Fatalf("after shutdown: %+v %v", got, err)
	}
}

// TestClaimAheadHoldsUntilDue: runs claimed ahead of their time are not sent
// before their scheduledFor (real clock: the hold is real time).
func TestClaimAheadHoldsUntilDue(t *testing.T) {
	e := newEnv(t)
	e.clock = nil
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.store = st
	e.clock = &clock{t: time.Now()}
	e.update(t, func(tx vibejobs.Tx) error {
		return tx.CreateProject(context.Background(), &vibejobs.Project{ID: e.project, Name: "test", CreatedAt: time.Now()})
	})
	j := e.job(t, "job_a", "https://a.example/")
	var due []time.Time
	for i := 0; i < 5; i++ {
		at := time.Now().Add(time.Duration(10+10*i) * time.Millisecond).Truncate(time.Millisecond)
		due = append(due, at)
		e.run(t, j, "run_"+string(rune('a'+i)), at)
	}
	d := dispatcher.New(dispatcher.Config{
		Store: e.store, Sender: e.sender, Opener: plainOpener{}, Owner: "o", Rand: func() float64 { return 0.5 },
		ClaimAhead: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for range due {
		x := e.sender.next(t)
		sentAt := time.Now()
		at, _ := time.Parse(contract.ScheduledForLayout, x.payload["scheduledFor"].(string))
		if sentAt.Before(at) {
			t.Fatalf("run due at %v sent early at %v", at, sentAt)
		}
		if x.payload["late"] != false {
			t.Fatalf("on-time run marked late")
		}
	}
}

// releaseCounter counts the runs a dispatcher hands back unsent, and its
// reads of the next due time (one per pass of its claim loop, while it has
// room).
type releaseCounter struct {
	vibejobs.DispatchStore
	released, polls atomic.Int64
}

func (r *releaseCounter) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	r.polls.Add(1)
	return r.DispatchStore.NextDueAt(ctx)
}

// waitPolls waits until the claim loop made n more passes.
func (r *releaseCounter) waitPolls(t *testing.T, n int64) {
	t.Helper()
	want := r.polls.Load() + n
	for deadline := time.Now().Add(10 * time.Second); r.polls.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the claim loop stopped")
		}
	}
}

// waitReleased waits until a claim was released, or fails with msg.
func (r *releaseCounter) waitReleased(t *testing.T, msg string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); r.released.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
	}
}

func (r *releaseCounter) ReleaseClaims(ctx context.Context, owner string, claims []*vibejobs.Claim, now, due time.Time) error {
	r.released.Add(int64(len(claims)))
	return r.DispatchStore.ReleaseClaims(ctx, owner, claims, now, due)
}

// startWith starts a dispatcher (fake clock, concurrency 8) whose store
// counts releases, claimAhead as dispatcher.Config.ClaimAhead. cancel stops
// it and done closes when Run returned; the test's cleanup does both.
func (e *env) startWith(t *testing.T, perHost int, claimAhead time.Duration) (d *dispatcher.Dispatcher, rc *releaseCounter, cancel context.CancelFunc, done chan struct{}) {
	t.Helper()
	rc = &releaseCounter{DispatchStore: e.store}
	d, cancel, done = e.startOn(t, rc, func(c *dispatcher.Config) { c.PerHost, c.ClaimAhead = perHost, claimAhead })
	return d, rc, cancel, done
}

// TestFullHostClaimsWaitForASlot: claims whose host is full wait for one of
// its slots instead of going back to the database, and are sent, as their
// first attempt, as the host's attempts finish.
func TestFullHostClaimsWaitForASlot(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	var runs []*vibejobs.Run
	for i := 0; i < 5; i++ {
		runs = append(runs, e.run(t, j, "run_"+string(rune('a'+i)), e.clock.Now()))
	}
	_, rc, _, _ := e.startWith(t, 2, 200*time.Millisecond)
	e.sender.next(t)
	e.sender.next(t)
	// All five are claimed (two sending, three waiting) before any is
	// released or a third is sent.
	for _, r := range runs {
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	}
	e.wantNothingSent(t, "a third attempt started while the host was full")
	unblock()
	for i := 0; i < 3; i++ {
		if x := e.sender.next(t); x.payload["attempt"] != 1.0 {
			t.Fatalf("waiting run sent as attempt %v", x.payload["attempt"])
		}
	}
	for _, r := range runs {
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	}
	if n := rc.released.Load(); n != 0 {
		t.Fatalf("%d claims released; want them to wait for the host", n)
	}
}

// TestPerHostCountsEverySpellingOfAHost: two URLs naming one destination
// share its slots, as they share the egress client's connections: were
// they counted apart, the second attempt would wait inside the client for a
// connection, on its own timeout.
func TestPerHostCountsEverySpellingOfAHost(t *testing.T) {
	e := newEnv(t)
	a := e.job(t, "job_a", "https://a.example/x")
	b := e.job(t, "job_b", "https://A.EXAMPLE:443/y")
	unblock := e.blockHost(a.URL)
	ra := e.run(t, a, "run_a", e.clock.Now())
	_, rc, _, _ := e.startWith(t, 1, 0)
	if x := e.sender.next(t); x.payload["runId"] != ra.ID {
		t.Fatalf("first sent %v", x.payload["runId"])
	}
	rb := e.run(t, b, "run_b", e.clock.Now())
	e.waitRun(t, rb.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	rc.waitPolls(t, 2)
	e.wantNothingSent(t, "while another spelling of its host held the only slot")
	unblock()
	if x := e.sender.next(t); x.payload["runId"] != rb.ID {
		t.Fatalf("after the slot freed, sent %v", x.payload["runId"])
	}
}

// TestWaitingClaimReleasedHalfTheLeaseMarginAfterItsTime: a claim waiting
// for its host waits up to LeaseMargin/2 after it is due (a claim made ahead
// counts from its time, not from the claim), then goes back to the
// database, and is claimed again, under the same attempt number, once the
// host has room.
func TestWaitingClaimReleasedHalfTheLeaseMarginAfterItsTime(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	first := e.run(t, j, "run_a", e.clock.Now())
	_, rc, _, _ := e.startWith(t, 1, 200*time.Millisecond)
	e.sender.next(t)
	// Claimed ahead (it falls due within ClaimAhead), it waits for the host.
	second := e.run(t, j, "run_b", e.clock.Now().Add(100*time.Millisecond))
	e.waitRun(t, second.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	// Past its claim + LeaseMargin/2, not past its time + LeaseMargin/2.
	e.clock.Add(dispatcher.DefaultLeaseMargin/2 + 50*time.Millisecond)
	rc.waitPolls(t, 2)
	if n := rc.released.Load(); n != 0 {
		t.Fatalf("%d claims released before their time + LeaseMargin/2", n)
	}
	e.clock.Add(100 * time.Millisecond)
	// Released, it is claimed again at once and waits anew: the host is
	// still full.
	rc.waitReleased(t, "the waiting claim was not released")
	unblock()
	if x := e.sender.next(t); x.payload["runId"] != second.ID || x.payload["attempt"] != 1.0 {
		t.Fatalf("after the release sent %v", x.payload)
	}
	e.waitRun(t, first.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	e.waitRun(t, second.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
}

// TestWaitingClaimReleasedAtItsDeadline: no attempt starts after the run's
// deadline (SEMANTICS.md section 2). A claim waiting for its host is
// released when its deadline passes, even within the LeaseMargin/2 it may
// otherwise wait, and is never sent.
func TestWaitingClaimReleasedAtItsDeadline(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	now := e.clock.Now()
	blocker := e.run(t, j, "run_blocker", now.Add(-vibejobs.DeliveryLifetime+500*time.Millisecond))
	victim := e.run(t, j, "run_victim", now.Add(-vibejobs.DeliveryLifetime+time.Second))
	_, rc, _, _ := e.startWith(t, 1, 0)
	if x := e.sender.next(t); x.payload["runId"] != blocker.ID {
		t.Fatalf("first sent %v", x.payload["runId"])
	}
	e.waitRun(t, victim.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	// Past the victim's deadline, within LeaseMargin/2 of its due time.
	e.clock.Add(time.Second + time.Millisecond)
	rc.waitReleased(t, "the claim waiting past its deadline was not released")
	unblock()
	e.waitRun(t, blocker.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	rc.waitPolls(t, 2)
	e.wantNothingSent(t, "after its deadline")
	got := e.waitRun(t, victim.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunScheduled })
	if len(got.Attempts) != 0 {
		t.Errorf("attempts of the run released at its deadline: %+v", got.Attempts)
	}
}

// TestWaitingFirstAttemptReleasedWhenItWouldBeLate: late says whether the
// first attempt started more than 60 s after scheduledFor. A first attempt
// claimed on time that waits for its host past that moment goes back, and
// its next claim decides it late.
func TestWaitingFirstAttemptReleasedWhenItWouldBeLate(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	now := e.clock.Now()
	blocker := e.run(t, j, "run_blocker", now.Add(-59500*time.Millisecond))
	victim := e.run(t, j, "run_victim", now.Add(-59*time.Second))
	_, rc, _, _ := e.startWith(t, 1, 0)
	if x := e.sender.next(t); x.payload["runId"] != blocker.ID {
		t.Fatalf("first sent %v", x.payload["runId"])
	}
	e.waitRun(t, victim.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	// 61 s after the victim's scheduledFor, within LeaseMargin/2 of its claim.
	e.clock.Add(2 * time.Second)
	rc.waitReleased(t, "the waiting first attempt was not released when it would be late")
	unblock()
	x := e.sender.next(t)
	if x.payload["runId"] != victim.ID || x.payload["attempt"] != 1.0 || x.payload["late"] != true {
		t.Fatalf("sent %v attempt %v late %v; want %s attempt 1 late true", x.payload["runId"], x.payload["attempt"], x.payload["late"], victim.ID)
	}
}

// TestWaitingRedeliveryOfAnOnTimeFirstAttemptWaits: a first attempt sent on
// time and interrupted keeps late=false; its redelivery, claimed more than
// 60 s after scheduledFor, waits for its host like any claim instead of
// going back at once (and being claimed again, over and over).
func TestWaitingRedeliveryOfAnOnTimeFirstAttemptWaits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	now := e.clock.Now()
	victim := e.run(t, j, "run_victim", now.Add(-2*time.Minute))
	// Sent on time by a process that died: late stays false.
	if cs, err := e.store.ClaimDueRuns(ctx, "dead", victim.ScheduledFor.Add(10*time.Second), 1, time.Second); err != nil || len(cs) != 1 || cs[0].Run.Late {
		t.Fatalf("first claim: %v, %v", cs, err)
	}
	if n, err := e.store.RecoverExpiredLeases(ctx, now.Add(-time.Second), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v", n, err)
	}
	blocker := e.run(t, j, "run_blocker", now.Add(-3*time.Minute))
	_, rc, _, _ := e.startWith(t, 1, 0)
	if x := e.sender.next(t); x.payload["runId"] != blocker.ID {
		t.Fatalf("first sent %v", x.payload["runId"])
	}
	e.waitRun(t, victim.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	rc.waitPolls(t, 3)
	if n := rc.released.Load(); n != 0 {
		t.Fatalf("%d claims released while within LeaseMargin/2 of their claim", n)
	}
	unblock()
	if x := e.sender.next(t); x.payload["runId"] != victim.ID || x.payload["attempt"] != 1.0 || x.payload["late"] != false {
		t.Fatalf("sent %v attempt %v late %v; want %s attempt 1 late false", x.payload["runId"], x.payload["attempt"], x.payload["late"], victim.ID)
	}
}

// TestShutdownReleasesWaitingClaims: at shutdown, claims still waiting for
// their host go back to the database unsent, for another process to take,
// and not due before their time.
func TestShutdownReleasesWaitingClaims(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	first := e.run(t, j, "run_a", e.clock.Now())
	// Claimed ahead of its time, it waits for the host (held by the first).
	second := e.run(t, j, "run_b", e.clock.Now().Add(100*time.Millisecond))
	_, rc, cancel, done := e.startWith(t, 1, 200*time.Millisecond)
	sentFirst := e.sender.next(t)
	e.waitRun(t, second.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	cancel()
	e.waitRun(t, second.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunScheduled })
	unblock()
	<-done
	if sentFirst.payload["runId"] != first.ID {
		t.Fatalf("sent %v first", sentFirst.payload["runId"])
	}
	e.wantNothingSent(t, "after shutdown began")
	e.waitRun(t, first.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	got := e.waitRun(t, second.ID, func(*vibejobs.Run) bool { return true })
	if got.State != vibejobs.RunScheduled || len(got.Attempts) != 0 {
		t.Fatalf("waiting run after shutdown: %s with %d attempts", got.State, len(got.Attempts))
	}
	// Not due before its time, or another process would send it early.
	if got.NextAttemptAt == nil || got.NextAttemptAt.Before(second.ScheduledFor) {
		t.Fatalf("released run due at %v, before its scheduledFor %v", got.NextAttemptAt, second.ScheduledFor)
	}
	if n := rc.released.Load(); n != 1 {
		t.Fatalf("%d claims released; want the waiting one", n)
	}
}

// TestShutdownSendsHeldClaimAtItsTime: a run claimed ahead of its time
// and held for it when Run's context ends is neither lost nor left in
// flight: it goes out at its time (at most ClaimAhead after the stop
// began; TestClaimAheadHoldsUntilDue checks the hold itself), its outcome
// is recorded, and only then does Run return.
func TestShutdownSendsHeldClaimAtItsTime(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	r := e.run(t, j, "run_a", e.clock.Now().Add(time.Second))
	_, rc, cancel, done := e.startWith(t, 8, time.Second)
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	cancel()
	<-done
	x := e.sender.next(t)
	if x.payload["runId"] != r.ID || x.payload["attempt"] != 1.0 {
		t.Fatalf("sent %v attempt %v", x.payload["runId"], x.payload["attempt"])
	}
	got, err := e.store.GetRun(context.Background(), e.project, r.ID)
	if err != nil || got.State != vibejobs.RunSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("held run after Run returned: %+v, %v; want succeeded, its attempt recorded", got, err)
	}
	if n := rc.released.Load(); n != 0 {
		t.Fatalf("%d claims given back", n)
	}
	e.wantNothingSent(t, "after Run returned")
}

// TestJobChangeWithdrawsHeldClaim: a job edited while its run is claimed
// ahead and held has the run sent with the new settings, as the spec wants
// ("every attempt uses the job's URL … as they are when that attempt
// starts"); one deleted meanwhile has its run cancelled unsent.
func TestJobChangeWithdrawsHeldClaim(t *testing.T) {
	t.Run("edited", func(t *testing.T) {
		e := newEnv(t)
		j := e.job(t, "job_a", "https://old.example/")
		r := e.run(t, j, "run_a", e.clock.Now().Add(time.Second))
		d, rc, _, _ := e.startWith(t, 8, 2*time.Second)
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
		j.URL = "https://new.example/"
		e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(context.Background(), j) })
		d.JobChanged(j.ID)
		// Withdrawn, it goes back once due, and is claimed again.
		e.clock.Add(time.Second)
		x := e.sender.next(t)
		if x.url != j.URL || x.payload["attempt"] != 1.0 {
			t.Fatalf("sent attempt %v to %s, want attempt 1 to the new URL", x.payload["attempt"], x.url)
		}
		if n := rc.released.Load(); n != 1 {
			t.Fatalf("%d claims released; want the held one", n)
		}
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	})
	t.Run("deleted", func(t *testing.T) {
		e := newEnv(t)
		j := e.job(t, "job_a", "https://a.example/")
		other := e.job(t, "job_b", "https://b.example/")
		r := e.run(t, j, "run_a", e.clock.Now().Add(time.Second))
		kept := e.run(t, other, "run_b", e.clock.Now().Add(time.Second))
		d, _, _, _ := e.startWith(t, 8, 2*time.Second)
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
		e.waitRun(t, kept.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
		e.update(t, func(tx vibejobs.Tx) error { return tx.DeleteJob(context.Background(), e.project, j.ID, e.clock.Now()) })
		d.JobChanged(j.ID)
		e.clock.Add(time.Second)
		got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
		if got.State != vibejobs.RunCancelled || got.FailureReason != vibejobs.ReasonJobDeleted || len(got.Attempts) != 0 {
			t.Fatalf("held run of a deleted job: %s (%s) with %d attempts", got.State, got.FailureReason, len(got.Attempts))
		}
		// The other job's held claim is not touched: it is sent at its time.
		if x := e.sender.next(t); x.url != other.URL {
			t.Fatalf("sent to %s", x.url)
		}
		e.waitRun(t, kept.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	})
	t.Run("paused", func(t *testing.T) {
		// A pause withdraws the occurrences after its time, those claimed
		// ahead and held too: given back unsent, the run is gone, and
		// never sent.
		e := newEnv(t)
		j, r := e.scheduledRun(t, time.Second)
		d, rc, _, _ := e.startWith(t, 8, 2*time.Second)
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
		if err := e.pause(j); err != nil {
			t.Fatal(err)
		}
		d.JobChanged(j.ID)
		e.clock.Add(time.Second)
		rc.waitReleased(t, "the held claim of the paused job was not given back")
		e.waitGone(t, r.ID)
		e.wantNothingSent(t, "after the pause")
	})
}

// TestWithdrawAllReleasesWaitingClaims: WithdrawAll (job changes may have
// been missed) sends back the claims waiting for their host too, which are
// then claimed again.
func TestWithdrawAllReleasesWaitingClaims(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	first := e.run(t, j, "run_a", e.clock.Now())
	second := e.run(t, j, "run_b", e.clock.Now())
	d, rc, _, _ := e.startWith(t, 1, 200*time.Millisecond)
	e.sender.next(t)
	e.waitRun(t, second.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	d.WithdrawAll()
	rc.waitReleased(t, "the waiting claim was not released")
	unblock()
	for _, r := range []*vibejobs.Run{first, second} {
		e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	}
}

// firstObserver records the first flag of every attempt it is told of.
type firstObserver struct {
	mu    sync.Mutex
	first []bool
}

func (o *firstObserver) AttemptFinished(_ string, _ vibejobs.Step, _ time.Duration, first bool, _ time.Duration) {
	o.mu.Lock()
	o.first = append(o.first, first)
	o.mu.Unlock()
}

func (o *firstObserver) SecretUnavailable() {}

// TestResentFirstAttemptIsNotAFirstAttempt: the first-attempt lateness is
// measured once per run, when the first attempt first goes out. A first
// attempt sent again after its claim's lease was recovered (its late flag
// kept) is not measured again: its lateness is the outage's, not the
// schedule's.
func TestResentFirstAttemptIsNotAFirstAttempt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := e.job(t, "job_a", "https://a.example/")
	now := e.clock.Now()
	resent := e.run(t, j, "run_resent", now.Add(-2*time.Minute))
	if cs, err := e.store.ClaimDueRuns(ctx, "dead", resent.ScheduledFor, 1, time.Second); err != nil || len(cs) != 1 {
		t.Fatalf("first claim: %v, %v", cs, err)
	}
	if n, err := e.store.RecoverExpiredLeases(ctx, now.Add(-time.Second), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v", n, err)
	}
	fresh := e.run(t, j, "run_fresh", now)
	obs := &firstObserver{}
	d := dispatcher.New(dispatcher.Config{Store: e.store, Sender: e.sender, Opener: plainOpener{}, Owner: "o",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 1, PerHost: 1,
		PollInterval: 20 * time.Millisecond, Observer: obs})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { d.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	for _, id := range []string{resent.ID, fresh.ID} {
		e.waitRun(t, id, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	}
	cancel()
	<-done
	obs.mu.Lock()
	defer obs.mu.Unlock()
	// The resent run is due first, so it goes first (concurrency 1).
	if want := []bool{false, true}; !slices.Equal(obs.first, want) {
		t.Fatalf("first flags reported %v, want %v (the resent first attempt, then a fresh one)", obs.first, want)
	}
}

// outageStore fails the first failRecords RecordOutcomes calls with
// failure (by default as a database that is down does), and makes the first
// call of NextDueAt and of RecordOutcomes hang until its context ends, as on
// a connection gone silent without a reset.
type outageStore struct {
	vibejobs.DispatchStore
	failRecords         int64
	failure             error
	records             atomic.Int64
	hungPoll, hungWrite atomic.Bool
}

func (o *outageStore) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	if o.hungPoll.CompareAndSwap(false, true) {
		<-ctx.Done()
		return time.Time{}, false, ctx.Err()
	}
	return o.DispatchStore.NextDueAt(ctx)
}

func (o *outageStore) RecordOutcomes(ctx context.Context, owner string, outcomes []vibejobs.Outcome) error {
	if n := o.records.Add(1); n <= o.failRecords {
		if n == 1 && o.hungWrite.CompareAndSwap(false, true) {
			<-ctx.Done()
			return ctx.Err()
		}
		if o.failure != nil {
			return o.failure
		}
		return vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	}
	return o.DispatchStore.RecordOutcomes(ctx, owner, outcomes)
}

// startOutage starts a dispatcher on o (storeTimeout as its StoreTimeout,
// 0 for the default) whose record loop retries a millisecond apart; the
// test's cleanup stops it.
func (e *env) startOutage(t *testing.T, o *outageStore, storeTimeout time.Duration) *dispatcher.Dispatcher {
	d := dispatcher.New(dispatcher.Config{
		Store: o, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8,
		PollInterval: 20 * time.Millisecond, StoreTimeout: storeTimeout,
	})
	dispatcher.SetRetryWait(d, func(int) time.Duration { return time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// TestDatabaseOutageNeitherHangsNorLosesOutcomes: a store call on a
// connection gone silent ends at StoreTimeout instead of hanging the loop
// for good, and an outcome that cannot be written is retried for as long as
// the dispatcher runs: it was dropped after 20 retries (21 s), and once its
// lease ended the run was sent again, though the app had accepted it.
func TestDatabaseOutageNeitherHangsNorLosesOutcomes(t *testing.T) {
	e := newEnv(t)
	o := &outageStore{DispatchStore: e.store, failRecords: 40}
	d := e.startOutage(t, o, 50*time.Millisecond)

	j := e.job(t, "job_outage", "https://app.example/hook")
	r := e.run(t, j, "run_outage", e.clock.Now())
	d.Wake()
	e.sender.next(t)
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	if n := o.records.Load(); n != 41 {
		t.Errorf("RecordOutcomes calls: %d, want 40 failed and one written", n)
	}
	e.wantNothingSent(t, "after the outage")
}

// TestRefusedOutcomesDoNotStallDeliveries: a batch the store refuses for a
// reason other than an outage, which retrying will not mend, is given up
// after 20 retries (its runs go to lease recovery) rather than retried for
// ever, holding every slot behind it.
func TestRefusedOutcomesDoNotStallDeliveries(t *testing.T) {
	e := newEnv(t)
	o := &outageStore{DispatchStore: e.store, failRecords: 21, failure: errors.New("refused")}
	o.hungPoll.Store(true)
	o.hungWrite.Store(true)
	d := e.startOutage(t, o, 0)

	j := e.job(t, "job_refused", "https://app.example/hook")
	e.run(t, j, "run_refused", e.clock.Now())
	d.Wake()
	e.sender.next(t)
	for deadline := time.Now().Add(10 * time.Second); o.records.Load() < 21; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("RecordOutcomes calls: %d", o.records.Load())
		}
	}
	after := e.run(t, j, "run_after", e.clock.Now())
	d.Wake()
	e.sender.next(t) // the dispatcher goes on
	e.waitRun(t, after.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	if n := o.records.Load(); n != 22 {
		t.Errorf("RecordOutcomes calls: %d, want 21 for the refused batch, then the next one", n)
	}
}

// TestWithdrawalSparesAnAttemptInFlight: a pause withdraws the runs created
// ahead of its time (DeleteFutureRuns after the request's time). The time
// is taken when the request arrives: a run claimed ahead whose time falls
// between that and the delete has gone out by then. Deleting the runs held
// by a claim deleted this one with its attempt in flight: the app accepted
// a run whose attempt and outcome were never recorded. A held run is left
// to its holder, who alone knows whether it went out.
func TestWithdrawalSparesAnAttemptInFlight(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	now := e.clock.Now()
	at := now.Add(100 * time.Millisecond)
	j := &vibejobs.Job{ID: "job_p", ProjectID: e.project, Name: "p", Schedule: "@every 1h", Timezone: "UTC",
		URL: "https://a.example/", Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(),
		Timeout: 10 * time.Second, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: now, NextRunAt: &at,
		CreatedAt: now, UpdatedAt: now,
		Secret: vibejobs.SealedSecret{KeyID: "plain", Ciphertext: []byte("vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8")}}
	e.update(t, func(tx vibejobs.Tx) error { return tx.CreateJob(ctx, j) })
	r := vibejobs.NewRun("run_p", j, vibejobs.TriggerSchedule, at, now)
	next := at.Add(time.Hour)
	if n, _, err := e.store.ApplyRunPlans(ctx, []vibejobs.RunPlan{{JobID: j.ID, From: at, Anchor: now, Next: &next,
		Runs: []*vibejobs.Run{r}}}, now); err != nil || n != 1 {
		t.Fatalf("ApplyRunPlans = %d, %v", n, err)
	}
	unblock := e.blockHost(j.URL)
	e.startWith(t, 8, 2*time.Second) // claims it ahead, holds it until its scheduledFor, then sends it

	x := e.sender.next(t) // the attempt is in flight
	if x.payload["runId"] != r.ID {
		t.Fatalf("sent %v", x.payload)
	}
	// A pause whose request arrived 1 ms before the run's time commits now.
	pausedAt := at.Add(-time.Millisecond)
	var n int
	e.update(t, func(tx vibejobs.Tx) error {
		var err error
		n, err = tx.DeleteFutureRuns(ctx, j.ID, pausedAt)
		return err
	})
	if n != 0 {
		t.Fatalf("DeleteFutureRuns withdrew %d run(s), the one whose attempt is in flight among them", n)
	}
	unblock() // the app accepts it
	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	if len(got.Attempts) != 1 {
		t.Fatalf("run %s with %d attempts, want its one attempt recorded", got.State, len(got.Attempts))
	}
}

// recoveringStore, once armed, makes the claim loop's next read of the
// next due time wait for a database as slow as the claim's lease: the
// clock moves on by by, and lease recovery (another replica's maintenance)
// ends the leases that expired meanwhile.
type recoveringStore struct {
	vibejobs.DispatchStore
	store *sqlite.Store
	clock *clock
	by    time.Duration
	armed atomic.Bool
	done  chan struct{}
	// released counts the runs released, polls the reads of the next due
	// time (one per pass of the claim loop).
	released, polls atomic.Int64
}

func (r *recoveringStore) ReleaseClaims(ctx context.Context, owner string, claims []*vibejobs.Claim, now, due time.Time) error {
	defer r.released.Add(int64(len(claims)))
	return r.DispatchStore.ReleaseClaims(ctx, owner, claims, now, due)
}

func (r *recoveringStore) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	r.polls.Add(1)
	if r.armed.CompareAndSwap(true, false) {
		r.clock.Add(r.by)
		_, err := r.store.RecoverExpiredLeases(ctx, r.clock.Now(), 10)
		close(r.done)
		if err != nil {
			return time.Time{}, false, err
		}
	}
	return r.DispatchStore.NextDueAt(ctx)
}

// TestStaleReleaseKeepsTheNewerClaim: a claim waiting for its host whose
// lease expired and was recovered while the claim loop was held up, and
// whose run this dispatcher claimed again, is released once the loop
// runs again: the release must end that old claim only. It ended the new
// claim's lease as well (a release named only the owner and the run), the
// run was claimed a third time, and the app got it twice with no crash.
func TestStaleReleaseKeepsTheNewerClaim(t *testing.T) {
	e := newEnv(t)
	blocker := e.job(t, "job_blocker", "https://a.example/blocker")
	blocker.Timeout = 30 * time.Second // its lease outlives the test's jump
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(context.Background(), blocker) })
	victim := e.job(t, "job_victim", "https://a.example/victim")
	victim.Timeout = time.Second // lease: 1 s + LeaseMargin
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(context.Background(), victim) })
	unblock := e.blockHost(blocker.URL)
	rb := e.run(t, blocker, "run_blocker", e.clock.Now().Add(-time.Second))
	rv := e.run(t, victim, "run_victim", e.clock.Now())

	rs := &recoveringStore{DispatchStore: e.store, store: e.store, clock: e.clock,
		by: victim.Timeout + dispatcher.DefaultLeaseMargin + time.Second, done: make(chan struct{})}
	d := dispatcher.New(dispatcher.Config{
		Store: rs, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8, PerHost: 1,
		PollInterval: 20 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { unblock(); cancel(); <-done })

	if x := e.sender.next(t); x.url != blocker.URL {
		t.Fatalf("first sent to %s", x.url)
	}
	// The victim's claim waits for the host the blocker holds.
	e.waitRun(t, rv.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	rs.armed.Store(true)
	<-rs.done
	// Recovered, the victim is claimed again by this dispatcher and waits
	// anew; the old claim, past its wait, goes back on the loop's next
	// pass, and that pass claims what it finds due.
	for deadline := time.Now().Add(10 * time.Second); rs.released.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the old claim was not released")
		}
	}
	want := rs.polls.Load() + 2
	for deadline := time.Now().Add(10 * time.Second); rs.polls.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the claim loop stopped")
		}
	}
	unblock()
	e.waitRun(t, rb.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	e.waitRun(t, rv.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	sends := 0
	for {
		select {
		case x := <-e.sender.got:
			if x.url == victim.URL {
				sends++
			}
			continue
		default:
		}
		break
	}
	if sends != 1 {
		t.Fatalf("victim sent %d times after its lease was recovered, want once", sends)
	}
}

// claimHook runs after once the first ClaimDueRuns that claimed something
// returned from the store, before the dispatcher sees the claims.
type claimHook struct {
	*releaseCounter
	once  sync.Once
	after func()
}

// startHooked starts a dispatcher (fake clock, concurrency 8, ClaimAhead
// 2 s) on hook's store, and stops it when the test ends. *d is set before
// it runs, for the hook to call.
func (e *env) startHooked(t *testing.T, hook *claimHook, d **dispatcher.Dispatcher) {
	t.Helper()
	*d = dispatcher.New(dispatcher.Config{
		Store: hook, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8, PerHost: 8,
		PollInterval: 20 * time.Millisecond, ClaimAhead: 2 * time.Second,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { (*d).Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (h *claimHook) ClaimDueRuns(ctx context.Context, owner string, now time.Time, limit int, leaseMargin time.Duration) ([]*vibejobs.Claim, error) {
	cs, err := h.releaseCounter.ClaimDueRuns(ctx, owner, now, limit, leaseMargin)
	if len(cs) > 0 {
		h.once.Do(h.after)
	}
	return cs, err
}

// TestJobChangedWhileClaiming: a job is paused, and JobChanged called,
// while the claim of its run ahead of its time is on its way back from the
// database: committed (the pause, which waits for the claim's lock on the
// run, marks it withdrawn) but not yet held by the dispatcher, which
// JobChanged then finds holding nothing. The claim must still be given
// back unsent, and the run never sent while its job is paused.
func TestJobChangedWhileClaiming(t *testing.T) {
	e := newEnv(t)
	j, r := e.scheduledRun(t, time.Second)
	var d *dispatcher.Dispatcher
	ready, paused := make(chan struct{}), make(chan struct{})
	rc := &releaseCounter{DispatchStore: e.store}
	hook := &claimHook{releaseCounter: rc, after: func() {
		<-ready
		if err := e.pause(j); err != nil {
			t.Errorf("the pause: %v", err) // not Fatal: the claim loop's goroutine
		}
		d.JobChanged(j.ID)
		close(paused)
	}}
	e.startHooked(t, hook, &d)
	close(ready)

	// The run's time comes only once the pause, made while it was still
	// ahead, is done: the claim shows in the store before the hook pauses.
	select {
	case <-paused:
	case <-time.After(10 * time.Second):
		t.Fatal("the claim never came back from the store")
	}
	e.clock.Add(time.Second)
	for deadline := time.Now().Add(10 * time.Second); rc.released.Load() == 0; time.Sleep(time.Millisecond) {
		select {
		case x := <-e.sender.got:
			t.Fatalf("the run of the job paused while it was being claimed was sent: attempt %v", x.payload["attempt"])
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim of the job paused while it was being claimed was not given back")
		}
	}
	e.waitGone(t, r.ID)
	e.wantNothingSent(t, "after the pause")
}

// TestSlowClaimGoesBackUnsent: a claim's lease, and whether its first
// attempt is late, are reckoned from the time the claim's statement was
// sent. A claim that comes back past its deadline (a database slow to
// commit) is given back unsent, not sent as it is: the lease could end
// while its attempt is still in flight, and another replica send the run
// beside it; or a first attempt found on time could start more than 60 s
// after its scheduledFor and still say late=false (SEMANTICS.md sections 1
// and 3). Claimed again, it goes out with both reckoned anew.
func TestSlowClaimGoesBackUnsent(t *testing.T) {
	for _, tc := range []struct {
		name     string
		age      time.Duration // of the run's scheduledFor when claimed
		stall    time.Duration // how long the claim's statement takes
		wantLate bool
	}{
		{"past the lease margin", 0, dispatcher.DefaultLeaseMargin/2 + time.Second, false},
		{"past the late threshold", 59500 * time.Millisecond, time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			j := e.job(t, "job_a", "https://a.example/")
			r := e.run(t, j, "run_a", e.clock.Now().Add(-tc.age))
			var d *dispatcher.Dispatcher
			rc := &releaseCounter{DispatchStore: e.store}
			e.startHooked(t, &claimHook{releaseCounter: rc, after: func() { e.clock.Add(tc.stall) }}, &d)
			x := e.sender.next(t)
			if n := rc.released.Load(); n != 1 {
				t.Fatalf("the claim that came back late was sent after %d releases, want 1", n)
			}
			if x.payload["runId"] != r.ID || x.payload["attempt"] != 1.0 || x.payload["late"] != tc.wantLate {
				t.Fatalf("sent %v attempt %v late %v; want %s attempt 1 late %v",
					x.payload["runId"], x.payload["attempt"], x.payload["late"], r.ID, tc.wantLate)
			}
			e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
			e.wantNothingSent(t, "after the run succeeded")
		})
	}
}

// failingStore fails NextDueAt and RecordOutcomes as a database that is
// down does while their flags are set, and counts their calls.
type failingStore struct {
	vibejobs.DispatchStore
	failPolls, failRecords atomic.Bool
	polls, records         atomic.Int64
}

func (f *failingStore) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	defer f.polls.Add(1)
	if f.failPolls.Load() {
		return time.Time{}, false, vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	}
	return f.DispatchStore.NextDueAt(ctx)
}

func (f *failingStore) RecordOutcomes(ctx context.Context, owner string, outcomes []vibejobs.Outcome) error {
	defer f.records.Add(1)
	if f.failRecords.Load() {
		return vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	}
	return f.DispatchStore.RecordOutcomes(ctx, owner, outcomes)
}

// waitCalls waits until calls grew by n: the loop making them has dealt
// with the outcome of all but the last.
func waitCalls(t *testing.T, calls *atomic.Int64, n int64, what string) {
	t.Helper()
	want := calls.Load() + n
	for deadline := time.Now().Add(10 * time.Second); calls.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d calls, want %d", what, calls.Load(), want)
		}
	}
}

// TestFailingSince: the dispatcher tells, for readiness, since when its
// claim loop has failed every pass against the store, or its record loop
// every write, from the first failure of the streak until a pass or a
// write succeeds. An idle dispatcher (nothing due) is not failing, and
// claims that succeed do not hide outcomes that cannot be written.
func TestFailingSince(t *testing.T) {
	e := newEnv(t)
	f := &failingStore{DispatchStore: e.store}
	d := dispatcher.New(dispatcher.Config{
		Store: f, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8,
		PollInterval: time.Millisecond,
	})
	dispatcher.SetRetryWait(d, func(int) time.Duration { return time.Millisecond })
	want := func(since time.Time, what string) {
		t.Helper()
		if got := d.FailingSince(); !got.Equal(since) {
			t.Fatalf("%s: FailingSince = %v, want %v", what, got, since)
		}
	}
	// wantCleared waits for the loops to note a success they made after
	// the store's last call.
	wantCleared := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !d.FailingSince().IsZero(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: FailingSince = %v, want zero", what, d.FailingSince())
			}
		}
	}
	want(time.Time{}, "before the first pass")
	f.failPolls.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitCalls(t, &f.polls, 2, "failing claim loop")
	first := e.clock.Now()
	want(first, "after failed passes")
	e.clock.Add(time.Minute)
	waitCalls(t, &f.polls, 2, "failing claim loop")
	want(first, "after more failed passes")
	f.failPolls.Store(false)
	wantCleared("after a pass that found nothing due")

	f.failRecords.Store(true)
	j := e.job(t, "job_a", "https://a.example/")
	r := e.run(t, j, "run_a", e.clock.Now())
	d.Wake()
	e.sender.next(t)
	waitCalls(t, &f.records, 2, "failing record loop")
	first = e.clock.Now()
	e.clock.Add(time.Minute)
	waitCalls(t, &f.records, 2, "failing record loop")
	waitCalls(t, &f.polls, 2, "claim loop while outcomes fail")
	want(first, "after failed writes of an outcome, and passes of the claim loop")
	f.failRecords.Store(false)
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	wantCleared("once the outcome was written")
}

// keyringOpener opens secrets in the clear, like plainOpener, except
// those sealed under a key id it lacks while missing is set: a key file
// without the job's master key.
type keyringOpener struct {
	missing atomic.Bool
}

func (k *keyringOpener) Open(s vibejobs.SealedSecret, _ string) (string, error) {
	if s.KeyID == "old" && k.missing.Load() {
		return "", errors.New("secretbox: sealed under a master key this keyring does not hold")
	}
	return string(s.Ciphertext), nil
}

// secretObserver counts the claims given back for a secret it could not open.
type secretObserver struct {
	firstObserver
	unavailable atomic.Int64
}

func (o *secretObserver) SecretUnavailable() { o.unavailable.Add(1) }

// TestUnopenableSecretIsNeitherSentNorAnAttempt: a job whose secret this
// process cannot open (its master key missing from the key file, as on a
// replica started with an old file) is a problem of ours, not the app's.
// Its claim goes back unsent, with no attempt recorded and its attempt
// number kept, to wait SecretUnavailablePause (for this replica or one
// holding the key), logged once per job with ids and key id only, and
// counted. It was recorded as an attempt failed with error code network:
// the owner saw their app fail, and the run spent its attempts, failing
// attempts_exhausted within the hour, while restoring the key would have
// delivered it.
func TestUnopenableSecretIsNeitherSentNorAnAttempt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := e.job(t, "job_a", "https://a.example/")
	j.Secret.KeyID = "old"
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(ctx, j) })
	r := e.run(t, j, "run_a", e.clock.Now())

	opener := &keyringOpener{}
	opener.missing.Store(true)
	obs := &secretObserver{}
	var logs syncbuf.Buffer
	d := dispatcher.New(dispatcher.Config{
		Store: e.store, Sender: e.sender, Opener: opener, Owner: "test-owner",
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Observer: obs,
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8,
		PollInterval: 20 * time.Millisecond,
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { d.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()

	// Given back twice, a pause apart, the key still missing.
	for i := 1; i <= 2; i++ {
		due := e.clock.Now().Add(dispatcher.SecretUnavailablePause)
		got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool {
			return r.State != vibejobs.RunDelivering && r.NextAttemptAt != nil && !r.NextAttemptAt.Before(due)
		})
		if got.State != vibejobs.RunScheduled || !got.NextAttemptAt.Equal(due) || len(got.Attempts) != 0 {
			t.Fatalf("given back %d: %s, next attempt %v (want %v), attempts %+v", i, got.State, got.NextAttemptAt, due, got.Attempts)
		}
		e.wantNothingSent(t, "without the secret")
		if n := obs.unavailable.Load(); n != int64(i) {
			t.Fatalf("SecretUnavailable observed %d times, want %d", n, i)
		}
		if i == 1 {
			e.clock.Add(dispatcher.SecretUnavailablePause)
			d.Wake()
		}
	}
	out := logs.String()
	if n := strings.Count(out, "dispatcher.secret_unavailable"); n != 1 ||
		!strings.Contains(out, "job_id=job_a") || !strings.Contains(out, "key_id=old") {
		t.Errorf("want one secret_unavailable line for the job (once per job per period), got:\n%s", out)
	}
	if strings.Contains(out, string(j.Secret.Ciphertext)) || strings.Contains(out, "a.example") {
		t.Errorf("the log shows the secret or the URL:\n%s", out)
	}

	// The key back in the file: the run goes out as its first attempt.
	opener.missing.Store(false)
	e.clock.Add(dispatcher.SecretUnavailablePause)
	d.Wake()
	if x := e.sender.next(t); x.payload["attempt"] != 1.0 {
		t.Fatalf("sent as attempt %v", x.payload["attempt"])
	}
	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
	if got.State != vibejobs.RunSucceeded || len(got.Attempts) != 1 || got.Attempts[0].ErrorCode != "" {
		t.Fatalf("run %s, attempts %+v", got.State, got.Attempts)
	}
}

// deletingOpener cannot open any secret, and deletes the job first: the job
// is deleted between the claim and its release.
type deletingOpener struct {
	delete func(jobID string)
}

func (o *deletingOpener) Open(_ vibejobs.SealedSecret, jobID string) (string, error) {
	o.delete(jobID)
	return "", errors.New("secretbox: sealed under a master key this keyring does not hold")
}

// TestUnopenableSecretOfADeletedJobEndsNow: a claim whose secret cannot be
// opened goes back to wait SecretUnavailablePause, but it goes back now: a
// run whose job was deleted meanwhile is cancelled now, and its event
// occurs now. It was released with the pause's end as the time of the
// release, and recorded as finished, and cancelled, 30 s in the future.
func TestUnopenableSecretOfADeletedJobEndsNow(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := e.job(t, "job_a", "https://a.example/")
	r := e.run(t, j, "run_a", e.clock.Now())
	now := e.clock.Now()
	opener := &deletingOpener{delete: func(jobID string) {
		// On the deliver goroutine: t.Error, not t.Fatal.
		if err := e.store.Update(ctx, func(tx vibejobs.Tx) error { return tx.DeleteJob(ctx, e.project, jobID, now) }); err != nil {
			t.Error(err)
		}
	}}
	d := dispatcher.New(dispatcher.Config{
		Store: e.store, Sender: e.sender, Opener: opener, Owner: "test-owner",
		Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now, Rand: func() float64 { return 0.5 },
		Concurrency: 8, PollInterval: 20 * time.Millisecond,
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { d.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()

	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State.Finished() })
	if got.State != vibejobs.RunCancelled || got.FailureReason != vibejobs.ReasonJobDeleted ||
		got.FinishedAt == nil || !got.FinishedAt.Equal(now) || len(got.Attempts) != 0 {
		t.Fatalf("run %s %q finished %v, %d attempts; want cancelled job_deleted at %s, no attempt",
			got.State, got.FailureReason, got.FinishedAt, len(got.Attempts), now)
	}
	p, err := e.store.ListEvents(ctx, e.project, vibejobs.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	cancelled := 0
	for _, ev := range p.Events {
		if ev.Type != vibejobs.EventRunCancelled {
			continue
		}
		if cancelled++; !ev.OccurredAt.Equal(now) {
			t.Errorf("run.cancelled at %s, want %s", ev.OccurredAt, now)
		}
	}
	if cancelled != 1 {
		t.Errorf("%d run.cancelled events, want 1", cancelled)
	}
	e.wantNothingSent(t, "without the secret")
}

// gidSender is sender noting the goroutine each request was sent from.
type gidSender struct {
	*sender
	gids chan string
}

func (s gidSender) Post(ctx context.Context, url string, h http.Header, body []byte, timeout time.Duration) egress.Result {
	buf := make([]byte, 64)
	s.gids <- strings.Fields(string(buf[:runtime.Stack(buf, false)]))[1] // "goroutine N [running]:"
	return s.sender.Post(ctx, url, h, body, timeout)
}

// workers counts the dispatcher's worker goroutines, and those of them
// waiting for an attempt.
func workers() (all, idle int) {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, "dispatcher.(*Dispatcher).worker(") {
			continue
		}
		all++
		if !strings.Contains(g, "dispatcher.(*Dispatcher).deliver(") && strings.Contains(g, "[select") {
			idle++
		}
	}
	return all, idle
}

// waitWorkers polls until cond holds of workers().
func waitWorkers(t *testing.T, what string, cond func(all, idle int) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		all, idle := workers()
		if cond(all, idle) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d workers, %d idle", what, all, idle)
		}
	}
}

// An attempt starts on the worker an earlier attempt left idle, not on a new
// goroutine, and no worker outlives Run.
func TestWorkerIsReusedAndEndsWithRun(t *testing.T) {
	e, s, d, stop := startNotingGoroutines(t, 8)
	j := e.job(t, "job_a", "https://a.example/")
	r := e.run(t, j, "run_a", e.clock.Now())
	d.Wake()
	first := <-s.gids
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	waitWorkers(t, "after the first attempt", func(all, idle int) bool { return all == 1 && idle == 1 })

	r = e.run(t, j, "run_b", e.clock.Now())
	d.Wake()
	if second := <-s.gids; second != first {
		t.Errorf("second attempt sent from goroutine %s, the first from %s", second, first)
	}
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	stop()
	waitWorkers(t, "after Run returned", func(all, _ int) bool { return all == 0 })
}

// startNotingGoroutines starts, once the workers of earlier tests have
// ended with their Run, a dispatcher with perHost slots a host whose
// sender notes the goroutine of each request; stop ends its Run (the test's
// end does too).
func startNotingGoroutines(t *testing.T, perHost int) (e *env, s gidSender, d *dispatcher.Dispatcher, stop func()) {
	t.Helper()
	waitWorkers(t, "before the test", func(all, _ int) bool { return all == 0 })
	e = newEnv(t)
	s = gidSender{e.sender, make(chan string, 10)}
	d = dispatcher.New(dispatcher.Config{
		Store: e.store, Sender: s, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8, PerHost: perHost,
		PollInterval: 20 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return e, s, d, stop
}

// A claim waiting for its host's slot is sent by the worker whose attempt
// freed the slot, not by a new goroutine.
func TestSlotPassesToTheWaitingClaimOnItsWorker(t *testing.T) {
	e, s, _, stop := startNotingGoroutines(t, 1)
	j := e.job(t, "job_a", "https://a.example/")
	release := make(chan struct{})
	e.sender.mu.Lock()
	e.sender.block[j.URL] = release
	e.sender.mu.Unlock()
	e.run(t, j, "run_a", e.clock.Now())
	e.run(t, j, "run_b", e.clock.Now())

	first := <-s.gids
	e.sender.next(t)
	// The second claim waits for the slot the first attempt holds.
	e.wantNothingSent(t, "a second attempt to a host of one slot")
	e.sender.mu.Lock()
	delete(e.sender.block, j.URL)
	e.sender.mu.Unlock()
	close(release)
	if second := <-s.gids; second != first {
		t.Errorf("the waiting claim was sent from goroutine %s, the attempt that freed its slot from %s", second, first)
	}
	e.sender.next(t)
	stop()
	waitWorkers(t, "after Run returned", func(all, _ int) bool { return all == 0 })
}

// TestHeldRetryIsDueAtItsOwnTime: a retry claimed ahead of its time is held
// until its own next attempt time, not until the end of the claim's window
// (ClaimAhead from the claim), so it goes out then. Withdrawn while held,
// it goes back once that time has come, and not before.
func TestHeldRetryIsDueAtItsOwnTime(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j, r := e.scheduledRun(t, 0)
	now := e.clock.Now()
	claims, err := e.store.ClaimDueRuns(ctx, "other", now, 1, 5*time.Second)
	if err != nil || len(claims) != 1 {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	next := now.Add(time.Second)
	if err := e.store.RecordOutcomes(ctx, "other", []vibejobs.Outcome{{RunID: r.ID, ClaimedAt: claims[0].ClaimedAt,
		Attempt: vibejobs.Attempt{Number: 1, StartedAt: now, FinishedAt: now, StatusCode: 503, ErrorCode: egress.CodeHTTP5xx},
		Step:    vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next}}}); err != nil {
		t.Fatal(err)
	}

	var d *dispatcher.Dispatcher
	rc := &releaseCounter{DispatchStore: e.store}
	withdrawn := make(chan struct{})
	hook := &claimHook{releaseCounter: rc, after: func() { d.JobChanged(j.ID); close(withdrawn) }}
	e.startHooked(t, hook, &d)
	select {
	case <-withdrawn:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry was never claimed ahead")
	}

	e.clock.Add(time.Second - time.Millisecond)
	rc.waitPolls(t, 3)
	if n := rc.released.Load(); n != 0 {
		t.Fatalf("the withdrawn retry went back %v before its time", time.Millisecond)
	}
	e.clock.Add(time.Millisecond)
	rc.waitReleased(t, "the withdrawn retry did not go back at its next attempt time (held to the claim window's end?)")
	if x := e.sender.next(t); x.payload["attempt"] != 2.0 {
		t.Fatalf("sent attempt %v after the release, want 2", x.payload["attempt"])
	}
}

// TestGivenBackClaimsKeepScheduledForOrder: SEMANTICS.md §4 "Caught-up
// runs go out in scheduledFor order". Twelve occurrences missed while the
// platform was down (due 12 … 1 minutes ago) are planned as the scheduler
// does; the app's host takes one attempt at a time and the first one is
// slow. The claims waiting for the host are given back after LeaseMargin/2
// (ReleaseClaims made them due "now", and the next claim took the later
// occurrences, still due at their own older times, ahead of them); given
// back in their place in line, they go out first.
func TestGivenBackClaimsKeepScheduledForOrder(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := e.job(t, "job_a", "https://a.example/hook")
	now := e.clock.Now()
	from := now.Add(-12 * time.Minute)
	j.NextRunAt = &from
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(ctx, j) })
	var runs []*vibejobs.Run
	for i := 12; i >= 1; i-- {
		at := now.Add(-time.Duration(i) * time.Minute)
		runs = append(runs, vibejobs.NewRun(fmt.Sprintf("run_%02d", 13-i), j, vibejobs.TriggerSchedule, at, now))
	}
	next := now.Add(time.Hour)
	if n, _, err := e.store.ApplyRunPlans(ctx, []vibejobs.RunPlan{{JobID: j.ID, From: from, Anchor: j.ScheduleAnchor,
		Next: &next, Runs: runs}}, now); err != nil || n != len(runs) {
		t.Fatalf("ApplyRunPlans = %d, %v", n, err)
	}
	unblock := e.blockHost(j.URL)
	_, rc, _, _ := e.startWith(t, 1, 0)
	var order []string
	x := e.sender.next(t) // the oldest occurrence, held up by the app
	order = append(order, x.payload["scheduledFor"].(string))
	// The claims waiting for the host pass their time + LeaseMargin/2.
	e.clock.Add(dispatcher.DefaultLeaseMargin/2 + time.Second)
	rc.waitReleased(t, "the waiting claims were not given back")
	// Wait until the dispatcher holds eight claims again (one sending,
	// seven waiting for the host), whichever runs they are.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		n := 0
		for _, r := range runs {
			got, err := e.store.GetRun(ctx, e.project, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State == vibejobs.RunDelivering {
				n++
			}
		}
		if n == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs delivering", n)
		}
	}
	unblock()
	for len(order) < len(runs) {
		x := e.sender.next(t)
		order = append(order, x.payload["scheduledFor"].(string))
	}
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			t.Fatalf("caught-up runs went out in this scheduledFor order:\n%v", order)
		}
	}
}

// stopDuringClaim is a store whose claims commit, after which the stop
// begins (stop, once) before the claim's answer is read: the claim then
// fails with the context's error, as a driver's read does when its context
// ends, though the runs are leased.
type stopDuringClaim struct {
	vibejobs.DispatchStore
	once sync.Once
	stop func()
}

func (s *stopDuringClaim) ClaimDueRuns(ctx context.Context, owner string, now time.Time, limit int, margin time.Duration) ([]*vibejobs.Claim, error) {
	claims, err := s.DispatchStore.ClaimDueRuns(context.WithoutCancel(ctx), owner, now, limit, margin)
	if err != nil || len(claims) == 0 {
		return claims, err
	}
	s.once.Do(s.stop)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return claims, nil
}

// TestStopDuringAClaimLosesNoClaim: a stop that began while a claim was in
// the database cut the claim's wait for its answer, though the claim
// committed: its runs stayed leased to a process that no longer knew of
// them, until the lease ended and another recorded an interrupted attempt
// that had never gone out. A claim now runs to its end whatever the stop,
// and what it took is sent and recorded before Run returns.
func TestStopDuringAClaimLosesNoClaim(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	r := e.run(t, j, "run_a", e.clock.Now())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &stopDuringClaim{DispatchStore: e.store, stop: cancel}
	d := dispatcher.New(dispatcher.Config{
		Store: store, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8,
		PollInterval: 20 * time.Millisecond,
	})
	d.Run(ctx)
	got, err := e.store.GetRun(context.Background(), e.project, r.ID)
	if err != nil || got.State != vibejobs.RunSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("run claimed as the stop began, after Run returned: %+v, %v; want succeeded, its attempt recorded", got, err)
	}
	if x := e.sender.next(t); x.payload["runId"] != r.ID {
		t.Fatalf("sent %v", x.payload["runId"])
	}
}

// startOn starts a dispatcher (fake clock, concurrency 8, as tune sets
// further) on store, e's store wrapped. cancel stops it and done closes
// when Run returned; the test's cleanup ends the blocks of blockHost, then
// does both.
func (e *env) startOn(t *testing.T, store vibejobs.DispatchStore, tune ...func(*dispatcher.Config)) (*dispatcher.Dispatcher, context.CancelFunc, chan struct{}) {
	t.Helper()
	cfg := dispatcher.Config{
		Store: store, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8,
		PollInterval: 20 * time.Millisecond,
	}
	for _, f := range tune {
		f(&cfg)
	}
	d := dispatcher.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() {
		for _, unblock := range e.unblocks {
			unblock()
		}
		cancel()
		<-done
	})
	return d, cancel, done
}

// lostClaimAnswer is a store whose first claim that takes run loseRun
// commits and then fails, as a claim whose answer a cut connection lost;
// ReadClaims gives back every claim of the owner made at the time asked
// that it took, as the PostgreSQL store reads the leases held under that
// claim time from the queue (SQLite's claims cannot lose their answer, and
// it reads none back). after, when set, receives each look for due runs
// (NextDueAt) after the lost claim, without blocking: the dispatcher is
// done with the lost one.
type lostClaimAnswer struct {
	vibejobs.DispatchStore
	loseRun string
	after   chan struct{}
	mu      sync.Mutex
	made    map[time.Time][]*vibejobs.Claim // by claim time, what each took
	lost    bool
	reads   int
}

func (s *lostClaimAnswer) ClaimDueRuns(ctx context.Context, owner string, now time.Time, limit int, margin time.Duration) ([]*vibejobs.Claim, error) {
	claims, err := s.DispatchStore.ClaimDueRuns(ctx, owner, now, limit, margin)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || len(claims) == 0 {
		return claims, err
	}
	if s.made == nil {
		s.made = map[time.Time][]*vibejobs.Claim{}
	}
	s.made[now] = append(s.made[now], claims...)
	if !s.lost && slices.ContainsFunc(claims, func(c *vibejobs.Claim) bool { return c.Run.ID == s.loseRun }) {
		s.lost = true
		return nil, errors.New("connection reset by peer: the claim's answer was lost")
	}
	return claims, nil
}

func (s *lostClaimAnswer) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	s.mu.Lock()
	if s.lost && s.after != nil {
		select {
		case s.after <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	return s.DispatchStore.NextDueAt(ctx)
}

func (s *lostClaimAnswer) ReadClaims(_ context.Context, owner string, now time.Time) ([]*vibejobs.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if owner != "test-owner" {
		return nil, nil
	}
	return s.made[now], nil
}

// TestLostClaimAnswerReadBack: a claim that committed but failed on the way
// back left its runs leased to a process that did not know of them, until
// the lease ended and lease recovery recorded an interrupted attempt that
// never went out and sent the run again. The dispatcher now reads the
// claim back (vibejobs.ClaimReader) and sends its runs at once, as
// claimed: one attempt, recorded under the claim's lease. (Without the read
// back the run is never sent here: no lease recovery runs.)
func TestLostClaimAnswerReadBack(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/")
	r := e.run(t, j, "run_a", e.clock.Now())
	store := &lostClaimAnswer{DispatchStore: e.store, loseRun: r.ID}
	_, cancel, done := e.startOn(t, store)

	if x := e.sender.next(t); x.payload["runId"] != r.ID || x.payload["attempt"] != 1.0 {
		t.Fatalf("sent %v attempt %v, want %s attempt 1", x.payload["runId"], x.payload["attempt"], r.ID)
	}
	got := e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	if len(got.Attempts) != 1 || got.Attempts[0].ErrorCode != "" {
		t.Fatalf("attempts %+v, want the one sent", got.Attempts)
	}
	cancel()
	<-done
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.reads != 1 {
		t.Fatalf("%d reads back, want 1 (the one failed claim)", store.reads)
	}
}

// TestLostClaimNotReadBackAtAReusedTime: a claim is read back by its owner
// and time alone, so one made at the time of an earlier claim of the same
// dispatcher (a clock that reads the same twice, as this test's does)
// would take the earlier claim's runs too, still in flight, and send them
// twice. Such a claim is not read back: its runs wait for lease recovery,
// as before reading back, and the earlier claim's run goes out once.
func TestLostClaimNotReadBackAtAReusedTime(t *testing.T) {
	e := newEnv(t)
	ja, jb := e.job(t, "job_a", "https://a.example/"), e.job(t, "job_b", "https://b.example/")
	unblock := e.blockHost("https://a.example/")
	a := e.run(t, ja, "run_a", e.clock.Now())
	store := &lostClaimAnswer{DispatchStore: e.store, loseRun: "run_b", after: make(chan struct{}, 1)}
	_, cancel, done := e.startOn(t, store)

	// run_a is in flight, its host blocked, when run_b is claimed at the
	// same time and the claim's answer is lost.
	e.waitRun(t, a.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	e.run(t, jb, "run_b", e.clock.Now())
	select {
	case <-store.after:
	case <-time.After(10 * time.Second):
		t.Fatal("run_b was never claimed")
	}
	store.mu.Lock()
	reads := store.reads
	store.mu.Unlock()
	if reads != 0 {
		t.Fatalf("%d reads back of a claim at a time an earlier claim had, want none", reads)
	}
	unblock()
	if x := e.sender.next(t); x.payload["runId"] != a.ID {
		t.Fatalf("sent %v, want run_a", x.payload["runId"])
	}
	e.waitRun(t, a.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	cancel()
	<-done
	e.wantNothingSent(t, "after run_a")
}

// stallingRecords fails RecordOutcomes while fail is set, as a database
// that is down does, or, while silent is set, makes it wait until its
// context ends, as one gone silent without a reset does (or until
// testDone is closed). entered receives each call that found the database
// down or silent, without blocking.
type stallingRecords struct {
	vibejobs.DispatchStore
	fail, silent atomic.Bool
	calls        atomic.Int64
	entered      chan struct{}
	testDone     chan struct{}
}

func newStallingRecords(s vibejobs.DispatchStore) *stallingRecords {
	return &stallingRecords{DispatchStore: s, entered: make(chan struct{}, 1), testDone: make(chan struct{})}
}

func (r *stallingRecords) RecordOutcomes(ctx context.Context, owner string, outcomes []vibejobs.Outcome) error {
	r.calls.Add(1)
	switch {
	case r.silent.Load():
		select {
		case r.entered <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.testDone:
			return errors.New("test over")
		}
	case r.fail.Load():
		select {
		case r.entered <- struct{}{}:
		default:
		}
		return vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	}
	return r.DispatchStore.RecordOutcomes(ctx, owner, outcomes)
}

// TestStopGivesUpUnwrittenOutcomesWithinItsBudget: at a stop, outcomes a
// database gone silent does not take are given up StopRecordTimeout after
// the last attempt finished, the call in progress cut, and Run returns. A
// stop retried them 20 times, each call waiting up to StoreTimeout: about
// 4 min with the defaults, past any orchestrator's grace period, for
// nothing a SIGKILL would not give. The run stays leased: once its lease
// ends, lease recovery records the attempt as interrupted and the run is
// due again under the same attempt number (at least once).
func TestStopGivesUpUnwrittenOutcomesWithinItsBudget(t *testing.T) {
	e := newEnv(t)
	s := newStallingRecords(e.store)
	s.silent.Store(true)
	var logs syncbuf.Buffer
	d := dispatcher.New(dispatcher.Config{
		Store: s, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		StoreTimeout: time.Hour, StopRecordTimeout: 50 * time.Millisecond,
	})
	dispatcher.SetRetryWait(d, func(int) time.Duration { return time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { close(s.testDone); cancel(); <-done })

	j := e.job(t, "job_silent", "https://app.example/hook")
	r := e.run(t, j, "run_silent", e.clock.Now())
	d.Wake()
	e.sender.next(t) // sent and accepted
	select {
	case <-s.entered: // its outcome's write hangs
	case <-time.After(10 * time.Second):
		t.Fatal("the outcome was never written")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still waits for a database gone silent 10 s into the stop, its attempt long finished")
	}
	if !strings.Contains(logs.String(), "dispatcher.outcomes_dropped") || !strings.Contains(logs.String(), "reason=stopping") {
		t.Errorf("the log does not say the outcome was given up at the stop:\n%s", logs.String())
	}
	got, err := e.store.GetRun(context.Background(), e.project, r.ID)
	if err != nil || got.State != vibejobs.RunDelivering || len(got.Attempts) != 0 {
		t.Fatalf("the run whose outcome was given up: %+v, %v; want delivering, for lease recovery", got, err)
	}
	n, err := e.store.RecoverExpiredLeases(context.Background(), e.clock.Now().Add(j.Timeout+dispatcher.DefaultLeaseMargin+time.Second), 10)
	if err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want the run's lease ended", n, err)
	}
	got, err = e.store.GetRun(context.Background(), e.project, r.ID)
	if err != nil || len(got.Attempts) != 1 || got.Attempts[0].ErrorCode != vibejobs.ErrorCodeInterrupted || got.State.Finished() {
		t.Fatalf("the run after lease recovery: %+v, %v; want its attempt interrupted and the run due again", got, err)
	}
}

// TestStopBudgetStartsWhenTheAttemptsEnd: the stop's budget for outcomes
// the database does not take starts when the last attempt in flight has
// finished, not when the stop began: an outcome that failed to be written
// while another attempt was still running is retried until that one ends,
// and both are written once the database is back.
func TestStopBudgetStartsWhenTheAttemptsEnd(t *testing.T) {
	e := newEnv(t)
	s := newStallingRecords(e.store)
	s.fail.Store(true)
	d := dispatcher.New(dispatcher.Config{
		Store: s, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8,
		PollInterval: 20 * time.Millisecond, StopRecordTimeout: time.Second,
	})
	dispatcher.SetRetryWait(d, func(int) time.Duration { return 100 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	slow := e.job(t, "job_slow", "https://slow.example/hook")
	unblock := e.blockHost(slow.URL)
	t.Cleanup(func() { close(s.testDone); unblock(); cancel(); <-done })
	fast := e.job(t, "job_fast", "https://fast.example/hook")
	rs := e.run(t, slow, "run_slow", e.clock.Now())
	d.Wake()
	e.sender.next(t) // the slow attempt is in flight
	rf := e.run(t, fast, "run_fast", e.clock.Now())
	d.Wake()
	e.sender.next(t) // the fast one is accepted; its outcome is refused
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the outcome was never written")
	}
	cancel()
	// Twelve retries after the stop began, at least 1.1 s later: past the
	// budget, had it started with the stop.
	waitCalls(t, &s.calls, 12, "retries of the refused outcome")
	s.fail.Store(false)
	unblock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10 s after its last attempt ended, the database back")
	}
	for _, id := range []string{rs.ID, rf.ID} {
		got, err := e.store.GetRun(context.Background(), e.project, id)
		if err != nil || got.State != vibejobs.RunSucceeded || len(got.Attempts) != 1 {
			t.Fatalf("run %s after the stop: %+v, %v; want succeeded, its attempt recorded", id, got, err)
		}
	}
}

// silentReleases makes ReleaseClaims wait until its context ends, as a
// database gone silent without a reset does (or until testDone is closed).
// entered receives each call, without blocking.
type silentReleases struct {
	vibejobs.DispatchStore
	entered  chan struct{}
	testDone chan struct{}
}

func (s *silentReleases) ReleaseClaims(ctx context.Context, owner string, claims []*vibejobs.Claim, now, due time.Time) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.testDone:
		return errors.New("test over")
	}
}

// TestStopGivesUpUnreleasedClaimsWithinItsBudget: at a stop, claims given
// back unsent (here one waiting for its host's slot) that a database gone
// silent does not take back are given up within the stop's budget, with
// the outcomes: StopRecordTimeout after the last attempt finished. Each
// release waited out StoreTimeout (with the defaults 10 s per call, and a
// stop makes several) before the attempts were even waited for, so a stop
// outlasted its documented bound. The run stays leased, for lease recovery.
func TestStopGivesUpUnreleasedClaimsWithinItsBudget(t *testing.T) {
	e := newEnv(t)
	s := &silentReleases{DispatchStore: e.store, entered: make(chan struct{}, 1), testDone: make(chan struct{})}
	var logs syncbuf.Buffer
	d := dispatcher.New(dispatcher.Config{
		Store: s, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 8, PerHost: 1,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		StoreTimeout: time.Hour, StopRecordTimeout: time.Second,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	j := e.job(t, "job_a", "https://a.example/")
	unblock := e.blockHost(j.URL)
	t.Cleanup(func() { close(s.testDone); unblock(); cancel(); <-done })
	first := e.run(t, j, "run_a", e.clock.Now())
	go func() { d.Run(ctx); close(done) }()
	e.sender.next(t) // the first run's attempt holds the host's one slot
	second := e.run(t, j, "run_b", e.clock.Now())
	d.Wake()
	e.waitRun(t, second.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	cancel()
	select {
	case <-s.entered: // the waiting claim's release hangs
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting claim was never given back")
	}
	unblock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still waits for a database gone silent 10 s into the stop, its attempt long finished")
	}
	if !strings.Contains(logs.String(), "dispatcher.release_failed") {
		t.Errorf("the log does not say the claim could not be given back:\n%s", logs.String())
	}
	got, err := e.store.GetRun(context.Background(), e.project, first.ID)
	if err != nil || got.State != vibejobs.RunSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("the run in flight at the stop: %+v, %v; want succeeded, its attempt recorded", got, err)
	}
	got, err = e.store.GetRun(context.Background(), e.project, second.ID)
	if err != nil || got.State != vibejobs.RunDelivering || len(got.Attempts) != 0 {
		t.Fatalf("the run that could not be given back: %+v, %v; want delivering, for lease recovery", got, err)
	}
	n, err := e.store.RecoverExpiredLeases(context.Background(), e.clock.Now().Add(j.Timeout+dispatcher.DefaultLeaseMargin+time.Second), 10)
	if err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want the run's lease ended", n, err)
	}
	got, err = e.store.GetRun(context.Background(), e.project, second.ID)
	if err != nil || got.State != vibejobs.RunScheduled || len(got.Attempts) != 1 || got.Attempts[0].ErrorCode != vibejobs.ErrorCodeInterrupted {
		t.Fatalf("the run after lease recovery: %+v, %v; want an interrupted attempt and the run due again", got, err)
	}
	e.wantNothingSent(t, "after the stop")
}

// TestStopWithOutcomesWaitingToBeHandedOver: while the database takes
// claims but not outcomes, the record loop retries its batch, the outcome
// channel fills, and the next finished attempt's worker waits to hand its
// outcome over. A stop then still ends StopRecordTimeout after the last
// attempt ended: the budget started only once every worker had returned,
// and that worker waited for the record loop, which waited for the
// budget, so Run never returned.
func TestStopWithOutcomesWaitingToBeHandedOver(t *testing.T) {
	e := newEnv(t)
	s := newStallingRecords(e.store)
	s.fail.Store(true)
	var logs syncbuf.Buffer
	d := dispatcher.New(dispatcher.Config{
		Store: s, Sender: e.sender, Opener: plainOpener{}, Owner: "test-owner",
		Now: e.clock.Now, Rand: func() float64 { return 0.5 }, Concurrency: 1,
		PollInterval: 10 * time.Millisecond, StopRecordTimeout: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	dispatcher.SetRetryWait(d, func(int) time.Duration { return time.Millisecond })
	for i := range 4 {
		j := e.job(t, fmt.Sprintf("job_%d", i), fmt.Sprintf("https://h%d.example/", i))
		e.run(t, j, fmt.Sprintf("run_%d", i), e.clock.Now())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second): // the defect: Run never returns
		}
	}()
	// One outcome in the record loop's failing batch, one in the channel
	// (its capacity is Concurrency), and the third attempt's worker left
	// to wait for room.
	for range 3 {
		e.sender.next(t)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still waits 10 s into the stop (StopRecordTimeout 50 ms), its attempts long ended")
	}
	if !strings.Contains(logs.String(), "reason=stopping") {
		t.Errorf("the log does not say the outcomes were given up at the stop:\n%s", logs.String())
	}
}
