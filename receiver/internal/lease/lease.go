// Package lease holds what the outbox stores share about lease times.
package lease

import "time"

// Until returns the lease end t as a store keeping times at precision unit
// must write it: rounded up. Rounded down, the lease would end early, and
// another worker could claim the item while it is still leased. A retry
// time is written the same way, so that the item is not handed out again
// before it.
func Until(t time.Time, unit time.Duration) time.Time {
	if r := t.Truncate(unit); !r.Equal(t) {
		return r.Add(unit)
	}
	return t
}
