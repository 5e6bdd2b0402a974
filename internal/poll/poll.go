// Package poll parks connections without a goroutine.
//
// A relayed SSE stream is open for a session's life and idle for most of
// it. Relayed the plain way, it holds a goroutine blocked in a read of its
// backend and another watching its client for a hang-up: two stacks,
// kilobytes each, for as long as the client listens, and thousands of
// streams hold thousands of them. Here a stream between two events is a
// Wait instead: its backend connection (the source) and its client
// connection (the watch) are registered with one epoll instance, which
// one goroutine of the process waits on. When the backend sends bytes, or
// ends, or the client hangs up, or another goroutine calls Wake, the Wait
// fires: its function runs, on a new goroutine or the poller's own,
// relays what there is to relay and arms the Wait again, or ends the
// stream. An idle stream thus holds no goroutine, only a slot in a table
// and its registrations in the kernel; and a process with nothing to
// relay sleeps in that one epoll_wait, with no timer to wake it.
//
// A fire says there is something to do, not that a read will find bytes:
// Readable may be the source's end, and the events of a fire are what the
// kernel reported, which the fire's goroutine then checks with reads of
// its own. Until that goroutine arms the Wait again (or closes it), the
// stream is that goroutine's. A fire may also run on the poller's own
// goroutine (SetInline), the cheapest way to relay a few bytes, as long
// as it does not wait.
//
// The caller owns the connections: a Wait never reads, writes or closes
// them, and a connection is in at most one Wait at a time. Close the Wait
// before the connections. A connection closed while its Wait is armed
// makes no event (the kernel forgets its registration quietly), so
// whoever closes it must also Wake or Close the Wait.
//
// Waits are implemented on Linux only; elsewhere NewWait returns
// ErrUnsupported and the caller relays the plain way.
package poll

import (
	"errors"
	"strconv"
	"strings"
	"syscall"
)

// Event says what ended a wait: one or more of these bits.
type Event uint8

const (
	// Readable: the source has bytes to read, or its end (EOF, a reset,
	// an error), which the next read returns.
	Readable Event = 1 << iota
	// Hangup: the watched connection's peer closed its side, or reset the
	// connection.
	Hangup
	// Woken: Wake was called.
	Woken
	// Inline: the fire runs on the poller's goroutine (SetInline), which
	// it must give up (Handoff) before it waits for anything.
	Inline
)

func (e Event) String() string {
	if e == 0 {
		return "0"
	}
	var parts []string
	for _, b := range []struct {
		bit  Event
		name string
	}{{Readable, "Readable"}, {Hangup, "Hangup"}, {Woken, "Woken"}, {Inline, "Inline"}} {
		if e&b.bit != 0 {
			parts = append(parts, b.name)
			e &^= b.bit
		}
	}
	if e != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(e), 16))
	}
	return strings.Join(parts, "|")
}

var (
	// ErrUnsupported is NewWait's error on a system without epoll.
	ErrUnsupported = errors.New("poll: not supported on this system")
	// ErrClosed is Arm's error once Close was called.
	ErrClosed = errors.New("poll: wait closed")
)

// A Wait parks a source connection and, optionally, a watched one, until
// the source has something to read, the watched one is hung up, or Wake
// is called. Its methods are safe from any goroutine, with one rule for
// Arm (see there).
type Wait struct {
	sys
}

// NewWait registers source and watch (which may be nil) with the
// process's poller, disarmed: nothing fires before Arm. The source is
// waited on for bytes to read or its end; the watch only for its peer's
// hang-up, never for bytes, so a request a client pipelines behind its
// stream does not fire it. Each must be a connection the system can poll
// (a net.TCPConn, a net.UnixConn, an os.File of a pipe), not already in
// another Wait. fire runs on a new goroutine, once for each Arm that an
// event ends, with the events seen.
func NewWait(source, watch syscall.Conn, fire func(Event)) (*Wait, error) {
	if source == nil || fire == nil {
		return nil, errors.New("poll: NewWait needs a source and a fire")
	}
	return newWait(source, watch, fire)
}

// SetWatch registers watch with a Wait that has none (NewWait's watch was
// nil): for a connection that becomes the one to watch only after the
// Wait is made (one that h1 puts to sleep when its handler returns, say).
// Call it before the first Arm. ErrClosed: the Wait is closed.
func (w *Wait) SetWatch(watch syscall.Conn) error {
	if watch == nil {
		return errors.New("poll: SetWatch needs a connection")
	}
	return w.setWatch(watch)
}

// Arm waits for the next event, which makes fire run. It must not be
// called again before the fire of the previous Arm has started (fire
// itself may call it). Readiness is level-triggered: bytes already
// waiting on the source, or a watch already hung up, fire at once; and
// once Wake was called, every Arm fires at once with Woken. An error
// (a connection already closed, the Wait closed: ErrClosed) means that
// fire does not run for this Arm.
func (w *Wait) Arm() error { return w.arm() }

// Wake makes the Wait fire with Woken: at once when it is armed, else at
// the next Arm. It is sticky: once woken, every later Arm fires at once.
// It may be called any number of times; it reports whether this call made
// fire run.
func (w *Wait) Wake() bool { return w.wake() }

// SetInline lets the poller run fire on its own goroutine, with Inline in
// the events, when the fire is one of a few at once: no goroutine is
// started for it, nor a thread woken to run that. The caller promises
// that such a fire calls Handoff before anything that may wait (a read
// that finds no bytes, a write that finds no room, a lock held across
// I/O): every Wait's events wait while it runs. Call it before the first
// Arm.
func (w *Wait) SetInline() { w.setInline() }

// Handoff, called by a fire running with Inline, gives the poller's
// goroutine up: the poller goes on on a new one, and the fire may wait as
// on any goroutine. A fire without Inline, or one that handed off
// already, may call it too: it does nothing then. It must not be called
// by anything but the Wait's fire (a hook of its connections, say) while
// the fire runs.
func (w *Wait) Handoff() { w.handoff() }

// Close deregisters the connections. No fire starts after Close returns
// (one already started may still be running, and one may be what calls
// Close). It may be called more than once. Call it before closing the
// connections; a connection closed first is fine too, as the kernel
// dropped its registration when it was closed.
func (w *Wait) Close() { w.close() }
