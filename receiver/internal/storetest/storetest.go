// Package storetest is the conformance suite of the receiver SDK's stores: the
// same tests, including the ones that kill child processes, run against every
// store. A store's test package calls RunChild from TestMain and Run from a
// test.
package storetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
)

// Store is everything a receiver store implements.
type Store interface {
	receiver.Store
	receiver.Outbox
	receiver.RetentionStore
}

// CheckUnconfigured calls every method of s, a store made without its
// database (a zero Store, a nil *Store), and fails t unless each answers an
// error that contains want, never a nil pointer panic (which the Handler
// would turn into a dropped connection and the Worker into a crashed app).
// name tells which store it is in the messages.
func CheckUnconfigured(t *testing.T, name string, s interface {
	Store
	Migrate(context.Context) error
}, want string) {
	t.Helper()
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	calls := map[string]func() error{
		"Migrate": func() error { return s.Migrate(ctx) },
		"Accept": func() error {
			_, _, err := s.Accept(ctx, "run_1", Body("run_1"))
			return err
		},
		"ClaimOutbox": func() error {
			_, err := s.ClaimOutbox(ctx, "a", now, now.Add(time.Minute), 1)
			return err
		},
		"CompleteOutbox": func() error { return s.CompleteOutbox(ctx, "run_1", now) },
		"FailOutbox":     func() error { return s.FailOutbox(ctx, "run_1", "a", now, "boom") },
		"ReleaseOutbox":  func() error { return s.ReleaseOutbox(ctx, "run_1", "a") },
		"DeleteProcessedOutbox": func() error {
			_, err := s.DeleteProcessedOutbox(ctx, now, 1)
			return err
		},
		"DeleteProcessedRuns": func() error {
			_, err := s.DeleteProcessedRuns(ctx, now, 1)
			return err
		},
	}
	for call, f := range calls {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s store: %s panicked: %v", name, call, r)
				}
			}()
			if err := f(); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s store: %s = %v; want an error that says %q", name, call, err, want)
			}
		}()
	}
}

// ItemState is what the suite reads of a run's rows.
type ItemState struct {
	Accepted     bool // an accepted_runs row exists
	RunProcessed bool // accepted_runs.processed_at is set
	Items        int  // job_outbox rows of the run
	Attempts     int
	Processed    bool
	LockedBy     string
	LastError    string
}

// Harness adapts one store to the suite.
type Harness struct {
	// New returns an empty, migrated store that the test owns, and the DSN
	// with which a child process opens the same database with Open.
	New func(t *testing.T) (Store, string)
	// Open opens the store at dsn; it runs in child processes.
	Open func(ctx context.Context, dsn string) (Store, func(), error)
	// Inspect reads the rows of runID.
	Inspect func(t *testing.T, s Store, runID string) ItemState
	// CountItems returns the number of job_outbox rows.
	CountItems func(t *testing.T, s Store) int
	// Exec runs a statement on the store's database.
	Exec func(t *testing.T, s Store, statement string)
}

// Secret is the suite's job secret (the contract's public test value).
const Secret = "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"

// Body returns a valid delivery body for runID.
func Body(runID string) []byte {
	return contract.Body(contract.Payload{
		JobID:        "job_digest",
		RunID:        runID,
		ScheduledFor: time.Date(2026, 10, 9, 9, 0, 0, 0, time.UTC),
		Attempt:      1,
		Trigger:      contract.TriggerSchedule,
	})
}

// NewRequest returns a signed delivery of body to url, signed at now.
func NewRequest(t testing.TB, url, secret string, body []byte, now time.Time) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contract.ContentType)
	req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
	req.Header.Set(contract.HeaderSignature, contract.Sign(secret, now.Unix(), body))
	return req
}

// Clock is a settable clock for tests.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Eventually polls cond until it holds or the deadline passes.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		<-tick.C
	}
}

func mustAccept(t *testing.T, s Store, runID string) {
	t.Helper()
	status, body, err := s.Accept(context.Background(), runID, Body(runID))
	if err != nil || status != receiver.AcceptedStatus || string(body) != receiver.AcceptedBody {
		t.Fatalf("Accept(%s) = %d %q %v", runID, status, body, err)
	}
}

// Child process plumbing: the test binary re-executes itself with these
// variables set, and TestMain hands over to RunChild.
const (
	envRole  = "VIBEJOBS_RECEIVER_CHILD"
	envDSN   = "VIBEJOBS_RECEIVER_CHILD_DSN"
	envHang  = "VIBEJOBS_RECEIVER_CHILD_HANG"
	envLease = "VIBEJOBS_RECEIVER_CHILD_LEASE"
	envID    = "VIBEJOBS_RECEIVER_CHILD_ID"
)

// child is a running child process of the test binary.
type child struct {
	cmd   *exec.Cmd
	lines chan string // stdout lines; closed at EOF
}

func startChild(t *testing.T, role, dsn string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role, envDSN+"="+dsn)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 1000)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// next returns the next stdout line with prefix, failing after within.
func (c *child) next(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q", prefix)
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return rest
			}
		case <-timeout:
			t.Fatalf("child did not print %q within %v", prefix, within)
		}
	}
}

// RunChild runs the child role named in the environment and exits; without one
// it returns at once. Call it first thing in TestMain.
func RunChild(h Harness) {
	role := os.Getenv(envRole)
	if role == "" {
		return
	}
	ctx := context.Background()
	s, closeStore, err := h.Open(ctx, os.Getenv(envDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		os.Exit(2)
	}
	defer closeStore()
	switch role {
	case "accept-then-die":
		err = childAcceptThenDie(s)
	case "worker":
		err = childWorker(ctx, s)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	fmt.Fprintln(os.Stderr, "child:", err)
	os.Exit(3)
}

// dieAfterCommit kills its own process with SIGKILL as soon as the inner
// store's Accept has returned, i.e. after COMMIT and before any response byte.
type dieAfterCommit struct{ Store }

func (d dieAfterCommit) Accept(ctx context.Context, runID string, payload []byte) (int, []byte, error) {
	status, body, err := d.Store.Accept(ctx, runID, payload)
	if err == nil {
		killSelf()
	}
	return status, body, err
}

func childAcceptThenDie(s Store) error {
	v, err := receiver.NewVerifier(receiver.Secrets{Current: Secret}, nil)
	if err != nil {
		return err
	}
	h, err := receiver.NewHandler(receiver.Config{Verifier: v, Logger: discardLogger()}, dieAfterCommit{s})
	if err != nil {
		return err
	}
	srv := httptest.NewServer(h)
	fmt.Println("listening", srv.URL)
	select {} // until killed
}

func childWorker(ctx context.Context, s Store) error {
	lease, err := time.ParseDuration(os.Getenv(envLease))
	if err != nil {
		return err
	}
	hang := os.Getenv(envHang) == "1"
	var mu sync.Mutex // one stdout line at a time
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	w, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:       s,
		ID:           os.Getenv(envID),
		Lease:        lease,
		PollInterval: 20 * time.Millisecond,
		Logger:       discardLogger(),
		Process: func(ctx context.Context, runID string, payload []byte) error {
			say("start %s", runID)
			if hang {
				select {} // stuck until killed, deaf to ctx like a wedged process
			}
			say("done %s", runID)
			return nil
		},
	})
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

func readAll(r io.Reader) string {
	b, _ := io.ReadAll(r)
	return string(b)
}
