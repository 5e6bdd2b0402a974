package proxy

import (
	"net"
	"syscall"
	"time"
	"unsafe"
)

// stateProbe reads the state of a connection's socket without taking part
// in its I/O.
type stateProbe struct {
	raw syscall.RawConn
	// peek is p.peekFD, bound once per connection: RawConn.Control takes a
	// func, and a method value made per call would allocate.
	peek func(fd uintptr)
	// gone is peekFD's answer. A connection carries one request at a
	// time, so one probe runs at a time.
	gone bool
}

func (p *stateProbe) init(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	p.raw, p.peek = raw, p.peekFD
	return true
}

// peerGone reports whether the backend has closed or reset the connection,
// or has sent bytes that nobody asked for, so that no request may start on
// it. It runs inside RawConn.Control, which only pins the fd; RawConn.Read
// would wait for the fd's read lock, which a reader parked on the
// connection would hold while it waits for the backend.
func (p *stateProbe) peerGone() bool {
	p.gone = false
	if p.raw.Control(p.peek) != nil {
		return false // the connection is closed; the write fails by itself
	}
	return p.gone
}

// peekFD looks at the socket's receive queue without consuming it and
// without blocking. Between requests an HTTP/1.1 connection has nothing to
// read, so anything but "would block" means the backend is leaving: 0 bytes
// is its FIN with nothing left unread, an error is a reset (or another
// pending socket error), and bytes are an answer to no request (a server
// closing an idle connection with a 408, say).
func (p *stateProbe) peekFD(fd uintptr) {
	var b [1]byte
	// Raw: a non-blocking call needs none of the runtime's syscall
	// bookkeeping (see h1.RawIO).
	_, _, err := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	p.gone = err != syscall.EAGAIN && err != syscall.EINTR
}

// resetWait bounds how long an EOF in place of an answer waits for the
// reset that shows the request reached a socket the backend had already
// closed. The reset trails the FIN by less than one round trip (the request
// left before the FIN arrived, or the write check would have refused it):
// microseconds on a node, about a millisecond across a cluster network,
// but tens of milliseconds when a busy node leaves packet processing to
// ksoftirqd (seen with 20 ms: 1 error in 50 crashes beside CPU hogs). Only
// an ambiguous close (a crash after reading the request) waits it out
// before its 502, so the bound is generous.
const resetWait = 250 * time.Millisecond

// tcpClose is TCP_CLOSE in include/net/tcp_states.h: a connection in
// CLOSE_WAIT (FIN received) moves there when a reset arrives.
const tcpClose = 7

// resetFollows reports whether a reset arrives within resetWait after the
// backend's FIN. It runs only on the error path.
func (p *stateProbe) resetFollows() bool {
	pause := 50 * time.Microsecond
	for deadline := time.Now().Add(resetWait); ; {
		var state [1]byte // tcpi_state, the first byte of struct tcp_info
		var errno syscall.Errno
		if p.raw.Control(func(fd uintptr) {
			size := uint32(len(state))
			_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
				uintptr(unsafe.Pointer(&state[0])), uintptr(unsafe.Pointer(&size)), 0)
		}) != nil || errno != 0 {
			return false
		}
		if state[0] == tcpClose {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 2*time.Millisecond)
	}
}
