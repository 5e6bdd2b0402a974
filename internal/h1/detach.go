package h1

import (
	"net"
	"net/http"
)

// Detached answers. An SSE stream is open for a session's life and idle
// for most of it; its handler, blocked in a read of the backend between
// events, would hold a goroutine (its stack: kilobytes) and the
// connection's buffers for as long as the client listens. A handler may
// instead detach its answer: it returns, the connection's goroutine ends
// without completing the answer, and whoever holds the Detached writes
// the rest of it, from any goroutine, one at a time, and ends it. Between
// writes the answer holds no buffer. The connection stays the server's
// (Shutdown waits for it; the request's context is cancelled as any
// running request's), and carries the client's next request once the
// answer is finished.

// Detached is an answer that outlives its handler (see Detach).
type Detached struct {
	c *conn
}

// ClientConn returns the client connection of w, an answer of this
// package's server that could be detached (its head written, nothing
// failed), or nil.
func ClientConn(w http.ResponseWriter) net.Conn {
	w = unwrap(w)
	rw, ok := w.(*response)
	if !ok || !rw.committed || rw.err != nil || rw.handlerDone || rw.c.detach != nil {
		return nil
	}
	return rw.c.rwc
}

// Detach detaches the answer w, for which ClientConn returned a
// connection: the handler must return without writing to w again, and
// then (on the connection's goroutine, once the server has let go of the
// answer) ready runs. From then on the answer is the Detached's, which
// must end it with Finish or Abort. cancelled runs, on a goroutine of its
// own, when the request's context is cancelled before (a failed write, or
// the server's BaseContext ended): as context.AfterFunc would, without a
// registration with the context. It returns nil, and nothing is
// detached, for any other w.
func Detach(w http.ResponseWriter, ready, cancelled func()) *Detached {
	if ClientConn(w) == nil {
		return nil
	}
	rw := unwrap(w).(*response)
	c := rw.c
	d := &Detached{c: c}
	c.detach = ready
	c.mu.Lock()
	c.onDetachedCancel = cancelled
	c.mu.Unlock()
	return d
}

// unwrap finds the answer under wrappers that unwrap, as
// http.ResponseController does.
func unwrap(w http.ResponseWriter) http.ResponseWriter {
	for range 8 {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
	return w
}

// Write writes p into the answer's body, chunked as the head said;
// nothing reaches the client before FlushError.
func (d *Detached) Write(p []byte) (int, error) {
	w := &d.c.resp
	if w.err != nil {
		return 0, w.err
	}
	w.buffers()
	return w.Write(p)
}

// FlushError sends what was written to the client, and gives the write
// buffer back: an answer between events holds none.
func (d *Detached) FlushError() error {
	w := &d.c.resp
	if w.o == nil {
		return w.err
	}
	err := w.FlushError()
	w.release()
	return err
}

// OnWait makes f run before a write of the answer waits for the client's
// socket, as the package's OnWait does for the connection; Finish and
// Abort clear it.
func (d *Detached) OnWait(f func()) bool { return OnWait(d.c.io, f) }

// Header is the answer's header map, as the handler's ResponseWriter's:
// what is set in it now (under http.TrailerPrefix, or announced in the
// Trailer header) is sent as trailers by Finish.
func (d *Detached) Header() http.Header { return d.c.resp.Header() }

// Finish completes the answer (the last chunk, the trailers) and ends the
// request: the connection then waits for the client's next request, on a
// goroutine of its own, or closes, as after any answer.
func (d *Detached) Finish() {
	c := d.c
	w := &c.resp
	c.mu.Lock()
	c.onDetachedCancel = nil // the request ends here, not by a cancellation
	c.mu.Unlock()
	OnWait(c.io, nil)
	w.buffers()
	w.finish()
	c.endRequest()
	c.send.clearAsked()
	keep := w.err == nil && !w.closeAfter && !c.gone && !c.srv.closing.Load()
	w.release()
	clear(c.header)
	if !keep || !c.wake() {
		c.close()
		return
	}
	go c.serve()
}

// Abort ends the request and closes the connection without completing
// the answer, as a handler's panic(http.ErrAbortHandler) does: the client
// sees the answer cut off, not complete.
func (d *Detached) Abort() {
	c := d.c
	c.mu.Lock()
	c.onDetachedCancel = nil // the request ends here, not by a cancellation
	c.mu.Unlock()
	OnWait(c.io, nil)
	c.endRequest()
	c.resp.release()
	clear(c.header)
	c.close()
}

// detached ends the conn goroutine's part in a request its handler
// detached: the watch stops (the request's context stays live), and the
// connection gives back the buffers the answer does not need.
func (c *conn) detached() {
	c.mu.Lock()
	c.stopWatchLocked()
	c.mu.Unlock()
	c.resp.release()
	// The request and its body were for the head, which is written: a
	// detached answer lives long (an open stream's life), and the request
	// is some 480 bytes the handler no longer needs either.
	c.resp.req, c.resp.body = nil, nil
	// The request's fields, kept for the next request (it may be a while),
	// and the answer's adopted ones, rendered with its head: Header builds
	// a map with what the detached answer adds (its trailers).
	c.fields, c.resp.fields = nil, nil
	if c.r == c.w && c.buf != nil {
		putReadBuffer(c.buf)
		c.buf, c.r, c.w = nil, 0, 0
	}
	// The connection sleeps while the answer waits (Sleep): its socket's
	// descriptor, not a net.Conn (some 870 bytes less for as long as the
	// stream is open). The holder watches it through Detached.Conn;
	// Finish wakes it for the client's next request. The watch is
	// stopped (above), so nothing of the server's reads it meanwhile.
	if s, ok := Sleep(c.io); ok {
		c.mu.Lock()
		c.rwc, c.io = s, s
		c.mu.Unlock()
		c.send.setConn(s)
	}
}

// Conn returns the connection of the answer, for its holder to watch (a
// hang-up, with internal/poll): once the handler has returned, a
// connection put to sleep (see Sleep), which Finish wakes. It is valid
// until Finish or Abort.
func (d *Detached) Conn() net.Conn {
	c := d.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rwc
}

// wake makes a connection that slept while its answer was detached a
// RawIO one again, for its next request; false: it could not be (it is
// closed or failing), and is to be closed.
func (c *conn) wake() bool {
	if !Asleep(c.io) {
		return true
	}
	rwc, io, err := awaken(c.io)
	if err != nil {
		return false
	}
	c.mu.Lock()
	c.rwc, c.io = rwc, io
	c.mu.Unlock()
	c.send.setConn(rwc)
	return true
}
