package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/dispatcher"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// replica is a vibejobs server running as a child process.
type replica struct {
	cmd *exec.Cmd
	api apiClient
	// exited is closed once the process ended, with its Wait's error in
	// err.
	exited chan struct{}
	err    error
	// log holds what the process wrote to stderr: its log.
	log *logWatch
}

// logWatch keeps what is written to it and lets a test wait for a line.
type logWatch struct {
	mu   sync.Mutex
	text strings.Builder
	// grew is closed, and replaced, at each write.
	grew chan struct{}
}

func newLogWatch() *logWatch { return &logWatch{grew: make(chan struct{})} }

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text.Write(p)
	close(w.grew)
	w.grew = make(chan struct{})
	return len(p), nil
}

// waitLog waits until r's log holds s, failing the test if r exits first
// or after 20 s.
func (r *replica) waitLog(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		r.log.mu.Lock()
		found, grew := strings.Contains(r.log.text.String(), s), r.log.grew
		r.log.mu.Unlock()
		if found {
			return
		}
		select {
		case <-grew:
		case <-r.exited:
			t.Fatalf("the server exited (%v) before logging %q", r.err, s)
		case <-timeout:
			t.Fatalf("the server did not log %q within 20 s", s)
		}
	}
}

// startReplica starts a server process on database (SQLite path or
// PostgreSQL URL; empty for SQLite in the data directory) with the shared
// data directory (master key, admin token), and env added to its
// environment.
func startReplica(t *testing.T, dataDir, database string, env ...string) *replica {
	t.Helper()
	r := spawnReplica(t, dataDir, database, env...)
	r.awaitReady(t, dataDir)
	return r
}

// spawnReplica starts the process without waiting for it.
func spawnReplica(t *testing.T, dataDir, database string, env ...string) *replica {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VIBEJOBS_E2E_CHILD=serve", "VIBEJOBS_LISTEN="+addr,
		"VIBEJOBS_DATA_DIR="+dataDir, "VIBEJOBS_DATABASE="+database, "VIBEJOBS_ALLOW_PRIVATE=127.0.0.0/8")
	cmd.Env = append(cmd.Env, env...)
	logs := newLogWatch()
	cmd.Stdout, cmd.Stderr = io.Discard, logs
	if testing.Verbose() {
		cmd.Stderr = io.MultiWriter(os.Stderr, logs)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{cmd: cmd, api: apiClient{t: t, base: "http://" + addr}, exited: make(chan struct{}), log: logs}
	go func() { r.err = cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-r.exited
		}
	})
	return r
}

