// Package h1 is tether's HTTP/1.1 on both sides: Server serves the
// client side of tether's connections, ReadAnswer reads the answers of
// backends for tether's own client (internal/proxy).
//
// net/http's server costs a proxy more than the proxy's own work: a second
// goroutine per request that reads ahead to notice a client leaving (a
// wake-up, a read and a context switch each), a textproto header parse
// that allocates per key, and a response writer in three layers. Server
// serves the common request itself, on the connection's goroutine, with
// one read for a request that arrives whole and one write for an answer
// that completes at once, and hands every other connection to the
// net/http server it wraps: h2c, and any HTTP/1.1 request of another
// shape (chunked bodies, Expect, Upgrade, HTTP/1.0, malformed input). So
// net/http still answers every edge case, and its limits, timeouts and
// handler are the configuration of both.
package h1

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Server serves HTTP/1.1 connections of a listener, and hands those it does
// not serve to the net/http server it wraps.
type Server struct {
	std *http.Server

	// SendTimeout bounds a write to a client that makes no progress: a
	// client that stops reading an answer (an SSE stream, a large body)
	// fails the write once it has taken nothing of it for SendTimeout (on
	// the fast path; on the connections handed to net/http, HTTP/1 and
	// h2c, for between SendTimeout and about twice it, see sendSlack); the
	// request's context is then cancelled, with the write's error as its
	// cause on the fast path, and the connection closed. It bounds the
	// progress of each write, not an answer's length: a stream that the
	// client reads lives as long as it likes (nginx's send_timeout, 60 s
	// by default). Zero: no bound. Set it before Serve.
	SendTimeout time.Duration

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	handoff   *handoffListener
	closing   atomic.Bool

	// The client watch's timer, one for all the connections (see
	// watch.go): it runs while watchArmed is set, and watchArms counts
	// the times it was set or set again.
	watchTimer *time.Timer
	watchArmed atomic.Bool
	watchArms  atomic.Uint64
	// watchDelay is clientWatchDelay; tests shorten it.
	watchDelay time.Duration

	// base is the BaseContext when it can be cancelled (and has no
	// deadline), set before the first connection; stopBase, guarded by
	// mu, ends cancelRequests' wait for it. See Serve.
	base     context.Context
	stopBase func() bool
}

// FieldsHandler is a handler that reads a request's header as Fields. For
// the requests Server serves itself, a FieldsHandler's ServeFields is
// called instead of ServeHTTP, with the fields as they were parsed and no
// map: r.Header is nil. Building the map and looking names up in it is
// most of what a request head costs a proxy that reads a few fields and
// writes the rest on. The list is the handler's to read and edit until
// ServeFields returns; then the connection reuses it. Its strings stay
// valid (they are substrings of the head): strings.Clone what is kept
// long, so that a head is not kept whole. Requests handed to net/http
// (h2c, the other shapes) reach ServeHTTP, with r.Header.
type FieldsHandler interface {
	http.Handler
	ServeFields(w http.ResponseWriter, r *http.Request, f Fields)
}

// Wrap returns a Server that serves with std's Handler and the limits of
// std: ReadHeaderTimeout (as net/http: from the connection's accept to the
// end of its first head, and from a later request's first byte to the end
// of its head, across a hand-over to net/http), IdleTimeout (between
// requests: an idle connection is closed between IdleTimeout and 9/8 of it
// after its last request, see idleSlack; and, without a
// ReadHeaderTimeout, before the first request too, where net/http waits
// for good), MaxHeaderBytes, BaseContext (whose end cancels the requests'
// contexts) and ErrorLog (a handler's panic). Besides std's, the
// returned Server's SendTimeout bounds a client that stops reading. std
// serves the connections handed over; it must not be served or shut down
// by the caller, only through the returned Server. ReadTimeout and
// WriteTimeout must be zero (the fast path has none: its answers are SSE
// streams that live for hours; SendTimeout is what bounds a write).
//
// As net/http's, a connection closed after an answer while its request's
// body is still coming (a 413 sent before the body was read) is closed in
// two steps: its write side at once, then, after a wait that lets the
// client read the answer, the whole of it (see lingerTimeout), so that
// the client gets the answer and not a reset.
func Wrap(std *http.Server) *Server {
	s := &Server{
		std:       std,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),

		watchDelay: clientWatchDelay,
	}
	// Made stopped: the first request arms it.
	s.watchTimer = time.AfterFunc(time.Hour, s.watchTick)
	s.watchTimer.Stop()
	return s
}

