package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/poll"
)

// Event streams: a legacy session's GET stream and a 2026-07-28
// subscriptions/listen stream stay open for the session's life, idle but
// for an event now and then. Relayed by a handler blocked in a read of the
// backend, each would hold two goroutines (the handler's, and h1's watch
// of the client) and their stacks, a copy buffer and the backend's read
// buffer: some 36 KiB for a stream that carries nothing. So a stream
// parks between events instead: once what reached the client ends with a
// whole event and nothing is buffered on either side, the handler detaches
// its answer (h1.Detach) and returns, the backend body gives its reader
// back (its Park), and the process's one poller (internal/poll) waits on
// the backend's socket for the next bytes and on the client's for a
// hang-up. What wakes it relays, with pooled buffers, until the stream is
// idle again (park) or ends (end): on the poller's own goroutine, most
// often, which is the cheapest (poll.Wait.SetInline), until a read or a
// write would wait (both connections' waits hand the poller's goroutine
// off: h1.OnWait), inlineBudget bytes have gone through, or the stream
// ends. A parked stream holds its sockets, the exchange and a few
// structs.
//
// A stream ends, at an event boundary, when its backend departs (a listen
// stream, see listen.go) or its session moves (a drain, drain.go): both
// are contexts, waited on with context.AfterFunc, which takes no goroutine
// either. A stream that cannot park (an answer net/http writes, h2c; a
// system without the poller) is relayed by its handler as before.

// parkableBody is a backend body that can give its read buffer back while
// nothing is buffered (backend's clientBody, eventIDTagger): Park returns
// the connection to wait on.
type parkableBody interface {
	Park() (net.Conn, bool)
}

// eventStream is one stream's relay.
type eventStream struct {
	p *Proxy
	// ctx is the request's context (the request itself is not kept: a
	// parked stream would keep it for its life).
	ctx context.Context
	// x is the request's exchange while its handler runs; a parked stream
	// keeps a copy of what its end reads (ex, and the status sent), and
	// the exchange goes back to the pool with the handler's return.
	x      *exchange
	ex     exchangeEnd
	status int32
	// announced is how many trailers the head announced (relay).
	announced int32
	resp      *h1.Answer

	// The answer: w while the handler runs, d once it is detached.
	w http.ResponseWriter
	d *h1.Detached

	// The small fields together (each open stream keeps this struct):
	// listen says a subscriptions/listen stream (counted by BeginListen);
	// whole that what reached the client ends with a whole event (or
	// nothing yet): the stream may park, or end, there; stopped that the
	// stream is to end at its next event boundary (its backend departed,
	// or its session moved).
	tail     eventTail
	listen   bool
	whole    bool
	parkable bool
	stopped  atomic.Bool
	wait     atomic.Pointer[poll.Wait]
	// stops unregister the AfterFuncs; written before the first park, read
	// by end (after it, through the poller's hand-off).
	stops [2]func() bool
}

// relayEvents relays an SSE stream's body. It reports parked when the
// stream went on without the handler (the exchange is then the stream's,
// which ends it); otherwise the stream has ended, cleanly when err is nil.
func (p *Proxy) relayEvents(w http.ResponseWriter, r *http.Request, x *exchange, resp *h1.Answer, announced int, buf []byte) (parked bool, err error) {
	s := &eventStream{p: p, ctx: r.Context(), x: x, resp: resp, announced: int32(announced), w: w, whole: true,
		listen: x.class.Op == opListen}
	_, s.parkable = resp.Body.(parkableBody)
	if s.listen {
		if ctx := x.ep.Departure(); ctx != nil {
			s.stops[0] = context.AfterFunc(ctx, s.stop)
		}
	}
	if x.moved != nil {
		// A session's GET stream ends when a drain moves the session, so
		// that its client opens it again, on the new backend.
		s.stops[1] = context.AfterFunc(x.moved, s.stop)
	}
	parked, err = s.copy(buf, false, false)
	if !parked {
		s.unregister()
	}
	return parked, err
}

