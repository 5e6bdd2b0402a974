package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// BackendTransport is what the proxy sends backend requests through: the
// HTTP/1.1 client of this package, or http.Transport for h2c.
type BackendTransport interface {
	http.RoundTripper
	CloseIdleConnections()
}

// DialBackend dials backends: a dead one fails fast, and kernel keep-alives
// find peers that vanished without a FIN.
var DialBackend = (&net.Dialer{
	Timeout:   2 * time.Second,
	KeepAlive: 30 * time.Second,
}).DialContext

// NewTransport returns the transport tether uses for backends: keep-alive
// pools sized for a proxy (up to 256 idle connections per backend, 1,024 in
// all, closed after 90 s idle), no environment proxies, no transparent
// compression. Over HTTP/1.1 it is tether's own client (see client), which
// writes and reads on the caller's goroutine. With h2c, backends are spoken
// to in HTTP/2 by prior knowledge, by http.Transport.
//
// A pooled connection is not used once the backend has closed it, so a
// request is never written into a connection whose backend just crashed:
// it is sent on a fresh connection, whose dial fails like any dial to a
// dead backend.
func NewTransport(h2c bool) BackendTransport {
	return NewTransportDial(h2c, DialBackend)
}

// NewTransportDial is NewTransport over the given dial function (tests put a
// connection of their own between the transport and the socket).
func NewTransportDial(h2c bool, dial func(ctx context.Context, network, addr string) (net.Conn, error)) BackendTransport {
	if !h2c {
		return newClient(dial)
	}
	return newH2CTransport(dial)
}

// newH2CTransport is an http.Transport with NewTransport's limits that
// speaks HTTP/2 by prior knowledge.
//
// No stale-connection check here. A backend that shuts down sends GOAWAY
// naming the last stream it took, and http2 retries later streams itself
// (errClientConnGotGoAway, with the body from GetBody, which the forward
// path sets on every request with a body; see TestBackendGracefulKillLoopH2C).
// A crashed backend sends no GOAWAY, and a stream
// written before http2's reader sees the FIN still fails; but refusing the
// write would not help: http2 keeps the first write error for every stream
// of the connection and retries none of them.
//
// One reset is told apart: on a connection whose backend has sent nothing
// yet, not even its connection preface (see prefaceConn).
func newH2CTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	t := newHTTPTransport(func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &prefaceConn{Conn: c}, nil
	})
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	t.Protocols = &protos
	return t
}

// prefaceConn is an h2c connection to a backend that knows whether the
// backend has sent anything on it. A reset before the backend's first byte
// is an unreadRequestError: an HTTP/2 server's first frame is its SETTINGS
// (RFC 9113 §3.4), which a Go server queues before it reads the client's
// preface, so a server that sent nothing has acted on no stream. The
// connection was closed under requests it had not read: a listener closed
// with the connection still in its accept queue (the connect succeeded,
// the server never saw it), or a server shutting down as it accepted it.
// http2 fails every stream written into such a connection and retries none;
// retryUnread sends them again, and a dial to the closed listener then
// takes the proxy's dial-error path. A reset after the backend's preface
// stays ambiguous, as on HTTP/1.1.
type prefaceConn struct {
	net.Conn
	heard atomic.Bool // a Read has returned bytes
	reset atomic.Bool // a Read or Write failed with a reset before that
}

func (c *prefaceConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.heard.Load() {
		c.heard.Store(true)
	}
	return n, c.unread(err)
}

func (c *prefaceConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	return n, c.unread(err)
}

// unread marks a reset before the backend's first byte as an
// unreadRequestError, and every error after it: the kernel reports a
// reset once, to the first call that asks, and a Read after it sees an
// EOF (http2's writer may have taken the reset).
func (c *prefaceConn) unread(err error) error {
	if err == nil || c.heard.Load() {
		return err
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		c.reset.Store(true)
	}
	if !c.reset.Load() {
		return err
	}
	return &unreadRequestError{err}
}

