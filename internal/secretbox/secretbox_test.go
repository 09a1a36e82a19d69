package secretbox_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vibejobs/vibejobs/internal/secretbox"
)

func TestSealOpenAndRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "master.key")
	k1, created, err := secretbox.LoadOrCreate(path)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v err %v", fi.Mode(), err)
	}
	const secret = "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	s, err := k1.Seal(secret, "job_a")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(s.Ciphertext, []byte(secret)) || bytes.Contains(s.Ciphertext, []byte("AAECAwQF")) {
		t.Fatal("ciphertext carries the plaintext")
	}
	if got, err := k1.Open(s, "job_a"); err != nil || got != secret {
		t.Fatalf("open: %q %v", got, err)
	}
	if _, err := k1.Open(s, "job_b"); !errors.Is(err, secretbox.ErrOpen) {
		t.Fatalf("moved to another job: %v", err)
	}
	// Reloading gives the same key.
	k1b, created, err := secretbox.LoadOrCreate(path)
	if err != nil || created || k1b.CurrentID() != k1.CurrentID() {
		t.Fatalf("reload: %v %v", created, err)
	}
	// Rotation: a new first line seals, the old line still opens.
	old, _ := os.ReadFile(path)
	nk, _ := secretbox.NewKey()
	k2, err := secretbox.Parse(append([]byte(nk+"\n"), old...))
	if err != nil {
		t.Fatal(err)
	}
	if k2.CurrentID() == k1.CurrentID() || len(k2.IDs()) != 2 {
		t.Fatalf("ids %v", k2.IDs())
	}
	if got, err := k2.Open(s, "job_a"); err != nil || got != secret {
		t.Fatalf("open with old key: %v", err)
	}
	// A keyring without the old key refuses.
	k3, _ := secretbox.Parse([]byte(nk))
	if _, err := k3.Open(s, "job_a"); !errors.Is(err, secretbox.ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
	// A wrong key under the same id (tampered file) does not open.
	s.Ciphertext[len(s.Ciphertext)-1] ^= 1
	if _, err := k1.Open(s, "job_a"); !errors.Is(err, secretbox.ErrOpen) {
		t.Fatalf("tampered: %v", err)
	}
}

func TestParseRejectsBadFiles(t *testing.T) {
	for _, bad := range []string{"", "# only a comment\n", "vjmk_short", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8", "vjmk_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8x"} {
		if _, err := secretbox.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// TestParseReadsEveryLine: a line longer than 64 KiB (a long comment) does
// not end the file: the keys after it were dropped, and secrets sealed
// under them no longer opened, with no error. A long line that is no key
// is refused as any other.
func TestParseReadsEveryLine(t *testing.T) {
	const key1 = "vjmk_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	const key2 = "vjmk_ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8"
	long := strings.Repeat("x", 70<<10)
	k, err := secretbox.Parse([]byte(key1 + "\n# " + long + "\n" + key2 + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ids := k.IDs(); len(ids) != 2 {
		t.Errorf("Parse kept %d keys, want 2", len(ids))
	}
	if _, err := secretbox.Parse([]byte(key1 + "\n" + long + "\n" + key2 + "\n")); err == nil {
		t.Error("Parse accepted a long line that is no key")
	}
}

// TestLoadOrCreateAtOnce: replicas sharing a data directory start together.
// Each one loads the one key that one of them created; none fails, and none
// reads the file empty or half written.
func TestLoadOrCreateAtOnce(t *testing.T) {
	for round := range 100 {
		path := filepath.Join(t.TempDir(), "data", "master.key")
		const n = 8
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			ids     [n]string
			errs    [n]error
			created atomic.Int32
		)
		for i := range n {
			wg.Go(func() {
				<-start
				k, c, err := secretbox.LoadOrCreate(path)
				errs[i] = err
				if err == nil {
					ids[i] = k.CurrentID()
				}
				if c {
					created.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d: a process starting at the same time failed: %v", round, errs[i])
			}
			if ids[i] != ids[0] {
				t.Fatalf("round %d: processes hold different keys: %v", round, ids)
			}
		}
		if c := created.Load(); c != 1 {
			t.Fatalf("round %d: %d processes say they created the key, want 1", round, c)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("round %d: key file %v, %v; want mode 0600", round, fi, err)
		}
		if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".master.key.*")); len(left) != 0 {
			t.Fatalf("round %d: temporary files left: %v", round, left)
		}
	}
}

// TestKeyFileErrorsNameTheFile: a key file that does not parse is named in
// the error, with the line at fault, and no key of it is: an operator with
// several key files (one per server, or one given by
// VIBEJOBS_MASTER_KEY_FILE) was told only of "key file line 2".
func TestKeyFileErrorsNameTheFile(t *testing.T) {
	const key = "vjmk_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	const bad = "vjmk_ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8x" // one character too many
	for _, tc := range []struct{ content, what string }{
		{key + "\n" + bad + "\n", "line 2"},
		{"# no key\n", "no key"},
	} {
		path := filepath.Join(t.TempDir(), "keys", "master.key")
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		for name, load := range map[string]func() error{
			"LoadOrCreate": func() error { _, _, err := secretbox.LoadOrCreate(path); return err },
			"Load":         func() error { _, _, err := secretbox.Load(path); return err },
		} {
			err := load()
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.what) {
				t.Errorf("%s of %q: %v, want an error naming %s and %s", name, tc.content, err, path, tc.what)
				continue
			}
			if strings.Contains(err.Error(), key[5:15]) || strings.Contains(err.Error(), bad[5:15]) {
				t.Errorf("%s: the error carries key material: %v", name, err)
			}
		}
	}
}
