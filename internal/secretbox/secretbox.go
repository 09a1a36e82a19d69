// Package secretbox encrypts job secrets at rest with AES-256-GCM under a
// master key, so a copied database file gives away no signing secret.
//
// A key file holds one key per line, "vjmk_" + unpadded base64url of 32 bytes;
// the first line is the current key (used to seal), later lines are older
// keys still accepted to open. A key's id is the first 16 hex digits of the
// SHA-256 of the key and is stored beside each ciphertext, so keys can be
// rotated: add a new first line, re-seal every secret, then drop the old lines.
package secretbox

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/privatefile"
)

const keyPrefix = "vjmk_"

// ErrUnknownKey means a ciphertext was sealed under a key the keyring lacks.
var ErrUnknownKey = errors.New("secretbox: sealed under a master key this keyring does not hold")

// ErrOpen means a ciphertext failed authentication (wrong key or tampering).
var ErrOpen = errors.New("secretbox: cannot open sealed secret (wrong master key or corrupted data)")

// Keyring seals with its current key and opens with any of its keys. It is
// safe for concurrent use.
type Keyring struct {
	current string
	aeads   map[string]cipher.AEAD
	order   []string
}

// NewKey returns a fresh encoded master key line.
func NewKey() (string, error) {
	var b [32]byte
	if _, err := io.ReadFull(rand.Reader, b[:]); err != nil {
		return "", err
	}
	return keyPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Parse reads a key file's content. Its errors name the line at fault and
// carry none of the file's content: no key is ever printed.
func Parse(data []byte) (*Keyring, error) {
	k, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("secretbox: key file %w", err)
	}
	return k, nil
}

// Load reads the key file at path and returns its keys and its content.
// Its errors name the file, and the line at fault, never a key.
func Load(path string) (*Keyring, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("secretbox: reading master key file: %w", err)
	}
	k, err := parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("secretbox: master key file %s %w", path, err)
	}
	return k, data, nil
}

// parse is Parse, its errors to follow the words "key file" and a name.
func parse(data []byte) (*Keyring, error) {
	k := &Keyring{aeads: map[string]cipher.AEAD{}}
	line := 0
	// Not a bufio.Scanner: it stops at a line over 64 KiB, and the keys
	// after it were dropped without an error.
	for text := range bytes.Lines(data) {
		line++
		s := strings.TrimSpace(string(text))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		raw, err := base64.RawURLEncoding.Strict().DecodeString(strings.TrimPrefix(s, keyPrefix))
		if !strings.HasPrefix(s, keyPrefix) || err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("line %d is not a %s key of 32 bytes", line, keyPrefix)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(raw)
		id := hex.EncodeToString(sum[:8])
		if _, dup := k.aeads[id]; dup {
			continue
		}
		if k.current == "" {
			k.current = id
		}
		k.aeads[id] = aead
		k.order = append(k.order, id)
	}
	if k.current == "" {
		return nil, errors.New("holds no key")
	}
	return k, nil
}

// LoadOrCreate reads the key file at path, creating it with a new key (mode
// 0600) when it does not exist. created reports whether it did. Processes
// starting at once on one data directory (replicas) all end up with the key
// of the one that created it: the file is written aside and linked into
// place whole (see privatefile.Create), so it is never seen empty or half
// written, and a process that loses the race to create it reads the
// winner's.
func LoadOrCreate(path string) (k *Keyring, created bool, err error) {
	k, _, err = Load(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, false, err
	}
	key, err := NewKey()
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("secretbox: creating key file: %w", err)
	}
	if err := privatefile.Create(path, []byte(key+"\n")); errors.Is(err, fs.ErrExist) {
		k, _, err = Load(path) // another process created it first
		return k, false, err
	} else if err != nil {
		return nil, false, fmt.Errorf("secretbox: creating key file: %w", err)
	}
	k, err = Parse([]byte(key))
	return k, true, err
}

// CurrentID is the id of the key that seals.
func (k *Keyring) CurrentID() string { return k.current }

// IDs lists the ids of every key, current first.
func (k *Keyring) IDs() []string { return append([]string(nil), k.order...) }

// Seal encrypts secret for the job jobID under the current key. The job id is
// authenticated data: a ciphertext moved to another job does not open.
func (k *Keyring) Seal(secret, jobID string) (vibejobs.SealedSecret, error) {
	aead := k.aeads[k.current]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(secret)+aead.Overhead())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return vibejobs.SealedSecret{}, err
	}
	return vibejobs.SealedSecret{KeyID: k.current, Ciphertext: aead.Seal(nonce, nonce, []byte(secret), []byte(jobID))}, nil
}

// Open decrypts a sealed secret of job jobID.
func (k *Keyring) Open(s vibejobs.SealedSecret, jobID string) (string, error) {
	aead, ok := k.aeads[s.KeyID]
	if !ok {
		return "", ErrUnknownKey
	}
	n := aead.NonceSize()
	if len(s.Ciphertext) < n+aead.Overhead() {
		return "", ErrOpen
	}
	plain, err := aead.Open(nil, s.Ciphertext[:n], s.Ciphertext[n:], []byte(jobID))
	if err != nil {
		return "", ErrOpen
	}
	return string(plain), nil
}
