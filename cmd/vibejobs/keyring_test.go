package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/privatefile"
	"github.com/vibejobs/vibejobs/internal/secretbox"
)

// TestKeyFileSaysWhenItCannotReload: a key file that changed on disk but
// does not read (unreadable, or not a key file) leaves the server sealing
// and opening with the keys it has; it says so in the log, without a key,
// since secrets a new key sealed elsewhere will not open here. It was
// silent.
func TestKeyFileSaysWhenItCannotReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "master.key")
	keys, _, err := secretbox.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	content, _ := os.ReadFile(path)
	var logs bytes.Buffer
	kf := newKeyFile(path, keys, slog.New(slog.NewTextHandler(&logs, nil)))
	if err := os.WriteFile(path, []byte("not a key file, longer than it was before\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sealed, err := kf.Seal("vjs_secret", "job_1")
	if err != nil || sealed.KeyID != keys.CurrentID() {
		t.Fatalf("Seal with an unreadable key file: %v %v, want the keys in hand", sealed.KeyID, err)
	}
	if plain, err := kf.Open(sealed, "job_1"); err != nil || plain != "vjs_secret" {
		t.Fatalf("Open: %q %v", plain, err)
	}
	if !strings.Contains(logs.String(), "master_key.reload_failed") {
		t.Fatalf("no warning logged: %q", logs.String())
	}
	if strings.Contains(logs.String(), strings.TrimSpace(string(content))) {
		t.Fatal("the log carries the key")
	}
}

// TestKeyFileSeesARotationDuringTheStart: a rotation whose key file lands
// between the start's read of the keys and the moment the server begins
// to seal is seen at the first seal. The file's state was taken after the
// read, so the new file looked like the one read: the server sealed under
// the replaced key for up to the reload interval, after rotate's second
// pass, and those secrets were lost once the older key left the file.
func TestKeyFileSeesARotationDuringTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "master.key")
	keys, _, err := secretbox.LoadOrCreate(path) // the start reads the keys
	if err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(path)
	nk, _ := secretbox.NewKey()
	if err := privatefile.Replace(path, append([]byte(nk+"\n"), old...)); err != nil { // rotate's file lands
		t.Fatal(err)
	}
	rotated, _ := secretbox.Parse([]byte(nk))
	kf := newKeyFile(path, keys, slog.New(slog.DiscardHandler))
	sealed, err := kf.Seal("vjs_secret", "job_1")
	if err != nil || sealed.KeyID != rotated.CurrentID() {
		t.Fatalf("Seal after a rotation: key %s (%v), want the new key %s", sealed.KeyID, err, rotated.CurrentID())
	}
}
