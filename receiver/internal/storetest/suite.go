package storetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
)

func killSelf() { syscall.Kill(os.Getpid(), syscall.SIGKILL) }

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// serveHandler serves the SDK's handler on s, verifying with Secret, on a
// loopback server closed when t ends.
func serveHandler(t *testing.T, s receiver.Store) *httptest.Server {
	t.Helper()
	v, err := receiver.NewVerifier(receiver.Secrets{Current: Secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	handler, err := receiver.NewHandler(receiver.Config{Verifier: v, Logger: discardLogger()}, s)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv
}

// Run runs the conformance suite against the store of h.
func Run(t *testing.T, h Harness) {
	t.Run("AcceptNewThenRepeat", func(t *testing.T) { testAcceptNewThenRepeat(t, h) })
	t.Run("AcceptRollsBackOnError", func(t *testing.T) { testAcceptRollsBack(t, h) })
	t.Run("AcceptCancelled", func(t *testing.T) { testAcceptCancelled(t, h) })
	t.Run("AcceptInvalidRunID", func(t *testing.T) { testAcceptInvalidRunID(t, h) })
	t.Run("HandlerCommitsAfterRequestCancelled", func(t *testing.T) { testHandlerCommitsAfterRequestCancelled(t, h) })
	t.Run("ConcurrentDeliveries", func(t *testing.T) { testConcurrentDeliveries(t, h) })
	t.Run("RedeliveryAfterProcessing", func(t *testing.T) { testRedeliveryAfterProcessing(t, h) })
	t.Run("ClaimLeaseCompleteFail", func(t *testing.T) { testClaimLease(t, h) })
	t.Run("ClaimRefusesBadInput", func(t *testing.T) { testClaimRefusesBadInput(t, h) })
	t.Run("LeaseEndsNoEarlier", func(t *testing.T) { testLeaseEndsNoEarlier(t, h) })
	t.Run("RetryComesNoEarlier", func(t *testing.T) { testRetryComesNoEarlier(t, h) })
	t.Run("LateCompletionStands", func(t *testing.T) { testLateCompletionStands(t, h) })
	t.Run("ReleaseGivesBackTheAttempt", func(t *testing.T) { testReleaseGivesBackTheAttempt(t, h) })
	t.Run("WorkerStopGivesBackTheAttempt", func(t *testing.T) { testWorkerStopGivesBackTheAttempt(t, h) })
	t.Run("WorkerRetriesWithBackoff", func(t *testing.T) { testWorkerRetries(t, h) })
	t.Run("ConcurrentWorkers", func(t *testing.T) { testConcurrentWorkers(t, h) })
	t.Run("Retention", func(t *testing.T) { testRetention(t, h) })
	t.Run("RetentionLimitNotPositive", func(t *testing.T) { testRetentionLimitNotPositive(t, h) })
	t.Run("CrashAfterCommitBeforeResponse", func(t *testing.T) { testCrashAfterCommit(t, h) })
	t.Run("WorkerKilledMidItem", func(t *testing.T) { testWorkerKilled(t, h) })
	t.Run("MigrateRefusesNewerSchema", func(t *testing.T) { testMigrateRefusesNewerSchema(t, h) })
}

// testMigrateRefusesNewerSchema: a database that a newer build of the SDK
// migrated further (here: to version 99) is refused, not run with this
// build's statements, and Migrate says why.
func testMigrateRefusesNewerSchema(t *testing.T, h Harness) {
	s, _ := h.New(t)
	h.Exec(t, s, `INSERT INTO receiver_migrations (version) VALUES (99)`)
	err := s.(interface{ Migrate(context.Context) error }).Migrate(context.Background())
	if err == nil || !strings.Contains(err.Error(), "schema is at version 99, newer than this build of the SDK knows") {
		t.Fatalf("Migrate of a database at receiver schema version 99: %v; want an error saying it is newer", err)
	}
}

func testAcceptNewThenRepeat(t *testing.T, h Harness) {
	s, _ := h.New(t)
	mustAccept(t, s, "run_a")
	mustAccept(t, s, "run_a")
	mustAccept(t, s, "run_b")
	st := h.Inspect(t, s, "run_a")
	if !st.Accepted || st.Items != 1 || st.Attempts != 0 || st.Processed {
		t.Fatalf("run_a after two accepts: %+v", st)
	}
	if n := h.CountItems(t, s); n != 2 {
		t.Fatalf("outbox has %d items, want 2", n)
	}
}

// A failure after the receipt's insert (the payload is not JSON, which the
// outbox column refuses) must roll the receipt back too.
func testAcceptRollsBack(t *testing.T, h Harness) {
	s, _ := h.New(t)
	status, body, err := s.Accept(context.Background(), "run_x", []byte("not json"))
	if err == nil || status != 0 || body != nil {
		t.Fatalf("Accept(bad payload) = %d %q %v, want an error and no response", status, body, err)
	}
	if st := h.Inspect(t, s, "run_x"); st.Accepted || st.Items != 0 {
		t.Fatalf("rows left after a failed accept: %+v", st)
	}
	mustAccept(t, s, "run_x")
	if st := h.Inspect(t, s, "run_x"); !st.Accepted || st.Items != 1 {
		t.Fatalf("after retry: %+v", st)
	}
	// The store still works on the connection used by the failed transaction.
	mustAccept(t, s, "run_y")
}

func testAcceptCancelled(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if status, _, err := s.Accept(ctx, "run_c", Body("run_c")); err == nil || status != 0 {
		t.Fatalf("Accept(cancelled) = %d %v, want an error", status, err)
	}
	mustAccept(t, s, "run_c")
}

// testAcceptInvalidRunID: Accept refuses a run id that the Handler would
// not pass it (contract.ValidID with the prefix "run_", as ValidatePayload
// checks a delivery's runId) with an error that says so, stores neither a
// receipt nor an item, and keeps working for valid ids. Both stores held
// the empty id, and SQLite every other string too, where PostgreSQL
// refused only what its text type cannot hold (NUL, bytes that are not
// UTF-8).
func testAcceptInvalidRunID(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	for _, id := range []string{
		"",
		"run_",                            // the prefix alone
		"job_1",                           // another prefix
		"RUN_1",                           // the prefix is case-sensitive
		"1",                               // no prefix
		"run_a b",                         // a space
		"run_a/b",                         // a character outside [A-Za-z0-9_-]
		"run_é",                           // not ASCII
		"run_\xff",                        // not UTF-8
		"run_\x00",                        // NUL
		"run_a\n",                         // a trailing newline
		"run_" + strings.Repeat("a", 125), // 129 bytes, one over the bound
	} {
		status, body, err := s.Accept(ctx, id, Body("run_1"))
		if err == nil || status != 0 || body != nil {
			t.Fatalf("Accept(%q) = %d %q %v; want an error and no response", id, status, body, err)
		}
		if !errors.Is(err, receiver.ErrInvalidRunID) {
			t.Fatalf("Accept(%q) error %q does not say the run id is at fault", id, err)
		}
		if strings.ContainsRune(id, 0) || !utf8.ValidString(id) {
			continue // PostgreSQL's text cannot hold it, so Inspect cannot look it up
		}
		if st := h.Inspect(t, s, id); st.Accepted || st.Items != 0 {
			t.Fatalf("Accept(%q) was refused but left rows: %+v", id, st)
		}
	}
	if n := h.CountItems(t, s); n != 0 {
		t.Fatalf("outbox has %d items after refused acceptances, want 0", n)
	}
	mustAccept(t, s, "run_"+strings.Repeat("a", 124)) // 128 bytes: the longest valid id
	mustAccept(t, s, "run_A-z_0")
	if n := h.CountItems(t, s); n != 2 {
		t.Fatalf("outbox has %d items after two valid acceptances, want 2", n)
	}
}

// cancelOnAccept cancels the request's context as the handler hands a
// verified delivery to the store, then accepts through the real store.
type cancelOnAccept struct {
	Store
	cancel context.CancelFunc
}

func (c cancelOnAccept) Accept(ctx context.Context, runID string, payload []byte) (int, []byte, error) {
	c.cancel()
	return c.Store.Accept(ctx, runID, payload)
}

// The request's context ends (the client left, a timeout middleware fired)
// just as the handler starts the acceptance: the store, which honours its
// context (AcceptCancelled), must still commit the receipt and the item, and
// the handler answer 202.
func testHandlerCommitsAfterRequestCancelled(t *testing.T, h Harness) {
	s, _ := h.New(t)
	v, err := receiver.NewVerifier(receiver.Secrets{Current: Secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handler, err := receiver.NewHandler(receiver.Config{Verifier: v, Logger: discardLogger()}, cancelOnAccept{s, cancel})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, NewRequest(t, "/", Secret, Body("run_cancel"), time.Now()).WithContext(ctx))
	if rec.Code != receiver.AcceptedStatus || rec.Body.String() != receiver.AcceptedBody {
		t.Fatalf("got %d %s, want %d %s", rec.Code, rec.Body, receiver.AcceptedStatus, receiver.AcceptedBody)
	}
	if st := h.Inspect(t, s, "run_cancel"); !st.Accepted || st.Items != 1 {
		t.Fatalf("after the answer: %+v", st)
	}
}

// 100 concurrent deliveries of one run through the real handler: one outbox
// item and 100 identical answers.
func testConcurrentDeliveries(t *testing.T, h Harness) {
	s, _ := h.New(t)
	srv := serveHandler(t, s)
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 100

	const n = 100
	body := Body("run_concurrent")
	answers := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			resp, err := client.Do(NewRequest(t, srv.URL, Secret, body, time.Now()))
			if err != nil {
				answers[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			answers[i] = fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), readAll(resp.Body))
		})
	}
	close(start)
	wg.Wait()
	want := "202 application/json " + receiver.AcceptedBody
	for i, a := range answers {
		if a != want {
			t.Fatalf("answer %d = %q, want %q", i, a, want)
		}
	}
	if st := h.Inspect(t, s, "run_concurrent"); st.Items != 1 || h.CountItems(t, s) != 1 {
		t.Fatalf("outbox after %d deliveries: %+v, %d items", n, st, h.CountItems(t, s))
	}
}

