package main

import (
	"context"
	"errors"
	"io"
	"testing"
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
