// Package testkit is what tether's tests share: waiting for a condition
// with a deadline, free loopback addresses, go-sdk MCP backends and HTTP
// servers that stop when the test ends.
//
// It imports no tether package but internal/mcpbackend, so the internal
// tests of any package (proxy, session, ...) can use it without an import
// cycle.
//
// Every function here that takes a testing.TB may end the test with
// FailNow, so it must be called from the test goroutine, never from a
// goroutine the test started (testing.T.FailNow only stops the goroutine
// that calls it). goroutine_test.go enforces that across the repository.
package testkit
