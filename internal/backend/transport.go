package backend

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// Transport is what the proxy sends backend requests through: the
// HTTP/1.1 Client of this package, or http.Transport for h2c.
type Transport interface {
	http.RoundTripper
	CloseIdleConnections()
}

// dialTimeout bounds a dial to a backend: a dead one fails fast.
const dialTimeout = 2 * time.Second

// Dial dials backends: a dead one fails fast, and kernel keep-alives
// find peers that vanished without a FIN.
var Dial = (&net.Dialer{
	Timeout:   dialTimeout,
	KeepAlive: 30 * time.Second,
}).DialContext

// NewTransport returns the transport tether uses for backends: keep-alive
// pools sized for a proxy (up to 256 idle connections per backend, 1,024 in
// all, closed after 90 s idle), no environment proxies, no transparent
// compression. Over HTTP/1.1 it is tether's own Client, which
// writes and reads on the caller's goroutine. With h2c, backends are spoken
// to in HTTP/2 by prior knowledge, by http.Transport.
//
// A pooled connection is not used once the backend has closed it, so a
// request is never written into a connection whose backend just crashed:
// it is sent on a fresh connection, whose dial fails like any dial to a
// dead backend.
func NewTransport(h2c bool) Transport {
	return NewTransportDial(h2c, Dial)
}

// NewTransportDial is NewTransport over the given dial function (tests put a
// connection of their own between the transport and the socket).
func NewTransportDial(h2c bool, dial func(ctx context.Context, network, addr string) (net.Conn, error)) Transport {
	if !h2c {
		return NewClient(dial)
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
// One failure is told apart: a write that failed before the client's
// connection preface was out (see prefaceConn).
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

// prefaceConn is an h2c connection to a backend that knows how far the
// client's side of it got: a write that fails with nothing of the client's
// connection preface out, nor a byte heard from the backend, failed before
// the backend could read a single stream (a stream begins after the 24
// bytes of the preface, RFC 9113 §3.4), so its error is a notSentError.
// http2 fails every stream written into such a connection and retries
// none; the proxy sends them again (mayResend). Any later failure is
// ambiguous: one connection carries many streams, and which of them the
// backend read cannot be told.
type prefaceConn struct {
	net.Conn
	heard   atomic.Bool  // a Read has returned bytes
	written atomic.Int64 // bytes that Write got out
}

// clientPrefaceLen is the length of an HTTP/2 client's connection preface
// ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").
const clientPrefaceLen = 24

func (c *prefaceConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.heard.Load() {
		c.heard.Store(true)
	}
	return n, err
}

func (c *prefaceConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	written := c.written.Add(int64(n))
	if err != nil && !c.heard.Load() && written < clientPrefaceLen {
		return n, &notSentError{err: err, written: written}
	}
	return n, err
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
