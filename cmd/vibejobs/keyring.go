package main

import (
	"errors"
	"os"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/secretbox"
)

// keyFile is a secretbox.Keyring that follows its key file, so "master-key
// rotate" takes effect on running servers without a restart: a secret sealed
// under a key the server does not know yet makes it re-read the file, and the
// file is re-read at most every reloadEvery for the current sealing key.
type keyFile struct {
	path        string
	reloadEvery time.Duration

	mu     sync.Mutex
	keys   *secretbox.Keyring
	loaded time.Time
}

func newKeyFile(path string, keys *secretbox.Keyring) *keyFile {
	return &keyFile{path: path, reloadEvery: 10 * time.Second, keys: keys, loaded: time.Now()}
}

func (k *keyFile) current(force bool) *secretbox.Keyring {
	k.mu.Lock()
	defer k.mu.Unlock()
	if force || time.Since(k.loaded) > k.reloadEvery {
		k.loaded = time.Now()
		if data, err := os.ReadFile(k.path); err == nil {
			if keys, err := secretbox.Parse(data); err == nil {
				k.keys = keys
			}
		}
	}
	return k.keys
}

// Seal seals under the current key of the file.
func (k *keyFile) Seal(secret, jobID string) (vibejobs.SealedSecret, error) {
	return k.current(false).Seal(secret, jobID)
}

// Open opens s, re-reading the key file once when s names an unknown key.
func (k *keyFile) Open(s vibejobs.SealedSecret, jobID string) (string, error) {
	plain, err := k.current(false).Open(s, jobID)
	if errors.Is(err, secretbox.ErrUnknownKey) {
		plain, err = k.current(true).Open(s, jobID)
	}
	return plain, err
}