// newHTTPTransport is an http.Transport with NewTransport's limits.
func newHTTPTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		MaxIdleConns:        maxIdleConns,
		MaxIdleConnsPerHost: maxIdleConnsPerBackend,
		IdleConnTimeout:     idleConnTimeout,
		DisableCompression:  true,
		// Tool calls may run for minutes; the client's context bounds them.
		ResponseHeaderTimeout: 0,
	}
}

// unreadRequestError is a connection reset that came, instead of any byte
// of an answer, after a request was written.
//
// A TCP stack answers with a reset, rather than an orderly FIN, when the
// socket is closed with received data still unread, or when data arrives
// for a socket that is already closed (then the reset follows the FIN, one
// round trip later). Either way the backend closed the connection without
// reading all of the request; an MCP server needs the whole body to know
// what to do, so it did not act on it. This is what a graceful Go backend
// does to a request that arrives on a keep-alive connection just as
// Server.Shutdown closes its idle connections (closeIdleConns does not look
// for unread data), and what a crash does to a request it had not read yet.
// A backend that crashes after reading the request closes with nothing
// unread: a FIN and no reset, which stays ambiguous and gets a 502.
//
// Over h2c the same reset is recognised only before the backend's first
// byte (prefaceConn): later, one connection carries many streams, and
// which of them the backend read cannot be told.
//
// The one reset this misreads is a deliberate abort (SO_LINGER 0) after the
// backend read and acted on a request without answering; no MCP server or
// Go, Node or Python HTTP server does that.
type unreadRequestError struct{ err error }

func (e *unreadRequestError) Error() string {
	return "backend reset the connection without reading the request: " + e.err.Error()
}

func (e *unreadRequestError) Unwrap() error { return e.err }

// isUnread reports whether err is an unreadRequestError. (A function of its
// own, so that the target of errors.As is allocated only for an error.)
func isUnread(err error) bool {
	var unread *unreadRequestError
	return errors.As(err, &unread)
}

// closedWhileIdle reports net/http's errServerClosedIdle ("http: server
// closed idle connection", unexported, so matched by its text): the
// transport's readLoop saw the backend close the connection while no
// request was expected on it, that is before this request was handed to
// the writeLoop. The backend closed before the request could reach it, so
// the request was never processed. net/http itself retries only idempotent
// requests on it; tether sends its POSTs again too (seen with SIGKILLed
// backends on a loaded node: 1 call in 50 crashes). It comes from an
// http.Transport given in Config.Transport; tether's own client sees such
// a close by peeking at the socket before the write, and moves on to
// another connection.
func closedWhileIdle(err error) bool {
	return err != nil && strings.HasSuffix(err.Error(), "http: server closed idle connection")
}

// notEstablished reports http2's errClientConnNotEstablished ("http2:
// client conn could not be established", unexported, so matched by its
// text): a new h2c connection closed before its first stream was written,
// so the request never left. (Which of it and prefaceConn's error a reset
// of a new connection gives depends on whether the request's first frame
// was written before the reset was read.)
func notEstablished(err error) bool {
	return err != nil && strings.HasSuffix(err.Error(), "http2: client conn could not be established")
}

// resendable reports an error after which retryUnread sends the request
// again.
func resendable(err error) bool { return isUnread(err) || closedWhileIdle(err) || notEstablished(err) }

// maxUnreadRetries bounds how often retryUnread sends one request again.
const maxUnreadRetries = 2

// retryUnread sends a request again, to the same backend, when the backend
// reset the connection without reading it (unreadRequestError). The next
// attempt takes another pooled connection or dials: a backend that is
// shutting down or gone refuses the dial, and the proxy's dial-error path
// ejects it and re-initializes the session; a backend that only closed one
// idle connection (its idle timeout racing the request) serves it, and the
// session stays where its state is.
type retryUnread struct{ next http.RoundTripper }

func (r retryUnread) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	for range maxUnreadRetries {
		if err == nil || !resendable(err) || req.Context().Err() != nil {
			break
		}
		if req.Body != nil && req.Body != http.NoBody {
			if req.GetBody == nil {
				break // the body is spent and cannot be rebuilt
			}
			body, gerr := req.GetBody()
			if gerr != nil {
				break
			}
			again := *req
			again.Body = body
			req = &again
		}
		resp, err = r.next.RoundTrip(req)
	}
	return resp, err
}
