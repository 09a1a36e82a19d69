package storetest

import (
	"slices"
	"strings"
	"testing"
)

// CheckSchema fails t unless got and want, two descriptions of a database
// schema with one line per object or property (a store's test reads them
// from its catalog), hold the same lines, in any order. The message names
// the lines each holds that the other does not.
func CheckSchema(t testing.TB, what string, got, want []string) {
	t.Helper()
	got, want = slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	var extra, missing []string
	for len(got) > 0 || len(want) > 0 {
		switch {
		case len(want) == 0 || (len(got) > 0 && got[0] < want[0]):
			extra, got = append(extra, got[0]), got[1:]
		case len(got) == 0 || want[0] < got[0]:
			missing, want = append(missing, want[0]), want[1:]
		default:
			got, want = got[1:], want[1:]
		}
	}
	if len(extra) > 0 || len(missing) > 0 {
		t.Errorf("%s, the schema differs from the one wanted:\nonly in the schema got:\n\t%s\nonly in the schema wanted:\n\t%s",
			what, strings.Join(extra, "\n\t"), strings.Join(missing, "\n\t"))
	}
}