// Serve accepts connections on ln until it fails or the server is shut
// down; it then returns http.ErrServerClosed (after Shutdown or Close) or
// the listener's error. Serve may be called once.
func (s *Server) Serve(ln net.Listener) error {
	if s.std.ReadTimeout != 0 || s.std.WriteTimeout != 0 {
		return errors.New("h1: the wrapped server must have no ReadTimeout or WriteTimeout")
	}
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		ln.Close()
		return http.ErrServerClosed
	}
	if s.handoff != nil {
		s.mu.Unlock()
		return errors.New("h1: Serve called twice")
	}
	s.listeners[ln] = struct{}{}
	s.handoff = newHandoffListener(ln.Addr())
	s.mu.Unlock()
	// It returns when Shutdown or Close closes the hand-off listener.
	go s.std.Serve(s.handoff)

	base := context.Background()
	if s.std.BaseContext != nil {
		base = s.std.BaseContext(ln)
	}
	// Handlers find the server as net/http's own put it there.
	base = context.WithValue(base, http.ServerContextKey, s.std)
	if _, ok := base.Deadline(); base.Done() != nil && !ok {
		// A request's context derived from a cancellable base registers
		// with it, and unregisters when the request ends: a lock and a
		// map insertion and deletion on the one context all connections
		// share, some 2 µs a request with cold caches. The requests'
		// contexts derive from base without its cancellation instead,
		// and cancelRequests cancels them when base ends, with its cause:
		// a goroutine's hop later than net/http's would. A base with a
		// deadline (which its requests' contexts must report) is kept as
		// it is.
		s.mu.Lock()
		s.base = base
		s.stopBase = context.AfterFunc(base, s.cancelRequests)
		s.mu.Unlock()
		base = context.WithoutCancel(base)
	}

	var backoff time.Duration
	for {
		rw, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			if retryableAccept(err) {
				// As net/http: out of descriptors is not fatal; wait for
				// some to be released.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logf("h1: accept error: %v; retrying in %v", err, backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := newConn(s, rw, base)
		if !s.track(c) {
			rw.Close()
			return http.ErrServerClosed
		}
		go c.serve()
	}
}

// Shutdown stops accepting, closes the idle connections, and waits for the
// others to finish their requests (and the handed-over connections, as
// net/http's Shutdown does) or for ctx to end, whose error it then
// returns. Connections still busy then are left to Close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.closeListeners()
	stdDone := make(chan error, 1)
	go func() { stdDone <- s.std.Shutdown(ctx) }()

	tick := time.NewTicker(shutdownPoll)
	defer tick.Stop()
	for {
		if s.closeIdle() == 0 {
			select {
			case err := <-stdDone:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// shutdownPoll is how often Shutdown looks for connections that went idle.
const shutdownPoll = 10 * time.Millisecond

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.closing.Store(true)
	s.closeListeners()
	s.mu.Lock()
	for c := range s.conns {
		c.state.Store(stateClosed)
		c.mu.Lock()
		if c.onDetachedCancel != nil {
			// A detached answer is waited on by whoever holds it, not by
			// a goroutine of the connection's: its poller sees no event
			// for a connection closed under it, so it is told.
			c.cancelLocked(http.ErrServerClosed)
		}
		rwc := c.rwc // a detached answer's sleeps (Sleep) under c.mu
		c.mu.Unlock()
		rwc.Close()
	}
	s.mu.Unlock()
	return s.std.Close()
}

func (s *Server) closeListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ln := range s.listeners {
		ln.Close()
		delete(s.listeners, ln)
	}
	if s.handoff == nil {
		// Never served: the wrapped server has no listener to stop.
		s.handoff = newHandoffListener(nil)
		s.handoff.Close()
	}
	s.releaseBaseLocked()
}

// closeIdle closes the connections waiting for a request and returns how
// many connections remain.
func (s *Server) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.state.CompareAndSwap(stateIdle, stateClosed) {
			c.rwc.Close()
			delete(s.conns, c)
		}
	}
	return len(s.conns)
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.releaseBaseLocked()
	s.mu.Unlock()
}

