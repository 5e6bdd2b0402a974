package h1

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// sendSlack is the fraction of SendTimeout by which the write deadline a
// connection's writes share may exceed SendTimeout, on a connection whose
// writes do not tell when they wait (not RawIO's: those handed to
// net/http): it is set again only once it is closer than SendTimeout, so
// that a connection makes one timer operation per SendTimeout/sendSlack of
// writing instead of one per write (as the idle deadline, see idleSlack).
// A write that the client takes nothing of fails between SendTimeout and
// SendTimeout*(1+1/sendSlack) after it started; one that made some
// progress first is given the bound again, so a write stalled after some
// progress fails within about twice SendTimeout of its last progress.
const sendSlack = 8

// sendBound bounds the progress of a connection's writes (Server's
// SendTimeout), as nginx's send_timeout does and net/http's HTTP/2
// WriteByteTimeout. A write to a RawIO connection (the fast path's) tells
// the bound when it is about to wait for room in the socket (waitWriter):
// only then is a deadline set, SendTimeout from then, and set again each
// time the client has taken some bytes, then dropped once the write is
// done; a write that does not wait, almost every one, costs no clock
// read and no timer. Any other write gets a write deadline no later than
// SendTimeout (plus sendSlack) from its start, and one the deadline
// interrupts after some progress is tried again, with the bound from
// then. The bound also keeps the deadline asked for by SetWriteDeadline (a
// handler's http.ResponseController, net/http's own resets), which the
// socket gets when it is sooner than the bound's.
type sendBound struct {
	conn    net.Conn      // whose write deadline it sets
	timeout time.Duration // SendTimeout; 0: writes are not bounded

	// everAsked says SetWriteDeadline was called since the last
	// clearAsked: most requests never call it, and clearAsked then costs
	// a load.
	everAsked atomic.Bool

	mu    sync.Mutex
	asked time.Time // the deadline SetWriteDeadline asked for, zero if none
	// kept is the bound's deadline: kept across writes (see sendSlack), or,
	// for a waitWriter's, the one of the wait in progress (zero if none).
	kept time.Time
	set  time.Time // the deadline conn has
}

// waitWriter is a writer that tells a sendBound when a write is about to
// wait for room, and when it is done (RawIO's).
type waitWriter interface {
	// writeWithin writes p as Write does, calling b.waiting before each
	// wait for room and b.waited after the write if it waited.
	writeWithin(p []byte, b *sendBound) (int, error)
}

func (b *sendBound) init(conn net.Conn, timeout time.Duration) {
	b.conn, b.timeout = conn, timeout
}

// setConn makes conn the one whose deadline is set, in place of the one
// before on the same socket (Sleep), which had the deadline set: conn gets
// it at the next write.
func (b *sendBound) setConn(conn net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conn, b.set = conn, time.Time{}
}

// write writes p to w (the connection, or its RawIO) within the bound. A
// retry follows a write that made progress, so there are at most len(p)
// of them, each bounded in time.
func (b *sendBound) write(w io.Writer, p []byte) (n int, err error) {
	if b.timeout <= 0 {
		return w.Write(p)
	}
	if ww, ok := w.(waitWriter); ok {
		return ww.writeWithin(p, b)
	}
	for {
		if err := b.arm(); err != nil {
			return n, err
		}
		m, err := w.Write(p[n:])
		n += m
		if err == nil || m == 0 || !errors.Is(err, os.ErrDeadlineExceeded) || b.askedPassed() {
			return n, err
		}
		// The client took some of p before the deadline: the bound runs
		// again from now.
	}
}

// arm gives the connection the deadline of a write about to start: the
// kept one while it is at least SendTimeout away, or the one asked for
// when that is sooner.
func (b *sendBound) arm() error {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kept.Before(now.Add(b.timeout)) {
		b.kept = now.Add(b.timeout + b.timeout/sendSlack)
	}
	return b.applyLocked()
}

// applyLocked sets the connection's write deadline to the sooner of the
// bound's and the one asked for, if it has not that one already. b.mu is
// held.
func (b *sendBound) applyLocked() error {
	want := b.kept
	if !b.asked.IsZero() && (want.IsZero() || b.asked.Before(want)) {
		want = b.asked
	}
	if want.Equal(b.set) {
		return nil
	}
	b.set = want
	return b.conn.SetWriteDeadline(want)
}

// waiting gives the connection the deadline of a wait for room about to
// start, SendTimeout from now: the write's first wait, or one after the
// client took some bytes.
func (b *sendBound) waiting() {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kept = now.Add(b.timeout)
	b.applyLocked()
}

// waited drops the deadline of a write's waits, the write done: a write
// that does not wait is not to find it passed.
func (b *sendBound) waited() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kept = time.Time{}
	b.applyLocked()
}

// askedPassed reports whether the deadline asked for has passed: a write
// it interrupted is over, progress or not.
func (b *sendBound) askedPassed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.asked.IsZero() && !time.Now().Before(b.asked)
}

// setDeadline is the connection's SetWriteDeadline: t bounds the writes
// from now on, a pending one too (as net.Conn's), next to the bound.
func (b *sendBound) setDeadline(t time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.everAsked.Store(true)
	b.asked = t
	return b.applyLocked()
}

// clearAsked drops the deadline asked for, as net/http does after each
// request: a handler's write deadline is its request's only.
func (b *sendBound) clearAsked() {
	if !b.everAsked.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.everAsked.Store(false)
	if !b.asked.IsZero() {
		b.asked = time.Time{}
		b.applyLocked()
	}
}
