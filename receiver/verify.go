// Package receiver is the SDK for apps that receive vibejobs deliveries. It does
// what the wire contract asks of a receiver so that an app does not have to get
// it right by hand:
//
//   - [Verifier] checks the Vibe-Signature header (exact form, freshness, HMAC in
//     constant time) against the current job secret and, during a rotation, the
//     previous one until its expiry.
//   - [NewHandler] is an http.Handler that refuses a Content-Type other than
//     application/json and a Content-Encoding other than identity (415),
//     reads the raw body through the 64 KiB bound,
//     counts physical header lines, verifies, validates the body against the
//     contract's schema ([ValidatePayload]) and durably accepts the run through a
//     [Store], answering with the stored response only after commit.
//     [NewMiddleware] does the same checks and hands the request to the app's own
//     handler instead.
//   - [Worker] drains the outbox: it claims items under a lease, runs the app's
//     function with the run id as idempotency key, retries with backoff and takes
//     over items whose worker died.
//   - [Retention] deletes processed receipts after the retention period.
//
// The package imports only the standard library and the contract package; the
// stores live in the subpackages pgstore (PostgreSQL, pgx) and sqlitestore
// (SQLite, modernc.org/sqlite).
//
// Keep the app's clock synchronized (NTP or the like): a signature whose time
// is more than contract.FreshnessSeconds from the app's clock is refused with
// 401, and the platform takes 401 and 403 as a refusal for good: the run
// fails, app_rejected, and is not retried. The same holds for a delivery
// signed with a secret the app has not loaded yet: the platform signs with a
// job's new secret from the moment rotate-secret answers, so load it with
// [Verifier.Rotate] at once (the previous one stays valid for the window,
// for attempts signed before).
//
// Nothing in this package logs or returns in an error the secret, the signature
// header or the body.
package receiver

import (
	"errors"
	"iter"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/vibejobs/vibejobs/contract"
)

// Errors of request verification, in addition to contract.ErrMalformedSignature,
// contract.ErrStaleSignature and contract.ErrBadSignature. None of them carries a
// header value.
var (
	// ErrCallerKind means the X-Vibe-Caller-Kind header is missing, repeated or
	// not "schedule".
	ErrCallerKind = errors.New("receiver: caller kind is not a single \"schedule\" header")
	// ErrSignatureHeader means the Vibe-Signature header is missing or appears on
	// more than one physical line.
	ErrSignatureHeader = errors.New("receiver: not exactly one Vibe-Signature header")
	// ErrInvalidSecret means a configured secret does not have the job secret
	// format ("vjs_" and 43 base64url characters).
	ErrInvalidSecret = errors.New("receiver: secret does not have the job secret format")
	// ErrPreviousWithoutExpiry means Secrets.Previous is set without
	// PreviousExpiresAt: such a secret would never be accepted.
	ErrPreviousWithoutExpiry = errors.New("receiver: a previous secret needs PreviousExpiresAt")
)

// DefaultRotationWindow is how long [Verifier.Rotate] keeps accepting the
// replaced secret: the platform may have signed an attempt with it just before
// the rotation, and such a signature stays fresh for at most 5 minutes.
const DefaultRotationWindow = contract.FreshnessSeconds * time.Second

// Secrets are the keys a [Verifier] accepts: the current job secret and,
// during a rotation, the previous one until PreviousExpiresAt (exclusive).
type Secrets struct {
	Current           string
	Previous          string
	PreviousExpiresAt time.Time
}

func (s Secrets) validate() error {
	if !contract.ValidSecret(s.Current) {
		return ErrInvalidSecret
	}
	if s.Previous != "" && !contract.ValidSecret(s.Previous) {
		return ErrInvalidSecret
	}
	if s.Previous != "" && s.PreviousExpiresAt.IsZero() {
		return ErrPreviousWithoutExpiry
	}
	return nil
}

// Verifier verifies delivery signatures. It is safe for concurrent use; the
// secrets can be replaced at any time with [Verifier.SetSecrets] or
// [Verifier.Rotate] while requests are being verified. The zero Verifier
// holds no secret, so it refuses every signature, and uses time.Now as its
// clock; give it its secrets with SetSecrets. Until then a [Handler] built on
// it answers deliveries 503, which the platform retries, rather than 401.
type Verifier struct {
	clock   func() time.Time // nil: time.Now
	secrets atomic.Pointer[Secrets]
}

func (v *Verifier) now() time.Time {
	if v.clock == nil {
		return time.Now()
	}
	return v.clock()
}

