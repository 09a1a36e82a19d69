package receiver_test

import (
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
)

func TestVerifyEvent(t *testing.T) {
	body := []byte(`{"event":"run.succeeded"}`)
	now := time.Unix(vectorT, 0)
	macOf := func(secret string) string {
		return strings.TrimPrefix(contract.Sign(secret, vectorT, body), "t=1791536400,v1=")
	}
	oldMAC, newMAC := macOf(vectorSecret), macOf(otherSecret)
	one := "t=1791536400,v1=" + newMAC
	two := one + ",v1=" + oldMAC
	cases := []struct {
		name    string
		header  string
		secrets []string
		now     time.Time
		want    error
	}{
		{"one value", one, []string{otherSecret}, now, nil},
		{"two values, first matches", two, []string{otherSecret}, now, nil},
		{"two values, second matches", two, []string{vectorSecret}, now, nil},
		{"two values, both secrets", two, []string{vectorSecret, otherSecret}, now, nil},
		{"empty secrets ignored", two, []string{"", vectorSecret}, now, nil},
		{"no secret", one, nil, now, contract.ErrBadSignature},
		{"neither matches", "t=1791536400,v1=" + strings.Repeat("a", 64) + ",v1=" + strings.Repeat("b", 64), []string{vectorSecret}, now, contract.ErrBadSignature},
		{"stale", two, []string{vectorSecret}, now.Add(301 * time.Second), contract.ErrStaleSignature},
		{"the same value twice", one + ",v1=" + newMAC, []string{otherSecret}, now, contract.ErrMalformedSignature},
		{"three values", two + ",v1=" + strings.Repeat("c", 64), []string{otherSecret}, now, contract.ErrMalformedSignature},
		{"second value uppercase", one + ",v1=" + strings.ToUpper(oldMAC), []string{vectorSecret}, now, contract.ErrMalformedSignature},
		{"second value short", one + ",v1=" + oldMAC[:63], []string{otherSecret}, now, contract.ErrMalformedSignature},
		{"second element other scheme", one + ",v2=" + oldMAC, []string{otherSecret}, now, contract.ErrMalformedSignature},
		{"space before second", one + ", v1=" + oldMAC, []string{otherSecret}, now, contract.ErrMalformedSignature},
		{"t repeated", "t=1791536400," + two[len("t=1791536400,"):] + ",t=1", []string{otherSecret}, now, contract.ErrMalformedSignature},
		{"empty", "", []string{otherSecret}, now, contract.ErrMalformedSignature},
	}
	for _, c := range cases {
		err := receiver.VerifyEvent(c.header, body, c.now, c.secrets...)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: VerifyEvent = %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzVerifyEvent: whatever header verifies is exactly t=<T>,v1=<mac> for the
// secret, or that with one more distinct 64-hex value before or after the
// mac: the hand-split of a two-value header lets nothing else through.
func FuzzVerifyEvent(f *testing.F) {
	body := []byte(`{"event":"run.succeeded"}`)
	now := time.Unix(vectorT, 0)
	sig := contract.Sign(vectorSecret, vectorT, body)
	mac := strings.TrimPrefix(sig, "t=1791536400,v1=")
	other := strings.Repeat("ab", 32)
	f.Add(sig)
	f.Add(sig + ",v1=" + other)
	f.Add("t=1791536400,v1=" + other + ",v1=" + mac)
	f.Add(sig + ",v1=" + mac)
	f.Add(sig + ",v1=" + other + ",v1=" + other)
	f.Fuzz(func(t *testing.T, header string) {
		if receiver.VerifyEvent(header, body, now, vectorSecret) != nil {
			return
		}
		ts, rest, _ := strings.Cut(header, ",v1=")
		n, err := strconv.ParseInt(strings.TrimPrefix(ts, "t="), 10, 64)
		if err != nil || ts != "t="+strconv.FormatInt(n, 10) {
			t.Fatalf("verified %q: its t is not canonical", header)
		}
		want := strings.TrimPrefix(contract.Sign(vectorSecret, n, body), ts+",v1=")
		hex64 := func(s string) bool {
			_, err := hex.DecodeString(s)
			return len(s) == 64 && err == nil && s == strings.ToLower(s)
		}
		switch vals := strings.Split(rest, ",v1="); {
		case len(vals) == 1 && vals[0] == want:
		case len(vals) == 2 && vals[0] != vals[1] && hex64(vals[0]) && hex64(vals[1]) && (vals[0] == want || vals[1] == want):
		default:
			t.Fatalf("verified %q", header)
		}
	})
}
