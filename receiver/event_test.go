package receiver_test

import (
	"errors"
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
