//go:build race

package h1

// raceEnabled: allocation counts are not meaningful under the race detector.
const raceEnabled = true
