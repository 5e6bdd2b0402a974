package h1

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// rawPair is a loopback TCP connection: the RawIO end and the plain peer.
func rawPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	r := RawIO(c)
	if _, ok := r.(*rawConn); !ok {
		t.Fatalf("RawIO of a TCP connection is %T", r)
	}
	t.Cleanup(func() { r.Close(); peer.Close() })
	return r, peer
}

// TestRawIO: reads and writes as a net.Conn's, with the same errors for
// the end of the stream, a deadline and a close.
func TestRawIO(t *testing.T) {
	t.Run("both ways, larger than the socket buffers", func(t *testing.T) {
		r, peer := rawPair(t)
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
		done := make(chan error, 1)
		go func() {
			_, err := r.Write(big)
			done <- err
		}()
		got := make([]byte, len(big))
		if _, err := io.ReadFull(peer, got); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("peer read: %v, equal %v", err, bytes.Equal(got, big))
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		go peer.Write(big)
		if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("read: %v", err)
		}
	})
	t.Run("end of stream", func(t *testing.T) {
		r, peer := rawPair(t)
		peer.Write([]byte("x"))
		peer.Close()
		b, err := io.ReadAll(r)
		if err != nil || string(b) != "x" {
			t.Fatalf("read %q, %v", b, err)
		}
		if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("after the end: %d, %v; want io.EOF", n, err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		r, _ := rawPair(t)
		r.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		_, err := r.Read(make([]byte, 1))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("read past the deadline: %v", err)
		}
	})
	t.Run("closed while reading", func(t *testing.T) {
		r, _ := rawPair(t)
		done := make(chan error, 1)
		go func() {
			_, err := r.Read(make([]byte, 1))
			done <- err
		}()
		time.AfterFunc(10*time.Millisecond, func() { r.Close() })
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read of a closed connection: %v", err)
		}
	})
	t.Run("peer reset", func(t *testing.T) {
		r, peer := rawPair(t)
		peer.(*net.TCPConn).SetLinger(0)
		peer.Close()
		var err error
		for i := 0; i < 100 && err == nil; i++ {
			_, err = r.Write([]byte("after the reset"))
		}
		if err == nil {
			t.Fatal("writes to a reset connection kept succeeding")
		}
	})
	t.Run("not TCP", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if RawIO(a) != a {
			t.Error("RawIO changed a pipe")
		}
	})
}

// answerAfter has peer read want bytes, then write answer.
func answerAfter(peer net.Conn, want int, answer string) chan error {
	done := make(chan error, 1)
	go func() {
		if _, err := io.ReadFull(peer, make([]byte, want)); err != nil {
			done <- err
			return
		}
		_, err := peer.Write([]byte(answer))
		done <- err
	}()
	return done
}

// TestWriteThenRead: a request and its answer in one wait; what the peer
// sent before the request is not lost; a write larger than the socket
// buffers goes on as Write does; failures of the write and of the read are
// told apart by written.
func TestWriteThenRead(t *testing.T) {
	t.Run("request and answer", func(t *testing.T) {
		r, peer := rawPair(t)
		done := answerAfter(peer, 7, "answer")
		p := make([]byte, 64)
		written, n, err := WriteThenRead(r, []byte("request"), p)
		if err != nil || written != 7 || string(p[:n]) != "answer" {
			t.Fatalf("written %d, read %q, %v", written, p[:n], err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bytes waiting before the write", func(t *testing.T) {
		r, peer := rawPair(t)
		peer.Write([]byte("early "))
		// One byte read: the rest waits in the socket, and the poller has
		// seen it arrive before WriteThenRead arms its wait.
		got := make([]byte, 1, 64)
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatal(err)
		}
		done := answerAfter(peer, 7, "answer")
		p := make([]byte, 64)
		_, n, err := WriteThenRead(r, []byte("request"), p)
		got = append(got, p[:n]...)
		r.SetReadDeadline(time.Now().Add(10 * time.Second))
		for err == nil && len(got) < len("early answer") {
			n, err = r.Read(p)
			got = append(got, p[:n]...)
		}
		if err != nil || string(got) != "early answer" {
			t.Fatalf("read %q, %v", got, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("larger than the socket buffers", func(t *testing.T) {
		r, peer := rawPair(t)
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
		done := answerAfter(peer, len(big), "ok")
		p := make([]byte, 64)
		written, n, err := WriteThenRead(r, big, p)
		if err != nil || written != len(big) || string(p[:n]) != "ok" {
			t.Fatalf("written %d of %d, read %q, %v", written, len(big), p[:n], err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("no answer within the deadline", func(t *testing.T) {
		r, peer := rawPair(t)
		done := answerAfter(peer, 7, "")
		r.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		written, _, err := WriteThenRead(r, []byte("request"), make([]byte, 64))
		if written != 7 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("written %d, %v; want 7 and a timeout", written, err)
		}
		<-done
	})
	t.Run("peer reset", func(t *testing.T) {
		r, peer := rawPair(t)
		peer.(*net.TCPConn).SetLinger(0)
		peer.Close()
		w := []byte("after the reset")
		for i := 0; ; i++ {
			written, _, err := WriteThenRead(r, w, make([]byte, 64))
			if err == nil {
				t.Fatalf("a reset connection answered (written %d)", written)
			}
			var op *net.OpError
			if !errors.As(err, &op) {
				t.Fatalf("error %T %v, want a *net.OpError", err, err)
			}
			if written < len(w) {
				if op.Op != "write" {
					t.Fatalf("short write (%d) reported as a %s error: %v", written, op.Op, err)
				}
				return
			}
			if op.Op != "read" {
				t.Fatalf("whole write, then a %s error: %v", op.Op, err)
			}
			if i == 100 {
				t.Fatal("writes to a reset connection kept succeeding")
			}
		}
	})
	t.Run("not TCP", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		done := answerAfter(b, 7, "answer")
		p := make([]byte, 64)
		written, n, err := WriteThenRead(a, []byte("request"), p)
		if err != nil || written != 7 || string(p[:n]) != "answer" {
			t.Fatalf("written %d, read %q, %v", written, p[:n], err)
		}
		<-done
	})
}

// BenchmarkReadWouldBlock is the read that WriteThenRead saves: a raw
// read(2) of a socket with nothing to read (EAGAIN). It says what one
// system call costs on this machine (0.1 µs on some, 1–3 µs on a virtual
// machine where the syscall traps to the hypervisor):
//
//	go test -run '^$' -bench ReadWouldBlock ./internal/h1/
func BenchmarkReadWouldBlock(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			io.Copy(io.Discard, c) // until the benchmark's end closes it
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	r := RawIO(c).(*rawConn)
	r.rbuf = make([]byte, 4096)
	var fd uintptr
	r.rc.Control(func(f uintptr) { fd = f })
	b.ResetTimer()
	for range b.N {
		if r.readOnce(fd) {
			b.Fatal("read something from a silent peer")
		}
	}
}
