package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/pgurl/pgurltest"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// TestOpenErrorNeverQuotesThePassword: a database URL that cannot be used
// is refused with an error that holds no part of its password, so the
// start's error and the logs may show it.
//
// pgx quotes a URL it cannot parse with the passwords it recognizes masked,
// and a malformed one keeps them. An @ left unescaped in a password parses:
// pgx ends the password at the first @ and takes the rest for the host
// name, which the connect error names (after a DNS lookup of it). Each URL
// of pgurltest.Refused is refused before any lookup.
func TestOpenErrorNeverQuotesThePassword(t *testing.T) {
	for _, url := range pgurltest.Refused {
		s, err := postgres.Open(context.Background(), url, postgres.Options{})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) = nil error, want one", url)
			continue
		}
		if strings.Contains(err.Error(), pgurltest.Canary) {
			t.Errorf("Open(%q): the error quotes the password: %v", url, err)
		}
	}
}
