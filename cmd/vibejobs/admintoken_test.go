package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func tokenMain(dataDir string, out io.Writer) *Main {
	m := NewMain(out, io.Discard)
	m.Config = Config{Listen: "127.0.0.1:0", DataDir: dataDir, LogFormat: "text", LogLevel: "error",
		Concurrency: 8, PerHost: 8, RetentionDays: 90, MaxJobsPerProject: 10}
	return m
}

// TestAdminTokenFileMode: the installation token is saved with mode 0600
// even over a file already at that path, whose mode a write in place kept
// (0644: readable by everyone).
func TestAdminTokenFileMode(t *testing.T) {
	dataDir := t.TempDir()
	path := filepath.Join(dataDir, "admin.token")
	if err := os.WriteFile(path, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	m := tokenMain(dataDir, io.Discard)
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(b)) != m.AdminToken || m.AdminToken == "" {
		t.Fatalf("admin.token does not hold the new token (%v)", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.token holding the installation token: %v %v, want mode 0600", fi.Mode().Perm(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(dataDir, ".admin.token*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// TestAdminTokenShownWhenNotSaved: the installation token is committed
// before it is saved, and no later start creates another; so when saving it
// fails the start still shows it, once, and says it was not saved. It
// failed the start without showing it: nobody could ever know it.
func TestAdminTokenShownWhenNotSaved(t *testing.T) {
	dataDir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dataDir, "admin.token"), 0o700); err != nil { // in the way
		t.Fatal(err)
	}
	var out bytes.Buffer
	m := tokenMain(dataDir, &out)
	err := m.Run(context.Background())
	m.Close()
	if err != nil {
		t.Fatalf("start with admin.token unwritable: %v", err)
	}
	if m.AdminToken == "" || !strings.Contains(out.String(), m.AdminToken) || !strings.Contains(out.String(), "could not be saved") {
		t.Fatalf("the installation token was not shown, or not said unsaved: %q", out.String())
	}
}
