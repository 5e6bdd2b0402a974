//go:build race

package backend

// raceEnabled: allocation counts are not meaningful under the race detector.
const raceEnabled = true
