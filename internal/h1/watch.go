package h1

import (
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

// armWatch starts the request's watch timer; bodyDone says the request
// has no body to read.
func (c *conn) armWatch(bodyDone bool) {
	c.mu.Lock()
	c.watch = watchArmed
	c.bodyDone = bodyDone
	c.mu.Unlock()
	if c.watchTimer == nil {
		c.watchTimer = time.AfterFunc(c.srv.watchDelay, c.watchFired)
	} else {
		c.watchTimer.Reset(c.srv.watchDelay)
	}
}

// watchFired runs on the timer's goroutine: it becomes the reader, unless
// the body is still being read, when the body's end starts the reader.
func (c *conn) watchFired() {
	c.mu.Lock()
	if c.watch != watchArmed {
		// The request ended first (or a stale run of the timer).
		c.mu.Unlock()
		return
	}
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

// startReadingLocked marks the reader started; c.mu is held.
func (c *conn) startReadingLocked() {
	c.watch = watchReading
	c.watchDone = make(chan struct{})
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
		c.cancel()
	}
	c.watch = watchOff
	close(c.watchDone)
}

// stopWatch ends the request's watch, interrupting the reader if it runs,
// and puts back a byte it read.
func (c *conn) stopWatch() {
	c.watchTimer.Stop()
	c.mu.Lock()
	if c.watch == watchReading {
		done := c.watchDone
		c.mu.Unlock()
		c.rwc.SetReadDeadline(aLongTimeAgo)
		<-done
		c.rwc.SetReadDeadline(time.Time{})
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