func (r *replica) awaitReady(t *testing.T, dataDir string) {
	t.Helper()
	waitReady(t, r.api.base)
	tok, err := os.ReadFile(filepath.Join(dataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	r.api.token = strings.TrimSpace(string(tok))
}

// TestReplicasBootstrapTogether: three replicas started at once on an empty
// database create exactly one default project and one admin token.
func TestReplicasBootstrapTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	url, st := pgReplicaURL(t, "")
	dataDir := t.TempDir()
	rs := []*replica{spawnReplica(t, dataDir, url), spawnReplica(t, dataDir, url), spawnReplica(t, dataDir, url)}
	for _, r := range rs {
		waitReady(t, r.api.base)
	}
	// The winner writes the token file before it listens.
	for _, r := range rs {
		r.awaitReady(t, dataDir)
	}
	ps, _, err := st.ListProjects(context.Background(), vibejobs.Page{})
	if err != nil || len(ps) != 1 {
		t.Fatalf("projects after a concurrent first start: %d %v", len(ps), err)
	}
	for _, r := range rs {
		if code, body := r.api.do("GET", "/v1/jobs", nil); code != 200 {
			t.Fatalf("the admin token does not work on every replica: %d %v", code, body)
		}
	}
}

// pgReplicaURL returns a URL of a fresh schema of the test database for
// replica processes, and a Store on the same schema for the test's checks.
func pgReplicaURL(t *testing.T, host string) (string, *postgres.Store) {
	t.Helper()
	base := postgres.TestURL(t)
	schema := postgres.NewTestSchema(t)
	store := postgres.MustOpenTestWith(t, postgres.Options{Schema: schema})
	u := base
	if host != "" {
		u = strings.Replace(u, "127.0.0.1:5432", host, 1)
	}
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "search_path=" + schema, store
}

// slowReceiver answers 200 after delay, counting deliveries per run id,
// and the deliveries whose sender went away before the answer (aborted).
type slowReceiver struct {
	*httptest.Server
	mu      sync.Mutex
	byRun   map[string]int
	aborted map[string]int
	// receipts tells, per run, of each delivery: for a failure's message.
	receipts map[string][]receipt
	// arrived, when set, is called with each delivery as it arrives,
	// before the receiver holds it.
	arrived func(r *http.Request)
}

// watch sets the function called with each delivery as it arrives.
func (sr *slowReceiver) watch(arrived func(r *http.Request)) {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	sr.arrived = arrived
}

func newSlowReceiver(t *testing.T, delay time.Duration) *slowReceiver {
	sr := &slowReceiver{byRun: map[string]int{}, aborted: map[string]int{}, receipts: map[string][]receipt{}}
	sr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		id := runIDOf(b)
		sr.mu.Lock()
		sr.byRun[id]++
		var p struct{ Attempt int }
		_ = json.Unmarshal(b, &p)
		sr.receipts[id] = append(sr.receipts[id], receipt{
			attempt: p.Attempt, at: time.Now(), from: r.RemoteAddr, signature: signatureTime(r.Header.Get("Vibe-Signature")), body: string(b),
		})
		arrived := sr.arrived
		sr.mu.Unlock()
		if arrived != nil {
			arrived(r)
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			sr.mu.Lock()
			sr.aborted[id]++
			sr.mu.Unlock()
		}
		w.WriteHeader(200)
	}))
	t.Cleanup(sr.Close)
	return sr
}

// receipt is a delivery as the receiver got it.
type receipt struct {
	attempt   int // the body's
	at        time.Time
	from      string // the sender's address: its connection
	signature string // the signature's head: its time
	body      string
}

func (r receipt) String() string {
	return fmt.Sprintf("%s from %s (%s) %s", r.at.Format("15:04:05.000000"), r.from, r.signature, r.body)
}

// mergeKeys returns the keys of a and b.
func mergeKeys(a, b map[int]int) map[int]bool {
	keys := map[int]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return keys
}

// signatureTime is the time part of a Vibe-Signature header.
func signatureTime(h string) string {
	t, _, _ := strings.Cut(h, ",")
	return t
}

// attemptsOf describes a run's attempts for a failure's message.
func attemptsOf(r *vibejobs.Run) []string {
	var out []string
	for _, a := range r.Attempts {
		out = append(out, fmt.Sprintf("#%d %s-%s status %d %s", a.Number, a.StartedAt.Format("15:04:05.000000"),
			a.FinishedAt.Format("15:04:05.000000"), a.StatusCode, a.ErrorCode))
	}
	return out
}

func runIDOf(body []byte) string {
	i := strings.Index(string(body), `"runId":"`)
	if i < 0 {
		return ""
	}
	rest := string(body[i+9:])
	return rest[:strings.IndexByte(rest, '"')]
}

