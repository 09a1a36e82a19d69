package pgurl_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/pgurl"
	"github.com/vibejobs/vibejobs/internal/pgurl/pgurltest"
)

// TestParseConfigNeverQuotesThePassword: each string of pgurltest.Refused
// is refused with one of pgurl's errors, which quote none of it.
func TestParseConfigNeverQuotesThePassword(t *testing.T) {
	for _, s := range pgurltest.Refused {
		_, err := pgurl.ParseConfig(s)
		if !errors.Is(err, pgurl.ErrUnparsable) && !errors.Is(err, pgurl.ErrAtInHost) {
			t.Errorf("ParseConfig(%q) = %v, want ErrUnparsable or ErrAtInHost", s, err)
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
