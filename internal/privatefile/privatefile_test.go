package privatefile_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/vibejobs/vibejobs/internal/privatefile"
)

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "master.key")
	if err := privatefile.Create(path, []byte("first\n")); err != nil {
		t.Fatal(err)
	}
	wantFile(t, path, "first\n")
	if err := privatefile.Create(path, []byte("second\n")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create over an existing file: %v, want fs.ErrExist", err)
	}
	wantFile(t, path, "first\n")
	wantOnly(t, dir, "master.key")
}

func TestReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if err := os.WriteFile(path, []byte("old, world-readable\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := privatefile.Replace(path, []byte("new\n")); err != nil {
		t.Fatal(err)
	}
	wantFile(t, path, "new\n")
	wantOnly(t, dir, "token")
	if err := privatefile.Replace(filepath.Join(dir, "missing", "token"), nil); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Replace in a missing directory: %v, want fs.ErrNotExist", err)
	}
}

// wantFile checks path's content and that only its owner may read it.
func wantFile(t *testing.T, path, content string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || string(b) != content {
		t.Fatalf("%s holds %q (%v), want %q", path, b, err, content)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s mode %v (%v), want 0600", path, fi.Mode().Perm(), err)
	}
}

// wantOnly checks that dir holds name alone: no file written beside it stays.
func wantOnly(t *testing.T, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != name {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("%s holds %q, want only %q", dir, names, name)
	}
}