// allRuns lists every run of a job through the Store.
func allRuns(t *testing.T, st vibejobs.Store, projectID, jobID string) []*vibejobs.Run {
	t.Helper()
	var out []*vibejobs.Run
	cursor := ""
	for {
		rs, next, err := st.ListRuns(context.Background(), projectID, vibejobs.RunFilter{JobID: jobID}, vibejobs.Page{Limit: 100, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rs...)
		if next == "" {
			return out
		}
		cursor = next
	}
}

// waitAllFinished waits until every run of the jobs is finished.
func waitAllFinished(t *testing.T, st vibejobs.Store, projectID string, jobIDs []string, within time.Duration) map[string][]*vibejobs.Run {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		all := map[string][]*vibejobs.Run{}
		open := 0
		for _, id := range jobIDs {
			rs := allRuns(t, st, projectID, id)
			for _, r := range rs {
				if !r.State.Finished() {
					open++
				}
			}
			all[id] = rs
		}
		if open == 0 {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs still unfinished after %v", open, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkEverySecond asserts the runs of a paused "@every 1s" job: exactly
// one run for each occurrence from the job's anchor to its pause (no
// occurrence lost, also none at the end, none twice, none after the pause),
// every one succeeded. The expected occurrences are computed from the job
// as stored, not from the runs found.
func checkEverySecond(t *testing.T, st vibejobs.Store, projectID, jobID string, runs []*vibejobs.Run) {
	t.Helper()
	j, err := st.GetJob(context.Background(), projectID, jobID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != vibejobs.JobPaused {
		t.Fatalf("job %s is %s, not paused: its occurrences have no end", jobID, j.State)
	}
	// The pause (at UpdatedAt) withdrew the runs scheduled after it and
	// skips every later occurrence; every one up to it is a run.
	var want []time.Time
	for at := j.ScheduleAnchor.Add(time.Second); !at.After(j.UpdatedAt); at = at.Add(time.Second) {
		want = append(want, at)
	}
	if len(want) < 3 {
		t.Fatalf("job %s: paused %v after its anchor: too short to prove anything", jobID, j.UpdatedAt.Sub(j.ScheduleAnchor))
	}
	got := map[int64]int{}
	for _, r := range runs {
		got[r.ScheduledFor.UnixMicro()]++
		if r.State != vibejobs.RunSucceeded {
			t.Errorf("job %s run %s: %s %s", jobID, r.ID, r.State, r.FailureReason)
		}
	}
	lost := 0
	for _, at := range want {
		switch n := got[at.UnixMicro()]; {
		case n == 0:
			lost++
			t.Errorf("job %s: occurrence %v lost", jobID, at)
		case n > 1:
			t.Errorf("job %s: occurrence %v has %d runs", jobID, at, n)
		}
		delete(got, at.UnixMicro())
	}
	// The pause's time is read when its request arrives, and a run held
	// ahead of its time whose attempt started before the pause committed
	// goes out and stays (only unsent runs are withdrawn): one occurrence
	// within a second after the pause may have its run too.
	for at, n := range got {
		if after := time.UnixMicro(at).Sub(j.UpdatedAt); n == 1 && after > 0 && after < time.Second {
			continue
		}
		t.Errorf("job %s: %d runs for %v, not an occurrence before the pause", jobID, n, time.UnixMicro(at).UTC())
	}
	if lost > 0 {
		t.Logf("job %s: %d of %d occurrences lost (anchor %v, paused %v)", jobID, lost, len(want), j.ScheduleAnchor, j.UpdatedAt)
	}
}

func createEveryJobs(t *testing.T, api apiClient, n int, url string) (projectID string, ids []string) {
	t.Helper()
	for i := 0; i < n; i++ {
		code, j := api.do("POST", "/v1/jobs", map[string]any{
			"name": fmt.Sprintf("tick-%d", i), "schedule": "@every 1s", "url": url, "timeout": "1s",
			"retry": map[string]any{"maxAttempts": 4, "minBackoff": "1s", "maxBackoff": "2s"},
		})
		if code != 201 {
			t.Fatalf("create: %d %v", code, j)
		}
		ids = append(ids, j["id"].(string))
	}
	_, j := api.do("GET", "/v1/jobs/"+ids[0], nil)
	_ = j
	return "", ids
}

func pauseAll(t *testing.T, api apiClient, ids []string) {
	t.Helper()
	for _, id := range ids {
		if code, body := api.do("POST", "/v1/jobs/"+id+"/pause", nil); code != 200 {
			t.Fatalf("pause: %d %v", code, body)
		}
	}
}

func projectOf(t *testing.T, st vibejobs.Store) string {
	t.Helper()
	ps, _, err := st.ListProjects(context.Background(), vibejobs.Page{})
	if err != nil || len(ps) != 1 {
		t.Fatalf("projects %v %v", ps, err)
	}
	return ps[0].ID
}

// TestReplicasSurviveSIGKILL: three replicas on one PostgreSQL share the
// load, each sending some of it; one killed with SIGKILL under load: no
// occurrence lost, none doubled, and the killed replica's attempts in
// flight are redelivered by the others.
func TestReplicasSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	url, st := pgReplicaURL(t, "")
	dataDir := t.TempDir()
	rc := newSlowReceiver(t, 400*time.Millisecond)
	r1 := startReplica(t, dataDir, url)
	r2 := startReplica(t, dataDir, url)
	r3 := startReplica(t, dataDir, url)
	// Which replica sent each delivery, told by the socket it came from.
	var (
		senderMu sync.Mutex
		bySender = map[int]int{} // pid: deliveries; 0: untold
	)
	rc.watch(func(r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		sender := 0
		for _, x := range []*replica{r1, r2, r3} {
			if owns, _ := ownsLocalPort(x.cmd.Process.Pid, int(ap.Port())); err == nil && owns {
				sender = x.cmd.Process.Pid
			}
		}
		senderMu.Lock()
		bySender[sender]++
		senderMu.Unlock()
	})
	_, ids := createEveryJobs(t, r1.api, 20, rc.URL)
	project := projectOf(t, st)
	time.Sleep(4 * time.Second) // load runs on all three
	// The work spreads: every replica sent some of it (unless /proc could
	// tell none of the senders).
	senderMu.Lock()
	for _, x := range []*replica{r1, r2, r3} {
		if len(bySender) > 1 || bySender[0] == 0 {
			if bySender[x.cmd.Process.Pid] == 0 {
				t.Errorf("replica %d sent none of the %v deliveries of the first 4 s (by sender pid)", x.cmd.Process.Pid, bySender)
			}
		}
	}
	senderMu.Unlock()
	// Killed while the receiver holds one of its deliveries: with the
	// runs due at one instant a second, another replica may claim them all
	// at times, and a kill at a set time could find the replica idle.
	pid := r2.cmd.Process.Pid
	inFlight := make(chan struct{}, 1)
	rc.watch(func(r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			return
		}
		if owns, ok := ownsLocalPort(pid, int(ap.Port())); owns || !ok {
			// Without /proc, kill at once, as a set time would.
			select {
			case inFlight <- struct{}{}:
			default:
			}
		}
	})
	select {
	case <-inFlight:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery of the replica to kill reached the receiver in 30 s")
	}
	if err := r2.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	rc.watch(nil)
	time.Sleep(4 * time.Second)
	pauseAll(t, r3.api, ids)
	all := waitAllFinished(t, st, project, ids, 60*time.Second)

	rc.mu.Lock()
	defer rc.mu.Unlock()
	interrupted := 0
	for _, id := range ids {
		checkEverySecond(t, st, project, id, all[id])
		for _, r := range all[id] {
			full, err := st.GetRun(context.Background(), project, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			// Per attempt number, as the receiver got them: an interrupted
			// attempt goes out again under its number.
			answered, made := map[int]int{}, map[int]int{}
			cut := 0
			for _, a := range full.Attempts {
				made[a.Number]++
				switch {
				case a.ErrorCode == vibejobs.ErrorCodeInterrupted:
					cut++
					// Only the killed replica's attempts are interrupted:
					// the survivors' leases are never taken from them. A
					// run claimed ahead of its time (held, maybe never
					// sent) starts at most ClaimAhead after its claim.
					if a.StartedAt.After(killedAt.Add(dispatcher.DefaultClaimAhead)) {
						t.Errorf("run %s: attempt %d started %v after the kill and was interrupted", r.ID, a.Number, a.StartedAt.Sub(killedAt))
					}
				case a.StatusCode != 0:
					answered[a.Number]++
				}
			}
			interrupted += cut
			// Counted at the receiver, not from the store: each answered
			// attempt was received once; one that was interrupted, or that
			// got no answer (a timeout, on a machine so loaded that the
			// receiver's 400 ms grew past the job's 1 s), at most once. So
			// no attempt number reached the receiver more often than it
			// was made: no run went out twice beside itself.
			got := map[int]int{}
			for _, rec := range rc.receipts[r.ID] {
				got[rec.attempt]++
			}
			for number := range mergeKeys(got, made) {
				if got[number] < answered[number] || got[number] > made[number] {
					t.Errorf("run %s: attempt %d received %d times, made %d times, %d of them answered (killed at %s): %v; attempts %v",
						r.ID, number, got[number], made[number], answered[number], killedAt.Format("15:04:05.000000"),
						rc.receipts[r.ID], attemptsOf(full))
				}
			}
		}
	}
	if interrupted == 0 {
		t.Fatal("the killed replica had no attempt in flight: the test proved nothing")
	}
	// The deliveries the kill cut off at the receiver were made again (by
	// the survivors: the killed replica is gone) and answered. (An
	// interrupted attempt need not have been sent: the kill may find a run
	// held ahead of its time.)
	cutOff := 0
	for id, n := range rc.aborted {
		cutOff += n
		if rc.byRun[id] <= n {
			t.Errorf("run %s: %d deliveries cut off by the kill, none made again (%d in all)", id, n, rc.byRun[id])
		}
	}
	if cutOff == 0 {
		t.Fatal("no delivery was cut off at the receiver by the kill: the test proved nothing")
	}
	t.Logf("%d interrupted attempts, %d deliveries cut off by the kill, all redelivered", interrupted, cutOff)
}

func (sr *slowReceiver) total() int {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	n := 0
	for _, c := range sr.byRun {
		n += c
	}
	return n
}

// TestReplicaCarriesOnWhenConnectionsGoSilent: every open connection to
// PostgreSQL goes silent, dropped without a reset (a failover, a NAT entry
// gone), while new connections work. The database calls of the background
// loops end at their timeout and the server delivers again on new
// connections; it hung for good, /readyz answering 200 all along (its
// ping opens a new connection).
func TestReplicaCarriesOnWhenConnectionsGoSilent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	proxy := newTCPProxy(t, "127.0.0.1:5432")
	url, _ := pgReplicaURL(t, proxy.ln.Addr().String())
	rc := newSlowReceiver(t, 0)
	m := NewMain(io.Discard, io.Discard)
	m.Config = Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Database: url, AllowPrivate: "127.0.0.0/8",
		LogFormat: "text", LogLevel: "error", Concurrency: 64, PerHost: 32, RetentionDays: 90,
		MaxJobsPerProject: 100, StoreTimeout: time.Second}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	t.Cleanup(func() {
		go func() { m.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Error("Close hung")
		}
	})
	api := apiClient{t: t, base: "http://" + m.Addr(), token: m.AdminToken}
	createEveryJobs(t, api, 3, rc.URL)
	// Each frozen connection in the pools costs a call its timeout (and
	// pgx's cancel delay) before it is dropped: here about 16 s in all.
	waitDeliveries := func(n int, what string) {
		t.Helper()
		for deadline := time.Now().Add(45 * time.Second); rc.total() < n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d deliveries, want %d", what, rc.total(), n)
			}
		}
	}
	waitDeliveries(6, "before the connections went silent")
	proxy.freeze()
	frozen := time.Now()
	waitDeliveries(rc.total()+9, "after the connections went silent (3 jobs @every 1s)")
	t.Logf("9 deliveries %v after the connections went silent", time.Since(frozen).Round(time.Millisecond))
}

