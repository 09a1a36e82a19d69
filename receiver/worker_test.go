package receiver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/receiver"
)

// fakeOutbox records what a Worker does with the items it hands out.
type fakeOutbox struct {
	mu        sync.Mutex
	items     []receiver.OutboxItem
	completed []string
	failed    map[string]time.Time
	reasons   map[string]string
	released  []string
	// claimed, when set, runs inside ClaimOutbox (a claim that takes time).
	claimed func()
	// failedOnce, when set, is closed by the first FailOutbox.
	failedOnce chan struct{}
	// holders lists the holder each call named: "claim holder",
	// "complete run" (which names none), "fail run holder", "release run
	// holder".
	holders []string
}

func (o *fakeOutbox) ClaimOutbox(_ context.Context, holder string, _, _ time.Time, limit int) ([]receiver.OutboxItem, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.holders = append(o.holders, "claim "+holder)
	if o.claimed != nil {
		o.claimed()
	}
	n := min(limit, len(o.items))
	got := o.items[:n]
	o.items = o.items[n:]
	return got, nil
}

func (o *fakeOutbox) CompleteOutbox(_ context.Context, runID string, _ time.Time) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.completed = append(o.completed, runID)
	o.holders = append(o.holders, "complete "+runID)
	return nil
}

func (o *fakeOutbox) FailOutbox(_ context.Context, runID, holder string, retryAt time.Time, reason string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.holders = append(o.holders, "fail "+runID+" "+holder)
	if o.failed == nil {
		o.failed, o.reasons = map[string]time.Time{}, map[string]string{}
	}
	o.failed[runID], o.reasons[runID] = retryAt, reason
	if o.failedOnce != nil {
		close(o.failedOnce)
		o.failedOnce = nil
	}
	return nil
}

func (o *fakeOutbox) ReleaseOutbox(_ context.Context, runID, holder string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.holders = append(o.holders, "release "+runID+" "+holder)
	o.released = append(o.released, runID)
	return nil
}