// Later attempts of a run (new body, new signature) reach the app after it
// accepted the run and again after the outbox processed it: each gets the
// stored answer and enqueues nothing, so the work runs once, on the payload
// first accepted. The receipt, not the outbox item, is what dedupes.
func testRedeliveryAfterProcessing(t *testing.T, h Harness) {
	s, _ := h.New(t)
	srv := serveHandler(t, s)
	body := func(attempt int) []byte {
		return contract.Body(contract.Payload{JobID: "job_digest", RunID: "run_again",
			ScheduledFor: time.Date(2026, 10, 9, 9, 0, 0, 0, time.UTC), Attempt: attempt, Late: true, Trigger: contract.TriggerSchedule})
	}
	deliver := func(attempt int) {
		t.Helper()
		resp, err := srv.Client().Do(NewRequest(t, srv.URL, Secret, body(attempt), time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != receiver.AcceptedStatus || got != receiver.AcceptedBody {
			t.Fatalf("attempt %d answered %d %s", attempt, resp.StatusCode, got)
		}
	}
	var runs [][]byte
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox: s,
		Logger: discardLogger(),
		Process: func(_ context.Context, _ string, p []byte) error {
			runs = append(runs, p)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	deliver(1)
	deliver(2) // accepted, not yet processed
	if n, err := w.ProcessBatch(context.Background()); n != 1 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	deliver(3) // after processing
	if n, err := w.ProcessBatch(context.Background()); n != 0 || err != nil {
		t.Fatalf("ProcessBatch after the redelivery = %d, %v; want nothing to do", n, err)
	}
	if st := h.Inspect(t, s, "run_again"); st.Items != 1 || !st.Processed || !st.RunProcessed || st.Attempts != 1 {
		t.Fatalf("after three deliveries: %+v", st)
	}
	if len(runs) != 1 || string(runs[0]) != string(body(1)) {
		t.Fatalf("the app ran %d times, first on %s; want once, on attempt 1's body", len(runs), runs)
	}
}

func testClaimLease(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, id := range []string{"run_1", "run_2", "run_3"} {
		mustAccept(t, s, id)
	}
	claim := func(worker string, at time.Time, limit int) []receiver.OutboxItem {
		t.Helper()
		items, err := s.ClaimOutbox(ctx, worker, at, at.Add(time.Minute), limit)
		if err != nil {
			t.Fatal(err)
		}
		return items
	}
	a := claim("a", now, 2)
	if len(a) != 2 || a[0].Attempt != 1 || a[1].Attempt != 1 {
		t.Fatalf("first claim: %v", a)
	}
	for _, it := range a {
		if _, err := receiver.ValidatePayload(canonical(it)); err != nil {
			t.Fatalf("claimed payload of %s: %v", it.RunID, err)
		}
	}
	b := claim("b", now.Add(time.Second), 10)
	if len(b) != 1 || b[0].RunID == a[0].RunID || b[0].RunID == a[1].RunID {
		t.Fatalf("second claim got %+v while a holds %s, %s", b, a[0].RunID, a[1].RunID)
	}
	if got := claim("c", now.Add(59*time.Second), 10); len(got) != 0 {
		t.Fatalf("claim during leases: %+v", got)
	}

	// a completes one item, fails the other; b's lease runs out.
	if err := s.CompleteOutbox(ctx, a[0].RunID, now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.FailOutbox(ctx, a[1].RunID, "a", now.Add(10*time.Minute), "boom"); err != nil {
		t.Fatal(err)
	}
	// A worker that does not hold the lease cannot release it.
	if err := s.FailOutbox(ctx, b[0].RunID, "intruder", now, "no"); err != nil {
		t.Fatal(err)
	}
	if st := h.Inspect(t, s, a[0].RunID); !st.Processed || !st.RunProcessed || st.LockedBy != "" {
		t.Fatalf("completed item: %+v", st)
	}
	if st := h.Inspect(t, s, a[1].RunID); st.Processed || st.LastError != "boom" || st.LockedBy != "" || st.Attempts != 1 {
		t.Fatalf("failed item: %+v", st)
	}
	if st := h.Inspect(t, s, b[0].RunID); st.LockedBy != "b" || st.LastError != "" {
		t.Fatalf("item leased by b after an intruder's release: %+v", st)
	}
	got := claim("c", now.Add(61*time.Second), 10)
	if len(got) != 1 || got[0].RunID != b[0].RunID || got[0].Attempt != 2 {
		t.Fatalf("claim after b's lease expired: %+v", got)
	}
	if err := s.CompleteOutbox(ctx, got[0].RunID, now.Add(62*time.Second)); err != nil {
		t.Fatal(err)
	}
	got = claim("d", now.Add(10*time.Minute), 10)
	if len(got) != 1 || got[0].RunID != a[1].RunID || got[0].Attempt != 2 {
		t.Fatalf("claim at the retry time: %+v", got)
	}
	// Completing twice is harmless.
	for range 2 {
		if err := s.CompleteOutbox(ctx, a[0].RunID, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
}

// testClaimRefusesBadInput: a claim that receiver.CheckClaim refuses (a
// limit below one, a worker name that cannot hold a lease, a lease that
// ends no later than now) is refused with an error and claims nothing, on
// every store alike. (SQLite reads a negative LIMIT as no limit, and would
// lease every due item; PostgreSQL refuses it and a NUL byte; both would
// lease items to the empty name, or for a lease already over, which any
// other worker could claim again at once.)
func testClaimRefusesBadInput(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	for _, id := range []string{"run_1", "run_2"} {
		mustAccept(t, s, id)
	}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name       string
		worker     string
		leaseUntil time.Time
		limit      int
		want       string // in the error
		is         error  // wrapped by the error, when not nil
	}{
		{"limit 0", "a", t0.Add(time.Minute), 0, "limit", nil},
		{"limit -1", "a", t0.Add(time.Minute), -1, "limit", nil},
		{"limit -2^62", "a", t0.Add(time.Minute), -1 << 62, "limit", nil},
		{"empty worker", "", t0.Add(time.Minute), 2, "worker", receiver.ErrInvalidWorker},
		{"worker with NUL", "a\x00b", t0.Add(time.Minute), 2, "worker", receiver.ErrInvalidWorker},
		{"worker not UTF-8", "a\xffb", t0.Add(time.Minute), 2, "worker", receiver.ErrInvalidWorker},
		{"lease ends at now", "a", t0, 2, "lease", nil},
		{"lease ended before now", "a", t0.Add(-time.Second), 2, "lease", nil},
	} {
		got, err := s.ClaimOutbox(ctx, c.worker, t0, c.leaseUntil, c.limit)
		if err == nil || len(got) != 0 {
			t.Fatalf("%s: ClaimOutbox = %d items, %v; want an error and none", c.name, len(got), err)
		}
		if !strings.Contains(err.Error(), c.want) || (c.is != nil && !errors.Is(err, c.is)) {
			t.Fatalf("%s: ClaimOutbox error %q does not name the %s", c.name, err, c.want)
		}
	}
	for _, id := range []string{"run_1", "run_2"} {
		if st := h.Inspect(t, s, id); st.LockedBy != "" || st.Attempts != 0 {
			t.Fatalf("%s after refused claims: %+v", id, st)
		}
	}
	if got, err := s.ClaimOutbox(ctx, "b", t0, t0.Add(time.Minute), 2); err != nil || len(got) != 2 || got[0].Attempt != 1 {
		t.Fatalf("claim after the refused ones: %v, %v; want both items at attempt 1", got, err)
	}
}

// testLeaseEndsNoEarlier: a lease ends no earlier than asked, whatever
// precision the store keeps times in: an item leased until just under a
// whole millisecond past a minute is not handed out again a fraction before.
func testLeaseEndsNoEarlier(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	mustAccept(t, s, "run_1")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	leaseUntil := t0.Add(time.Minute + 900*time.Microsecond + 900*time.Nanosecond)
	if got, err := s.ClaimOutbox(ctx, "a", t0, leaseUntil, 1); err != nil || len(got) != 1 {
		t.Fatalf("first claim: %v, %v", got, err)
	}
	for _, at := range []time.Time{t0.Add(time.Minute + 100*time.Microsecond), leaseUntil.Add(-100 * time.Nanosecond)} {
		if got, err := s.ClaimOutbox(ctx, "b", at, at.Add(time.Minute), 1); err != nil || len(got) != 0 {
			t.Fatalf("claim at %s, before the lease until %s ends: %d items, %v", at.Format(time.StampNano), leaseUntil.Format(time.StampNano), len(got), err)
		}
	}
	if got, err := s.ClaimOutbox(ctx, "b", t0.Add(time.Minute+time.Millisecond), t0.Add(2*time.Minute), 1); err != nil || len(got) != 1 {
		t.Fatalf("claim after the lease ended: %d items, %v", len(got), err)
	}
}

// testRetryComesNoEarlier: an item failed with a retry time is not handed
// out again before that time, whatever precision the store keeps times in
// (it was, up to a millisecond early on SQLite and a microsecond on
// PostgreSQL, each time truncated).
func testRetryComesNoEarlier(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	mustAccept(t, s, "run_1")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, err := s.ClaimOutbox(ctx, "a", t0, t0.Add(time.Second), 1); err != nil || len(got) != 1 {
		t.Fatalf("first claim: %v, %v", got, err)
	}
	retryAt := t0.Add(time.Minute + 900*time.Microsecond + 900*time.Nanosecond)
	if err := s.FailOutbox(ctx, "run_1", "a", retryAt, "boom"); err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Time{t0.Add(time.Minute + 100*time.Microsecond), retryAt.Add(-100 * time.Nanosecond)} {
		if got, err := s.ClaimOutbox(ctx, "b", at, at.Add(time.Minute), 1); err != nil || len(got) != 0 {
			t.Fatalf("claim at %s, before the retry at %s: %d items, %v", at.Format(time.StampNano), retryAt.Format(time.StampNano), len(got), err)
		}
	}
	if got, err := s.ClaimOutbox(ctx, "b", t0.Add(time.Minute+time.Millisecond), t0.Add(2*time.Minute), 1); err != nil || len(got) != 1 {
		t.Fatalf("claim once the retry is due: %d items, %v", len(got), err)
	}
}

// testLateCompletionStands: a worker whose lease ran out while the app
// still ran the item finishes after another worker took the item over. The
// work was done: its completion stands, and the taker's failure afterwards
// neither re-queues the item nor clears its processed mark.
func testLateCompletionStands(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	mustAccept(t, s, "run_slow")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, err := s.ClaimOutbox(ctx, "a", t0, t0.Add(time.Minute), 1); err != nil || len(got) != 1 {
		t.Fatalf("a's claim: %v, %v", got, err)
	}
	if got, err := s.ClaimOutbox(ctx, "b", t0.Add(2*time.Minute), t0.Add(3*time.Minute), 1); err != nil || len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("b's claim after a's lease ended: %v, %v", got, err)
	}
	if err := s.CompleteOutbox(ctx, "run_slow", t0.Add(150*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.FailOutbox(ctx, "run_slow", "b", t0.Add(160*time.Second), "b failed"); err != nil {
		t.Fatal(err)
	}
	if st := h.Inspect(t, s, "run_slow"); !st.Processed || !st.RunProcessed || st.LastError != "" {
		t.Fatalf("after a's late completion and b's failure: %+v", st)
	}
	if got, err := s.ClaimOutbox(ctx, "c", t0.Add(time.Hour), t0.Add(61*time.Minute), 10); err != nil || len(got) != 0 {
		t.Fatalf("a processed item was claimed again: %v, %v", got, err)
	}
}

// testReleaseGivesBackTheAttempt: an item given back by its holder is due
// again at once with the attempt its claim counted taken back, and with the
// error of the last attempt that counted; a worker that does not hold the
// item cannot give it back, nor can anyone once it is processed.
func testReleaseGivesBackTheAttempt(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	mustAccept(t, s, "run_1")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, err := s.ClaimOutbox(ctx, "a", t0, t0.Add(time.Minute), 1); err != nil || len(got) != 1 || got[0].Attempt != 1 {
		t.Fatalf("first claim: %v, %v", got, err)
	}
	retryAt := t0.Add(time.Minute)
	if err := s.FailOutbox(ctx, "run_1", "a", retryAt, "boom"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ClaimOutbox(ctx, "b", retryAt, retryAt.Add(time.Minute), 1); err != nil || len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("claim at the retry time: %v, %v", got, err)
	}
	// Not b's to give back: nothing changes.
	if err := s.ReleaseOutbox(ctx, "run_1", "a"); err != nil {
		t.Fatal(err)
	}
	if st := h.Inspect(t, s, "run_1"); st.LockedBy != "b" || st.Attempts != 2 {
		t.Fatalf("after a release by a worker that does not hold the item: %+v", st)
	}
	if err := s.ReleaseOutbox(ctx, "run_1", "b"); err != nil {
		t.Fatal(err)
	}
	if st := h.Inspect(t, s, "run_1"); st.LockedBy != "" || st.Attempts != 1 || st.LastError != "boom" || st.Processed {
		t.Fatalf("after b gave it back: %+v, want unlocked, 1 attempt, last error boom", st)
	}
	// Due at once, well inside b's lease, under the attempt number b had.
	at := retryAt.Add(time.Second)
	got, err := s.ClaimOutbox(ctx, "c", at, at.Add(time.Minute), 1)
	if err != nil || len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("claim after the release: %v, %v; want the item at attempt 2", got, err)
	}
	if err := s.CompleteOutbox(ctx, "run_1", at); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseOutbox(ctx, "run_1", "c"); err != nil {
		t.Fatal(err)
	}
	if st := h.Inspect(t, s, "run_1"); !st.Processed || st.Attempts != 2 {
		t.Fatalf("a release after completion changed the item: %+v", st)
	}
}

// testWorkerStopGivesBackTheAttempt: a Worker stopped while the app's
// function runs gives the item back without counting the attempt, and one
// stopped between its claim and the function's start gives it back without
// running it; either way the item's next claim is its first attempt again.
func testWorkerStopGivesBackTheAttempt(t *testing.T, h Harness) {
	s, _ := h.New(t)
	mustAccept(t, s, "run_1")
	newWorker := func(o receiver.Outbox, process receiver.ProcessFunc) *receiver.Worker {
		t.Helper()
		w, err := receiver.NewWorker(receiver.WorkerConfig{Outbox: o, Process: process, Logger: discardLogger(), PollInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}

	// Stopped mid-run: the function sees ctx end and returns its error.
	started := make(chan struct{})
	w := newWorker(s, func(ctx context.Context, _ string, _ []byte) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- w.Run(ctx) }()
	<-started
	cancel()
	if err := <-stopped; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if st := h.Inspect(t, s, "run_1"); st.Attempts != 0 || st.LockedBy != "" || st.Processed {
		t.Fatalf("after a stop mid-run: %+v, want 0 attempts and unlocked", st)
	}

	// Stopped once the claim committed: the function never starts.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	ran := false
	w = newWorker(cancelOnClaim{Outbox: s, cancel: cancel}, func(context.Context, string, []byte) error {
		ran = true
		return nil
	})
	if n, err := w.ProcessBatch(ctx); n != 1 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if st := h.Inspect(t, s, "run_1"); ran || st.Attempts != 0 || st.LockedBy != "" || st.Processed {
		t.Fatalf("after a stop during the claim: ran %v, %+v; want not run, 0 attempts, unlocked", ran, st)
	}

	// The next worker runs it as its first attempt.
	w = newWorker(s, func(context.Context, string, []byte) error { return nil })
	if n, err := w.ProcessBatch(context.Background()); n != 1 || err != nil {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if st := h.Inspect(t, s, "run_1"); st.Attempts != 1 || !st.Processed {
		t.Fatalf("after the run that completed it: %+v, want 1 attempt, processed", st)
	}
}

// cancelOnClaim cancels the worker's context once its claim has committed:
// a stop that comes between the claim and the run.
type cancelOnClaim struct {
	receiver.Outbox
	cancel context.CancelFunc
}

func (o cancelOnClaim) ClaimOutbox(ctx context.Context, worker string, now, leaseUntil time.Time, limit int) ([]receiver.OutboxItem, error) {
	items, err := o.Outbox.ClaimOutbox(ctx, worker, now, leaseUntil, limit)
	o.cancel()
	return items, err
}

func canonical(it receiver.OutboxItem) []byte {
	var got []byte
	w, _ := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:  staticOutbox{it},
		Process: func(_ context.Context, _ string, p []byte) error { got = p; return nil },
		Logger:  discardLogger(),
	})
	w.ProcessBatch(context.Background())
	return got
}

// staticOutbox hands out one item, to observe what the Worker passes on.
type staticOutbox struct{ it receiver.OutboxItem }

func (o staticOutbox) ClaimOutbox(context.Context, string, time.Time, time.Time, int) ([]receiver.OutboxItem, error) {
	return []receiver.OutboxItem{o.it}, nil
}
func (staticOutbox) CompleteOutbox(context.Context, string, time.Time) error { return nil }
func (staticOutbox) FailOutbox(context.Context, string, string, time.Time, string) error {
	return nil
}
func (staticOutbox) ReleaseOutbox(context.Context, string, string) error { return nil }

func testWorkerRetries(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	clock := NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	mustAccept(t, s, "run_flaky")
	var calls atomic.Int32
	var payload []byte
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:  s,
		Now:     clock.Now,
		Backoff: func(attempt int) time.Duration { return time.Duration(attempt) * time.Minute },
		Logger:  discardLogger(),
		Process: func(ctx context.Context, runID string, p []byte) error {
			if calls.Add(1) < 3 {
				return errors.New("downstream unavailable")
			}
			payload = p
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	batch := func(want int) {
		t.Helper()
		if n, err := w.ProcessBatch(ctx); err != nil || n != want {
			t.Fatalf("ProcessBatch = %d, %v; want %d", n, err, want)
		}
	}
	batch(1) // attempt 1 fails: retry after 1 min
	if st := h.Inspect(t, s, "run_flaky"); st.LastError != "downstream unavailable" || st.Processed {
		t.Fatalf("after a failure: %+v", st)
	}
	clock.Add(59 * time.Second)
	batch(0)
	clock.Add(time.Second)
	batch(1) // attempt 2 fails: retry after 2 min
	clock.Add(119 * time.Second)
	batch(0)
	clock.Add(time.Second)
	batch(1) // attempt 3 succeeds
	st := h.Inspect(t, s, "run_flaky")
	if !st.Processed || !st.RunProcessed || st.Attempts != 3 || st.LastError != "" {
		t.Fatalf("after success: %+v", st)
	}
	if string(payload) != string(Body("run_flaky")) {
		t.Fatalf("payload = %s, want the exact delivery body", payload)
	}
	clock.Add(time.Hour)
	batch(0)
}

// Workers in one process share the outbox; without failures each item runs
// exactly once.
func testConcurrentWorkers(t *testing.T, h Harness) {
	s, _ := h.New(t)
	const items, workers = 40, 4
	for i := range items {
		mustAccept(t, s, fmt.Sprintf("run_%02d", i))
	}
	var mu sync.Mutex
	seen := map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range workers {
		w, err := receiver.NewWorker(receiver.WorkerConfig{
			Outbox:       s,
			ID:           fmt.Sprintf("w%d", i),
			Concurrency:  3,
			PollInterval: 10 * time.Millisecond,
			Logger:       discardLogger(),
			Process: func(ctx context.Context, runID string, _ []byte) error {
				mu.Lock()
				defer mu.Unlock()
				seen[runID]++
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { w.Run(ctx) })
	}
	Eventually(t, 30*time.Second, "all items processed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == items
	})
	cancel()
	wg.Wait()
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s processed %d times", id, n)
		}
	}
	for i := range items {
		if st := h.Inspect(t, s, fmt.Sprintf("run_%02d", i)); !st.Processed {
			t.Errorf("run_%02d not marked processed: %+v", i, st)
		}
	}
}

func testRetention(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	now := time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	old := now.Add(-100 * 24 * time.Hour)
	for i := range 5 {
		id := fmt.Sprintf("run_old%d", i)
		mustAccept(t, s, id)
		if err := s.CompleteOutbox(ctx, id, old); err != nil {
			t.Fatal(err)
		}
	}
	mustAccept(t, s, "run_recent")
	if err := s.CompleteOutbox(ctx, "run_recent", now.Add(-89*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	mustAccept(t, s, "run_pending") // never processed: kept whatever its age

	// An acceptance record with a processed item still present must survive
	// the runs pass (outbox first).
	if n, err := s.DeleteProcessedRuns(ctx, now, 100); err != nil || n != 0 {
		t.Fatalf("DeleteProcessedRuns before the outbox pass = %d, %v; want 0", n, err)
	}

	r, err := receiver.NewRetention(receiver.RetentionConfig{Store: s, BatchSize: 2, Now: func() time.Time { return now }, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	outbox, runs, err := r.RunOnce(ctx)
	if err != nil || outbox != 5 || runs != 5 {
		t.Fatalf("RunOnce = %d, %d, %v; want 5, 5", outbox, runs, err)
	}
	for i := range 5 {
		if st := h.Inspect(t, s, fmt.Sprintf("run_old%d", i)); st.Accepted || st.Items != 0 {
			t.Fatalf("old run %d kept: %+v", i, st)
		}
	}
	if st := h.Inspect(t, s, "run_recent"); !st.Accepted || st.Items != 1 {
		t.Fatalf("recent run: %+v", st)
	}
	if st := h.Inspect(t, s, "run_pending"); !st.Accepted || st.Items != 1 {
		t.Fatalf("pending run: %+v", st)
	}
	if outbox, runs, err := r.RunOnce(ctx); err != nil || outbox+runs != 0 {
		t.Fatalf("second RunOnce = %d, %d, %v", outbox, runs, err)
	}
}

// testRetentionLimitNotPositive: a delete of fewer than one row is refused
// with an error and deletes nothing, on every store alike (SQLite reads a
// negative LIMIT as no limit).
func testRetentionLimitNotPositive(t *testing.T, h Harness) {
	s, _ := h.New(t)
	ctx := context.Background()
	now := time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	for _, id := range []string{"run_1", "run_2"} {
		mustAccept(t, s, id)
		if err := s.CompleteOutbox(ctx, id, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	deletes := []struct {
		name string
		del  func(context.Context, time.Time, int) (int, error)
	}{{"DeleteProcessedOutbox", s.DeleteProcessedOutbox}, {"DeleteProcessedRuns", s.DeleteProcessedRuns}}
	for i, d := range deletes {
		if i == 1 {
			// The runs pass deletes only runs without an item: leave none.
			if n, err := s.DeleteProcessedOutbox(ctx, now, 10); err != nil || n != 2 {
				t.Fatalf("DeleteProcessedOutbox(limit 10) = %d, %v; want 2", n, err)
			}
		}
		before := map[string]ItemState{}
		for _, id := range []string{"run_1", "run_2"} {
			before[id] = h.Inspect(t, s, id)
		}
		for _, limit := range []int{0, -1, -1 << 62} {
			n, err := d.del(ctx, now, limit)
			if err == nil || n != 0 || !strings.Contains(err.Error(), "limit") {
				t.Fatalf("%s(limit %d) = %d, %v; want 0 and an error that names the limit", d.name, limit, n, err)
			}
			for id, want := range before {
				if st := h.Inspect(t, s, id); st != want {
					t.Fatalf("%s after %s(limit %d): %+v, was %+v", id, d.name, limit, st, want)
				}
			}
		}
	}
	if n, err := s.DeleteProcessedRuns(ctx, now, 10); err != nil || n != 2 {
		t.Fatalf("DeleteProcessedRuns(limit 10) = %d, %v; want 2", n, err)
	}
}

// A child process commits the acceptance and SIGKILLs itself before
// answering; the platform's retry must get the same answer and no second item.
func testCrashAfterCommit(t *testing.T, h Harness) {
	s, dsn := h.New(t)
	c := startChild(t, "accept-then-die", dsn)
	url := c.next(t, "listening ", 60*time.Second)
	body := Body("run_crash")
	resp, err := http.DefaultClient.Do(NewRequest(t, url, Secret, body, time.Now()))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("the dying child answered %d", resp.StatusCode)
	}
	werr := c.cmd.Wait()
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", werr)
	}
	if st := h.Inspect(t, s, "run_crash"); !st.Accepted || st.Items != 1 {
		t.Fatalf("after the crash: %+v", st)
	}

	srv := serveHandler(t, s)
	resp, err = srv.Client().Do(NewRequest(t, srv.URL, Secret, body, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != receiver.AcceptedStatus || got != receiver.AcceptedBody {
		t.Fatalf("retry answered %d %q", resp.StatusCode, got)
	}
	if n := h.CountItems(t, s); n != 1 {
		t.Fatalf("outbox has %d items after the retry, want 1", n)
	}
}

// Two worker processes: A claims an item and is killed while running it; B
// processes everything else and, once A's lease has ended, A's item too.
func testWorkerKilled(t *testing.T, h Harness) {
	s, dsn := h.New(t)
	const items = 8
	const lease = time.Second
	for i := range items {
		mustAccept(t, s, fmt.Sprintf("run_k%d", i))
	}
	a := startChild(t, "worker", dsn, envID+"=A", envLease+"="+lease.String(), envHang+"=1")
	stuck := a.next(t, "start ", 60*time.Second)
	claimedByA := time.Now()

	b := startChild(t, "worker", dsn, envID+"=B", envLease+"="+lease.String())
	a.cmd.Process.Signal(syscall.SIGKILL)
	a.cmd.Wait()

	done := map[string]bool{}
	var tookOverAt time.Time
	for len(done) < items {
		select {
		case line, ok := <-b.lines:
			if !ok {
				t.Fatalf("worker B exited; done so far: %v", done)
			}
			if id, found := strings.CutPrefix(line, "start "); found && id == stuck && tookOverAt.IsZero() {
				tookOverAt = time.Now()
			}
			if id, found := strings.CutPrefix(line, "done "); found {
				done[id] = true
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("timed out; B processed %v", done)
		}
	}
	if d := tookOverAt.Sub(claimedByA); d < lease/2 {
		t.Errorf("B took over %s %v after A claimed it, before A's %v lease could end", stuck, d, lease)
	}
	Eventually(t, 30*time.Second, "every item marked processed", func() bool {
		for i := range items {
			if !h.Inspect(t, s, fmt.Sprintf("run_k%d", i)).Processed {
				return false
			}
		}
		return true
	})
	if st := h.Inspect(t, s, stuck); st.Attempts != 2 {
		t.Errorf("%s: %+v, want 2 attempts (A's and B's)", stuck, st)
	}
}
