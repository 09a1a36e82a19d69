package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/privatefile"
	"github.com/vibejobs/vibejobs/internal/secretbox"
)

// parseStoreFlags parses into c the flags of a command that opens the
// database and does nothing else with the server's settings: where the
// database is, how to log and, with masterKey, the master key file. Their
// environment variables are read; serve's other variables, which an
// environment shared with serve holds, are neither read nor checked. A
// serve flag the command would ignore is refused. On an error, c holds
// what was read up to it (see inLogFormat).
func (c *Config) parseStoreFlags(name string, args []string, getenv func(string) string, stderr io.Writer, masterKey bool) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.storeFlagSet(fs, getenv)
	if masterKey {
		c.masterKeyFlagSet(fs, getenv)
	}
	if err := fs.Parse(args); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok && isServeFlag(f) {
			return fmt.Errorf("%w: %s does not use --%s: it is a setting of vibejobs serve", errUsage, name, f)
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return badInput(c.validateStore())
}

// isServeFlag reports whether name is a flag of vibejobs serve.
func isServeFlag(name string) bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	new(Config).flagSet(fs, func(string) string { return "" })
	return fs.Lookup(name) != nil
}

// migrate runs the migrations of the configured database and exits.
func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	c := new(Config)
	defer func() { err = inLogFormat(c, err) }()
	if err := c.parseStoreFlags("vibejobs migrate", args, getenv, stderr, false); err != nil {
		return err
	}
	store, err := c.openStore(ctx, c.newLogger(stderr), time.Now)
	if err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	fmt.Fprintln(stdout, "migrations applied")
	return store.Close()
}

