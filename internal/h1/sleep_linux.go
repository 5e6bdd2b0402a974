package h1

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Sleeping connections. A parked stream's sockets are idle for most of
// their life, and a Go net.Conn costs some 870 bytes a socket while it
// exists: its netFD and addresses on the heap, and off it the runtime's
// poll descriptor (two timers in it) and the finalizer's record, which
// the runtime keeps for as long as the descriptor is registered with its
// network poller. Sleep trades the net.Conn for a duplicate of its
// descriptor: a stream's bytes are then read and written with raw
// non-blocking system calls, which need no poller (the caller has its
// own, internal/poll, which tells it when there are bytes), and a
// net.Conn is made again (net.FileConn) only when a read or write would
// wait, for as long as the connection is not put to sleep again.

// Sleep returns a connection that stands for c, a connection of RawIO's
// (or one Sleep returned), holding only a duplicate of its socket's
// descriptor; c is closed, which keeps the socket open through the
// duplicate. A sleeping connection that a read or write woke (it had to
// wait) sleeps again. Deadlines set on c are not carried over: Sleep is
// for a connection that has none. It reports false, and returns c as it
// is, for any other connection, or when the descriptor cannot be
// duplicated.
//
// The connection serves one reader and one writer at a time, as RawIO's
// do; Close, the deadlines and SyscallConn may be called at any time.
// Its SyscallConn gives Control only (for epoll_ctl, say): Control holds
// the descriptor open, so a Close meanwhile cannot make its number name
// another file.
func Sleep(c net.Conn) (net.Conn, bool) {
	switch sc := c.(type) {
	case *sleepingConn:
		sc.mu.Lock()
		awake := sc.awake
		sc.awake = nil
		sc.mu.Unlock()
		if awake != nil {
			awake.Close() // its own descriptor, not the sleeping one's
		}
		return sc, true
	case *rawConn:
		d := -1
		var derr error
		err := sc.rc.Control(func(fd uintptr) { d, derr = dupCloexec(int(fd)) })
		if err != nil || derr != nil {
			return c, false
		}
		s := &sleepingConn{fd: d, onWait: sc.onWait}
		sc.Close()
		return s, true
	}
	return c, false
}

// awaken returns the socket of c, a connection Sleep returned, as a TCP
// connection and its RawIO (c is closed, its OnWait hook and deadlines not
// carried over). On failure c is closed.
func awaken(c net.Conn) (rwc, io net.Conn, err error) {
	sc := c.(*sleepingConn)
	sc.mu.Lock()
	awake := sc.awake
	sc.awake = nil
	sc.mu.Unlock()
	if awake == nil {
		if err := sc.upgrade("read"); err != nil {
			sc.Close()
			return nil, nil, err
		}
		sc.mu.Lock()
		awake, sc.awake = sc.awake, nil
		sc.mu.Unlock()
	}
	sc.Close()
	OnWait(awake, nil)
	awake.SetDeadline(time.Time{})
	return awake.(*rawConn).TCPConn, awake, nil
}

// Asleep reports whether c is a connection Sleep returned.
func Asleep(c net.Conn) bool {
	_, ok := c.(*sleepingConn)
	return ok
}

type sleepingConn struct {
	// mu guards the descriptor's life (fd is -1 once closed), awake and
	// the deadlines; raw system calls on fd hold it for reading, so that
	// Close, which takes it for writing, waits for them (they never block).
	mu sync.RWMutex
	fd int
	// awake is the net.Conn (RawIO's) a read or write that had to wait
	// made of a duplicate of fd, nil while the connection sleeps.
	awake net.Conn
	// onWait is OnWait's f, run before a wait (see RawIO).
	onWait func()
	rd, wd deadline
}

// clockBase is the origin of a sleeping connection's deadlines, which are
// kept as the time from it (8 bytes, not a time.Time's 24: an open stream
// has two sleeping connections, and 72 bytes fit the allocator's 80-byte
// class where 104 took 112). A deadline is then an instant of the
// monotonic clock, as net.Conn's are once set.
var clockBase = time.Now()

// deadline is a deadline's time from clockBase; 0: none.
type deadline time.Duration

func deadlineOf(t time.Time) deadline {
	if t.IsZero() {
		return 0
	}
	if d := t.Sub(clockBase); d != 0 {
		return deadline(d)
	}
	return -1 // clockBase itself: passed, as a nanosecond before it is
}

// passed reports whether the deadline is set and has passed: a raw call
// never waits, so only such a deadline bounds it.
func (d deadline) passed() bool {
	return d != 0 && time.Since(clockBase) >= time.Duration(d)
}

// time is the deadline as a time.Time, for a net.Conn's SetDeadline.
func (d deadline) time() time.Time {
	if d == 0 {
		return time.Time{}
	}
	return clockBase.Add(time.Duration(d))
}

func dupCloexec(fd int) (int, error) {
	d, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if e != 0 {
		return -1, os.NewSyscallError("fcntl", e)
	}
	return int(d), nil
}

