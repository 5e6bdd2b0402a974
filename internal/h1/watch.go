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

// The watch's timer is not set and stopped per request (two timer
// operations, each a lock and a heap update, sometimes a wake-up of the
// network poller), nor is the clock read: a request that finds the timer
// resting arms it, and when it fires it looks at the request running
// then. The request it was timing is watched; one that started since
// becomes the one it times, for another clientWatchDelay; with none
// running it rests until the next request. So a request is watched after
// running from clientWatchDelay to twice that, and a connection busy with
// quick requests sees one timer run per clientWatchDelay and no timer
// operation per request.

// armWatch notes the start of a request, whose context cancel cancels;
// bodyDone says the request has no body to read. It also gives the
// request its read deadline: none until the handler sets one.
func (c *conn) armWatch(bodyDone bool, cancel context.CancelCauseFunc) {
	c.mu.Lock()
	c.cancel = cancel
	c.watch = watchWaiting
	c.bodyDone = bodyDone
	c.reqSeq++
	c.rdWant = time.Time{}
	if !c.watchArmed {
		c.watchArmed = true
		c.watchSeq = c.reqSeq
		if c.watchTimer == nil {
			c.watchTimer = time.AfterFunc(c.srv.watchDelay, c.watchFired)
		} else {
			c.watchTimer.Reset(c.srv.watchDelay)
		}
	}
	c.mu.Unlock()
}

// watchFired runs on the timer's goroutine: for a request running since
// the timer was set it becomes the reader, unless the body is still being
// read, when the body's end starts the reader.
func (c *conn) watchFired() {
	c.mu.Lock()
	if c.watch != watchWaiting {
		// No request runs (the one that armed the timer has ended): rest.
		c.watchArmed = false
		c.mu.Unlock()
		return
	}
	if c.reqSeq != c.watchSeq {
		// A request that started since: its turn comes at the next run.
		c.watchSeq = c.reqSeq
		c.watchTimer.Reset(c.srv.watchDelay)
		c.mu.Unlock()
		return
	}
	c.watchArmed = false
	if !c.bodyDone {
		c.watch = watchAfterBody
		c.mu.Unlock()
		return
	}
	c.startReadingLocked()
	c.mu.Unlock()
	c.backgroundRead()
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
// byte (kept for the next request), or the interruption stopWatch causes.
func (c *conn) backgroundRead() {
	n, err := c.io.Read(c.peeked[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hasPeeked = n == 1
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.gone = true
		c.cancel(nil)
	}
	c.watch = watchOff
	close(c.watchDone)
}

// stopWatch ends the request's watch, interrupting the reader if it runs,
// and puts back a byte it read. The timer is left as it is.
func (c *conn) stopWatch() {
	c.mu.Lock()
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
	if c.hasPeeked {
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
	c.mu.Unlock()
}
