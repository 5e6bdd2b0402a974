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
