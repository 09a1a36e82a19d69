// Package pgurl reads a PostgreSQL connection string (a postgres:// URL or
// a key=value DSN) into a pool configuration with errors that quote none of
// it, so that they may be shown and logged.
package pgurl

import (
	"errors"
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

// ParseConfig parses url as pgxpool.ParseConfig does, and refuses with
// ErrUnparsable what does not parse and with ErrAtInHost a host or
// fallback host holding an @; neither quotes url.
func ParseConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
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
