package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
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
		keys, _, err := secretbox.Load(k.path)
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

// lockKeyFile waits for, and takes, the lock that makes the changes of the
// key file at path take turns, calling waiting first when another process
// holds it, and returns the function that releases it; it stops waiting
// when ctx ends. A rotation holds it from its read of the file to its end:
// two at once each put their new key first in the file as they had read it,
// and the last to write dropped the other's key, under which secrets were
// sealed. The lock is a flock of the file's directory, kept open until the
// lock is released: the file itself is replaced by a rename, and a lock
// file would stay behind. Servers reading the file never take it.
func lockKeyFile(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("locking the master key file: %w", err)
	}
	// Tried again and again, not waited for in flock(2), which no context
	// can interrupt.
	lock := func() error { return syscall.Flock(int(dir.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) }
	var retry *time.Ticker
	for err = lock(); errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR); err = lock() {
		if retry == nil {
			if waiting != nil {
				waiting()
			}
			retry = time.NewTicker(100 * time.Millisecond)
			defer retry.Stop()
		}
		select {
		case <-retry.C:
		case <-ctx.Done():
			dir.Close()
			return nil, fmt.Errorf("waiting for the lock of the master key file %s: %w", path, ctx.Err())
		}
	}
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("locking the directory of the master key file %s: %w", path, err)
	}
	// Closing the last descriptor of the directory drops the lock.
	return func() { dir.Close() }, nil
}
