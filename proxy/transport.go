package proxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
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
		// HTTP/2 multiplexes every request over one connection: a refused
		// write there would fail the connection and every stream on it, and
		// http2 does not retry write errors. A graceful backend says which
		// streams it never saw (GOAWAY) and http2 retries those itself.
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
type backendConn struct {
	net.Conn
	probe stateProbe
}

// Write refuses the first write of a request on a connection the backend
// has left; every other write goes straight through.
func (c *backendConn) Write(p []byte) (int, error) {
	if startsRequest(p) && c.probe.peerGone() {
		return 0, errStaleConn
	}
	return c.Conn.Write(p)
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