// inlineBudget is the most a fire on the poller's goroutine relays before
// it hands the goroutine off: every parked stream's events wait while it
// runs. An event of a few KiB goes through whole; a stream that carries
// more than this in one go is busy, and relays on a goroutine of its own.
const inlineBudget = 64 << 10

// copy relays what the backend sends until the stream parks (parked) or
// ends: nil at the body's end or at an event boundary after a stop, an
// error otherwise (the answer is then cut off, not completed, since a
// client must not take half an event for a whole one). woken says the
// poller saw bytes to read: the stream reads before it parks again.
// inline says it runs on the poller's goroutine (poll.Inline).
func (s *eventStream) copy(buf []byte, woken, inline bool) (parked bool, err error) {
	relayed := 0
	for {
		if s.whole {
			if s.stopped.Load() {
				return false, nil
			}
			if !woken && s.parkable && s.park() {
				return true, nil
			}
		}
		woken = false
		n, rerr := s.resp.Body.Read(buf)
		if n > 0 {
			if err := s.write(buf[:n]); err != nil {
				return false, err
			}
			if relayed += n; inline && relayed > inlineBudget {
				s.wait.Load().Handoff()
				inline = false
			}
			s.whole = s.tail.endsEvent(buf[:n])
			if rerr == nil && s.whole {
				if err := s.flush(); err != nil {
					return false, errors.Join(errClientWrite, err)
				}
			}
		}
		if rerr == io.EOF {
			return false, nil
		}
		if rerr != nil {
			if s.stopped.Load() && s.whole {
				return false, nil // stopped: the body was closed to end the read
			}
			return false, rerr
		}
	}
}

func (s *eventStream) write(b []byte) error {
	var n int
	var err error
	if s.d != nil {
		n, err = s.d.Write(b)
	} else {
		n, err = s.w.Write(b)
	}
	if err != nil {
		return errors.Join(errClientWrite, err)
	}
	if n != len(b) {
		return errors.Join(errClientWrite, io.ErrShortWrite)
	}
	return nil
}

func (s *eventStream) flush() error {
	if s.d != nil {
		return s.d.FlushError()
	}
	return flush(s.w)
}

// park parks the stream, if it can: the backend body lets go of its
// buffer, and the poller waits. The first park detaches the answer from
// the handler, which then returns; the poller is armed once h1 has let
// go of the answer (armFirst).
func (s *eventStream) park() bool {
	conn, ok := s.resp.Body.(parkableBody).Park()
	if !ok {
		return false
	}
	if wait := s.wait.Load(); wait != nil {
		return wait.Arm() == nil // else the read finds out what happened
	}
	client := h1.ClientConn(s.w)
	source, sok := conn.(syscall.Conn)
	_, wok := client.(syscall.Conn)
	if !sok || !wok {
		s.parkable = false
		return false
	}
	// The client's connection is watched from armFirst: h1 puts it to
	// sleep (h1.Sleep) once the handler has returned.
	wait, err := poll.NewWait(source, nil, s.wake)
	if err != nil {
		s.parkable = false
		return false
	}
	s.wait.Store(wait)
	// The client's hang-up is the poller's to see while the stream is
	// parked; the request's cancellation (Shutdown's) is h1's to report.
	s.d = h1.Detach(s.w, s.armFirst, s.interrupt)
	// Wakes relay on the poller's goroutine if both connections hand it
	// off before they wait. The hooks go with the connections: the
	// backend's when it goes back to the pool, the client's with the
	// answer's end.
	handoff := wait.Handoff
	if h1.OnWait(conn, handoff) && s.d.OnWait(handoff) {
		wait.SetInline()
	}
	s.ex, s.status = s.x.exchangeEnd, int32(s.x.out.status)
	s.lighten()
	s.x.parked = true
	// Nothing of the exchange is used from here on: it is reused once the
	// handler returns. The answer's request is the exchange's direct
	// request.
	s.x, s.w, s.resp.Request = nil, nil, nil
	// Its head is with the client: its fields (and the backend's head
	// they are substrings of) are not read again.
	s.resp.ForgetHead()
	return true
}

