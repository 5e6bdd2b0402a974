//go:build race

package session_test

const raceEnabled = true
