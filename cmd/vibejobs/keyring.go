package main

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/secretbox"
)

// keyFile is a secretbox.Keyring that follows its key file, so "master-key
// rotate" takes effect on running servers without a restart: a secret sealed
// under a key the server does not know yet makes it re-read the file, the
// file is re-read at most every reloadEvery for opening, and before every
// seal when it changed on disk, so that nothing is sealed under a key the
// rotation has replaced once the rotation's file is in place.
type keyFile struct {
	path        string
	reloadEvery time.Duration
	logger      *slog.Logger

	mu     sync.Mutex
	keys   *secretbox.Keyring
	loaded time.Time
	info   os.FileInfo // of the file keys were read from; nil if unknown
}

// newKeyFile returns a keyFile starting with keys, read from path earlier.
// What the file is now is not recorded as what keys came from: a rotation
// may have replaced it since, and the first seal re-reads it.
func newKeyFile(path string, keys *secretbox.Keyring, logger *slog.Logger) *keyFile {
	return &keyFile{path: path, reloadEvery: 10 * time.Second, logger: logger, keys: keys, loaded: time.Now()}
}

func (k *keyFile) current(force bool) *secretbox.Keyring {
	k.mu.Lock()
	defer k.mu.Unlock()
	if force || time.Since(k.loaded) > k.reloadEvery {
		k.loaded = time.Now()
		info, _ := os.Stat(k.path) // before the read: a change after it is seen next time
		data, err := os.ReadFile(k.path)
		var keys *secretbox.Keyring
		if err == nil {
			keys, err = secretbox.Parse(data)
		}
		if err != nil {
			// The keys in hand go on sealing and opening: say so, as
			// secrets the file's new key sealed elsewhere will not open.
			k.logger.Warn("master_key.reload_failed", "path", k.path, "error", err.Error())
		} else {
			k.keys, k.info = keys, info
		}
	}
	return k.keys
}

// Seal seals under the current key of the file, as it is on disk now.
func (k *keyFile) Seal(secret, jobID string) (vibejobs.SealedSecret, error) {
	return k.current(k.changed()).Seal(secret, jobID)
}

// changed reports whether the key file on disk is not the one last read
// (rotate replaces it by a rename).
func (k *keyFile) changed() bool {
	info, err := os.Stat(k.path)
	if err != nil {
		return false // keep sealing under the keys in hand
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.info == nil || !os.SameFile(k.info, info) || !info.ModTime().Equal(k.info.ModTime()) || info.Size() != k.info.Size()
}

// Open opens s, re-reading the key file once when s names an unknown key.
func (k *keyFile) Open(s vibejobs.SealedSecret, jobID string) (string, error) {
	plain, err := k.current(false).Open(s, jobID)
	if errors.Is(err, secretbox.ErrUnknownKey) {
		plain, err = k.current(true).Open(s, jobID)
	}
	return plain, err
}
