package h1

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// RawIO returns c with its reads and writes made as raw system calls when
// c is a TCP connection: the socket is non-blocking, so a read or write
// never blocks in the kernel, and the runtime's bookkeeping for a call
// that might (entersyscall) is waste. Worse, a process that has gone idle
// wakes the runtime's sysmon thread on its next such call, which then
// polls every 20 µs for a millisecond: a sixth of a proxy's CPU when
// requests come a millisecond apart (golang/go#18236). Waiting is still
// the runtime's network poller's (syscall.RawConn), so deadlines, Close
// and cancellation behave as they do for c. Other connections come back
// as they are.
//
// The result serves one reader and one writer at a time, as a connection
// carrying HTTP/1.1 does.
func RawIO(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	r := &rawConn{TCPConn: tc, rc: rc}
	// Bound once: a closure per call would allocate. One for the reading
	// side (which of its steps, readMode says) and one for the writing
	// side, which may run at the same time.
	r.readFD, r.writeFD = r.readStep, r.writeAll
	return r
}

// The steps of the reading side (rawConn.readMode).
const (
	modeRead          = iota // readOnce
	modeReadIdle             // readIdleOnce
	modeWriteThenRead        // writeThenReadOnce
)

// readStep is the step of the read in progress.
func (c *rawConn) readStep(fd uintptr) bool {
	switch c.readMode {
	case modeReadIdle:
		return c.readIdleOnce(fd)
	case modeWriteThenRead:
		return c.writeThenReadOnce(fd)
	}
	return c.readOnce(fd)
}

type rawConn struct {
	*net.TCPConn
	rc              syscall.RawConn
	readFD, writeFD func(fd uintptr) bool
	readMode        uint8
	rbuf            []byte
	idleBuf         *[]byte // readIdle's buffer
	rn              int
	rerr            syscall.Errno
	wbuf            []byte
	wn              int
	werr            syscall.Errno
	// bound is the send bound of the write in progress (writeWithin), and
	// boundAt what of wbuf was written when it last set its deadline (-1:
	// not yet).
	bound   *sendBound
	boundAt int
	// onWait runs before a read or write waits for the socket (OnWait).
	onWait func()
}

// OnWait makes f run before any read or write of c waits for its socket
// (f nil: nothing), on the goroutine about to wait, which holds c's read
// or write lock then (f must not use c): a fire running on the poller's
// goroutine hands it off there (poll.Wait.Handoff). It reports whether c
// is a connection RawIO made raw, whose waits it can see; any other's it
// cannot, and f is not set. Whoever sets f clears it before c can be
// used by another.
func OnWait(c net.Conn, f func()) bool {
	switch rc := c.(type) {
	case *rawConn:
		rc.onWait = f
		return true
	case *sleepingConn:
		rc.setOnWait(f)
		return true
	}
	return false
}

func (c *rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rbuf, c.rn, c.rerr, c.readMode = p, 0, 0, modeRead
	err := c.rc.Read(c.readFD)
	c.rbuf = nil
	return c.readResult(err)
}

// readIdle is Read into *buf, a buffer of readBuffers', for a connection
// that waits for its next request: if none has come, the buffer goes back
// to readBuffers while the poller waits (*buf is nil), and a buffer is
// taken again once there is something to read.
func (c *rawConn) readIdle(buf *[]byte) (int, error) {
	c.idleBuf = buf
	c.rbuf, c.rn, c.rerr, c.readMode = *buf, 0, 0, modeReadIdle
	err := c.rc.Read(c.readFD)
	c.rbuf, c.idleBuf = nil, nil
	return c.readResult(err)
}

// readIdleOnce is readOnce for readIdle.
func (c *rawConn) readIdleOnce(fd uintptr) bool {
	if c.rbuf == nil {
		*c.idleBuf = getReadBuffer()
		c.rbuf = *c.idleBuf
	}
	if c.readOnce(fd) {
		return true
	}
	putReadBuffer(c.rbuf)
	*c.idleBuf, c.rbuf = nil, nil
	return false
}

// readResult is what Read returns after RawConn.Read returned err.
func (c *rawConn) readResult(err error) (int, error) {
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case c.rerr != 0:
		return 0, c.opError("read", os.NewSyscallError("read", c.rerr))
	case c.rn == 0:
		return 0, io.EOF
	}
	return c.rn, nil
}

