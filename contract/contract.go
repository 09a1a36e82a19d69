// Package contract is the wire format of a scheduled-job delivery: the exact body
// bytes, the Vibe-Signature header and the job secret format. The platform's
// dispatcher and the receiver SDK both use it, so the two sides cannot drift.
//
// It imports only the standard library.
package contract

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"
)

// Header names and fixed values of the contract.
const (
	HeaderSignature      = "Vibe-Signature"
	HeaderCallerKind     = "X-Vibe-Caller-Kind"
	HeaderIdempotencyKey = "Idempotency-Key"
	CallerKindSchedule   = "schedule"
	ContentType          = "application/json"
	BodyType             = "scheduled_job.run"

	// TriggerSchedule and TriggerManual are the two values of the body's trigger.
	TriggerSchedule = "schedule"
	TriggerManual   = "manual"

	// MaxBodyBytes is the largest body a receiver must accept (64 KiB).
	MaxBodyBytes = 64 << 10
	// FreshnessSeconds bounds |now − t| for a signature to verify.
	FreshnessSeconds = 300
	// MaxAttempt is the highest attempt number a body may carry.
	MaxAttempt = 4
	// MaxSafeInteger is 2^53−1, the largest t a verifier accepts.
	MaxSafeInteger = 1<<53 - 1

	// SecretPrefix starts every job secret; SecretLength is its full length.
	SecretPrefix = "vjs_"
	SecretLength = 47
	// ScheduledForLayout formats scheduledFor: UTC with exactly 3 fraction digits.
	ScheduledForLayout = "2006-01-02T15:04:05.000Z"
)

// Payload is the decoded content of a delivery body.
type Payload struct {
	JobID        string
	RunID        string
	ScheduledFor time.Time
	Attempt      int
	Late         bool
	Trigger      string
}

// AppendBody appends the exact body bytes for p to dst: UTF-8, no whitespace, keys
// in contract order. Ids must already satisfy ValidID; AppendBody does not escape.
func AppendBody(dst []byte, p Payload) []byte {
	dst = append(dst, `{"type":"scheduled_job.run","jobId":"`...)
	dst = append(dst, p.JobID...)
	dst = append(dst, `","runId":"`...)
	dst = append(dst, p.RunID...)
	dst = append(dst, `","scheduledFor":"`...)
	dst = p.ScheduledFor.UTC().AppendFormat(dst, ScheduledForLayout)
	dst = append(dst, `","attempt":`...)
	dst = strconv.AppendInt(dst, int64(p.Attempt), 10)
	dst = append(dst, `,"late":`...)
	dst = strconv.AppendBool(dst, p.Late)
	dst = append(dst, `,"trigger":"`...)
	dst = append(dst, p.Trigger...)
	dst = append(dst, `"}`...)
	return dst
}

// Body returns the exact body bytes for p.
func Body(p Payload) []byte { return AppendBody(make([]byte, 0, 192), p) }

// ValidID reports whether id uses only [A-Za-z0-9_-], is non-empty and carries
// prefix (for example "job_" or "run_").
func ValidID(id, prefix string) bool {
	if len(id) <= len(prefix) || len(id) > 128 || !strings.HasPrefix(id, prefix) {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Sign returns the Vibe-Signature header value for body sent at Unix second t,
// keyed by the UTF-8 bytes of the whole secret string.
func Sign(secret string, t int64, body []byte) string {
	return string(AppendSignature(make([]byte, 0, 90), secret, t, body))
}

// AppendSignature appends the Vibe-Signature header value to dst.
func AppendSignature(dst []byte, secret string, t int64, body []byte) []byte {
	var ts [20]byte
	tb := strconv.AppendInt(ts[:0], t, 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(tb)
	mac.Write([]byte{'.'})
	mac.Write(body)
	var sum [sha256.Size]byte
	dst = append(dst, "t="...)
	dst = append(dst, tb...)
	dst = append(dst, ",v1="...)
	return hex.AppendEncode(dst, mac.Sum(sum[:0]))
}

// Errors returned by ParseSignature and Verify. They never contain the header,
// the secret or the body.
var (
	ErrMalformedSignature = errors.New("contract: malformed signature header")
	ErrStaleSignature     = errors.New("contract: signature timestamp outside the freshness window")
	ErrBadSignature       = errors.New("contract: signature does not match")
)

// ParseSignature parses a header of the exact form t=<T>,v1=<64 lowercase hex>,
// where T is 0 or 1–16 digits without a leading zero and at most 2^53−1.
// Anything else (extra or repeated fields, whitespace, uppercase hex) is
// ErrMalformedSignature.
func ParseSignature(header string) (t int64, mac [sha256.Size]byte, err error) {
	const pre = "t="
	if !strings.HasPrefix(header, pre) {
		return 0, mac, ErrMalformedSignature
	}
	rest := header[len(pre):]
	comma := strings.IndexByte(rest, ',')
	if comma < 1 || comma > 16 {
		return 0, mac, ErrMalformedSignature
	}
	digits := rest[:comma]
	if digits[0] == '0' && len(digits) > 1 {
		return 0, mac, ErrMalformedSignature
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, mac, ErrMalformedSignature
		}
		t = t*10 + int64(digits[i]-'0')
	}
	if t > MaxSafeInteger {
		return 0, mac, ErrMalformedSignature
	}
	rest = rest[comma:]
	const v1 = ",v1="
	if !strings.HasPrefix(rest, v1) || len(rest) != len(v1)+2*sha256.Size {
		return 0, mac, ErrMalformedSignature
	}
	hx := rest[len(v1):]
	for i := 0; i < len(hx); i++ {
		c := hx[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return 0, mac, ErrMalformedSignature
		}
	}
	if _, err := hex.Decode(mac[:], []byte(hx)); err != nil {
		return 0, mac, ErrMalformedSignature
	}
	return t, mac, nil
}

// Verify checks header against body for secret at Unix second now: the exact
// header form, freshness |now − t| ≤ 300 s and the HMAC in constant time.
func Verify(secret, header string, body []byte, now int64) error {
	t, got, err := ParseSignature(header)
	if err != nil {
		return err
	}
	return verifyParsed(secret, t, got, body, now)
}

// VerifyAny is Verify against several secrets (a rotation window): it succeeds
// when any non-empty secret matches.
func VerifyAny(secrets []string, header string, body []byte, now int64) error {
	t, got, err := ParseSignature(header)
	if err != nil {
		return err
	}
	err = ErrBadSignature
	for _, s := range secrets {
		if s == "" {
			continue
		}
		if e := verifyParsed(s, t, got, body, now); e == nil {
			return nil
		} else if errors.Is(e, ErrStaleSignature) {
			return e
		}
	}
	return err
}

func verifyParsed(secret string, t int64, got [sha256.Size]byte, body []byte, now int64) error {
	d := now - t
	if d > FreshnessSeconds || d < -FreshnessSeconds {
		return ErrStaleSignature
	}
	var ts [20]byte
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(strconv.AppendInt(ts[:0], t, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	var sum [sha256.Size]byte
	if !hmac.Equal(mac.Sum(sum[:0]), got[:]) {
		return ErrBadSignature
	}
	return nil
}

// NewSecret returns a fresh job secret: "vjs_" and the unpadded base64url of 32
// bytes read from r (crypto/rand.Reader when r is nil).
func NewSecret(r io.Reader) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	var b [32]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return "", err
	}
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// ValidSecret reports whether s has the job secret format.
func ValidSecret(s string) bool {
	if len(s) != SecretLength || !strings.HasPrefix(s, SecretPrefix) {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s[len(SecretPrefix):])
	return err == nil && len(b) == 32
}
