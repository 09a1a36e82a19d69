package postgres

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/vibejobs/vibejobs"
)

// TestServerStatesThatMeanUnavailable: the server's answers that say the
// database is away or cannot work for now (shutting down, starting, too
// many connections, a standby during a failover, out of disk or memory, a
// statement cancelled by the server's statement_timeout) are the
// unavailable kind: the API answers 503 and the dispatcher keeps the
// outcomes it could not write, as on SQLite for a full disk. A refusal of
// the statement itself is not.
func TestServerStatesThatMeanUnavailable(t *testing.T) {
	for code, want := range map[string]string{
		"08006": vibejobs.EUNAVAILABLE, "57P01": vibejobs.EUNAVAILABLE, "57P03": vibejobs.EUNAVAILABLE,
		"53300": vibejobs.EUNAVAILABLE, "25006": vibejobs.EUNAVAILABLE,
		"53100": vibejobs.EUNAVAILABLE, "53200": vibejobs.EUNAVAILABLE, "57014": vibejobs.EUNAVAILABLE,
		"23505": "", "42P01": "",
	} {
		err := mapError(&pgconn.PgError{Code: code}, "testing")
		var ve *vibejobs.Error
		got := ""
		if errors.As(err, &ve) {
			got = ve.Kind
		}
		if got != want {
			t.Errorf("SQLSTATE %s: kind %q, want %q", code, got, want)
		}
	}
}
