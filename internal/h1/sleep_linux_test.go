package h1

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// sleepingPair is rawPair with its RawIO end put to sleep.
func sleepingPair(t *testing.T) (*sleepingConn, net.Conn, net.Conn) {
	t.Helper()
	r, peer := rawPair(t)
	s, ok := Sleep(r)
	if !ok || !Asleep(s) {
		t.Fatalf("Sleep of a RawIO connection: %T, %v", s, ok)
	}
	t.Cleanup(func() { s.Close() })
	return s.(*sleepingConn), r, peer
}

// A sleeping connection reads and writes as the connection it stands for
// did, over the same socket: with raw calls while they need not wait,
// through a net.Conn made of its descriptor while they must, and raw again
// once put back to sleep. The connection it replaced is closed, its socket
// not.
func TestSleepingConn(t *testing.T) {
	s, r, peer := sleepingPair(t)
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the replaced connection reads %v, want it closed", err)
	}
	buf := make([]byte, 64)

	// Bytes already there: read raw, nothing woken.
	io.WriteString(peer, "first")
	waitReadable(t, s)
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "first" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if s.awake != nil {
		t.Fatal("a read that did not wait woke the connection")
	}

	// No bytes yet: the read waits, awake, until they come (sent once
	// the read is about to wait: its OnWait hook).
	waiting := make(chan struct{})
	var once sync.Once
	OnWait(s, func() { once.Do(func() { close(waiting) }) })
	go func() {
		<-waiting
		io.WriteString(peer, "second")
	}()
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "second" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	OnWait(s, nil)
	if s.awake == nil {
		t.Fatal("a read that waited left the connection asleep")
	}

	// Back to sleep: the net.Conn goes, the socket stays.
	if again, ok := Sleep(s); !ok || again != net.Conn(s) || s.awake != nil {
		t.Fatalf("Sleep of a woken connection: %T %v, awake %v", again, ok, s.awake)
	}
	io.WriteString(peer, "third")
	waitReadable(t, s)
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "third" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}

	// Writes, larger than the socket buffers: they wake it to wait for room.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
	done := make(chan error, 1)
	go func() {
		n, err := s.Write(big)
		if err == nil && n != len(big) {
			err = io.ErrShortWrite
		}
		done <- err
	}()
	got := make([]byte, len(big))
	if _, err := io.ReadFull(peer, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("peer read: %v, equal %v", err, bytes.Equal(got, big))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a, ok := s.LocalAddr().(*net.TCPAddr); !ok || a.String() != peer.RemoteAddr().String() {
		t.Errorf("local address %v, the peer's remote %v", s.LocalAddr(), peer.RemoteAddr())
	}
	if a, ok := s.RemoteAddr().(*net.TCPAddr); !ok || a.String() != peer.LocalAddr().String() {
		t.Errorf("remote address %v, the peer's local %v", s.RemoteAddr(), peer.LocalAddr())
	}

	// The peer's end: EOF, asleep as awake.
	Sleep(s)
	peer.Close()
	if _, err := io.ReadAll(s); err != nil {
		t.Errorf("read to the peer's close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if _, err := s.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
	if err := s.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second close: %v", err)
	}
	rc, _ := s.SyscallConn()
	if err := rc.Control(func(uintptr) { t.Error("Control ran after Close") }); err == nil {
		t.Error("Control after Close: no error")
	}
}

// waitReadable waits for bytes on s's socket without reading them (the
// peer's write may not have crossed loopback yet).
func waitReadable(t *testing.T, s *sleepingConn) {
	t.Helper()
	rc, _ := s.SyscallConn()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		rc.Control(func(fd uintptr) {
			var b [1]byte
			r, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
			if e == 0 {
				n = int(r)
			}
		})
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no bytes came")
		}
		time.Sleep(time.Millisecond)
	}
}

// A read that must wait runs the OnWait hook first, once, and a Close ends
// it; deadlines bound a sleeping connection's reads as a net.Conn's.
func TestSleepingConnWaits(t *testing.T) {
	t.Run("OnWait, then Close ends the wait", func(t *testing.T) {
		s, _, _ := sleepingPair(t)
		var waits atomic.Int32
		if !OnWait(s, func() { waits.Add(1) }) {
			t.Fatal("OnWait refused a sleeping connection")
		}
		done := make(chan error, 1)
		go func() {
			_, err := s.Read(make([]byte, 8))
			done <- err
		}()
		deadline := time.Now().Add(10 * time.Second)
		for waits.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the read did not wait")
			}
			time.Sleep(time.Millisecond)
		}
		s.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("read ended by Close: %v", err)
		}
	})
	t.Run("deadlines", func(t *testing.T) {
		s, _, peer := sleepingPair(t)
		s.SetReadDeadline(time.Now().Add(-time.Second))
		io.WriteString(peer, "x")
		waitReadable(t, s)
		if _, err := s.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read past its deadline, asleep: %v", err)
		}
		s.SetReadDeadline(time.Time{})
		if n, err := s.Read(make([]byte, 8)); n != 1 || err != nil {
			t.Fatalf("read: %d, %v", n, err)
		}
		s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := s.Read(make([]byte, 8))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("read that waited past its deadline: %v", err)
		}
	})
	t.Run("deadline long past", func(t *testing.T) {
		// net/http's way to end a read: a deadline from before the process
		// began, which has passed for reads and writes alike.
		s, _, peer := sleepingPair(t)
		io.WriteString(peer, "x")
		waitReadable(t, s)
		s.SetDeadline(time.Unix(1, 0))
		if _, err := s.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read past a deadline long past: %v", err)
		}
		if _, err := s.Write([]byte("y")); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("write past a deadline long past: %v", err)
		}
		s.SetDeadline(time.Now().Add(time.Hour))
		if n, err := s.Read(make([]byte, 8)); n != 1 || err != nil {
			t.Errorf("read before its deadline: %d, %v", n, err)
		}
	})
}

// Close racing reads (a stream stopped from another goroutine) never
// leaves a read on a descriptor number Close gave back.
func TestSleepingConnCloseRacesRead(t *testing.T) {
	for range 100 {
		s, _, peer := sleepingPair(t)
		go io.WriteString(peer, "bytes")
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 4)
			for {
				if _, err := s.Read(buf); err != nil {
					return
				}
			}
		}()
		s.Close()
		<-done
		peer.Close()
	}
}

// Sleep leaves any other connection as it is.
func TestSleepOnlyRawIO(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if c, ok := Sleep(a); ok || c != a || Asleep(c) {
		t.Errorf("Sleep of a pipe: %T %v", c, ok)
	}
}

// Every open stream has two sleeping connections, for its life: 80 bytes
// is the allocator's class they fit in on 64-bit systems (a deadline kept
// as a time.Time, not a duration from clockBase, would take 112).
func TestSleepingConnSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are for 64-bit systems")
	}
	if size := unsafe.Sizeof(sleepingConn{}); size > 80 {
		t.Errorf("sleepingConn is %d bytes, past the 80-byte size class", size)
	}
}