// lighten lets go of what the request brought that the stream's end does
// not read, before the stream parks for what may be hours: the request's
// body (a listen stream's, whose share of --max-inflight-body-bytes goes
// back now: it is not in flight any more), and the request's head, which
// the classification's header values are substrings of (a legacy GET's
// Mcp-Session-Id keeps the whole head, some hundreds of bytes) — they are
// copied. The span's mcp.name, which the end takes from the body when no
// Mcp-Name gave it, is read first.
func (s *eventStream) lighten() {
	c := &s.ex.class
	if s.ex.span != nil && c.Name == "" && !c.Batch {
		if member := nameMember(c.Method); member != "" {
			c.Name, _, _ = paramsString(c.Params, member, "")
		}
	}
	c.Body, c.Params, c.ID = nil, nil, nil
	c.SessionID = strings.Clone(c.SessionID)
	c.ProtocolVersion = strings.Clone(c.ProtocolVersion)
	c.Name = strings.Clone(c.Name)
	s.ex.newSID = strings.Clone(s.ex.newSID) // a field of the backend's head
	if s.ex.bodyHeld > 0 {
		s.p.bodies.release(s.ex.bodyHeld)
		s.ex.bodyHeld = 0
	}
}

// armFirst arms the poller for the first time, on the connection's
// goroutine once the handler has returned.
func (s *eventStream) armFirst() {
	wait := s.wait.Load()
	watch, ok := s.d.Conn().(syscall.Conn)
	if !ok {
		s.end(errNoWatch)
		return
	}
	if err := wait.SetWatch(watch); err != nil {
		s.end(err) // the client's connection closed (Server.Close)
		return
	}
	if wait.Arm() != nil {
		s.wake(poll.Readable) // a connection closed: the read says how
	}
}

// wake runs when the parked stream has something to do: on a goroutine
// of its own, or the poller's (poll.Inline).
func (s *eventStream) wake(ev poll.Event) {
	if ev&poll.Hangup != 0 {
		s.end(errClientGone)
		return
	}
	if err := s.ctx.Err(); err != nil {
		s.end(err)
		return
	}
	buf := streamCopyBuffers.Get().(*[]byte)
	parked, err := s.copy(*buf, true, ev&poll.Inline != 0)
	streamCopyBuffers.Put(buf)
	if !parked {
		s.end(err)
	}
}

var (
	errClientGone = errors.New("client closed the connection")
	errNoWatch    = errors.New("tether: the client's connection cannot be watched")
)

// stop ends the stream at its next event boundary (its backend departed,
// or its session moved).
func (s *eventStream) stop() {
	s.stopped.Store(true)
	s.interrupt()
}

// interrupt makes the stream look at its state: a parked one is woken; a
// running one waiting on the backend is stopped by closing the backend's
// body, which ends the read.
func (s *eventStream) interrupt() {
	if wait := s.wait.Load(); wait != nil && wait.Wake() {
		return
	}
	s.resp.Body.Close()
}

func (s *eventStream) unregister() {
	for _, stop := range s.stops {
		if stop != nil {
			stop()
		}
	}
}

// end ends a detached stream: err nil completes the answer (with the
// backend's trailers), any other cuts it off; then the exchange ends as
// the handler's would have.
func (s *eventStream) end(err error) {
	p := s.p
	// The answer's last writes, and the exchange's end, may wait: not on
	// the poller's goroutine.
	s.wait.Load().Handoff()
	s.wait.Load().Close()
	s.unregister()
	s.resp.Body.Close() // now, to populate the trailers
	if err != nil {
		p.noteRelayFailure(s.ctx, s.ex.ep, err)
		s.d.Abort()
	} else {
		if len(s.resp.Trailer) > 0 {
			addTrailers(s.d.Header(), s.resp.Trailer, int(s.announced))
		}
		s.d.Finish()
	}
	if s.listen {
		s.ex.ep.EndListen()
	}
	p.endRequest(&s.ex, int(s.status))
}