// masterKey implements "master-key rotate": a new key becomes the first line
// of the key file (older keys stay, so running servers and secrets not yet
// re-sealed keep working), then every secret is re-sealed under it in small
// transactions. Servers pick the new key up when they next read the file.
//
// With JSON logs, what it says on stderr as it works, and its failure, are
// JSON records (master_key.rotation_waiting,
// master_key.previous_secret_dropped); its summary stays on stdout.
func masterKey(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(stdout, masterKeyUsage)
		return nil
	}
	if len(args) == 0 || args[0] != "rotate" {
		fmt.Fprint(stderr, masterKeyUsage)
		return fmt.Errorf("%w: master-key rotate [flags]", errUsage)
	}
	c := new(Config)
	defer func() { err = inLogFormat(c, err) }()
	if err := c.parseStoreFlags("vibejobs master-key rotate", args[1:], getenv, stderr, true); err != nil {
		return err
	}
	logger := c.newLogger(stderr)
	path := c.masterKeyPath()
	// A key file that does not read stops the rotation before the
	// database is opened; it is read again below, once it is our turn.
	if _, _, err := secretbox.Load(path); err != nil {
		return err
	}
	// Rotations take turns, on the key file and on the database (hosts
	// with copies of the file share it): each reads the file and the
	// database's key once the one before it has ended, so none drops the
	// key another put first, and none re-seals under its key what another
	// is re-sealing under its own.
	waiting := func() {
		if c.jsonLogs() {
			logger.Info("master_key.rotation_waiting")
			return
		}
		fmt.Fprintln(stderr, "waiting for another master key rotation to end")
	}
	unlock, err := lockKeyFile(ctx, path, waiting)
	if err != nil {
		return err
	}
	defer unlock()
	store, err := c.openExistingStore(ctx, logger)
	if err != nil {
		return err
	}
	defer store.Close()
	if l, ok := store.(rotationLocker); ok {
		unlock, err := l.LockMasterKeyRotation(ctx, waiting)
		if err != nil {
			return err
		}
		defer unlock()
	}
	oldKeys, old, err := secretbox.Load(path)
	if err != nil {
		return err
	}
	if err := checkMasterKey(ctx, store, oldKeys); err != nil {
		return err
	}
	nk, err := secretbox.NewKey()
	if err != nil {
		return err
	}
	content := append([]byte(nk+"\n"), old...)
	keys, err := secretbox.Parse(content)
	if err != nil {
		return err
	}
	// On disk for good before any secret is sealed under the new key: a
	// file lost to a crash after the re-sealing would lose every secret.
	if err := privatefile.Replace(path, content); err != nil {
		return fmt.Errorf("replacing master key file: %w", err)
	}
	// Servers seal under the new key from their next seal on (they check
	// the file before each). A seal begun just before the file changed may
	// commit after the first pass: a second pass, once such requests are
	// done, re-seals it too.
	secrets, answers := 0, 0
	for pass := range 2 {
		if pass == 1 {
			select {
			case <-time.After(resealSettle):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		n, dropped, err := resealAll(ctx, store, keys, time.Now)
		for _, id := range dropped {
			if c.jsonLogs() {
				logger.Warn("master_key.previous_secret_dropped", "subscription", id)
				continue
			}
			fmt.Fprintf(stderr, "subscription %s: its previous secret does not open with the key file and was dropped; requests are signed with its current secret alone, as they already were\n", id)
		}
		if err != nil {
			return err
		}
		secrets += n
		if n, err = resealAnswers(ctx, store, keys); err != nil {
			return fmt.Errorf("re-sealing stored Idempotency-Key answers (the new key is in place; run rotate again to finish): %w", err)
		}
		answers += n
	}
	// Every secret is under the new key: from now on a server needs it to
	// start (see checkMasterKey).
	if err := store.Update(ctx, func(tx vibejobs.Tx) error { return tx.SetMasterKey(ctx, keys.CurrentID()) }); err != nil {
		return fmt.Errorf("recording the new master key (run rotate again to finish): %w", err)
	}
	fmt.Fprintf(stdout, "master key rotated: new key %s, %d secrets and %d stored Idempotency-Key answers re-sealed; older keys remain in %s until you remove them\n",
		keys.CurrentID(), secrets, answers, path)
	return nil
}

// openExistingStore opens the configured database for "master-key rotate",
// which creates none. Opened as serve opens it, a SQLite file that is not
// there, or a PostgreSQL schema never migrated (a mistyped database name or
// search_path), would be made empty, and the rotation would succeed on it: a
// new key first in the file, none of the real database's secrets under it,
// and older keys said to be of no more use.
func (c *Config) openExistingStore(ctx context.Context, logger *slog.Logger) (vibejobs.Store, error) {
	if pgURL, ok := postgresURL(c.Database); ok {
		return postgres.Open(ctx, pgURL, postgres.Options{Logger: logger, MustExist: true})
	}
	db := c.sqlitePath()
	if _, err := os.Stat(db); err != nil {
		return nil, fmt.Errorf("no database to re-seal at %s (on PostgreSQL, give --database or VIBEJOBS_DATABASE): %w", db, err)
	}
	return c.openStore(ctx, logger, time.Now)
}

// rotationLocker is a Store whose database hosts share, each with its copy
// of the key file: its lock makes their rotations take turns (the key
// file's lock covers one host).
type rotationLocker interface {
	LockMasterKeyRotation(ctx context.Context, waiting func()) (unlock func(), err error)
}

const masterKeyUsage = `Usage: vibejobs master-key rotate [flags]

  rotate   put a new master key first in the key file and re-seal every
           secret under it, while servers keep running

"vibejobs master-key rotate -h" lists its flags.
`

// isHelp reports whether arg asks for a command's usage.
func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "help" }

// resealSettle is how long "master-key rotate" waits for requests that
// sealed a secret under the old key just before the key file changed.
const resealSettle = 2 * time.Second

