// Package backend is tether's client for backends: connections, their
// pools, and the retry contract (retry.go, MayResend), which decides alone
// whether a failed request may be sent again. It knows HTTP, not MCP: what
// makes a request idempotent is the caller's to say.
//
// Over HTTP/1.1 it is tether's own Client; over h2c, and to https
// backends, net/http's Transport with the same limits.

package backend
