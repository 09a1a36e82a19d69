package storetest

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// session returns a session of token tokenID in projectA expiring at
// expires; its key is the SHA-256 of name.
func session(name, tokenID string, expires time.Time) *vibejobs.DashboardSession {
	k := sha256.Sum256([]byte(name))
	return &vibejobs.DashboardSession{Key: k[:], TokenID: tokenID, ProjectID: projectA, ExpiresAt: expires}
}

func testSessions(t *testing.T, f *fixture) {
	f.projects()
	create := func(s *vibejobs.DashboardSession, max int) {
		t.Helper()
		if err := f.s.CreateSession(f.ctx, s, max); err != nil {
			t.Fatalf("CreateSession: %v", err)
		}
	}
	live := func(s *vibejobs.DashboardSession, now time.Time) bool {
		t.Helper()
		got, err := f.s.GetSession(f.ctx, s.Key, now)
		if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
			return false
		}
		if err != nil {
			t.Fatalf("GetSession: %v", err)
		}
		wantEqual(t, "GetSession", got, s)
		return true
	}

	a := session("a", "tok_1", T0.Add(time.Hour))
	create(a, 0)
	if !live(a, T0) || !live(a, T0.Add(time.Hour-time.Millisecond)) {
		t.Fatal("a session is not found before it expires")
	}
	if live(a, T0.Add(time.Hour)) {
		t.Error("a session is found at its expiry")
	}
	_, err := f.s.GetSession(f.ctx, session("never", "tok_1", T0).Key, T0)
	wantNotFound(t, "GetSession of an unknown key", err, "session")

	// The bound is per token: the sessions that expire first go.
	b := session("b", "tok_1", T0.Add(2*time.Hour))
	other := session("other", "tok_2", T0.Add(30*time.Minute))
	create(other, 2)
	create(b, 2)
	if !live(a, T0) || !live(b, T0) {
		t.Fatal("two sessions of a token with max 2: one is gone")
	}
	c := session("c", "tok_1", T0.Add(3*time.Hour))
	create(c, 2)
	if live(a, T0) {
		t.Error("the third session of a token with max 2 kept the one that expires first")
	}
	if !live(b, T0) || !live(c, T0) || !live(other, T0) {
		t.Error("a session that should stay was ended")
	}

	if err := f.s.DeleteSession(f.ctx, b.Key); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	if live(b, T0) {
		t.Error("a deleted session is found")
	}
	if err := f.s.DeleteSession(f.ctx, b.Key); err != nil {
		t.Errorf("DeleteSession of a gone session: %v", err)
	}

	// Pruning takes the expired only, as many as the limit allows.
	for _, want := range []int{1, 0} {
		if n, err := f.s.PruneSessions(f.ctx, T0.Add(2*time.Hour), 1); err != nil || n != want {
			t.Fatalf("PruneSessions(limit 1) = %d, %v; want %d", n, err, want)
		}
	}
	if !live(c, T0) {
		t.Error("a live session was pruned")
	}
}