// resealAll re-seals every job and subscription secret not sealed under
// keys' current key, and returns how many, with the ids of the subscriptions
// whose previous secret it dropped because it does not open (see
// resealSubscriptions; returned with an error too).
func resealAll(ctx context.Context, store vibejobs.Store, keys *secretbox.Keyring, now func() time.Time) (int, []string, error) {
	total := 0
	var dropped []string
	for {
		n := 0
		err := store.Update(ctx, func(tx vibejobs.Tx) error {
			jobs, err := tx.SecretsNotUnder(ctx, keys.CurrentID(), 200)
			if err != nil {
				return err
			}
			n = len(jobs)
			for _, j := range jobs {
				plain, err := keys.Open(j.Secret, j.ID)
				if err != nil {
					return fmt.Errorf("opening the secret of %s: %w", j.ID, err)
				}
				sealed, err := keys.Seal(plain, j.ID)
				if err != nil {
					return err
				}
				if err := tx.SetJobSecret(ctx, j.ID, sealed); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, nil, fmt.Errorf("re-sealing secrets (the new key is in place; run rotate again to finish): %w", err)
		}
		total += n
		if n == 0 {
			break
		}
	}
	for {
		n, d, err := resealSubscriptions(ctx, store, keys, now())
		if err != nil {
			return 0, dropped, fmt.Errorf("re-sealing subscription secrets (the new key is in place; run rotate again to finish): %w", err)
		}
		total, dropped = total+n, append(dropped, d...)
		if n == 0 {
			break
		}
	}
	return total, dropped, nil
}

// resealAnswers re-seals the stored answers of completed Idempotency-Key
// records (they hold the secrets of the jobs and tokens they created), 200
// records a transaction, and returns how many changed.
func resealAnswers(ctx context.Context, store vibejobs.Store, keys *secretbox.Keyring) (int, error) {
	total, project, key := 0, "", ""
	for {
		var recs []*vibejobs.IdempotencyRecord
		n := 0
		err := store.Update(ctx, func(tx vibejobs.Tx) error {
			var err error
			if recs, err = tx.CompletedIdempotencyKeys(ctx, project, key, 200); err != nil {
				return err
			}
			n = 0
			for _, rec := range recs {
				if rec.ExpiresAt.Before(time.Now()) {
					// Never replayed again, and pruned soon: an answer an
					// older rotation left under a key since removed must
					// not stop this one.
					continue
				}
				changed, err := api.ResealAnswer(rec, keys, keys.CurrentID())
				if err != nil {
					return err
				}
				if !changed {
					continue
				}
				// A record taken over since it was read (it had expired)
				// holds another answer, sealed under the new key already.
				switch err := tx.SetIdempotencyAnswer(ctx, rec); {
				case err == nil:
					n++
				case vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND:
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		total += n
		if len(recs) < 200 {
			return total, nil
		}
		project, key = recs[len(recs)-1].ProjectID, recs[len(recs)-1].Key
	}
}

// resealSubscriptions re-seals, in one transaction, up to 200 subscriptions
// whose current or previous secret is sealed under an older key, and
// returns how many, with the ids of those whose previous secret it dropped
// because it does not open. Every subscription it lists ends with both
// secrets under keys' current key or the previous one gone, so a caller
// looping until it returns 0 ends.
//
// A previous secret signs only until its grace window ends: one whose
// window ended at now is dropped unopened. One still in its window that
// does not open (sealed under a master key the file lost; rows rotated
// before the API dropped such secrets hold one) is dropped too and named:
// the deliverer already signs without it, so no receiver sees a change,
// while kept it could never be re-sealed and would fail every rotation
// until the subscription's secret is rotated again. A current secret that
// does not open still fails the rotation: it is the subscription's only
// way to sign, and dropping it is not ours to do (rotating it through the
// API is).
func resealSubscriptions(ctx context.Context, store vibejobs.Store, keys *secretbox.Keyring, now time.Time) (int, []string, error) {
	n := 0
	var dropped []string
	err := store.Update(ctx, func(tx vibejobs.Tx) error {
		subs, err := tx.SubscriptionSecretsNotUnder(ctx, keys.CurrentID(), 200)
		if err != nil {
			return err
		}
		n, dropped = len(subs), nil
		for _, s := range subs {
			current, err := reseal(keys, s.Secret, s.ID)
			if err != nil {
				return err
			}
			var previous vibejobs.SealedSecret
			if s.PreviousSecret.KeyID != "" && s.PreviousExpiresAt != nil && now.Before(*s.PreviousExpiresAt) {
				if plain, err := keys.Open(s.PreviousSecret, s.ID); err != nil {
					dropped = append(dropped, s.ID)
				} else if previous, err = keys.Seal(plain, s.ID); err != nil {
					return err
				}
			}
			if err := tx.SetSubscriptionSecrets(ctx, s.ID, current, previous); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return n, dropped, nil
}

func reseal(keys *secretbox.Keyring, sealed vibejobs.SealedSecret, aad string) (vibejobs.SealedSecret, error) {
	plain, err := keys.Open(sealed, aad)
	if err != nil {
		return vibejobs.SealedSecret{}, fmt.Errorf("opening the secret of %s: %w", aad, err)
	}
	return keys.Seal(plain, aad)
}