// cancelRequests cancels the contexts of the requests running when the
// base context ends. A request that starts later sees base ended (see
// serveRequest).
func (s *Server) cancelRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	cause := context.Cause(s.base)
	for c := range s.conns {
		c.mu.Lock()
		if c.cancel != nil {
			c.cancelLocked(cause)
		}
		c.mu.Unlock()
	}
}

// releaseBaseLocked stops waiting for the base context once the server is
// closed and its last connection gone: no request is left to cancel, and
// a base that outlives the server no longer holds it. s.mu is held.
func (s *Server) releaseBaseLocked() {
	if s.stopBase != nil && s.closing.Load() && len(s.conns) == 0 {
		s.stopBase()
		s.stopBase = nil
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.std.ErrorLog != nil {
		s.std.ErrorLog.Printf(format, args...)
	}
}

// retryableAccept reports an accept error that passes: out of descriptors
// (some are released as connections close), a connection reset before it
// was accepted.
func retryableAccept(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED)
}

// handoffListener is the wrapped server's listener: Accept returns the
// connections the fast path hands over.
type handoffListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// give hands c to the wrapped server; false if it has stopped.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

// handedConn is a connection handed over to net/http with the bytes
// already read from it, which its first reads return. It keeps for
// net/http what the fast path started: the header deadline of the head
// being read, and the send bound of the connection's writes; and it lets
// net/http close its write side (CloseWrite), for the lingering close
// net/http makes after an early answer (closeWriteAndWait).
type handedConn struct {
	net.Conn
	pending []byte
	// headDeadline is the header deadline already running for the head
	// whose start is in pending (from the accept for a connection's first
	// request, from the first byte of a later one), zero if none: see
	// SetReadDeadline.
	headDeadline time.Time
	send         sendBound
}

func newHandedConn(rwc net.Conn, pending []byte, headDeadline time.Time, sendTimeout time.Duration) *handedConn {
	c := &handedConn{Conn: rwc, pending: pending, headDeadline: headDeadline}
	c.send.init(rwc, sendTimeout)
	return c
}

func (c *handedConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// SetReadDeadline is net/http's; its first call is the header deadline
// net/http gives a connection it has just accepted (conn.serve sets
// ReadHeaderTimeout from now, before it reads the first head, or the h2c
// preface). That head began before the hand-over, and its deadline runs
// from then: the first call gets the deadline already running when that
// one is sooner, so that a slow head gets ReadHeaderTimeout once, not
// once in the fast path and again in net/http. net/http's later calls
// (the next heads', a handler's) are its own. Only net/http's serving
// goroutine makes the first call, before any other can.
func (c *handedConn) SetReadDeadline(t time.Time) error {
	if d := c.headDeadline; !d.IsZero() {
		c.headDeadline = time.Time{}
		if t.IsZero() || d.Before(t) {
			t = d
		}
	}
	return c.Conn.SetReadDeadline(t)
}

// Write writes within the send bound.
func (c *handedConn) Write(p []byte) (int, error) { return c.send.write(c.Conn, p) }

// SetWriteDeadline bounds the writes as net/http asks (a handler's
// http.ResponseController), within the send bound.
func (c *handedConn) SetWriteDeadline(t time.Time) error { return c.send.setDeadline(t) }

func (c *handedConn) SetDeadline(t time.Time) error {
	rerr := c.SetReadDeadline(t)
	if err := c.SetWriteDeadline(t); err != nil {
		return err
	}
	return rerr
}

// CloseWrite closes the connection's write side, which net/http's
// lingering close needs (it finds it by this method, as on a
// *net.TCPConn): without it, a client still sending a body net/http did
// not read gets a reset for the answer.
func (c *handedConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// closeWriter is a connection whose write side closes alone (TCP's).
type closeWriter interface {
	CloseWrite() error
}
