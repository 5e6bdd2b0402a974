package backend

import (
	"net"
	"syscall"
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
