package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// holdingReceiver answers 200 at once, except the first delivery it
// gets, which it answers only when release is called. It counts the
// deliveries of each run.
type holdingReceiver struct {
	*receiver
	held    chan struct{} // closed when the first delivery arrived
	release func()
}

func newHoldingReceiver(t *testing.T) *holdingReceiver {
	t.Helper()
	h := &holdingReceiver{held: make(chan struct{})}
	gate := make(chan struct{})
	var first, released sync.Once
	h.release = func() { released.Do(func() { close(gate) }) }
	h.receiver = newReceiver(t, func(x received) int {
		hold := false
		first.Do(func() { hold = true })
		if hold {
			close(h.held)
			<-gate
		}
		return 200
	})
	t.Cleanup(h.release) // before the server's Close, which waits for it
	return h
}

// count returns how many deliveries of run id arrived.
func (h *holdingReceiver) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, x := range h.reqs {
		if runIDOf(x.Body) == id {
			n++
		}
	}
	return n
}

// waitHeld waits until the held delivery arrived.
func (h *holdingReceiver) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-h.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the held delivery never arrived")
	}
}

// waitStopping waits until r logged that its stop began, then checks that
// /readyz answers 503 stopping and closes its connection: the listener
// stays open while the deliveries end, so a load balancer's probe learns
// why rather than finding the port closed.
func (r *replica) waitStopping(t *testing.T) {
	t.Helper()
	r.waitLog(t, "msg=server.stopping")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(r.api.base + "/readyz")
	if err != nil {
		t.Fatalf("/readyz once the stop began: %v; want 503 stopping", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"code":"stopping"`) || !resp.Close {
		t.Fatalf("/readyz once the stop began: %d %s (connection closed: %v); want 503 stopping, closing its connection",
			resp.StatusCode, body, resp.Close)
	}
}

// manualRun triggers a run of job and returns its id.
func manualRun(t *testing.T, api apiClient, jobID string) string {
	t.Helper()
	code, run := api.do("POST", "/v1/jobs/"+jobID+"/runs", nil)
	if code != 202 {
		t.Fatalf("trigger: %d %v", code, run)
	}
	return run["id"].(string)
}

// heldJob creates on r a job to rc with a 30 s timeout whose schedule is
// not due for months (its runs are manual), and returns its id.
func heldJob(t *testing.T, r *replica, rc *holdingReceiver, name string) string {
	t.Helper()
	code, job := r.api.do("POST", "/v1/jobs", map[string]any{
		"name": name, "schedule": "0 0 1 1 *", "url": rc.URL, "timeout": "30s",
	})
	if code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	return job["id"].(string)
}

// stopWithAttemptHeld starts a run of a new job of r and, while rc holds
// its attempt, sends r sig and waits until r logged that its stop began.
// It returns the run's id. r is killed at the test's end, before rc lets
// the attempt go, so that a failing test leaves no server behind.
func stopWithAttemptHeld(t *testing.T, r *replica, rc *holdingReceiver, sig syscall.Signal) string {
	t.Helper()
	run := manualRun(t, r.api, heldJob(t, r, rc, "held"))
	rc.waitHeld(t)
	t.Cleanup(func() { _ = r.cmd.Process.Kill() })
	if err := r.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	r.waitStopping(t)
	return run
}

// releaseAndWaitExit lets rc answer the attempt it holds and waits for r,
// told to stop, to exit 0 within 20 s.
func releaseAndWaitExit(t *testing.T, r *replica, rc *holdingReceiver) {
	t.Helper()
	rc.release()
	select {
	case <-r.exited:
		if r.err != nil {
			t.Fatalf("the server exited with %v after SIGTERM; want 0", r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the server did not exit within 20 s of its last attempt's answer")
	}
}

// reopenSQLite opens the SQLite database a stopped server left in
// dataDir, closed at the test's end.
func reopenSQLite(t *testing.T, dataDir string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(dataDir, "vibejobs.db"), sqlite.Options{Logger: discardLogger()})
	if err != nil {
		t.Fatalf("reopening the database: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSIGTERMFinishesAttemptsAndGivesBackTheRest: a server told to stop
// (SIGTERM) with an attempt in flight and another run of the same host
// claimed and waiting for its slot (--per-host 1) answers /readyz 503
// stopping at once, waits for the attempt's answer and records it, exits 0 and
// leaves its database closed (SQLite: no write-ahead log left). The next
// start opens it; every run is delivered once, as its first attempt.
// (Which way the waiting run goes depends on when the answer comes: see
// below. The dispatcher's tests pin each.) On both stores.
func TestSIGTERMFinishesAttemptsAndGivesBackTheRest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			dataDir := t.TempDir()
			database := ""
			var st vibejobs.Store
			if store == "postgres" {
				url, pg := pgReplicaURL(t, "")
				database, st = url, pg
			}
			rc := newHoldingReceiver(t)
			r := startReplica(t, dataDir, database, "VIBEJOBS_PER_HOST=1")
			jobID := heldJob(t, r, rc, "stop")
			// The receiver holds the first run's attempt; the second run,
			// for the same host, waits for its slot.
			first := manualRun(t, r.api, jobID)
			rc.waitHeld(t)
			second := manualRun(t, r.api, jobID)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if _, got := r.api.do("GET", "/v1/runs/"+second, nil); got["state"] == "delivering" {
					break // claimed, waiting for the host's one slot
				}
				if time.Now().After(deadline) {
					t.Fatal("the second run was never claimed")
				}
			}
			t.Cleanup(func() { _ = r.cmd.Process.Kill() }) // on failure: before the receiver's release
			if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			r.waitStopping(t)
			releaseAndWaitExit(t, r, rc)
			if store == "sqlite" {
				for _, suffix := range []string{"-wal", "-shm"} {
					if _, err := os.Stat(filepath.Join(dataDir, "vibejobs.db"+suffix)); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("vibejobs.db%s left behind (%v): the database was not closed", suffix, err)
					}
				}
				st = reopenSQLite(t, dataDir)
			}
			projectID := projectOf(t, st)
			got1, err := st.GetRun(context.Background(), projectID, first)
			if err != nil || got1.State != vibejobs.RunSucceeded || len(got1.Attempts) != 1 || got1.Attempts[0].StatusCode != 200 {
				t.Fatalf("the run in flight at SIGTERM: %+v, %v; want succeeded with its one attempt", got1, err)
			}
			// The waiting run was given back unsent, or, when the first
			// answer came before the dispatcher stopped (the signal and
			// the answer race), it had the slot and went out: either way
			// once, and nothing is left in flight.
			got2, err := st.GetRun(context.Background(), projectID, second)
			switch {
			case err != nil:
				t.Fatal(err)
			case got2.State == vibejobs.RunScheduled && len(got2.Attempts) == 0 && rc.count(second) == 0:
				t.Log("the waiting run was given back unsent")
			case got2.State == vibejobs.RunSucceeded && len(got2.Attempts) == 1 && rc.count(second) == 1:
				t.Log("the waiting run took the slot before the dispatcher stopped")
			default:
				t.Fatalf("the run waiting for its host at SIGTERM: %s with %d attempts, %d deliveries; want scheduled and unsent, or succeeded and sent once",
					got2.State, len(got2.Attempts), rc.count(second))
			}

			// The next start delivers the second run (if it was given
			// back), once, as attempt 1.
			r2 := startReplica(t, dataDir, database)
			got := waitRunState(t, r2.api, second, "succeeded")
			atts := got["attempts"].([]any)
			if len(atts) != 1 || atts[0].(map[string]any)["number"].(float64) != 1 {
				t.Fatalf("the run waiting at SIGTERM: attempts %v; want its first, once", atts)
			}
			if n, m := rc.count(first), rc.count(second); n != 1 || m != 1 {
				t.Fatalf("deliveries: %d of the run in flight, %d of the one waiting; want 1 each", n, m)
			}
		})
	}
}

// TestStopServesUntilTheDeliveriesEnd: from SIGTERM until its attempt in
// flight has its answer, recorded, a server answers /readyz with 503
// stopping and keeps answering /healthz and the API; then it closes its
// listener and exits 0. It closed its listener first: /readyz refused the
// connection instead of saying why, and requests sent before a load
// balancer noticed failed, for up to a job's timeout while the deliveries
// went on.
func TestStopServesUntilTheDeliveriesEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	dataDir := t.TempDir()
	rc := newHoldingReceiver(t)
	r := startReplica(t, dataDir, "")
	run := stopWithAttemptHeld(t, r, rc, syscall.SIGTERM)
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(r.api.base + "/healthz")
	if err != nil {
		t.Fatalf("/healthz while the stop waits for an attempt: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/healthz while the stop waits for an attempt: %d, want 200", resp.StatusCode)
	}
	// The API answers, with the run still delivering: its attempt waits
	// for the receiver.
	if code, got := r.api.do("GET", "/v1/runs/"+run, nil); code != 200 || got["state"] != "delivering" {
		t.Fatalf("GET the run while the stop waits for its attempt: %d %v; want 200, delivering", code, got)
	}
	r.waitStopping(t) // a second probe
	releaseAndWaitExit(t, r, rc)
	s := reopenSQLite(t, dataDir)
	got, err := s.GetRun(context.Background(), projectOf(t, s), run)
	if err != nil || got.State != vibejobs.RunSucceeded || len(got.Attempts) != 1 {
		t.Fatalf("the run in flight at SIGTERM: %+v, %v; want succeeded, its attempt recorded", got, err)
	}
	// The stop is logged once; the probes that it answered, at debug, not
	// at the info level the server runs at.
	r.log.mu.Lock()
	logs := r.log.text.String()
	r.log.mu.Unlock()
	_, stop, _ := strings.Cut(logs, "msg=server.stopping")
	if n := strings.Count(logs, "msg=server.stopping"); n != 1 || strings.Contains(stop, `route="GET /readyz"`) {
		t.Errorf("the stop logged %d times, and /readyz after it as:\n%s\nwant the stop once and no probe", n, stop)
	}
}

// TestSecondSignalStopsAtOnce: a second SIGTERM or SIGINT, while the first
// one's stop waits for an attempt in flight (up to its job's timeout), ends
// the process at once; it was ignored, and only SIGKILL stopped a server
// whose stop an operator did not want to wait for. The attempt cut off is
// left in flight in the database, for lease recovery to send again under
// the same number, as after a crash. Also for a server started with SIGINT
// ignored (as a shell starts a command run with &): the runtime gave the
// ignore back after the first SIGINT, so the second was dropped (the test
// binary itself run that way hung here).
func TestSecondSignalStopsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		env  []string
	}{
		{"SIGTERM", syscall.SIGTERM, nil},
		{"SIGINT", syscall.SIGINT, nil},
		{"SIGINT ignored at start", syscall.SIGINT, []string{"VIBEJOBS_E2E_SIGINT=ignored"}},
	} {
		sig := tc.sig
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			rc := newHoldingReceiver(t)
			r := startReplica(t, dataDir, "", tc.env...)
			run := stopWithAttemptHeld(t, r, rc, sig)
			if err := r.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-r.exited:
				var ee *exec.ExitError
				if !errors.As(r.err, &ee) {
					t.Fatalf("exit after a second %v: %v", sig, r.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("still running 10 s after a second %v, its attempt in flight", sig)
			}
			s := reopenSQLite(t, dataDir)
			got, err := s.GetRun(context.Background(), projectOf(t, s), run)
			if err != nil || got.State != vibejobs.RunDelivering || len(got.Attempts) != 0 {
				t.Fatalf("the run cut off: %+v, %v; want delivering, for lease recovery", got, err)
			}
		})
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestStopCutsARequestThatOutlastsTheDrain: a client that holds an API
// request open (its body never comes) does not make the stop fail: once
// the drain's time is up its connection is closed and Close reports no
// error. It returned "context deadline exceeded", so serve printed that
// and exited 1 after every SIGTERM such a client was around for (a unit
// that systemd then lists as failed), with the request's handler still
// running on a database being closed.
func TestStopCutsARequestThatOutlastsTheDrain(t *testing.T) {
	m, api := startMain(t, t.TempDir())
	m.Config.DrainTimeout = 100 * time.Millisecond
	conn, err := net.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Expect: 100-continue: the server's "100 Continue" says the handler
	// is reading the body, which never comes.
	fmt.Fprintf(conn, "POST /v1/jobs HTTP/1.1\r\nHost: vibejobs\r\nAuthorization: Bearer %s\r\nIdempotency-Key: held-open\r\n"+
		"Content-Type: application/json\r\nContent-Length: 64\r\nExpect: 100-continue\r\n\r\n", api.token)
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("the server did not start reading the request: %q, %v", line, err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close with a request held open past the drain: %v", err)
	}
	// Its connection was closed, not left to the handler.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(br); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the held request's connection: %v; want it closed", err)
	}
}

// stuckHandler holds each request to /stuck, once its connection is cut,
// until release is closed, then pings the store and sends the result on
// pinged. entered is closed when the request arrived.
type stuckHandler struct {
	entered, release chan struct{}
	pinged           chan error
}

func newStuckHandler() *stuckHandler {
	return &stuckHandler{entered: make(chan struct{}), release: make(chan struct{}), pinged: make(chan error, 1)}
}

func (s *stuckHandler) wrap(m *Main) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/stuck" {
				h.ServeHTTP(w, r)
				return
			}
			close(s.entered)
			<-r.Context().Done() // the drain's time is up: its connection is cut
			<-s.release
			s.pinged <- m.Store().Ping(context.Background())
		})
	}
}

// startStuck starts a server, HandlerExitTimeout exit, with a request to
// /stuck held in s, and returns it and what it logs.
func startStuck(t *testing.T, s *stuckHandler, exit time.Duration) (*Main, *logWatch) {
	t.Helper()
	logs := newLogWatch()
	m := NewMain(io.Discard, logs)
	m.Config = testConfig(t.TempDir())
	m.Config.DrainTimeout = 100 * time.Millisecond
	m.Config.HandlerExitTimeout = exit
	m.wrapHandler = s.wrap(m)
	if err := m.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	conn, err := net.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprint(conn, "GET /stuck HTTP/1.1\r\nHost: vibejobs\r\n\r\n")
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached its handler")
	}
	return m, logs
}

// waitLogOrDone waits until logs hold s, or done is closed, for up to 10 s;
// it reports whether the log came first.
func waitLogOrDone(t *testing.T, logs *logWatch, s string, done <-chan struct{}) bool {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		logs.mu.Lock()
		found, grew := strings.Contains(logs.text.String(), s), logs.grew
		logs.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-grew:
		case <-done:
			return false
		case <-timeout:
			t.Fatalf("neither %q was logged nor did Close return within 10 s", s)
		}
	}
}

// TestStopWaitsForHandlersBeforeClosingTheDatabase: a handler still
// running when the drain's time is up, its connection cut, still finds
// the database open: Close waits for it before closing the database. Close
// cut the connection and closed the database at once, so such a handler
// on its way out (an API request freeing its idempotency key after its
// effect failed) had its store calls fail, and the key stayed claimed.
func TestStopWaitsForHandlersBeforeClosingTheDatabase(t *testing.T) {
	s := newStuckHandler()
	m, logs := startStuck(t, s, 0)
	closed := make(chan error, 1)
	done := make(chan struct{})
	go func() { closed <- m.Close(); close(done) }()
	if !waitLogOrDone(t, logs, "msg=http.handlers_running", done) {
		t.Error("Close returned while a handler still ran")
	}
	close(s.release)
	if err := <-s.pinged; err != nil {
		t.Errorf("the handler still running at the drain's end found the database closed: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestStopWaitForHandlersIsBounded: a handler that outlasts
// HandlerExitTimeout does not hold up the stop: Close logs it and closes
// the database; the handler's store calls then fail, and nothing panics.
func TestStopWaitForHandlersIsBounded(t *testing.T) {
	s := newStuckHandler()
	m, logs := startStuck(t, s, 50*time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waits 10 s for a handler that does not return")
	}
	logs.mu.Lock()
	text := logs.text.String()
	logs.mu.Unlock()
	if !strings.Contains(text, "msg=http.handlers_abandoned handlers=1") {
		t.Errorf("the log does not say a handler was left running:\n%s", text)
	}
	close(s.release)
	select {
	case err := <-s.pinged:
		if err == nil {
			t.Error("the handler left running pinged a database Close had closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler left running never got an answer from the closed store")
	}
}
