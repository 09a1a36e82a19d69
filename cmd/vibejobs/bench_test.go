package main

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// TestBenchRefusesBadFlags: a benchmark given a count, a concurrency or a
// duration it cannot run with answers a usage error at once, instead of
// measuring nothing (a raw loop with no workers reported billions of
// requests a second).
func TestBenchRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"burst", "--raw-only", "--concurrency", "0"},
		{"burst", "--runs", "0"},
		{"lateness", "--jobs", "-1"},
		{"lateness", "--duration", "-1s"},
		{"lateness", "--replicas", "0"},
		{"events", "--subscriptions", "-1"},
		{"scale", "--jobs", "x"},
		{"nope"},
		{},
	} {
		if err := bench(context.Background(), args, io.Discard, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("bench %q = %v, want a usage error", args, err)
		}
	}
}

// TestInterruptedBurstStops: a burst interrupted while it waits for its
// runs (here before they are even due, 10 s after planning) returns the
// interruption. It ignored it and ran to its end: main's context catches
// Ctrl-C, so nothing else would stop it.
func TestInterruptedBurstStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := bench(ctx, []string{"burst", "--runs", "10"}, io.Discard, io.Discard)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("interrupted burst = %v, want the context's error", err)
	}
}