// tcpProxy sits between replicas and PostgreSQL so a test can cut every
// connection and refuse new ones, as if the database went away, or make the
// connections open at a moment go silent (freeze).
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]*atomic.Bool // the frozen flag of the connection's pair
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]*atomic.Bool{}}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.cut() })
	return p
}

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		frozen := new(atomic.Bool)
		p.mu.Lock()
		p.conns[c], p.conns[up] = frozen, frozen
		p.mu.Unlock()
		go pipe(up, c, frozen)
		go pipe(c, up, frozen)
	}
}

// pipe copies src to dst, dropping what it reads once frozen, until either
// side closes; then it closes both.
func pipe(dst, src net.Conn, frozen *atomic.Bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if frozen.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// freeze makes the connections open now go silent: what either side sends
// is dropped and nothing is closed, as when a route or a NAT entry
// disappears without a reset. New connections work.
func (p *tcpProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, frozen := range p.conns {
		frozen.Store(true)
	}
}

func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]*atomic.Bool{}
}

func (p *tcpProxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

func readyStatus(base string) int {
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitMetric polls base's /metrics until the sample named series (its
// name and labels, as printed) holds a value ok accepts.
func waitMetric(t *testing.T, base, series string, ok func(float64) bool, within time.Duration) {
	t.Helper()
	last := "no such series"
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for line := range strings.SplitSeq(get(t, base+"/metrics", ""), "\n") {
			if v, found := strings.CutPrefix(line, series+" "); found {
				last = line
				if f, err := strconv.ParseFloat(v, 64); err == nil && ok(f) {
					return
				}
			}
		}
	}
	t.Fatalf("%s/metrics: %s never held the value wanted (last: %s)", base, series, last)
}

func waitStatus(t *testing.T, base string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for readyStatus(base) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s/readyz never answered %d", base, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReplicasRideOutDatabaseOutage: every connection to PostgreSQL is cut
// and refused for a while under load: /readyz says not ready meanwhile, the
// replicas reconnect afterwards, and nothing is lost or sent twice.
func TestReplicasRideOutDatabaseOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	proxy := newTCPProxy(t, "127.0.0.1:5432")
	url, st := pgReplicaURL(t, proxy.ln.Addr().String())
	dataDir := t.TempDir()
	rc := newSlowReceiver(t, 0)
	r1 := startReplica(t, dataDir, url)
	r2 := startReplica(t, dataDir, url)
	_, ids := createEveryJobs(t, r1.api, 10, rc.URL)
	project := projectOf(t, st)
	time.Sleep(2 * time.Second)

	proxy.cut()
	waitStatus(t, r1.api.base, 503, 15*time.Second)
	waitStatus(t, r2.api.base, 503, 15*time.Second)
	// Not ready for as long as the database is gone, not just once.
	for until := time.Now().Add(3 * time.Second); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
		for _, r := range []*replica{r1, r2} {
			if code := readyStatus(r.api.base); code != 503 {
				t.Fatalf("%s/readyz answered %d while the database is gone", r.api.base, code)
			}
		}
	}
	// The loops that hold no API request say so in the metrics.
	failing := func(v float64) bool { return v > 0 }
	for _, r := range []*replica{r1, r2} {
		for _, loop := range []string{"dispatcher", "maintenance", "webhooks"} {
			waitMetric(t, r.api.base, `vibejobs_loop_failing_seconds{loop="`+loop+`"}`, failing, 15*time.Second)
		}
	}
	proxy.restore()
	waitStatus(t, r1.api.base, 200, 30*time.Second)
	waitStatus(t, r2.api.base, 200, 30*time.Second)
	for _, r := range []*replica{r1, r2} {
		waitMetric(t, r.api.base, `vibejobs_loop_failing_seconds{loop="maintenance"}`, func(v float64) bool { return v == 0 }, 15*time.Second)
	}
	time.Sleep(3 * time.Second)
	pauseAll(t, r2.api, ids)
	all := waitAllFinished(t, st, project, ids, 60*time.Second)
	for _, id := range ids {
		checkEverySecond(t, st, project, id, all[id])
		checkSentOnce(t, st, project, rc, all[id])
	}
}

