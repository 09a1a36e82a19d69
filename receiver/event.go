package receiver

import (
	"errors"
	"time"

	"github.com/vibejobs/vibejobs/contract"
)

// eventSigLen is the length of one ",v1=<64 hex>" element.
const eventSigLen = len(",v1=") + 64

// VerifyEvent verifies an event signature header of the form
// t=<T>,v1=<hex> or t=<T>,v1=<hex>,v1=<hex>: during a subscription's secret
// rotation the sender signs the same message with both secrets. T and each hex
// value follow the job signature's exact rules, the two hex values must differ,
// and the header verifies when any v1 matches any of secrets at now (freshness
// ±300 s). Empty secrets are ignored.
func VerifyEvent(header string, body []byte, now time.Time, secrets ...string) error {
	first, second := header, ""
	// A header with two values is exactly one job-style header followed by one
	// more ",v1=" element; anything else fails the job-style parse below.
	if n := len(header) - eventSigLen; n > 0 && header[n:n+4] == ",v1=" {
		if _, _, err := contract.ParseSignature(header[:n]); err == nil {
			first = header[:n]
			second = first[:len(first)-64] + header[n+4:]
		}
	}
	if _, _, err := contract.ParseSignature(first); err != nil {
		return err
	}
	if second != "" {
		if _, _, err := contract.ParseSignature(second); err != nil {
			return err
		}
		if first == second {
			return contract.ErrMalformedSignature
		}
	}
	err := contract.VerifyAny(secrets, first, body, now.Unix())
	if err == nil || second == "" || errors.Is(err, contract.ErrStaleSignature) {
		return err
	}
	return contract.VerifyAny(secrets, second, body, now.Unix())
}
