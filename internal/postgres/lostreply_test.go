package postgres_test

import (
	"context"
	"maps"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// cutProxy forwards connections from 127.0.0.1 to the test server. Once
// armed, the first answer the server sends to the next statement bound for
// execution (a Bind message, which pgx sends for every statement but its
// pings) is dropped and the connection closed: the server ran the
// statement, and committed it when it was one on its own (the answer of an
// implicit transaction leaves after its commit), but the client never
// learns so.
type cutProxy struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	wg     sync.WaitGroup
}

// openThroughCutProxy opens two stores on a fresh schema: direct, and s,
// whose connections go through proxy, a cutProxy.
func openThroughCutProxy(t *testing.T) (direct, s *postgres.Store, proxy *cutProxy) {
	t.Helper()
	schema := postgres.NewTestSchema(t)
	direct = open(t, schema)
	u, err := url.Parse(postgres.TestURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy = newCutProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	s, err = postgres.Open(context.Background(), u.String(), postgres.Options{Schema: schema, Logger: quiet, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return direct, s, proxy
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		var cut atomic.Bool
		p.wg.Add(2)
		go func() { // client to server
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if buf[0] == 'B' && p.armed.CompareAndSwap(true, false) {
						cut.Store(true)
					}
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server to client
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if cut.Load() {
					s.Close()
					return
				}
				if n > 0 {
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// TestRecordedOutcomesToldOfOnceWhenTheAnswerIsLost: RecordOutcomes whose
// statement committed but whose answer was lost (a connection cut, a
// timeout) fails, and the dispatcher sends the batch again. The outcomes
// are recorded by then, their leases gone: the retry recorded nothing, and
// neither call told of the attempts or of the runs they ended, so
// vibejobs_attempts_total and vibejobs_runs_finished_total never counted
// them. The retry tells of them, once.
func TestRecordedOutcomesToldOfOnceWhenTheAnswerIsLost(t *testing.T) {
	ctx := context.Background()
	direct, s, proxy := openThroughCutProxy(t)

	var mu sync.Mutex
	ended, recorded := vibejobs.RunsEnded{}, vibejobs.AttemptsRecorded{}
	s.OnRunsEnded(func(e vibejobs.RunsEnded) {
		mu.Lock()
		defer mu.Unlock()
		for k, n := range e {
			ended[k] += n
		}
	})
	s.OnAttemptsRecorded(func(a vibejobs.AttemptsRecorded) {
		mu.Lock()
		defer mu.Unlock()
		for k, n := range a {
			recorded[k] += n
		}
	})

	prj := newProject(t, direct)
	j := newJobs(t, direct, prj, 1)[0]
	if n, _, err := direct.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, t0, t0.Add(time.Second), t0.Add(2*time.Second))}, t0); err != nil || n != 3 {
		t.Fatalf("ApplyRunPlans = %d, %v", n, err)
	}
	now := t0.Add(2 * time.Second)
	claims, err := s.ClaimDueRuns(ctx, "w", now, 10, 5*time.Second)
	if err != nil || len(claims) != 3 {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	next := now.Add(time.Minute)
	steps := []struct {
		status int
		code   string
		step   vibejobs.Step
	}{
		{200, "", vibejobs.Step{State: vibejobs.RunSucceeded}},
		{401, "http_4xx", vibejobs.Step{State: vibejobs.RunFailed, FailureReason: vibejobs.ReasonAppRejected}},
		{500, "http_5xx", vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next}},
	}
	outcomes := make([]vibejobs.Outcome, len(claims))
	for i, c := range claims {
		outcomes[i] = vibejobs.Outcome{
			RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Step: steps[i].step,
			Attempt: vibejobs.Attempt{Number: 1, StartedAt: now, FinishedAt: now.Add(time.Duration(i+1) * time.Millisecond),
				StatusCode: steps[i].status, ErrorCode: steps[i].code, SignatureTimestamp: now.Unix()},
		}
	}

	proxy.armed.Store(true)
	if err := s.RecordOutcomes(ctx, "w", outcomes); err == nil {
		t.Fatal("RecordOutcomes whose answer was lost succeeded")
	}
	if proxy.armed.Load() {
		t.Fatal("the statement never went out: the test proved nothing")
	}
	for i, c := range claims {
		r, err := direct.GetRun(ctx, prj, c.Run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != steps[i].step.State || len(r.Attempts) != 1 {
			t.Fatalf("run %d after the lost answer: %s with %d attempts; want %s with 1: the statement did not commit",
				i, r.State, len(r.Attempts), steps[i].step.State)
		}
	}
	// The dispatcher sends the batch again until a call succeeds.
	if err := s.RecordOutcomes(ctx, "w", outcomes); err != nil {
		t.Fatalf("RecordOutcomes again: %v", err)
	}
	wantEnded := vibejobs.RunsEnded{
		{State: vibejobs.RunSucceeded}:                                  1,
		{State: vibejobs.RunFailed, Reason: vibejobs.ReasonAppRejected}: 1,
	}
	wantRecorded := vibejobs.AttemptsRecorded{
		{State: vibejobs.RunSucceeded}:                       1,
		{State: vibejobs.RunFailed, ErrorCode: "http_4xx"}:   1,
		{State: vibejobs.RunRetrying, ErrorCode: "http_5xx"}: 1,
	}
	mu.Lock()
	defer mu.Unlock()
	if !maps.Equal(ended, wantEnded) {
		t.Errorf("runs ended told of: %v, want %v", ended, wantEnded)
	}
	if !maps.Equal(recorded, wantRecorded) {
		t.Errorf("attempts recorded told of: %v, want %v", recorded, wantRecorded)
	}
	for i, c := range claims {
		r, err := direct.GetRun(ctx, prj, c.Run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Attempts) != 1 {
			t.Errorf("run %d: %d attempts after the retry, want 1", i, len(r.Attempts))
		}
	}
}

// cutApplyStore arms proxy for the next ApplyRunPlans call, once: that
// call's statement runs and commits, and its answer is lost.
type cutApplyStore struct {
	vibejobs.SchedulerStore
	proxy *cutProxy
	armed bool
}

func (s *cutApplyStore) ApplyRunPlans(ctx context.Context, plans []vibejobs.RunPlan, now time.Time) (int, int64, error) {
	if !s.armed {
		s.armed = true
		s.proxy.armed.Store(true)
	}
	return s.SchedulerStore.ApplyRunPlans(ctx, plans, now)
}

// TestRunsCreatedToldOfOnceWhenTheAnswerIsLost: an ApplyRunPlans whose
// statement committed but whose answer was lost (a connection cut, a store
// timeout) fails. Its job has moved on, so the scheduler does not plan those
// occurrences again, and neither call told of the runs it created:
// vibejobs_runs_created_total never counted them. The scheduler's next call
// sends the failed call's plans again, resent, and the store tells of the
// runs they name that exist: once, and not those of another replica.
func TestRunsCreatedToldOfOnceWhenTheAnswerIsLost(t *testing.T) {
	ctx := context.Background()
	direct, s, proxy := openThroughCutProxy(t)
	prj := newProject(t, direct)
	j := newJobs(t, direct, prj, 1)[0] // every second from t0

	now := t0
	clock := func() time.Time { return now }
	var told, toldOther atomic.Int64
	a := scheduler.New(scheduler.Config{Store: &cutApplyStore{SchedulerStore: s, proxy: proxy}, Now: clock, Logger: quiet,
		OnRunsCreated: func(n int) { told.Add(int64(n)) }})
	other := scheduler.New(scheduler.Config{Store: direct, Now: clock, Logger: quiet,
		OnRunsCreated: func(n int) { toldOther.Add(int64(n)) }})

	if _, err := a.RunOnce(ctx); err == nil {
		t.Fatal("RunOnce whose answer was lost succeeded")
	}
	if proxy.armed.Load() {
		t.Fatal("the statement never went out: the test proved nothing")
	}
	runs, _, err := direct.ListRuns(ctx, prj, vibejobs.RunFilter{JobID: j.ID}, vibejobs.Page{})
	if err != nil || len(runs) != 3 {
		t.Fatalf("runs after the lost answer: %d, %v; want 3 (t0 to t0+2s): the statement did not commit", len(runs), err)
	}
	// Another replica plans the next occurrence, then the scheduler scans
	// again: its job is not due, it has only the lost call's plans to send.
	now = t0.Add(time.Second)
	if n, err := other.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("the other replica's RunOnce = %d, %v; want 1", n, err)
	}
	for range 2 {
		if _, err := a.RunOnce(ctx); err != nil {
			t.Fatalf("RunOnce again: %v", err)
		}
	}
	if n, m := told.Load(), toldOther.Load(); n != 3 || m != 1 {
		t.Errorf("runs told of: %d by the replica whose answer was lost, %d by the other; want 3 and 1", n, m)
	}
	runs, _, err = direct.ListRuns(ctx, prj, vibejobs.RunFilter{JobID: j.ID}, vibejobs.Page{})
	if err != nil || len(runs) != 4 {
		t.Fatalf("runs: %d, %v; want 4", len(runs), err)
	}
}

// TestSkipsToldOfOnceWhenTheAnswerIsLost: the catch-up skips of an
// ApplyRunPlans whose statement committed but whose answer was lost were
// added to the job, and told of by no call, so
// vibejobs_skipped_occurrences_total never counted them. The scheduler's
// next call sends the plan again, resent; the store finds a run of it, so
// the lost call applied it, and tells of its skips: once.
func TestSkipsToldOfOnceWhenTheAnswerIsLost(t *testing.T) {
	ctx := context.Background()
	direct, s, proxy := openThroughCutProxy(t)
	prj := newProject(t, direct)
	j := jobFor(prj) // every second
	j.CatchUp, j.ScheduleAnchor = vibejobs.CatchUpLatest, t0.Add(-time.Hour)
	down := t0.Add(-10 * time.Second) // missed t0-10s to t0-6s: the latest runs, four are skipped
	j.NextRunAt = &down
	mustUpdate(t, direct, func(tx vibejobs.Tx) error { return tx.CreateJob(ctx, j) })

	now := t0
	var skipped atomic.Int64
	a := scheduler.New(scheduler.Config{Store: &cutApplyStore{SchedulerStore: s, proxy: proxy},
		Now: func() time.Time { return now }, Logger: quiet, OnSkipped: func(n int64) { skipped.Add(n) }})
	if _, err := a.RunOnce(ctx); err == nil {
		t.Fatal("RunOnce whose answer was lost succeeded")
	}
	if proxy.armed.Load() {
		t.Fatal("the statement never went out: the test proved nothing")
	}
	got, err := direct.GetJob(ctx, prj, j.ID)
	if err != nil || got.SkippedRuns != 4 {
		t.Fatalf("job after the lost answer: %d skipped, %v; want 4: the statement did not commit", got.SkippedRuns, err)
	}
	for range 2 {
		if _, err := a.RunOnce(ctx); err != nil {
			t.Fatalf("RunOnce again: %v", err)
		}
	}
	if n := skipped.Load(); n != 4 {
		t.Errorf("skipped occurrences told of: %d, want the 4 the lost call applied", n)
	}
}

// TestLostClaimReadBack: ClaimDueRuns whose statement committed but whose
// answer was lost fails, and its runs stay leased to the owner. ReadClaims
// with the owner and the claim's time gives them back as the claim would
// have (attempt number, lateness decided at the claim time, due time, the
// job's settings), in due order; with another owner or time, none. The
// outcomes of the claims read back are recorded under the claim's lease,
// after which nothing is left to read back.
func TestLostClaimReadBack(t *testing.T) {
	ctx := context.Background()
	direct, s, proxy := openThroughCutProxy(t)

	prj := newProject(t, direct)
	j := newJobs(t, direct, prj, 1)[0]
	dues := []time.Time{t0, t0.Add(time.Second), t0.Add(2 * time.Second)}
	if n, _, err := direct.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, dues...)}, t0); err != nil || n != 3 {
		t.Fatalf("ApplyRunPlans = %d, %v", n, err)
	}
	// 61 s after the first: late; the second at exactly 60 s, once the
	// claim time is kept to the microsecond, is not.
	now := t0.Add(61*time.Second + 500*time.Nanosecond)
	proxy.armed.Store(true)
	if claims, err := s.ClaimDueRuns(ctx, "w", now, 10, 5*time.Second); err == nil {
		t.Fatalf("ClaimDueRuns whose answer was lost = %d claims, no error", len(claims))
	}
	if proxy.armed.Load() {
		t.Fatal("the statement never went out: the test proved nothing")
	}

	for _, other := range []struct {
		owner string
		at    time.Time
	}{{"w2", now}, {"w", now.Add(time.Microsecond)}, {"w", now.Add(-time.Microsecond)}} {
		if got, err := direct.ReadClaims(ctx, other.owner, other.at); err != nil || len(got) != 0 {
			t.Fatalf("ReadClaims(%s, %v) = %d, %v; want none", other.owner, other.at, len(got), err)
		}
	}
	got, err := direct.ReadClaims(ctx, "w", now)
	if err != nil || len(got) != 3 {
		t.Fatalf("ReadClaims = %d, %v; want the 3 claims", len(got), err)
	}
	late := []bool{true, false, false}
	outcomes := make([]vibejobs.Outcome, len(got))
	for i, c := range got {
		if !c.DueAt.Equal(dues[i]) || !c.ClaimedAt.Equal(now.Truncate(time.Microsecond)) || c.LateDecided ||
			c.Run.State != vibejobs.RunDelivering || c.Run.Attempt != 1 || c.Run.Late != late[i] || c.Run.NextAttemptAt != nil ||
			c.URL != j.URL || c.Timeout != j.Timeout || c.Retry != j.Retry || c.Secret.KeyID != j.Secret.KeyID {
			t.Fatalf("claim %d read back: %+v, run %+v; want due %v, claimed at %v, attempt 1, late %v, the job's settings",
				i, c, c.Run, dues[i], now, late[i])
		}
		outcomes[i] = vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Step: vibejobs.Step{State: vibejobs.RunSucceeded},
			Attempt: vibejobs.Attempt{Number: 1, StartedAt: now, FinishedAt: now, StatusCode: 200, SignatureTimestamp: now.Unix()}}
	}
	if err := direct.RecordOutcomes(ctx, "w", outcomes); err != nil {
		t.Fatal(err)
	}
	for i, c := range got {
		r, err := direct.GetRun(ctx, prj, c.Run.ID)
		if err != nil || r.State != vibejobs.RunSucceeded || len(r.Attempts) != 1 || r.Late != late[i] {
			t.Fatalf("run %d after its outcome: %+v, %v; want succeeded with its one attempt, late %v", i, r, err, late[i])
		}
	}
	if got, err := direct.ReadClaims(ctx, "w", now); err != nil || len(got) != 0 {
		t.Fatalf("ReadClaims after the outcomes = %d, %v; want none", len(got), err)
	}
}
