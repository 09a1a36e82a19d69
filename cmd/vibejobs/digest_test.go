package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/examples/digest/digestapp"
)

// TestDigestExampleAgainstThePlatform runs the real platform and the example
// app built on the receiver SDK: scheduled and manual runs are verified,
// accepted durably and processed once each; after a secret rotation the app,
// given the new secret and the old one as previous, keeps accepting.
func TestDigestExampleAgainstThePlatform(t *testing.T) {
	_, api := startMain(t, t.TempDir())
	dir := t.TempDir()

	// The job first (its URL names the app's port, reserved here).
	addr := freeAddr(t)
	code, job := api.do("POST", "/v1/jobs", map[string]any{
		"name": "daily digest", "schedule": "* * * * * *", "url": "http://" + addr + "/",
	})
	if code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	id := job["id"].(string)
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(job["secret"].(string)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	processed := make(chan string, 100)
	app := &digestapp.Main{Listen: addr, SecretFile: secretFile, Database: filepath.Join(dir, "digest.db"),
		JobIDs: []string{id}, PollInterval: 20 * time.Millisecond, Stdout: io.Discard,
		OnProcessed: func(runID string) { processed <- runID }}
	if err := app.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			app.Close()
		}
	}()

	wait := func(what string) string {
		t.Helper()
		select {
		case r := <-processed:
			return r
		case <-time.After(15 * time.Second):
			t.Fatalf("no digest processed (%s)", what)
			return ""
		}
	}
	first := wait("scheduled")
	waitRunState(t, api, first, "succeeded")

	// A manual run too.
	_, run := api.do("POST", "/v1/jobs/"+id+"/runs", nil)
	manual := run["id"].(string)
	for r := wait("manual"); r != manual; r = wait("manual") {
	}
	waitRunState(t, api, manual, "succeeded")

	// Rotate: the platform signs with the new secret from the next attempt;
	// the app restarts with the new secret and the previous one.
	api.do("POST", "/v1/jobs/"+id+"/pause", nil)
	_, rot := api.do("POST", "/v1/jobs/"+id+"/rotate-secret", nil)
	prevFile := filepath.Join(dir, "previous")
	if err := os.Rename(secretFile, prevFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secretFile, []byte(rot["secret"].(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	app.Close()
	closed = true
	app2 := &digestapp.Main{Listen: addr, SecretFile: secretFile, PreviousSecretFile: prevFile, PreviousWindow: 5 * time.Minute,
		Database: filepath.Join(dir, "digest.db"), JobIDs: []string{id}, PollInterval: 20 * time.Millisecond,
		Stdout: io.Discard, OnProcessed: func(runID string) { processed <- runID }}
	if err := app2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer app2.Close()
	_, run = api.do("POST", "/v1/jobs/"+id+"/runs", nil)
	after := run["id"].(string)
	for r := wait("after rotation"); r != after; r = wait("after rotation") {
	}
	got := waitRunState(t, api, after, "succeeded")
	if n := len(got["attempts"].([]any)); n != 1 {
		t.Fatalf("after rotation: %d attempts", n)
	}
}