// checkSentOnce asserts that, no process having crashed, each of the runs
// reached the receiver once per attempt that was not interrupted, and never
// for an interrupted one: no run was sent twice. (A claim whose answer was
// lost, or a claim given back whose release failed, leaves its run leased
// and unsent: lease recovery records an interrupted attempt never sent.)
func checkSentOnce(t *testing.T, st vibejobs.Store, projectID string, rc *slowReceiver, runs []*vibejobs.Run) {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, r := range runs {
		full, err := st.GetRun(context.Background(), projectID, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		sent := 0
		for _, a := range full.Attempts {
			if a.ErrorCode != vibejobs.ErrorCodeInterrupted {
				sent++
			}
		}
		if n := rc.byRun[r.ID]; n != sent {
			t.Errorf("run %s received %d times for %d attempts, %d of them not interrupted", r.ID, n, len(full.Attempts), sent)
		}
	}
}

// TestRetriesWhileReceiverDown: the receiver refuses connections for two
// attempts, then comes back: the run is delivered on attempt 3, and the
// attempts are spaced by the job's backoff (1 s, then 2 s, ±20 %).
func TestRetriesWhileReceiverDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	url, st := pgReplicaURL(t, "")
	r := startReplica(t, t.TempDir(), url)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused until the receiver comes back

	code, job := r.api.do("POST", "/v1/jobs", map[string]any{
		"name": "down", "schedule": "0 0 1 1 *", "url": "http://" + addr + "/", "timeout": "1s",
		"retry": map[string]any{"maxAttempts": 4, "minBackoff": "1s", "maxBackoff": "2s"},
	})
	if code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	_, run := r.api.do("POST", "/v1/jobs/"+job["id"].(string)+"/runs", nil)
	runID := run["id"].(string)
	project := projectOf(t, st)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := st.GetRun(context.Background(), project, runID)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Attempts) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attempts %+v", got.Attempts)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("re-listening on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	got := waitRunState(t, r.api, runID, "succeeded")
	full, err := st.GetRun(context.Background(), project, runID)
	if err != nil {
		t.Fatal(err)
	}
	a := full.Attempts
	if len(a) != 3 || a[0].ErrorCode != "network" || a[1].ErrorCode != "network" || a[2].StatusCode != 204 {
		t.Fatalf("attempts %+v (run %v)", a, got)
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		gap := a[i+1].StartedAt.Sub(a[i].FinishedAt)
		// ±20 % jitter, plus the dispatcher's wake-up and its record of
		// the attempt: a second of it, as a loaded CI machine can take,
		// still tells the job's backoff from a policy not applied (the
		// next delay without the 2 s cap is 10 s, the default 30 s).
		if gap < want*8/10 || gap > want*12/10+time.Second {
			t.Errorf("gap before attempt %d = %v, want %v ±20%%", i+2, gap, want)
		}
	}
}