func (c *sleepingConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		c.mu.RLock()
		if awake := c.awake; awake != nil {
			c.mu.RUnlock()
			return awake.Read(p)
		}
		if c.fd < 0 {
			c.mu.RUnlock()
			return 0, c.opError("read", net.ErrClosed)
		}
		if c.rd.passed() {
			c.mu.RUnlock()
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(c.fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		c.mu.RUnlock()
		switch e {
		case 0:
			if n == 0 {
				return 0, io.EOF
			}
			return int(n), nil
		case syscall.EINTR:
		case syscall.EAGAIN:
			if err := c.wake("read"); err != nil {
				return 0, err
			}
		default:
			return 0, c.opError("read", os.NewSyscallError("read", e))
		}
	}
}

func (c *sleepingConn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		c.mu.RLock()
		if awake := c.awake; awake != nil {
			c.mu.RUnlock()
			n, err := awake.Write(p[written:])
			return written + n, err
		}
		if c.fd < 0 {
			c.mu.RUnlock()
			return written, c.opError("write", net.ErrClosed)
		}
		if c.wd.passed() {
			c.mu.RUnlock()
			return written, c.opError("write", os.ErrDeadlineExceeded)
		}
		rest := p[written:]
		n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(c.fd), uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)), syscall.MSG_NOSIGNAL, 0, 0)
		c.mu.RUnlock()
		switch e {
		case 0:
			written += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			if err := c.wake("write"); err != nil {
				return written, err
			}
		default:
			return written, c.opError("write", os.NewSyscallError("write", e))
		}
	}
	return written, nil
}

// wake makes the net.Conn a read or write that would wait waits on (the
// runtime's poller's), after onWait: a duplicate of the descriptor, so
// that Sleep, closing it, leaves the sleeping one as it was.
func (c *sleepingConn) wake(op string) error {
	c.mu.RLock()
	onWait := c.onWait
	c.mu.RUnlock()
	if onWait != nil {
		onWait()
	}
	return c.upgrade(op)
}

// upgrade makes wake's net.Conn.
func (c *sleepingConn) upgrade(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.awake != nil {
		return nil // the other side woke it
	}
	if c.fd < 0 {
		return c.opErrorLocked(op, net.ErrClosed)
	}
	d, err := dupCloexec(c.fd)
	if err != nil {
		return c.opErrorLocked(op, err)
	}
	f := os.NewFile(uintptr(d), "")
	nc, err := net.FileConn(f) // a duplicate of d, which f closes
	f.Close()
	if err != nil {
		return c.opErrorLocked(op, err)
	}
	awake := RawIO(nc)
	if c.rd != 0 {
		awake.SetReadDeadline(c.rd.time())
	}
	if c.wd != 0 {
		awake.SetWriteDeadline(c.wd.time())
	}
	OnWait(awake, c.onWait)
	c.awake = awake
	return nil
}

func (c *sleepingConn) setOnWait(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onWait = f
	if c.awake != nil {
		OnWait(c.awake, f)
	}
}

func (c *sleepingConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return c.opErrorLocked("close", net.ErrClosed)
	}
	if c.awake != nil {
		c.awake.Close() // ends a read or write waiting on it
		c.awake = nil
	}
	err := syscall.Close(c.fd)
	c.fd = -1
	if err != nil {
		return &net.OpError{Op: "close", Net: "tcp", Err: os.NewSyscallError("close", err)}
	}
	return nil
}

func (c *sleepingConn) SetDeadline(t time.Time) error      { return c.setDeadline(t, true, true) }
func (c *sleepingConn) SetReadDeadline(t time.Time) error  { return c.setDeadline(t, true, false) }
func (c *sleepingConn) SetWriteDeadline(t time.Time) error { return c.setDeadline(t, false, true) }

// setDeadline keeps the deadlines for the raw reads and writes of a
// sleeping connection (past checks them) and passes them on to the
// net.Conn of an awake one, which enforces them while it waits.
func (c *sleepingConn) setDeadline(t time.Time, read, write bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return c.opErrorLocked("set", net.ErrClosed)
	}
	if read {
		c.rd = deadlineOf(t)
	}
	if write {
		c.wd = deadlineOf(t)
	}
	switch {
	case c.awake == nil:
		return nil
	case read && write:
		return c.awake.SetDeadline(t)
	case read:
		return c.awake.SetReadDeadline(t)
	default:
		return c.awake.SetWriteDeadline(t)
	}
}

func (c *sleepingConn) LocalAddr() net.Addr {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.addrLocked(syscall.Getsockname)
}

func (c *sleepingConn) RemoteAddr() net.Addr {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.addrLocked(syscall.Getpeername)
}

// addrLocked is the socket's address that get reads: asked of the kernel,
// not kept, since it is for error messages and logs, seldom wanted.
func (c *sleepingConn) addrLocked(get func(int) (syscall.Sockaddr, error)) net.Addr {
	if c.fd < 0 {
		return nil
	}
	sa, err := get(c.fd)
	if err != nil {
		return nil
	}
	switch sa := sa.(type) {
	case *syscall.SockaddrInet4:
		return &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
	case *syscall.SockaddrInet6:
		return &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
	}
	return nil
}

func (c *sleepingConn) opError(op string, err error) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.opErrorLocked(op, err)
}

// opErrorLocked wraps err as net.Conn's methods do (see rawConn.opError).
func (c *sleepingConn) opErrorLocked(op string, err error) error {
	e := &net.OpError{Op: op, Net: "tcp", Err: err}
	if c.fd >= 0 {
		e.Source, e.Addr = c.addrLocked(syscall.Getsockname), c.addrLocked(syscall.Getpeername)
	}
	return e
}

// SyscallConn gives the descriptor to Control; Read and Write are not
// supported (a sleeping connection does its own).
func (c *sleepingConn) SyscallConn() (syscall.RawConn, error) {
	return (*sleepingRawConn)(c), nil
}

type sleepingRawConn sleepingConn

var errSleepingRaw = errors.New("h1: a sleeping connection's RawConn has Control only")

func (r *sleepingRawConn) Control(f func(fd uintptr)) error {
	c := (*sleepingConn)(r)
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.fd < 0 {
		return net.ErrClosed
	}
	f(uintptr(c.fd))
	return nil
}

func (r *sleepingRawConn) Read(func(fd uintptr) bool) error  { return errSleepingRaw }
func (r *sleepingRawConn) Write(func(fd uintptr) bool) error { return errSleepingRaw }
