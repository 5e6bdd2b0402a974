package backend

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/tether-mcp/tether/internal/h1"
)

// The retry contract: what tether promises about a request it forwards
// (DESIGN §13).
//
// At most once. A request that may have reached the backend's application
// is never sent again, to any backend, unless it is idempotent: an MCP
// method that only reads (readOnlyMethod), an HTTP method that is safe, or
// a request the client marked with an Idempotency-Key. A request that
// provably did not reach the application may be sent again. The proofs:
//
//   - the dial failed (the proxy then tries another backend: a new session
//     is placed elsewhere, a session re-initialized);
//   - a pooled connection was seen closed by the backend before the
//     request was written (stateProbe's peek): the request goes to the next
//     connection, never into that one;
//   - the connection broke before the request's last byte was written
//     (notSentError): the backend cannot have had all of it, and an MCP
//     server acts on a whole JSON-RPC message only;
//   - http.Transport's own proofs, for the transports it carries (h2c,
//     https): the connection was closed while idle, before the request was
//     handed to it (closedWhileIdle), a new HTTP/2 connection failed before
//     its first stream was written (notEstablished); and HTTP/2's GOAWAY
//     above the last stream id or REFUSED_STREAM, which x/net/http2 acts on
//     itself (it sends such streams again with GetBody).
//
// A reset after the whole request was written is not proof: a backend may
// read a tools/call, run it and then reset (SO_LINGER 0), and so may a
// crashing sidecar, a mesh proxy or a middlebox; a FIN followed by a reset
// is not either (a retransmission of bytes the backend had read draws a
// reset from a closed socket). Such a failure is a 502 with a message that
// says the request may have run and was not retried. nginx never passes a
// sent non-idempotent request to another upstream (proxy_next_upstream
// without non_idempotent), HAProxy retries on connect-failure by default,
// Envoy's retries are opt-in.
//
// MayResend is the one predicate: tether's client (Client.send, between
// the connections of its pool) and the proxy (around any transport) both
// ask it, and MaxResends bounds how often one attempt is repeated.

// MaxResends bounds how often one attempt sends its request again after a
// failure MayResend allows (the proxy's retries elsewhere, after a failed
// dial or a backend's 404 for the session, are counted apart).
const MaxResends = 2

// MayResend reports whether a request that failed with err may be sent
// again: the backend provably did not get it, or it is idempotent.
// idempotent is the caller's knowledge of the request (and, for a retry
// within one connection pool, that no byte of its answer arrived).
func MayResend(err error, idempotent bool) bool {
	if err == nil || isCanceled(err) || errors.Is(err, h1.ErrMalformedAnswer) {
		// A malformed answer is an answer: the backend ran the request.
		return false
	}
	return idempotent || NotSent(err)
}

// NotSent reports an error that proves the backend did not get the whole
// request.
func NotSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns) || IsDialError(err) || closedWhileIdle(err) || notEstablished(err)
}

// isCanceled reports a failure that is the request's own end (its context
// was cancelled or timed out): nobody waits for a second try.
func isCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// notSentError is a failure before the request's last byte reached the
// socket: the backend cannot have had all of it. written is how many
// bytes did (0: none).
type notSentError struct {
	err     error
	written int64
}

func (e *notSentError) Error() string {
	if e.written == 0 {
		return "request not sent: " + e.err.Error()
	}
	return "request not sent in full: " + e.err.Error()
}

func (e *notSentError) Unwrap() error { return e.err }

// closedWhileIdle reports net/http's errServerClosedIdle ("http: server
// closed idle connection", unexported, so matched by its text): the
// transport's readLoop saw the backend close the connection while no
// request was expected on it, that is before this request was handed to
// the writeLoop, whose write then found the connection closed. It comes
// from an http.Transport (https backends, Config.Transport); tether's own
// client sees such a close by peeking at the socket before the write, and
// moves on to another connection.
func closedWhileIdle(err error) bool {
	return err != nil && strings.HasSuffix(err.Error(), "http: server closed idle connection")
}

// notEstablished reports http2's errClientConnNotEstablished ("http2:
// client conn could not be established", unexported, so matched by its
// text): a new h2c connection closed before its first stream was written,
// so the request never left.
func notEstablished(err error) bool {
	return err != nil && strings.HasSuffix(err.Error(), "http2: client conn could not be established")
}

// IsDialError reports whether err is a failure to establish the connection.
func IsDialError(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}
