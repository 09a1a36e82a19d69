//go:build !race

package egress_test

const raceEnabled = false
