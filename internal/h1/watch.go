package h1

import (
	"context"
	"errors"
	"os"
	"time"
)

// The client watch: net/http reads ahead on every request's connection, in
// a goroutine of its own, so that a client closing its connection cancels
// the request's context. That read is a goroutine start, a read that finds
// nothing, a wake-up and a cross-thread hand-off per request, most of it
// for requests answered in a millisecond. Here the read starts only for a
// request still running after clientWatchDelay (and whose body has been
// read, as net/http's), which is what needs it: an SSE stream, a slow tool
// call.

// The watch has one timer for the whole server, not one per connection:
// a timer that fires is a thread woken from the network poller, a
// goroutine started and the runtime's sysmon woken, and a connection's
// timer fired once per clientWatchDelay while the connection was busy,
// even with each of its requests answered in a millisecond. The server's
// timer ticks every clientWatchDelay while some request runs unwatched.
// A tick visits the connections: a request seen running at two
// consecutive ticks is watched (or, its body still being read, once the
// body's end is read); one seen for the first time is noted by its
// number. So a request is watched after running from clientWatchDelay to
// twice that. A tick that finds no request left to wait for lets the
// timer rest, and the next request to start arms it again (that request
// counts as seen: the first tick is clientWatchDelay away). A request
// only reads an atomic flag: a busy server makes one timer operation per
// tick, none per request, and an idle one none at all. Shutdown and Close
// leave the timer be: a request still running is still watched (the read
// of its closed connection fails, which cancels it), and the timer rests
// once none runs. A connection handed over, or closed, has no request
// running for a tick to see.

// armWatch notes the start of a request, of context ctx, which cancel
// cancels; bodyDone says the request has no body to read. It also gives
// the request its read deadline: none until the handler sets one.
func (c *conn) armWatch(ctx context.Context, cancel context.CancelCauseFunc, bodyDone bool) {
	c.mu.Lock()
	c.reqCtx = ctx
	c.cancel = cancel
	c.watch = watchWaiting
	c.bodyDone = bodyDone
	c.reqSeq++
	c.rdWant = time.Time{}
	// After watch is set: a tick that lets the timer rest clears the flag,
	// then looks for a waiting request again (see watchTick).
	if s := c.srv; !s.watchArmed.Load() && s.watchArmed.CompareAndSwap(false, true) {
		c.watchSeq = c.reqSeq
		s.resetWatchTimer()
	}
	c.mu.Unlock()
}

// resetWatchTimer sets the timer for clientWatchDelay from now; only the
// one that set watchArmed, or the tick that keeps it set, calls it.
func (s *Server) resetWatchTimer() {
	s.watchArms.Add(1)
	s.watchTimer.Reset(s.watchDelay)
}

// watchTick runs on the timer's goroutine: it visits the connections,
// and sets the timer again while a request runs unwatched, or lets it
// rest.
func (s *Server) watchTick() {
	if s.visitWaiting(true) {
		s.resetWatchTimer()
		return
	}
	s.watchArmed.Store(false)
	// A request that started during the visit, after its connection was
	// visited, found the flag still set and did not arm the timer: it is
	// seen now (its watch was set before it read the flag), or it read
	// the flag cleared and armed the timer itself.
	if s.visitWaiting(false) && s.watchArmed.CompareAndSwap(false, true) {
		s.resetWatchTimer()
	}
}

// visitWaiting reports whether a request runs that the watch waits on,
// on some connection; tick says it is a tick's visit, which moves the
// watch of each one on (see tickLocked).
func (s *Server) visitWaiting(tick bool) bool {
	waiting := false
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.state.Load() == stateIdle {
			// Waiting for a request, without c.mu: one that starts after
			// this load reads the flag after the tick cleared it.
			continue
		}
		c.mu.Lock()
		if tick {
			waiting = c.tickLocked() || waiting
		} else if c.watch == watchWaiting {
			waiting = true
		}
		c.mu.Unlock()
		if waiting && !tick {
			break
		}
	}
	return waiting
}

// tickLocked is a tick's visit of the connection: a request seen at the
// tick before is watched, unless its body is still being read, when the
// body's end starts the watch. It reports whether the request still
// waits for a tick. c.mu is held.
func (c *conn) tickLocked() bool {
	if c.watch != watchWaiting {
		return false // no request, or one watched or about to be
	}
	if c.watchSeq != c.reqSeq {
		// A request that started since the last tick: its turn comes at
		// the next one.
		c.watchSeq = c.reqSeq
		return true
	}
	if !c.bodyDone {
		c.watch = watchAfterBody
		return false
	}
	c.startReadingLocked()
	go c.backgroundRead()
	return false
}

// bodyRead is called when the request body has been read to its end.
func (c *conn) bodyRead() {
	c.mu.Lock()
	c.bodyDone = true
	start := c.watch == watchAfterBody
	if start {
		c.startReadingLocked()
	}
	c.mu.Unlock()
	if start {
		go c.backgroundRead()
	}
}

// startReadingLocked marks the reader started, and gives the socket the
// request's read deadline (not the idle deadline it may still have); c.mu
// is held.
func (c *conn) startReadingLocked() {
	c.watch = watchReading
	c.watchDone = make(chan struct{})
	c.applyReadDeadline()
}

// backgroundRead reads one byte: the end of the connection (the client
// left: the request's context is cancelled), a pipelined request's first
// byte (kept for the next request), or the interruption endRequest causes.
func (c *conn) backgroundRead() {
	n, err := c.io.Read(c.peeked[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hasPeeked = n == 1
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.gone = true
		c.cancelLocked(nil)
	}
	c.watch = watchOff
	close(c.watchDone)
}

// endRequest cancels the request's context, as net/http does once the
// handler has returned, and ends the request's watch, interrupting the
// reader if it runs; it puts back a byte the reader read. The timer is
// left as it is: the next tick finds no request here.
func (c *conn) endRequest() {
	c.mu.Lock()
	c.cancelLocked(nil)
	c.stopWatchLocked()
	c.mu.Unlock()
}

// stopWatchLocked ends the request's watch, interrupting the reader if it
// runs (c.mu is let go while it ends), and puts back a byte it read. c.mu
// is held.
func (c *conn) stopWatchLocked() {
	if c.watch == watchReading {
		done := c.watchDone
		// The deadline wanted stays: the next read puts it back.
		c.rdSet = aLongTimeAgo
		c.rwc.SetReadDeadline(aLongTimeAgo)
		c.mu.Unlock()
		<-done
		c.mu.Lock()
	}
	c.watch = watchOff
	c.keepPeekedLocked()
}

// keepPeekedLocked puts a byte the watch's reader read back into the
// connection's buffer, for the next request. c.mu is held.
func (c *conn) keepPeekedLocked() {
	if c.hasPeeked {
		if c.buf == nil {
			c.buf = getReadBuffer()
			c.r, c.w = 0, 0
		}
		c.hasPeeked = false
		if c.w == len(c.buf) {
			if c.r > 0 {
				c.w = copy(c.buf, c.buf[c.r:c.w])
				c.r = 0
			} else {
				c.buf = append(c.buf, 0)
			}
		}
		c.buf[c.w] = c.peeked[0]
		c.w++
	}
}
