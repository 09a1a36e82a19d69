package health_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/health"
)

func TestStreak(t *testing.T) {
	var s health.Streak
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if got := s.Since(); !got.IsZero() {
		t.Fatalf("a new streak began at %v", got)
	}
	s.Fail(t0)
	s.Fail(t0.Add(time.Minute))
	if got := s.Since(); !got.Equal(t0) {
		t.Fatalf("streak began at %v, want the first failure %v", got, t0)
	}
	s.Clear()
	if got := s.Since(); !got.IsZero() {
		t.Fatalf("cleared streak began at %v", got)
	}
	s.Fail(t0.Add(2 * time.Minute))
	if got, want := s.Since(), t0.Add(2*time.Minute); !got.Equal(want) {
		t.Fatalf("new streak began at %v, want %v", got, want)
	}
}

func TestPass(t *testing.T) {
	var s health.Streak
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	failed, ended := errors.New("database down"), context.Canceled
	s.Pass(t0, failed, ended)
	if got := s.Since(); !got.IsZero() {
		t.Fatalf("a pass cut short by its context began a streak at %v", got)
	}
	s.Pass(t0, failed, nil)
	s.Pass(t0.Add(time.Minute), failed, ended)
	s.Pass(t0.Add(2*time.Minute), failed, nil)
	if got := s.Since(); !got.Equal(t0) {
		t.Fatalf("streak began at %v, want the first failure %v", got, t0)
	}
	s.Pass(t0.Add(3*time.Minute), nil, nil)
	if got := s.Since(); !got.IsZero() {
		t.Fatalf("a pass that succeeded left a streak begun at %v", got)
	}
}
