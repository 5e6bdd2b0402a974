//go:build race

package e2e

// raceEnabled builds the tether binary under test with -race too.
const raceEnabled = true