// readOnce is one read(2); false asks the poller to wait for data.
func (c *rawConn) readOnce(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if c.onWait != nil {
				c.onWait()
			}
			return false
		case 0:
			c.rn = int(n)
		default:
			c.rerr = e
		}
		return true
	}
}

// WriteThenRead writes w, then reads into p the first bytes that arrive
// after it: a request, then the start of its answer. Both happen in one
// RawConn.Read, whose poller wait is armed before w is written, so the
// read is made only once the poller has seen bytes arrive. Read after
// Write would first try a read that finds nothing (EAGAIN, a system call
// of a microsecond or two on a virtual machine) and only then wait. Bytes
// that were already waiting before w was written (none, between the
// requests of an HTTP/1.1 connection) are read when the next ones arrive.
//
// written is how much of w reached the socket; err is the write's when
// written < len(w), the read's otherwise. A write that finds the socket's
// buffer full goes on as Write does, waiting for room, and the read as
// Read does.
func (c *rawConn) WriteThenRead(w, p []byte) (written, n int, err error) {
	c.wbuf, c.wn, c.werr = w, 0, 0
	c.rbuf, c.rn, c.rerr, c.readMode = p, 0, 0, modeWriteThenRead
	rerr := c.rc.Read(c.readFD)
	written, c.wbuf, c.rbuf = c.wn, nil, nil
	switch {
	case rerr != nil && written < len(w):
		return written, 0, c.opError("write", rerr)
	case c.werr != 0:
		return written, 0, c.opError("write", os.NewSyscallError("write", c.werr))
	case written < len(w):
		// The socket's buffer is full: the rest waits for room.
		more, err := c.Write(w[written:])
		written += more
		if err != nil {
			return written, 0, err
		}
		n, err := c.Read(p)
		return written, n, err
	}
	n, err = c.readResult(rerr)
	return written, n, err
}

// writeThenReadOnce is WriteThenRead's step: while wbuf is not all
// written, a write (true stops the wait: the write failed or would
// block); then a read, but not on the call that completed the write: the
// answer cannot have come before its request, and the poller, armed
// before the write, wakes the wait when it comes.
func (c *rawConn) writeThenReadOnce(fd uintptr) bool {
	if c.wn < len(c.wbuf) {
		if !c.writeAll(fd) || c.werr != 0 {
			return true
		}
		return false
	}
	return c.readOnce(fd)
}

func (c *rawConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wbuf, c.wn, c.werr = p, 0, 0
	err := c.rc.Write(c.writeFD)
	c.wbuf = nil
	switch {
	case err != nil:
		return c.wn, c.opError("write", err)
	case c.werr != 0:
		return c.wn, c.opError("write", os.NewSyscallError("write", c.werr))
	}
	return c.wn, nil
}

// writeWithin is Write within a send bound: the bound sets a deadline only
// for a write that waits for room (see sendBound), from writeAll, just
// before the poller's wait, which then has it.
func (c *rawConn) writeWithin(p []byte, b *sendBound) (int, error) {
	c.bound, c.boundAt = b, -1
	n, err := c.Write(p)
	if c.boundAt >= 0 {
		b.waited()
	}
	c.bound = nil
	return n, err
}

// writeAll writes what is left of wbuf; false asks the poller to wait for
// room. MSG_NOSIGNAL: a peer gone is an EPIPE error, not a signal.
func (c *rawConn) writeAll(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		rest := c.wbuf[c.wn:]
		n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)), syscall.MSG_NOSIGNAL, 0, 0)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if c.bound != nil && c.boundAt != c.wn {
				// The first wait of a bounded write, or the client took
				// some bytes since the last: the bound runs from now.
				// (Setting the deadline here, the fd's write lock held,
				// is safe: deadlines take no lock of the fd's.)
				c.boundAt = c.wn
				c.bound.waiting()
			}
			if c.onWait != nil {
				c.onWait()
			}
			return false
		case 0:
			c.wn += int(n)
		default:
			c.werr = e
			return true
		}
	}
	return true
}

// opError wraps err as net.Conn's own methods do, so that callers'
// errors.Is (os.ErrDeadlineExceeded, net.ErrClosed, syscall.ECONNRESET)
// and net.Error checks see what they would see without RawIO.
func (c *rawConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
