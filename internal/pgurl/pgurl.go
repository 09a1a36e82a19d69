// Package pgurl reads a PostgreSQL connection string (a postgres:// URL or
// a key=value DSN) into a pool configuration with errors that quote none of
// it, so that they may be shown and logged.
package pgurl

import (
	"errors"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	// ErrUnparsable: pgx's own parse error quotes the string with the
	// passwords it recognizes masked, and a malformed one ("password = x",
	// an unterminated quote) keeps them in plain text.
	ErrUnparsable = errors.New("cannot parse the database URL")
	// ErrAtInHost: pgx ends a URL's password at its first @, so a password
	// with an @ left unescaped puts its rest in the host name, which every
	// connect error names (after asking DNS for it). No host name holds an
	// @.
	ErrAtInHost = errors.New("the database URL's host holds an @: write an @ of the user or password as %40")
)

// FileError is ParseConfig's refusal of a connection string naming a file
// that cannot be read: pgx reads the TLS files (sslrootcert, sslcert,
// sslkey, from the string or from their PG* variables) as it parses. It
// names the setting, and never the path, which is part of the string.
type FileError struct {
	// Setting is sslrootcert, sslcert or sslkey; "" when pgx's error did
	// not say which.
	Setting string
	// Err says why, without the path: fs.ErrNotExist, fs.ErrPermission
	// or another error of the system.
	Err error
}

func (e *FileError) Error() string {
	if e.Setting == "" {
		return "cannot read a file the database URL names (sslrootcert, sslcert or sslkey): " + e.Err.Error()
	}
	return "cannot read the " + e.Setting + " file the database URL names (or PG" + strings.ToUpper(e.Setting) + "): " + e.Err.Error()
}

func (e *FileError) Unwrap() error { return e.Err }

// fileSettings are the TLS settings that name a file, by the text with
// which pgx's parse error begins when it cannot read that file.
var fileSettings = []struct{ prefix, setting string }{
	{"unable to read CA file:", "sslrootcert"},
	{"unable to read cert:", "sslcert"},
	{"unable to read sslkey:", "sslkey"},
}

// ParseConfig parses url as pgxpool.ParseConfig does, and refuses with
// ErrUnparsable what does not parse, with a *FileError a file it names
// that cannot be read, and with ErrAtInHost a host or fallback host
// holding an @; none quotes url.
func ParseConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		if fe := fileError(err); fe != nil {
			return nil, fe
		}
		return nil, ErrUnparsable
	}
	bad := strings.Contains(cfg.ConnConfig.Host, "@")
	for _, fb := range cfg.ConnConfig.Fallbacks {
		bad = bad || strings.Contains(fb.Host, "@")
	}
	if bad {
		return nil, ErrAtInHost
	}
	return cfg, nil
}

// fileError returns the *FileError that err, pgx's parse error, stands for,
// or nil when err is of another kind: pgx's error quotes the string, and
// the *fs.PathError it wraps the path.
func fileError(err error) *FileError {
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		return nil
	}
	fe := &FileError{Err: pe.Err}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if errors.Unwrap(e) != error(pe) {
			continue
		}
		for _, f := range fileSettings {
			if strings.HasPrefix(e.Error(), f.prefix) {
				fe.Setting = f.setting
			}
		}
	}
	return fe
}