func TestWorkerOutcomes(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	o := &fakeOutbox{items: []receiver.OutboxItem{
		{RunID: "run_ok", Payload: []byte(vectorBody), Attempt: 1},
		{RunID: "run_err", Payload: []byte(vectorBody), Attempt: 3},
		{RunID: "run_panic", Payload: []byte(vectorBody), Attempt: 1},
	}}
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:      o,
		Concurrency: 3,
		Now:         func() time.Time { return now },
		Logger:      slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, runID string, _ []byte) error {
			switch runID {
			case "run_err":
				return errors.New("smtp 451")
			case "run_panic":
				panic("nil map")
			}
			if _, ok := ctx.Deadline(); !ok {
				return errors.New("no lease deadline on ctx")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.ProcessBatch(context.Background()); n != 3 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if len(o.completed) != 1 || o.completed[0] != "run_ok" {
		t.Fatalf("completed %v", o.completed)
	}
	if got := o.failed["run_err"]; !got.Equal(now.Add(receiver.DefaultBackoff(3))) {
		t.Fatalf("run_err retry at %v", got)
	}
	if o.reasons["run_err"] != "smtp 451" || o.reasons["run_panic"] != "panic: nil map" {
		t.Fatalf("reasons %v", o.reasons)
	}
}

// Stopping the worker cancels the running item and gives it back, due at
// once and without counting the attempt, instead of recording a failure
// that would charge the item an attempt and a backoff.
func TestWorkerStopReleasesItem(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	o := &fakeOutbox{items: []receiver.OutboxItem{{RunID: "run_long", Payload: []byte(vectorBody), Attempt: 1}}}
	started := make(chan struct{})
	w, _ := receiver.NewWorker(receiver.WorkerConfig{
		Outbox: o,
		Now:    func() time.Time { return now },
		Logger: slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, runID string, _ []byte) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- w.Run(ctx) }()
	<-started
	cancel()
	if err := <-stopped; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if len(o.released) != 1 || o.released[0] != "run_long" || len(o.failed) != 0 || len(o.completed) != 0 {
		t.Fatalf("released %v, failed %v, completed %v; want run_long released only", o.released, o.failed, o.completed)
	}
}

// TestWorkerStopOutcomes: what a stop does to an item depends on what the
// app's function made of it. Not started (the stop came during the claim):
// given back unrun. Succeeded, even after the stop: processed. Failed before
// the stop: a counted failure with its backoff.
func TestWorkerStopOutcomes(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ran []string
	var mu sync.Mutex
	o := &fakeOutbox{items: []receiver.OutboxItem{{RunID: "run_unstarted", Payload: []byte(vectorBody), Attempt: 2}}, claimed: cancel}
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox: o,
		Now:    func() time.Time { return now },
		Logger: slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, runID string, _ []byte) error {
			mu.Lock()
			ran = append(ran, runID)
			mu.Unlock()
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.ProcessBatch(ctx); n != 1 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if len(ran) != 0 || len(o.released) != 1 || o.released[0] != "run_unstarted" || len(o.failed)+len(o.completed) != 0 {
		t.Fatalf("stop during the claim: ran %v, released %v, failed %v, completed %v; want only a release", ran, o.released, o.failed, o.completed)
	}

	// The function sees the stop and still finishes its work.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	failedBeforeStop := make(chan struct{}) // its failure is recorded
	o = &fakeOutbox{items: []receiver.OutboxItem{
		{RunID: "run_done_after_stop", Payload: []byte(vectorBody), Attempt: 1},
		{RunID: "run_failed_before_stop", Payload: []byte(vectorBody), Attempt: 3},
	}, failedOnce: failedBeforeStop}
	w, err = receiver.NewWorker(receiver.WorkerConfig{
		Outbox:      o,
		Concurrency: 2,
		Now:         func() time.Time { return now },
		Logger:      slog.New(slog.DiscardHandler),
		Process: func(pctx context.Context, runID string, _ []byte) error {
			if runID == "run_failed_before_stop" {
				return errors.New("smtp 451")
			}
			<-failedBeforeStop
			cancel()
			<-pctx.Done()
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.ProcessBatch(ctx); n != 2 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if len(o.completed) != 1 || o.completed[0] != "run_done_after_stop" {
		t.Fatalf("completed %v, want run_done_after_stop", o.completed)
	}
	if got, ok := o.failed["run_failed_before_stop"]; !ok || !got.Equal(now.Add(receiver.DefaultBackoff(3))) {
		t.Fatalf("run_failed_before_stop: retry at %v (%v), want after its backoff", got, ok)
	}
	if len(o.released) != 0 {
		t.Fatalf("released %v, want none", o.released)
	}
}

// TestWorkerContextEndsWithTheLease: the lease starts before the claim, so
// a claim that takes time leaves the app less of it; the app's context ends
// when the lease does, not a whole lease after the claim returned (by then
// another worker may run the item). A claim that outlasts the lease runs
// nothing, and gives its items back without counting their attempts.
func TestWorkerContextEndsWithTheLease(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var claimTook time.Duration
	o := &fakeOutbox{claimed: func() { now = now.Add(claimTook) }}
	var left time.Duration
	ran := 0
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox: o,
		Lease:  time.Minute,
		Now:    func() time.Time { return now },
		Logger: slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, _ string, _ []byte) error {
			ran++
			d, _ := ctx.Deadline()
			left = time.Until(d)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	claimTook = 40 * time.Second
	o.items = []receiver.OutboxItem{{RunID: "run_slow_claim", Payload: []byte(vectorBody), Attempt: 1}}
	if n, err := w.ProcessBatch(context.Background()); n != 1 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if ran != 1 || left > 20*time.Second || left < 19*time.Second {
		t.Fatalf("after a 40 s claim of a 1 min lease the app got %v (ran %d), want the 20 s left", left, ran)
	}

	claimTook = time.Minute
	o.items = []receiver.OutboxItem{{RunID: "run_late", Payload: []byte(vectorBody), Attempt: 1}}
	if n, err := w.ProcessBatch(context.Background()); n != 1 || err == nil {
		t.Fatalf("ProcessBatch after a claim as long as the lease = %d, %v; want 1 and an error", n, err)
	}
	if ran != 1 || len(o.completed) != 1 || len(o.failed) != 0 {
		t.Fatalf("an item whose lease ended during the claim was run (%d runs) or recorded (%v, %v)", ran, o.completed, o.failed)
	}
	if len(o.released) != 1 || o.released[0] != "run_late" {
		t.Fatalf("given back %v after a claim as long as the lease, want run_late", o.released)
	}
}

// leaseRecorder is a fakeOutbox that keeps the lease end of the last claim.
type leaseRecorder struct {
	*fakeOutbox
	until time.Time
}

func (o *leaseRecorder) ClaimOutbox(ctx context.Context, holder string, now, leaseUntil time.Time, limit int) ([]receiver.OutboxItem, error) {
	o.until = leaseUntil
	return o.fakeOutbox.ClaimOutbox(ctx, holder, now, leaseUntil, limit)
}

// TestWorkerContextEndsNoLaterThanTheLease: on the default clock, every
// item's context ends no later than the lease its claim asked for, however
// late the item's goroutine started after the claim (a deadline measured
// from there ran past the lease by that delay, while another worker could
// claim the item).
func TestWorkerContextEndsNoLaterThanTheLease(t *testing.T) {
	o := &leaseRecorder{fakeOutbox: &fakeOutbox{}}
	var mu sync.Mutex
	var deadlines []time.Time
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:      o,
		Lease:       time.Minute,
		Concurrency: 16,
		Logger:      slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, _ string, _ []byte) error {
			d, ok := ctx.Deadline()
			if !ok {
				return errors.New("no deadline")
			}
			mu.Lock()
			defer mu.Unlock()
			deadlines = append(deadlines, d)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		o.items = append(o.items, receiver.OutboxItem{RunID: fmt.Sprintf("run_%d", i), Payload: []byte(vectorBody), Attempt: 1})
	}
	if n, err := w.ProcessBatch(context.Background()); n != 16 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if len(deadlines) != 16 || len(o.completed) != 16 {
		t.Fatalf("%d items ran, %d completed; want 16", len(deadlines), len(o.completed))
	}
	for _, d := range deadlines {
		if d.After(o.until) {
			t.Fatalf("an item's context ends %v after its lease", d.Sub(o.until))
		}
	}
}

// TestWorkerClaimsHoldItemsApart: each claim holds its items under a name
// of its own, the Worker's ID and the claim's number, and records their
// outcomes under it. Under the bare ID, a function that outlived its lease
// and then failed would release the Worker's next claim of the same item
// (the store checks only the holder), and a third claim could run it beside
// the second.
func TestWorkerClaimsHoldItemsApart(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	o := &fakeOutbox{}
	ctx, stop := context.WithCancel(context.Background())
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox: o,
		ID:     "w1",
		Now:    func() time.Time { return now },
		Logger: slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, runID string, _ []byte) error {
			switch runID {
			case "run_fails":
				return errors.New("boom")
			case "run_stopped":
				stop()
				return ctx.Err()
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"run_fails", "run_ok", "run_stopped"} {
		o.items = []receiver.OutboxItem{{RunID: id, Payload: []byte(vectorBody), Attempt: 1}}
		if n, err := w.ProcessBatch(ctx); n != 1 || err != nil {
			t.Fatalf("ProcessBatch of %s = %d, %v", id, n, err)
		}
	}
	want := []string{
		"claim w1#1", "fail run_fails w1#1",
		"claim w1#2", "complete run_ok",
		"claim w1#3", "release run_stopped w1#3",
	}
	if !reflect.DeepEqual(o.holders, want) {
		t.Fatalf("calls %q, want %q", o.holders, want)
	}
}

// TestNewWorkerRefusesBadConfig: a config the Worker cannot run with is
// refused by NewWorker with an error, not met later at every claim. An ID
// that is not valid UTF-8, or holds a NUL byte, is one: PostgreSQL's text
// columns refuse it, so on pgstore every claim would fail, while sqlitestore
// took it.
func TestNewWorkerRefusesBadConfig(t *testing.T) {
	process := func(context.Context, string, []byte) error { return nil }
	for name, cfg := range map[string]receiver.WorkerConfig{
		"no outbox":            {Process: process},
		"no process":           {Outbox: &fakeOutbox{}},
		"negative lease":       {Outbox: &fakeOutbox{}, Process: process, Lease: -time.Second},
		"negative concurrency": {Outbox: &fakeOutbox{}, Process: process, Concurrency: -1},
		"negative poll":        {Outbox: &fakeOutbox{}, Process: process, PollInterval: -time.Second},
		"ID with a NUL byte":   {Outbox: &fakeOutbox{}, Process: process, ID: "worker\x00a"},
		"ID not UTF-8":         {Outbox: &fakeOutbox{}, Process: process, ID: "worker\xffa"},
		"ID cut inside a rune": {Outbox: &fakeOutbox{}, Process: process, ID: "worker-\xc3"},
	} {
		if _, err := receiver.NewWorker(cfg); err == nil {
			t.Errorf("%s: NewWorker accepted it; want an error", name)
		}
	}
	w, err := receiver.NewWorker(receiver.WorkerConfig{Outbox: &fakeOutbox{}, Process: process, ID: "wörker-1"})
	if err != nil || w.ID() != "wörker-1" {
		t.Fatalf("NewWorker with a UTF-8 ID: %v", err)
	}
}

func TestDefaultBackoff(t *testing.T) {
	want := map[int]time.Duration{0: 5 * time.Second, 1: 5 * time.Second, 2: 10 * time.Second, 3: 20 * time.Second, 10: 2560 * time.Second, 11: time.Hour, 1000: time.Hour}
	for attempt, d := range want {
		if got := receiver.DefaultBackoff(attempt); got != d {
			t.Errorf("DefaultBackoff(%d) = %v, want %v", attempt, got, d)
		}
	}
}

// TestWorkerRunIsNotHeldUpBySlowItem: Run keeps Concurrency items in
// flight, so the items behind a slow one are claimed and processed while it
// still runs, instead of waiting for the whole batch to end. The poll
// interval is an hour: every claim after the first comes from an item
// finishing while the outbox had more work.
func TestWorkerRunIsNotHeldUpBySlowItem(t *testing.T) {
	o := &fakeOutbox{items: []receiver.OutboxItem{
		{RunID: "run_slow", Payload: []byte(vectorBody), Attempt: 1},
		{RunID: "run_1", Payload: []byte(vectorBody), Attempt: 1},
		{RunID: "run_2", Payload: []byte(vectorBody), Attempt: 1},
		{RunID: "run_3", Payload: []byte(vectorBody), Attempt: 1},
		{RunID: "run_4", Payload: []byte(vectorBody), Attempt: 1},
	}}
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	fastDone := make(chan string, 4)
	slowStarted := make(chan struct{})
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:       o,
		Concurrency:  2,
		PollInterval: time.Hour,
		Logger:       slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, runID string, _ []byte) error {
			if runID == "run_slow" {
				close(slowStarted)
				// Not cut short by the stop: with both ready, a select
				// could take ctx.Done and the item would be given back,
				// not recorded.
				<-release
				return nil
			}
			fastDone <- runID
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- w.Run(ctx) }()
	var got []string
	for len(got) < 4 {
		select {
		case id := <-fastDone:
			got = append(got, id)
		case <-time.After(10 * time.Second):
			t.Fatalf("while run_slow ran, only %v of the 4 items behind it were processed", got)
		}
	}
	// An item whose function had not begun when the stop came would be
	// given back, not recorded: its goroutine may start after the others.
	select {
	case <-slowStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("run_slow never started")
	}
	releaseOnce()
	// run_slow's outcome is recorded before Run returns.
	cancel()
	if err := <-stopped; err != nil {
		t.Fatalf("Run = %v", err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.completed)+len(o.failed) != 5 {
		t.Fatalf("completed %v, failed %v: want all 5 recorded", o.completed, o.failed)
	}
}

// A Worker not made with NewWorker answers an error, never a nil pointer
// panic, and Run returns it at once rather than polling nothing forever.
func TestZeroWorkerErrors(t *testing.T) {
	for name, w := range map[string]*receiver.Worker{"zero": {}, "nil": nil} {
		if n, err := w.ProcessBatch(context.Background()); err == nil || n != 0 ||
			!strings.Contains(err.Error(), "NewWorker") {
			t.Errorf("%s Worker: ProcessBatch = %d, %v; want an error naming NewWorker", name, n, err)
		}
		if err := w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "NewWorker") {
			t.Errorf("%s Worker: Run = %v; want an error naming NewWorker", name, err)
		}
		if id := w.ID(); id != "" {
			t.Errorf("%s Worker: ID = %q, want empty", name, id)
		}
	}
}