// TestReplicasRideOutAnOutageLongerThanTheirLeases: three replicas on one
// PostgreSQL, each with attempts in flight when every connection is cut
// and refused; the attempts are answered during the outage, which lasts
// until their leases have ended. Once the database is back, each replica
// records the outcomes it kept: every run delivered once, with its one
// attempt. Recovered as interrupted by the first lease recovery pass
// after the outage, on any replica (their owners alive, their outcomes on
// the way), the runs went out a second time with no crash.
func TestReplicasRideOutAnOutageLongerThanTheirLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	proxy := newTCPProxy(t, "127.0.0.1:5432")
	url, st := pgReplicaURL(t, proxy.ln.Addr().String())
	dataDir := t.TempDir()
	rc := newSlowReceiver(t, 0)
	rs := []*replica{startReplica(t, dataDir, url), startReplica(t, dataDir, url), startReplica(t, dataDir, url)}
	const timeout, perReplica = 4 * time.Second, 3
	code, job := rs[0].api.do("POST", "/v1/jobs", map[string]any{
		"name": "held", "schedule": "0 0 1 1 *", "url": rc.URL, "timeout": timeout.String(),
	})
	if code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	// The receiver holds every delivery until the database is gone.
	gate := make(chan struct{})
	var (
		arrivedMu   sync.Mutex
		lastArrival time.Time
	)
	held := make(chan struct{}, len(rs)*perReplica)
	rc.watch(func(*http.Request) {
		arrivedMu.Lock()
		lastArrival = time.Now()
		arrivedMu.Unlock()
		held <- struct{}{}
		<-gate
	})
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	var runs []string
	for _, r := range rs {
		// Each replica's API wakes its own dispatcher: the runs spread.
		for range perReplica {
			runs = append(runs, manualRun(t, r.api, job["id"].(string)))
		}
	}
	for range runs {
		select {
		case <-held:
		case <-time.After(20 * time.Second):
			t.Fatal("not every run reached the receiver within 20 s")
		}
	}
	proxy.cut()
	close(gate)
	rc.watch(nil)
	// Every lease ends during the outage: a claim's lease runs from
	// before its attempt was sent, for the job's timeout and the lease
	// margin. Every replica's lease recovery fails meanwhile.
	arrivedMu.Lock()
	leasesEnd := lastArrival.Add(timeout + dispatcher.DefaultLeaseMargin)
	arrivedMu.Unlock()
	for _, r := range rs {
		waitMetric(t, r.api.base, `vibejobs_loop_failing_seconds{loop="maintenance"}`, func(v float64) bool { return v > 0 }, 15*time.Second)
	}
	time.Sleep(time.Until(leasesEnd) + 100*time.Millisecond)
	proxy.restore()

	project := projectOf(t, st)
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range runs {
		for {
			got, err := st.GetRun(context.Background(), project, id)
			if err != nil {
				t.Fatal(err)
			}
			if got.State.Finished() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %s still %s 60 s after the database came back", id, got.State)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	twice := 0
	for _, id := range runs {
		got, err := st.GetRun(context.Background(), project, id)
		if err != nil {
			t.Fatal(err)
		}
		if n := rc.byRun[id]; n != 1 || got.State != vibejobs.RunSucceeded || len(got.Attempts) != 1 || got.Attempts[0].StatusCode != 200 {
			twice++
			var atts []string
			for _, a := range got.Attempts {
				atts = append(atts, fmt.Sprintf("#%d %d %s", a.Number, a.StatusCode, a.ErrorCode))
			}
			t.Errorf("run %s: %s, received %d times, attempts %v; want succeeded, received once, its one attempt answered 200",
				id, got.State, n, atts)
		}
	}
	if twice > 0 {
		t.Logf("%d of %d runs delivered again after the outage", twice, len(runs))
	}
}

// TestReplicasRideOutTerminatedConnections: under load, every connection
// of three replicas to PostgreSQL (pools and listeners) is ended by the
// server (pg_terminate_backend, as an administrator or a restart does),
// again and again, while the database stays up: the replicas reconnect
// and carry on, and no occurrence is lost, doubled or sent twice.
func TestReplicasRideOutTerminatedConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	url, st := pgReplicaURL(t, "")
	// Names this test's connections, and only them.
	app := fmt.Sprintf("vibejobs-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	url += "&application_name=" + app
	dataDir := t.TempDir()
	rc := newSlowReceiver(t, 100*time.Millisecond)
	rs := []*replica{startReplica(t, dataDir, url), startReplica(t, dataDir, url), startReplica(t, dataDir, url)}
	_, ids := createEveryJobs(t, rs[0].api, 10, rc.URL)
	project := projectOf(t, st)
	admin, err := pgx.Connect(context.Background(), postgres.TestURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	time.Sleep(2 * time.Second) // load runs on all three
	ended := 0
	for i := 0; i < 8; i++ {
		// The pids first, then each ended on its own, its name checked
		// again: pg_terminate_backend in a WHERE clause may be called
		// before the name is tested (the planner orders the conditions),
		// which ends every session of the shared server.
		rows, _ := admin.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			rows, _ := admin.Query(context.Background(),
				`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND application_name = $2`, pid, app)
			done, err := pgx.CollectRows(rows, pgx.RowTo[bool])
			if err != nil {
				t.Fatal(err)
			}
			if len(done) == 1 && done[0] {
				ended++
			}
		}
		time.Sleep(700 * time.Millisecond)
	}
	if ended == 0 {
		t.Fatal("no connection of the replicas was ended: the test proved nothing")
	}
	time.Sleep(2 * time.Second)
	pauseAll(t, rs[1].api, ids)
	all := waitAllFinished(t, st, project, ids, 60*time.Second)
	for _, id := range ids {
		checkEverySecond(t, st, project, id, all[id])
		checkSentOnce(t, st, project, rc, all[id])
	}
	t.Logf("%d connections ended", ended)
}
