package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// Linux TCP states (include/net/tcp_states.h), the first byte of tcp_info.
const (
	tcpClose     = 7
	tcpCloseWait = 8
)

// tcpState reads the kernel's TCP state of c's socket: the test's own view
// of "the backend's FIN (or RST) has arrived", independent of the probe.
func tcpState(t *testing.T, c syscall.Conn) byte {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var state [1]byte // the kernel copies as much of tcp_info as asked for
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		size := uint32(len(state))
		_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&state[0])), uintptr(unsafe.Pointer(&size)), 0)
	}); err != nil {
		t.Fatal(err)
	}
	if errno != 0 {
		t.Fatal(errno)
	}
	return state[0]
}

// waitTCPState waits until c's socket is in state want.
func waitTCPState(t *testing.T, c syscall.Conn, want byte) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); tcpState(t, c) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("socket never reached TCP state %d (now %d)", want, tcpState(t, c))
		}
		time.Sleep(time.Millisecond)
	}
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// The probe tells an idle open connection from one whose peer closed,
// reset, or sent bytes nobody asked for, without consuming anything; the
// wrapper refuses only the first write of a request on such a connection.
func TestPeerGone(t *testing.T) {
	const request = "POST /mcp HTTP/1.1\r\nHost: backend\r\nContent-Length: 2\r\n\r\n{}"

	t.Run("idle, then unsolicited bytes", func(t *testing.T) {
		c, s := tcpPair(t)
		var p stateProbe
		if !p.init(c) {
			t.Fatal("probe: init failed on a TCP connection")
		}
		if p.peerGone() {
			t.Fatal("idle open connection reported gone")
		}
		if _, err := s.Write([]byte("HTTP/1.1 408 Request Timeout\r\n")); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !p.peerGone(); {
			if time.Now().After(deadline) {
				t.Fatal("unsolicited bytes never reported")
			}
			time.Sleep(time.Millisecond)
		}
		buf := make([]byte, 64) // the probe consumed nothing: all of it is still there
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := io.ReadAtLeast(c, buf, len("HTTP/1.1 408 Request Timeout\r\n")); err != nil || string(buf[:n]) != "HTTP/1.1 408 Request Timeout\r\n" {
			t.Fatalf("read after probe: %q, %v", buf[:n], err)
		}
		if p.peerGone() {
			t.Fatal("drained open connection reported gone")
		}
	})

	t.Run("FIN", func(t *testing.T) {
		c, s := tcpPair(t)
		bc := newBackendConn(c)
		s.Close()
		waitTCPState(t, c, tcpCloseWait)
		if !bc.(*backendConn).probe.peerGone() {
			t.Fatal("closed by the peer, not reported")
		}
		if n, err := bc.Write([]byte(request)); n != 0 || !errors.Is(err, errStaleConn) {
			t.Fatalf("request on a closed connection: wrote %d, err %v; want 0, errStaleConn", n, err)
		}
		// A write that continues a request is not the wrapper's to refuse.
		if n, err := bc.Write([]byte(`{"more":"body"}`)); n != len(`{"more":"body"}`) || err != nil {
			t.Fatalf("body write: wrote %d, err %v", n, err)
		}
	})

	t.Run("RST", func(t *testing.T) {
		c, s := tcpPair(t)
		bc := newBackendConn(c)
		s.SetLinger(0) // close with a reset
		s.Close()
		waitTCPState(t, c, tcpClose)
		if n, err := bc.Write([]byte(request)); n != 0 || !errors.Is(err, errStaleConn) {
			t.Fatalf("request on a reset connection: wrote %d, err %v; want 0, errStaleConn", n, err)
		}
	})

	t.Run("open connection writes", func(t *testing.T) {
		c, s := tcpPair(t)
		bc := newBackendConn(c)
		if n, err := bc.Write([]byte(request)); n != len(request) || err != nil {
			t.Fatalf("request on an open connection: wrote %d, err %v", n, err)
		}
		buf := make([]byte, len(request))
		s.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != request {
			t.Fatalf("backend read %q, %v", buf, err)
		}
	})

	t.Run("no allocation", func(t *testing.T) {
		if raceEnabled {
			t.Skip("allocation counts are not meaningful under the race detector")
		}
		c, _ := tcpPair(t)
		var p stateProbe
		p.init(c)
		line := []byte(request)
		if n := testing.AllocsPerRun(200, func() {
			if startsRequest(line) && p.peerGone() {
				t.Fatal("idle open connection reported gone")
			}
		}); n != 0 {
			t.Errorf("%v allocations per check, want 0", n)
		}
	})
}

// heldConn is a client connection whose reads stop, once the first
// response has been read, until the client writes again or closes it. It
// holds the transport's readLoop exactly where it is when a backend dies
// between two requests: parked on an idle pooled connection, not yet aware
// of the FIN that the kernel already has.
type heldConn struct {
	*net.TCPConn
	hold    int           // bytes after which reads stop
	read    int           // bytes read so far (only the readLoop reads)
	parked  chan struct{} // closed when a read first stops
	release chan struct{} // closed by a Write after parking, or by Close
	once    sync.Once
	park    sync.Once
}

func (c *heldConn) Read(p []byte) (int, error) {
	if c.read >= c.hold {
		c.park.Do(func() { close(c.parked) })
		<-c.release
	}
	n, err := c.TCPConn.Read(p)
	c.read += n
	return n, err
}

func (c *heldConn) Write(p []byte) (int, error) {
	n, err := c.TCPConn.Write(p)
	select {
	case <-c.parked: // a request written after the hold: let the readLoop see what follows
		c.once.Do(func() { close(c.release) })
	default:
	}
	return n, err
}

func (c *heldConn) Close() error {
	c.once.Do(func() { close(c.release) })
	return c.TCPConn.Close()
}

// A backend serves one request on a keep-alive connection and closes it.
// The FIN reaches the client's socket while the transport's readLoop has
// not run yet. The next POST from the pool must not be written into that
// socket: it is sent on a fresh connection and succeeds. (Before the fix,
// the POST was written, the read got EOF, and net/http returned the error:
// a POST that may have been processed is not retried.)
func TestPooledConnClosedByBackend(t *testing.T) {
	const response = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted, served atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			first := accepted.Add(1) == 1
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					served.Add(1)
					if _, err := io.WriteString(c, response); err != nil || first {
						return // the first connection closes after one response
					}
				}
			}()
		}
	}()

	var mu sync.Mutex
	var conns []*heldConn
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hc := &heldConn{TCPConn: c.(*net.TCPConn), hold: len(response), parked: make(chan struct{}), release: make(chan struct{})}
		mu.Lock()
		conns = append(conns, hc)
		mu.Unlock()
		return hc, nil
	}
	tr := newTransport(false, dial)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	post := func() (string, error) {
		resp, err := client.Post("http://"+ln.Addr().String()+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}

	if body, err := post(); err != nil || body != "ok" {
		t.Fatalf("first request: %q, %v", body, err)
	}
	mu.Lock()
	first := conns[0]
	mu.Unlock()
	select { // the connection is back in the pool and its readLoop waits on it
	case <-first.parked:
	case <-time.After(10 * time.Second):
		t.Fatal("the transport never went back to reading the idle connection")
	}
	waitTCPState(t, first, tcpCloseWait) // the backend's FIN has arrived

	if body, err := post(); err != nil || body != "ok" {
		t.Fatalf("request after the backend closed the pooled connection: %q, %v", body, err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("backend accepted %d connections, want 2 (the request went to a fresh one)", n)
	}
	if n := served.Load(); n != 2 {
		t.Errorf("backend served %d requests, want 2", n)
	}
}
