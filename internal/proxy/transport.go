package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// NewTransport returns the transport tether uses for backends: keep-alive
// pools sized for a proxy (the default of 2 idle connections per host makes
// connection churn dominate), no environment proxies, no transparent
// compression. With h2c, backends are spoken to in HTTP/2 by prior knowledge.
//
// Over HTTP/1.1 a pooled connection refuses to carry a new request once the
// backend has closed it (see backendConn), so a request is never written
// into a connection whose backend just crashed: net/http retries it on a
// fresh connection, whose dial fails like any dial to a dead backend.
func NewTransport(h2c bool) *http.Transport {
	dialer := &net.Dialer{
		Timeout:   2 * time.Second,
		KeepAlive: 30 * time.Second,
	}
	return newTransport(h2c, dialer.DialContext)
}

// newTransport is NewTransport over the given dial function (tests put a
// connection of their own between the transport and the socket).
func newTransport(h2c bool, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	t := &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		// Tool calls may run for minutes; the client's context bounds them.
		ResponseHeaderTimeout: 0,
	}
	if h2c {
		var protos http.Protocols
		protos.SetUnencryptedHTTP2(true)
		t.Protocols = &protos
		// No check here. A backend that shuts down sends GOAWAY naming the
		// last stream it took, and http2 retries later streams itself
		// (errClientConnGotGoAway, with the body from GetBody, which
		// rewrite sets on every request with a body; see
		// TestBackendGracefulKillLoopH2C). A crashed backend sends no
		// GOAWAY, and a stream written before http2's reader sees the FIN
		// still fails; but refusing the write would not help: http2 keeps
		// the first write error for every stream of the connection and
		// retries none of them.
		return t
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newBackendConn(c), nil
	}
	return t
}

// newBackendConn wraps c when its socket can be probed, and returns c as
// it is otherwise (other platforms, connections without a file descriptor).
func newBackendConn(c net.Conn) net.Conn {
	bc := &backendConn{Conn: c}
	if !bc.probe.init(c) {
		return c
	}
	return bc
}

// errStaleConn is what a pooled connection answers to the first write of a
// request once the backend has closed it, reset it, or sent bytes nobody
// asked for (a server about to close an idle connection, e.g. with a 408).
// Nothing has been written, so net/http returns its nothingWrittenError and,
// for a reused connection and a request whose body can be replayed (tether
// sets GetBody), sends the request again on another connection.
var errStaleConn = errors.New("backend closed the idle connection before the request was written")

// backendConn is an HTTP/1.1 connection to a backend that checks, before
// the first write of each request, whether the backend is still there.
//
// A keep-alive connection sits in the pool while the transport's readLoop
// waits on it. When the backend dies, its FIN (or RST) reaches the socket
// at once, but the readLoop learns of it only when the scheduler runs it
// (milliseconds on a busy machine). A request taken from the pool in that
// window would be written into the dead socket; its write succeeds, the
// read then fails, and a POST is not retried because net/http cannot know
// the backend never saw it. Here it can be known: the backend closed before
// a byte of the request left, so the request was never processed.
//
// The check peeks at the socket without consuming anything and without the
// fd's read lock, which the readLoop holds while it waits (see peerGone).
// It costs one non-blocking syscall per request and allocates nothing.
//
// It also tells which connection resets leave the request unread (see
// unreadRequestError).
type backendConn struct {
	net.Conn
	probe stateProbe
	// unanswered is set when a request starts and cleared by the first
	// byte read after it. Writes come from the transport's writeLoop and
	// reads from its readLoop, hence the atomic.
	unanswered atomic.Bool
	// written is cleared when a request starts and set once its first
	// write has returned: a FIN read before then says nothing yet of where
	// the request went (see awaitWritten).
	written atomic.Bool
}

// Write refuses the first write of a request on a connection the backend
// has left; every other write goes straight through.
func (c *backendConn) Write(p []byte) (int, error) {
	if startsRequest(p) {
		if c.probe.peerGone() {
			return 0, errStaleConn
		}
		// Before the write: the answer may be read before Write returns.
		c.written.Store(false)
		c.unanswered.Store(true)
		n, err := c.Conn.Write(p)
		c.written.Store(true)
		return n, err
	}
	return c.Conn.Write(p)
}

// Read marks a reset that arrives before any byte of the answer.
func (c *backendConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if c.unanswered.Load() {
			c.unanswered.Store(false)
		}
	} else if err != nil && c.unanswered.Load() {
		if errors.Is(err, syscall.ECONNRESET) || (err == io.EOF && c.awaitWritten() && c.probe.resetFollows()) {
			return n, &unreadRequestError{err}
		}
	}
	return n, err
}

// maxWriteWait bounds how long an EOF in place of an answer waits for the
// request's write to return. The readLoop can see the backend's FIN before
// the transport's writeLoop, on a loaded machine, has even written the
// request; the reset that tells "unread" from "read" follows that write.
const maxWriteWait = time.Second

// awaitWritten waits until the current request's first write has returned
// (at most maxWriteWait), so that a reset it provokes can be seen; it
// reports false when the write never returned in time.
func (c *backendConn) awaitWritten() bool {
	pause := 50 * time.Microsecond
	for deadline := time.Now().Add(maxWriteWait); !c.written.Load(); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 2*time.Millisecond)
	}
	return true
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
// backends on a loaded node: 1 call in 50 crashes).
func closedWhileIdle(err error) bool {
	return err != nil && strings.HasSuffix(err.Error(), "http: server closed idle connection")
}

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
		if err == nil || !(isUnread(err) || closedWhileIdle(err)) || req.Context().Err() != nil {
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

// maxMethodLen bounds the scan for the method of a request line; HTTP
// methods in use are far shorter.
const maxMethodLen = 24

// startsRequest reports whether p begins an HTTP/1.1 request: a method
// token, a space, a target and " HTTP/1.1\r\n". net/http writes each request
// through a buffer that it flushes at the end, so the first write of a
// request on the socket holds at least its whole request line, while later
// writes of the same request continue its body. Checking the line rather
// than "bytes were read since the last write" keeps a body write that
// follows an early response (a 401 or 413 sent before the body was read)
// from being mistaken for a new request. A JSON body cannot contain such a
// line: a raw CR LF may not appear inside a JSON string.
func startsRequest(p []byte) bool {
	sp := bytes.IndexByte(p[:min(len(p), maxMethodLen+1)], ' ')
	if sp <= 0 {
		return false
	}
	for _, b := range p[:sp] {
		if !isTokenByte(b) {
			return false
		}
	}
	eol := bytes.Index(p[sp:], crlf)
	return eol >= 0 && bytes.HasSuffix(p[sp:sp+eol], httpVersion)
}

var (
	crlf        = []byte("\r\n")
	httpVersion = []byte(" HTTP/1.1")
)

// isTokenByte reports whether b may appear in an HTTP token (RFC 9110
// 5.6.2), which a method is.
func isTokenByte(b byte) bool {
	switch {
	case 'A' <= b && b <= 'Z', 'a' <= b && b <= 'z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}
