package pgurl_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vibejobs/vibejobs/internal/pgurl"
	"github.com/vibejobs/vibejobs/internal/pgurl/pgurltest"
)

// TestParseConfigNeverQuotesThePassword: each string of pgurltest.Refused
// is refused with one of pgurl's errors, which quote none of it.
func TestParseConfigNeverQuotesThePassword(t *testing.T) {
	for _, s := range pgurltest.Refused {
		_, err := pgurl.ParseConfig(s)
		var fe *pgurl.FileError
		if !errors.Is(err, pgurl.ErrUnparsable) && !errors.Is(err, pgurl.ErrAtInHost) && !errors.As(err, &fe) {
			t.Errorf("ParseConfig(%q) = %v, want ErrUnparsable, ErrAtInHost or a FileError", s, err)
			continue
		}
		if strings.Contains(err.Error(), pgurltest.Canary) {
			t.Errorf("ParseConfig(%q): the error quotes the password: %v", s, err)
		}
	}
}

// TestParseConfigTakesAGoodURL: a usable URL parses, an @ escaped as %40 in
// its password included.
func TestParseConfigTakesAGoodURL(t *testing.T) {
	cfg, err := pgurl.ParseConfig("postgres://app:x%40y@127.0.0.1:5432/db?sslmode=disable")
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	if c := cfg.ConnConfig; c.Host != "127.0.0.1" || c.Password != "x@y" || c.Database != "db" {
		t.Errorf("parsed host %q password %q database %q", c.Host, c.Password, c.Database)
	}
}

// TestParseConfigNamesAFileItCannotRead: a URL naming a TLS file that
// cannot be read (pgx reads them as it parses) is refused with a
// *FileError that names the setting and the cause, neither the path nor
// the password. It was ErrUnparsable, "cannot parse the database URL",
// which sent the operator looking for a typo in a URL that had none.
func TestParseConfigNamesAFileItCannotRead(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "Missing7file.crt")
	key := filepath.Join(dir, "client.key")
	if err := os.WriteFile(key, pemKey(t), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "postgres://app:" + pgurltest.Canary + "@127.0.0.1:5432/db?sslmode=verify-full&"
	for _, tc := range []struct {
		name, query, env, setting string
		cause                     error
	}{
		{"root cert missing", "sslrootcert=" + missing, "", "sslrootcert", fs.ErrNotExist},
		{"root cert a directory", "sslrootcert=" + dir, "", "sslrootcert", syscall.EISDIR},
		{"root cert from the environment", "", missing, "sslrootcert", fs.ErrNotExist},
		{"client cert missing", "sslcert=" + missing + "&sslkey=" + key, "", "sslcert", fs.ErrNotExist},
		{"client key missing", "sslcert=" + key + "&sslkey=" + missing, "", "sslkey", fs.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PGSSLROOTCERT", tc.env)
			_, err := pgurl.ParseConfig(base + tc.query)
			var fe *pgurl.FileError
			if !errors.As(err, &fe) || fe.Setting != tc.setting || !errors.Is(err, tc.cause) {
				t.Fatalf("ParseConfig = %#v; want a FileError for %s, %v", err, tc.setting, tc.cause)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.setting+" file") || !strings.Contains(msg, "PG"+strings.ToUpper(tc.setting)) {
				t.Errorf("the error does not name %s: %s", tc.setting, msg)
			}
			for _, secret := range []string{pgurltest.Canary, "Missing7file", dir} {
				if strings.Contains(msg, secret) {
					t.Errorf("the error quotes the URL (%s): %s", secret, msg)
				}
			}
		})
	}
}

// pemKey returns an EC private key in PEM, for pgx to read as sslkey.
func pemKey(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}