// NewVerifier returns a Verifier for s. now is the clock used for freshness and
// for the previous secret's expiry; nil means time.Now. Secrets that do not have
// the job secret format (for example with a trailing newline from a file) are
// rejected with ErrInvalidSecret.
func NewVerifier(s Secrets, now func() time.Time) (*Verifier, error) {
	v := &Verifier{clock: now}
	if err := v.SetSecrets(s); err != nil {
		return nil, err
	}
	return v, nil
}

// SetSecrets replaces the accepted secrets. On error the old ones stay.
func (v *Verifier) SetSecrets(s Secrets) error {
	if err := s.validate(); err != nil {
		return err
	}
	v.secrets.Store(&s)
	return nil
}

// hasSecret reports whether v holds a secret: SetSecrets and Rotate store
// only secrets with a Current one.
func (v *Verifier) hasSecret() bool { return v.secrets.Load() != nil }

// Secrets returns the secrets in force (none for a zero Verifier).
func (v *Verifier) Secrets() Secrets {
	if s := v.secrets.Load(); s != nil {
		return *s
	}
	return Secrets{}
}

// Rotate makes next the current secret and keeps accepting the one it replaces
// for window (DefaultRotationWindow when window ≤ 0) from now. Rotations at
// once apply one after the other: each keeps the secret the one before made
// current, and none is lost. Rotating to the secret already current (a
// reloaded config, a retried call) replaces nothing and changes nothing: the
// previous secret keeps its window.
func (v *Verifier) Rotate(next string, window time.Duration) error {
	if window <= 0 {
		window = DefaultRotationWindow
	}
	for {
		old := v.secrets.Load()
		s := Secrets{Current: next}
		if old != nil { // nil: a zero Verifier, with no secret to keep
			if next == old.Current {
				return nil
			}
			s.Previous, s.PreviousExpiresAt = old.Current, v.now().Add(window)
		}
		if err := s.validate(); err != nil {
			return err
		}
		if v.secrets.CompareAndSwap(old, &s) {
			return nil
		}
	}
}

// Verify checks one Vibe-Signature header value against the raw body: the exact
// form t=<T>,v1=<64 lowercase hex>, |now − T| ≤ 300 s and the HMAC-SHA256 under
// the current secret or, before its expiry, the previous one. It returns nil or
// one of the contract's errors.
func (v *Verifier) Verify(signature string, body []byte) error {
	now := v.now()
	s := v.Secrets() // a zero Verifier's: no key, every signature refused
	keys := [2]string{s.Current}
	if s.Previous != "" && now.Before(s.PreviousExpiresAt) {
		keys[1] = s.Previous
	}
	// VerifyAny skips the empty second key.
	return contract.VerifyAny(keys[:], signature, body, now.Unix())
}

// VerifyHeaders checks the headers of a delivery: exactly one
// X-Vibe-Caller-Kind value, equal to "schedule", and exactly one
// Vibe-Signature value, which must verify against body.
//
// Header names are case-insensitive on the wire, so h may spell them in any
// ASCII case: a map built by hand or converted from another framework
// ("vibe-signature", "VIBE-SIGNATURE") is read like the canonical one net/http
// builds. Each value in h counts as one physical header line, under whatever
// spellings of the name it is filed: two values in total are a repeated
// header and are rejected. Values are compared exactly; a value that a proxy
// or framework joined from several lines ("a, b") does not verify.
func (v *Verifier) VerifyHeaders(h http.Header, body []byte) error {
	caller, n := headerLines(h, contract.HeaderCallerKind)
	if n != 1 || caller != contract.CallerKindSchedule {
		return ErrCallerKind
	}
	sig, n := headerLines(h, contract.HeaderSignature)
	if n != 1 {
		return ErrSignatureHeader
	}
	return v.Verify(sig, body)
}

// headerLines returns how many values h holds for name, under any ASCII case
// of it, and the first of them. It does not fold non-ASCII letters: a header
// name is an ASCII token, and Unicode folding would let "\u212a" (the Kelvin
// sign) stand for "k".
func headerLines(h http.Header, name string) (first string, n int) {
	for v := range headerValues(h, name) {
		if n == 0 {
			first = v
		}
		n++
	}
	return first, n
}

// headerValues yields every line of h whose name is name in any ASCII case.
func headerValues(h http.Header, name string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for k, vs := range h {
			if !asciiEqualFold(k, name) {
				continue
			}
			for _, v := range vs {
				if !yield(v) {
					return
				}
			}
		}
	}
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}
