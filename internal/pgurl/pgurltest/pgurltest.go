// Package pgurltest holds the connection strings that every Open built on
// pgurl.ParseConfig must refuse without quoting their password, for the
// tests of pgurl and of each such Open.
package pgurltest

// Canary is the password, or the part of one, that no error may quote.
const Canary = "Canary7pw"

// Refused are connection strings that carry Canary in a password and that
// cannot be used: malformed ones, which pgx's parse error would quote with
// the password unmasked (an unterminated quote, spaces around the =, an
// escaped space, a pool setting that does not parse), and ones whose host
// holds an @ (an @ left unescaped in a password), which pgx parses with the
// rest of the password as the host name, named by every connect error after
// a DNS lookup of it, and one naming a TLS file that does not exist,
// which pgx reads as it parses. Each is refused before any lookup.
var Refused = []string{
	"host=127.0.0.1 user=app password='x " + Canary,
	"host=127.0.0.1 user=app password = " + Canary + " port=x",
	"host=127.0.0.1 user=app password=x\\ " + Canary + " y",
	"postgres://app:" + Canary + "@127.0.0.1:99999/db",
	"postgres://app:" + Canary + "@127.0.0.1:1/db?pool_max_conns=x",
	"postgres://app:x@" + Canary + "@127.0.0.1:1/db",
	"postgres://app:x@" + Canary + "@127.0.0.1:1,127.0.0.1:2/db",
	"postgres://app:x@127.0.0.1:1,x@" + Canary + "@127.0.0.1:2/db",
	"host=x@" + Canary + "@127.0.0.1 port=1 user=app",
	"postgres://app:" + Canary + "@127.0.0.1:1/db?sslrootcert=/nonexistent/vibejobs-test/root.crt",
}
