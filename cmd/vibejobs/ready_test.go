package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

// pollFailer fails the dispatcher's NextDueAt, as a database that refuses
// its statements does while Ping still answers, while fail is set, and
// counts the calls.
type pollFailer struct {
	vibejobs.DispatchStore
	fail  atomic.Bool
	polls atomic.Int64
}

func (p *pollFailer) NextDueAt(ctx context.Context) (time.Time, bool, error) {
	defer p.polls.Add(1)
	if p.fail.Load() {
		return time.Time{}, false, vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	}
	return p.DispatchStore.NextDueAt(ctx)
}

// TestReadyzWhileALoopFails: a dispatcher whose every pass fails against
// the database delivers nothing, although the database answers Ping:
// /readyz says not ready once that has lasted loopStallLimit (by the
// server's clock), without telling why (the log does), and ready again
// once a pass succeeds. A shorter streak leaves it ready.
func TestReadyzWhileALoopFails(t *testing.T) {
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	pf := &pollFailer{}
	logs := &syncbuf.Buffer{}
	m := NewMain(io.Discard, logs)
	m.Now = now
	m.WrapDispatchStore = func(s vibejobs.DispatchStore) vibejobs.DispatchStore { pf.DispatchStore = s; return pf }
	m.Config = Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), AllowPrivate: "127.0.0.0/8",
		LogFormat: "text", LogLevel: "info", Concurrency: 8, PerHost: 8, RetentionDays: 90, MaxJobsPerProject: 10}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	base := "http://" + m.Addr()
	waitReady(t, base)

	pf.fail.Store(true)
	// Two failed passes: the first is noted before the second begins.
	for want, deadline := pf.polls.Load()+2, time.Now().Add(10*time.Second); pf.polls.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the dispatcher stopped polling")
		}
	}
	advance(loopStallLimit)
	if code := readyStatus(base); code != 200 {
		t.Fatalf("/readyz answered %d after failing passes for %v, want 200", code, loopStallLimit)
	}
	advance(time.Second)
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"not_ready"`) {
		t.Fatalf("/readyz with the dispatcher failing for longer than %v: %d %s, want 503 not_ready", loopStallLimit, resp.StatusCode, body)
	}
	if strings.Contains(string(body), "dispatcher") || strings.Contains(string(body), "database") {
		t.Errorf("/readyz tells the reason: %s", body)
	}
	if !strings.Contains(logs.String(), "the dispatcher has failed every pass") {
		t.Errorf("the log does not tell why /readyz failed:\n%s", logs.String())
	}

	pf.fail.Store(false)
	waitStatus(t, base, 200, 10*time.Second)
}
