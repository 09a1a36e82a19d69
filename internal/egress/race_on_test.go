//go:build race

package egress_test

// raceEnabled shrinks the burst test: the race detector slows net/http tenfold.
const raceEnabled = true
