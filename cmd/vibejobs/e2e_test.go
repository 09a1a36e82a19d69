package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/contract"
)

// TestMain lets the crash test re-execute this binary as a real server process.
func TestMain(m *testing.M) {
	if os.Getenv("VIBEJOBS_E2E_CHILD") == "serve" {
		if os.Getenv("VIBEJOBS_E2E_SIGINT") == "ignored" {
			// As a shell starts a command run with &: SIG_IGN, which
			// the runtime keeps for SIGINT until it is asked for it.
			signal.Ignore(os.Interrupt)
		}
		ctx, stop := signalContext()
		defer stop()
		os.Exit(run(ctx, []string{"serve"}, os.Getenv, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// received is one request as the receiver saw it.
type received struct {
	Header http.Header
	Body   []byte
	At     time.Time
}

// receiver is a loopback app whose answers the test scripts.
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []received
	got     chan received
	respond func(r received) int
}

func newReceiver(t *testing.T, respond func(received) int) *receiver {
	t.Helper()
	rc := &receiver{got: make(chan received, 100), respond: respond}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		x := received{Header: r.Header.Clone(), Body: body, At: time.Now()}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, x)
		rc.mu.Unlock()
		code := 200
		if rc.respond != nil {
			code = rc.respond(x)
		}
		rc.got <- x
		w.WriteHeader(code)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// next waits for the next request, failing the test after d.
func (rc *receiver) next(t *testing.T, d time.Duration) received {
	t.Helper()
	select {
	case x := <-rc.got:
		return x
	case <-time.After(d):
		t.Fatalf("no delivery within %v", d)
		return received{}
	}
}

type apiClient struct {
	t     *testing.T
	base  string
	token string
}

// do sends a request; POSTs carry a fresh Idempotency-Key.
func (c apiClient) do(method, path string, body any) (int, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, rd)
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	if method == http.MethodPost {
		var k [12]byte
		_, _ = rand.Read(k[:])
		req.Header.Set("Idempotency-Key", hex.EncodeToString(k[:]))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			c.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, out
}

func startMain(t *testing.T, dataDir string) (*Main, apiClient) {
	t.Helper()
	m := NewMain(io.Discard, io.Discard)
	if testing.Verbose() {
		m.Stderr = os.Stderr
	}
	m.Config = testConfig(dataDir)
	if err := m.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	token := m.AdminToken
	if token == "" {
		b, err := os.ReadFile(filepath.Join(dataDir, "admin.token"))
		if err != nil {
			t.Fatal(err)
		}
		token = strings.TrimSpace(string(b))
	}
	return m, apiClient{t: t, base: "http://" + m.Addr(), token: token}
}

// testConfig is the configuration of a test's server on dataDir: on a
// port of its own, its deliveries allowed to loopback receivers.
func testConfig(dataDir string) Config {
	return Config{
		Listen: "127.0.0.1:0", DataDir: dataDir, AllowPrivate: "127.0.0.0/8",
		LogFormat: "text", LogLevel: "info", Concurrency: 64, PerHost: 32,
		RetentionDays: 90, MaxJobsPerProject: 1000,
	}
}

// checkDelivery asserts the wire contract of SEMANTICS.md section 1 and
// returns the decoded payload.
func checkDelivery(t *testing.T, x received, secret, jobID string) map[string]any {
	t.Helper()
	for _, h := range []string{"Content-Type", "X-Vibe-Caller-Kind", "Vibe-Signature", "User-Agent", "Idempotency-Key"} {
		if n := len(x.Header.Values(h)); n != 1 {
			t.Fatalf("header %s appears %d times", h, n)
		}
	}
	if x.Header.Get("Content-Type") != "application/json" || x.Header.Get("X-Vibe-Caller-Kind") != "schedule" ||
		!strings.HasPrefix(x.Header.Get("User-Agent"), "vibejobs/") {
		t.Fatalf("headers %v", x.Header)
	}
	if err := contract.Verify(secret, x.Header.Get("Vibe-Signature"), x.Body, time.Now().Unix()); err != nil {
		t.Fatalf("signature does not verify: %v", err)
	}
	var p map[string]any
	dec := json.NewDecoder(bytes.NewReader(x.Body))
	dec.UseNumber()
	if err := dec.Decode(&p); err != nil {
		t.Fatal(err)
	}
	sf, err := time.Parse(contract.ScheduledForLayout, p["scheduledFor"].(string))
	if err != nil {
		t.Fatalf("scheduledFor %v", p["scheduledFor"])
	}
	att, _ := p["attempt"].(json.Number).Int64()
	want := contract.Body(contract.Payload{
		JobID: jobID, RunID: p["runId"].(string), ScheduledFor: sf,
		Attempt: int(att), Late: p["late"].(bool), Trigger: p["trigger"].(string),
	})
	if !bytes.Equal(want, x.Body) {
		t.Fatalf("body not in contract form:\n got %s\nwant %s", x.Body, want)
	}
	if x.Header.Get("Idempotency-Key") != p["runId"] {
		t.Fatalf("Idempotency-Key %q != runId %q", x.Header.Get("Idempotency-Key"), p["runId"])
	}
	return p
}

func TestEndToEnd(t *testing.T) {
	var mu sync.Mutex
	answers := map[string][]int{} // per job id: scripted status codes, then 200
	rc := newReceiver(t, func(x received) int {
		var p struct{ JobID string }
		_ = json.Unmarshal(x.Body, &p)
		mu.Lock()
		defer mu.Unlock()
		if a := answers[p.JobID]; len(a) > 0 {
			answers[p.JobID] = a[1:]
			return a[0]
		}
		return 200
	})
	_, api := startMain(t, t.TempDir())

	// A job every second: its runs arrive signed and in contract form.
	code, job := api.do("POST", "/v1/jobs", map[string]any{
		"name": "tick", "schedule": "* * * * * *", "url": rc.URL + "/hook",
		"retry": map[string]any{"maxAttempts": 3, "minBackoff": "1s", "maxBackoff": "1h"},
	})
	if code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	secret, _ := job["secret"].(string)
	jobID, _ := job["id"].(string)
	if !contract.ValidSecret(secret) || !strings.HasPrefix(jobID, "job_") {
		t.Fatalf("job %v", job)
	}
	p := checkDelivery(t, rc.next(t, 10*time.Second), secret, jobID)
	if p["trigger"] != "schedule" || p["late"] != false || p["attempt"].(json.Number).String() != "1" {
		t.Fatalf("payload %v", p)
	}
	// The secret is never shown again.
	if _, got := api.do("GET", "/v1/jobs/"+jobID, nil); got["secret"] != nil {
		t.Fatal("get shows the secret")
	}
	if code, _ := api.do("POST", "/v1/jobs/"+jobID+"/pause", nil); code != 200 {
		t.Fatalf("pause: %d", code)
	}

	// A manual run of a job that answers 500 once: retried as attempt 2 with a
	// fresh signature, then succeeded; both attempts recorded.
	code, job2 := api.do("POST", "/v1/jobs", map[string]any{
		"name": "manual", "schedule": "0 0 1 1 *", "url": rc.URL + "/m",
		"retry": map[string]any{"maxAttempts": 3, "minBackoff": "1s", "maxBackoff": "1h"},
	})
	if code != 201 {
		t.Fatalf("create 2: %d %v", code, job2)
	}
	id2, secret2 := job2["id"].(string), job2["secret"].(string)
	mu.Lock()
	answers[id2] = []int{500}
	mu.Unlock()
	code, run := api.do("POST", "/v1/jobs/"+id2+"/runs", nil)
	if code != 202 || run["trigger"] != "manual" {
		t.Fatalf("trigger: %d %v", code, run)
	}
	runID := run["id"].(string)
	var first map[string]any
	for {
		x := rc.next(t, 10*time.Second)
		pp := checkDelivery(t, x, secretFor(x, jobID, secret, id2, secret2), jobIDOf(x))
		if pp["runId"] == runID {
			first = pp
			break
		}
	}
	if first["attempt"].(json.Number).String() != "1" || first["trigger"] != "manual" {
		t.Fatalf("first attempt %v", first)
	}
	var second map[string]any
	for second == nil {
		x := rc.next(t, 10*time.Second)
		if pp := checkDelivery(t, x, secretFor(x, jobID, secret, id2, secret2), jobIDOf(x)); pp["runId"] == runID {
			second = pp
		}
	}
	if second["attempt"].(json.Number).String() != "2" || second["scheduledFor"] != first["scheduledFor"] {
		t.Fatalf("second attempt %v", second)
	}
	got := waitRunState(t, api, runID, "succeeded")
	atts, _ := got["attempts"].([]any)
	if len(atts) != 2 {
		t.Fatalf("attempts %v", got["attempts"])
	}
	a1 := atts[0].(map[string]any)
	if a1["statusCode"].(float64) != 500 || a1["errorCode"] != "http_5xx" || a1["signatureTimestamp"].(float64) == 0 {
		t.Fatalf("attempt 1 %v", a1)
	}

	// 401 fails the run at once, app_rejected.
	mu.Lock()
	answers[id2] = []int{401}
	mu.Unlock()
	_, run = api.do("POST", "/v1/jobs/"+id2+"/runs", nil)
	got = waitRunState(t, api, run["id"].(string), "failed")
	if got["failureReason"] != "app_rejected" {
		t.Fatalf("401 run %v", got)
	}
}

func jobIDOf(x received) string {
	var p struct{ JobID string }
	_ = json.Unmarshal(x.Body, &p)
	return p.JobID
}

func secretFor(x received, id1, s1, id2, s2 string) string {
	if jobIDOf(x) == id1 {
		return s1
	}
	return s2
}

// waitRunState polls the API until the run reaches state (the API is the
// observable; there is no event to wait on from outside the server).
func waitRunState(t *testing.T, api apiClient, runID, state string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, r := api.do("GET", "/v1/runs/"+runID, nil)
		if r["state"] == state {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: state %v, want %s", runID, r["state"], state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCrashRecoveryRedelivers kills a real server process with SIGKILL while
// an attempt is in flight; another process takes the run over when the lease
// ends, records the lost attempt as interrupted and sends it again under the
// same attempt number.
func TestCrashRecoveryRedelivers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	hold := make(chan struct{})
	defer close(hold)
	first := true
	var mu sync.Mutex
	rc := newReceiver(t, func(x received) int {
		mu.Lock()
		f := first
		first = false
		mu.Unlock()
		if f {
			rcGot <- x
			<-hold // never answered: the process dies meanwhile
		}
		return 200
	})
	dataDir := t.TempDir()
	addr := freeAddr(t)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "VIBEJOBS_E2E_CHILD=serve", "VIBEJOBS_LISTEN="+addr,
		"VIBEJOBS_DATA_DIR="+dataDir, "VIBEJOBS_ALLOW_PRIVATE=127.0.0.0/8")
	child.Stdout, child.Stderr = io.Discard, io.Discard
	if testing.Verbose() {
		child.Stderr = os.Stderr
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	api := apiClient{t: t, base: "http://" + addr}
	waitReady(t, api.base)
	tok, err := os.ReadFile(filepath.Join(dataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	api.token = strings.TrimSpace(string(tok))

	code, job := api.do("POST", "/v1/jobs", map[string]any{
		"name": "crash", "schedule": "0 0 1 1 *", "url": rc.URL, "timeout": "1s",
	})
	if code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	_, run := api.do("POST", "/v1/jobs/"+job["id"].(string)+"/runs", nil)
	runID := run["id"].(string)
	var x received
	select {
	case x = <-rcGot:
	case <-time.After(10 * time.Second):
		t.Fatal("first attempt never arrived")
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()

	// A new process on the same database takes over after the lease.
	_, api2 := startMain(t, dataDir)
	var again received
	for {
		again = rc.next(t, 30*time.Second)
		if jobIDOf(again) == job["id"] && !bytes.Equal(again.Body, nil) {
			if again.At.After(x.At) {
				break
			}
		}
	}
	if !bytes.Equal(again.Body, x.Body) {
		t.Fatalf("redelivery body differs:\n%s\n%s", x.Body, again.Body)
	}
	checkDelivery(t, again, job["secret"].(string), job["id"].(string))
	got := waitRunState(t, api2, runID, "succeeded")
	atts := got["attempts"].([]any)
	if len(atts) != 2 {
		t.Fatalf("attempts %v", atts)
	}
	a0, a1 := atts[0].(map[string]any), atts[1].(map[string]any)
	if a0["errorCode"] != "interrupted" || a0["number"].(float64) != 1 || a1["number"].(float64) != 1 || a1["statusCode"].(float64) != 200 {
		t.Fatalf("attempts %v", atts)
	}
}

var rcGot = make(chan received, 1)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("server never became ready")
}

// TestMetricsExposed: after a delivery, /metrics carries the platform's
// collectors and the Go process metrics, and no URL or secret.
func TestMetricsExposed(t *testing.T) {
	rc := newReceiver(t, nil)
	m, api := startMain(t, t.TempDir())
	code, job := api.do("POST", "/v1/jobs", map[string]any{"name": "m", "schedule": "0 0 1 1 *", "url": rc.URL + "/x"})
	if code != 201 {
		t.Fatalf("create: %d", code)
	}
	_, run := api.do("POST", "/v1/jobs/"+job["id"].(string)+"/runs", nil)
	waitRunState(t, api, run["id"].(string), "succeeded")
	// The store tells the metrics of the run it ended right after the
	// commit the API read: the scrape may come in between. (The series
	// are there from the start, at 0: wait for the counts.)
	counted := []string{`vibejobs_runs_finished_total{reason="",state="succeeded"} 1`, `vibejobs_attempts_total{error_code="",outcome="succeeded"} 1`}
	var text string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + m.Addr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text = string(body)
		if strings.Contains(text, counted[0]) && strings.Contains(text, counted[1]) || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{
		`vibejobs_attempts_total{error_code="",outcome="succeeded"} 1`,
		`vibejobs_runs_finished_total{reason="",state="succeeded"} 1`,
		"vibejobs_delivery_duration_seconds_count 1",
		"vibejobs_first_attempt_lateness_seconds_count 1",
		"vibejobs_runs_due", "vibejobs_oldest_due_run_age_seconds", "vibejobs_leases_recovered_total",
		`vibejobs_runs_created_total{trigger="manual"} 1`,
		"vibejobs_skipped_occurrences_total", "vibejobs_unplannable_jobs 0", "go_goroutines", "process_resident_memory_bytes",
		`vibejobs_loop_failing_seconds{loop="scheduler"} 0`, `vibejobs_loop_failing_seconds{loop="dispatcher"} 0`,
		`vibejobs_loop_failing_seconds{loop="maintenance"} 0`, `vibejobs_loop_failing_seconds{loop="webhooks"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(text, rc.URL) || strings.Contains(text, job["secret"].(string)) {
		t.Error("/metrics carries a URL or secret")
	}
}
