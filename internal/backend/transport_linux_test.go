package backend

import (
	"bufio"
	"context"
	"fmt"
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

// TCP states (include/net/tcp_states.h): TCP_CLOSE_WAIT, the peer's FIN
// has arrived; TCP_CLOSE, so has a reset.
const (
	tcpCloseWait = 8
	tcpClose     = 7
)

// tcpState reads the kernel's TCP state of c's socket: the test's own view
// of "the backend's FIN (or RST) has arrived", independent of the probe.
func tcpState(c syscall.Conn) (byte, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var state [1]byte // the kernel copies as much of tcp_info as asked for
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		size := uint32(len(state))
		_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&state[0])), uintptr(unsafe.Pointer(&size)), 0)
	}); err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return state[0], nil
}

// reachTCPState waits until c's socket is in state want, or 10 s pass.
func reachTCPState(c syscall.Conn, want byte) error {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		state, err := tcpState(c)
		if err != nil {
			return err
		}
		if state == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("socket never reached TCP state %d (now %d)", want, state)
		}
	}
}

func waitTCPState(t *testing.T, c syscall.Conn, want byte) {
	t.Helper()
	if err := reachTCPState(c, want); err != nil {
		t.Fatal(err)
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
// reset, or sent bytes nobody asked for, without consuming anything.
func TestPeerGone(t *testing.T) {
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
		var p stateProbe
		p.init(c)
		s.Close()
		waitTCPState(t, c, tcpCloseWait)
		if !p.peerGone() {
			t.Fatal("closed by the peer, not reported")
		}
	})

	t.Run("RST", func(t *testing.T) {
		c, s := tcpPair(t)
		var p stateProbe
		p.init(c)
		s.SetLinger(0) // close with a reset
		s.Close()
		waitTCPState(t, c, tcpClose)
		if !p.peerGone() {
			t.Fatal("reset by the peer, not reported")
		}
	})

	t.Run("no allocation", func(t *testing.T) {
		if raceEnabled {
			t.Skip("allocation counts are not meaningful under the race detector")
		}
		c, _ := tcpPair(t)
		var p stateProbe
		p.init(c)
		if n := testing.AllocsPerRun(200, func() {
			if p.peerGone() {
				t.Fatal("idle open connection reported gone")
			}
		}); n != 0 {
			t.Errorf("%v allocations per check, want 0", n)
		}
	})
}

// heldConn is a client connection whose reads stop, once the first
// response has been read, until the client writes again or closes it. It
// holds the client exactly where it is when a backend dies between two
// requests: the connection idle in the pool, nobody reading it, the FIN
// already in the kernel.
type heldConn struct {
	*net.TCPConn
	hold    int64         // bytes after which reads stop
	read    atomic.Int64  // bytes read so far
	parked  chan struct{} // closed once the first response has been read
	release chan struct{} // closed by a Write after parking, or by Close
	once    sync.Once
	park    sync.Once
	// beforeWrite, when set, runs before the first write after parking:
	// after the transport's check, before the bytes leave.
	beforeWrite func()
}

func (c *heldConn) Read(p []byte) (int, error) {
	if c.read.Load() >= c.hold {
		c.park.Do(func() { close(c.parked) })
		<-c.release
	}
	n, err := c.TCPConn.Read(p)
	if c.read.Add(int64(n)) >= c.hold {
		c.park.Do(func() { close(c.parked) })
	}
	return n, err
}

func (c *heldConn) Write(p []byte) (int, error) {
	select {
	case <-c.parked:
		if c.beforeWrite != nil {
			c.beforeWrite()
			c.beforeWrite = nil
		}
	default:
	}
	n, err := c.TCPConn.Write(p)
	select {
	case <-c.parked: // a request written after the hold: let its answer be read
		c.once.Do(func() { close(c.release) })
	default:
	}
	return n, err
}

func (c *heldConn) Close() error {
	c.once.Do(func() { close(c.release) })
	return c.TCPConn.Close()
}

const pooledResponse = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"

// pooledRig is a raw HTTP/1.1 backend and a client transport whose
// connections are heldConns. The backend's first connection serves one
// request, then hands itself to second; every later connection serves
// requests normally.
type pooledRig struct {
	url      string
	accepted atomic.Int32
	served   atomic.Int32 // requests read in full
	client   *http.Client
	// idempotent makes post send an Idempotency-Key.
	idempotent bool

	mu    sync.Mutex
	conns []*heldConn
}

func newPooledRig(t *testing.T, rt func(Transport) http.RoundTripper, second func(c *net.TCPConn, br *bufio.Reader)) *pooledRig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r := &pooledRig{url: "http://" + ln.Addr().String() + "/mcp"}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			first := r.accepted.Add(1) == 1
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					r.served.Add(1)
					if _, err := io.WriteString(c, pooledResponse); err != nil {
						return
					}
					if first {
						second(c.(*net.TCPConn), br)
						return
					}
				}
			}()
		}
	}()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hc := &heldConn{TCPConn: c.(*net.TCPConn), hold: int64(len(pooledResponse)), parked: make(chan struct{}), release: make(chan struct{})}
		r.mu.Lock()
		r.conns = append(r.conns, hc)
		r.mu.Unlock()
		return hc, nil
	}
	tr := NewTransportDial(false, dial)
	t.Cleanup(tr.CloseIdleConnections)
	r.client = &http.Client{Transport: rt(tr), Timeout: 10 * time.Second}
	return r
}

func (r *pooledRig) post() (string, error) {
	req, err := http.NewRequest(http.MethodPost, r.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if r.idempotent {
		req.Header.Set("Idempotency-Key", "k1")
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// firstConn waits until the first response has been read on the first
// connection, and returns it.
func (r *pooledRig) firstConn(t *testing.T) *heldConn {
	t.Helper()
	r.mu.Lock()
	first := r.conns[0]
	r.mu.Unlock()
	select {
	case <-first.parked:
	case <-time.After(10 * time.Second):
		t.Fatal("the first response was never read")
	}
	return first
}

func plainTransport(tr Transport) http.RoundTripper { return tr }

// A backend serves one request on a keep-alive connection and closes it.
// The FIN reaches the client's socket while the connection is idle in the
// pool, read by nobody. The next POST from the pool must not be written
// into that socket: it is sent on a fresh connection and succeeds. (Written
// there, its read would get EOF, and a POST that may have been processed
// is not retried.)
func TestPooledConnClosedByBackend(t *testing.T) {
	r := newPooledRig(t, plainTransport, func(*net.TCPConn, *bufio.Reader) {}) // close after one response
	if body, err := r.post(); err != nil || body != "ok" {
		t.Fatalf("first request: %q, %v", body, err)
	}
	waitTCPState(t, r.firstConn(t), tcpCloseWait) // the backend's FIN has arrived

	if body, err := r.post(); err != nil || body != "ok" {
		t.Fatalf("request after the backend closed the pooled connection: %q, %v", body, err)
	}
	if n := r.accepted.Load(); n != 2 {
		t.Errorf("backend accepted %d connections, want 2 (the request went to a fresh one)", n)
	}
	if n := r.served.Load(); n != 2 {
		t.Errorf("backend served %d requests, want 2", n)
	}
}

// waitUnread waits until c's socket holds received bytes that nobody has
// read.
func waitUnread(c *net.TCPConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		var pending int32
		raw.Control(func(fd uintptr) {
			syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, // SIOCINQ: bytes received, unread
				uintptr(unsafe.Pointer(&pending)))
		})
		if pending > 0 {
			return true
		}
	}
	return false
}

// waitH2Headers waits until c's socket holds, received and unread, an
// HTTP/2 client's connection preface and frames through a whole HEADERS
// frame: a request's stream has reached the server, which has read none of
// it. It peeks (MSG_PEEK) and consumes nothing.
func waitH2Headers(c *net.TCPConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	const prefaceLen = 24
	buf := make([]byte, 64<<10)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		n := 0
		raw.Control(func(fd uintptr) {
			m, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
				syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
			if errno == 0 {
				n = int(m)
			}
		})
		for off := prefaceLen; off+9 <= n; {
			size := int(buf[off])<<16 | int(buf[off+1])<<8 | int(buf[off+2])
			end := off + 9 + size
			if end > n {
				break
			}
			if buf[off+3] == 0x1 { // HEADERS
				return true
			}
			off = end
		}
	}
	return false
}

// At most once (retry.go): a request written in full into a pooled
// connection is not sent again after the backend resets or closes that
// connection, whether it read the request or not, unless the request is
// idempotent (an Idempotency-Key here; the proxy also counts MCP's
// read-only methods) and no byte of its answer came. Issue 29: a backend
// that read a tools/call, ran it and reset the connection (SO_LINGER 0) got
// it three times.
func TestResetBeforeAnswer(t *testing.T) {
	tests := []struct {
		name string
		// second is what the backend does with the next request on the
		// pooled connection; rig gives access to the client's side.
		second      func(r **pooledRig, c *net.TCPConn, br *bufio.Reader)
		idempotent  bool // the request carries an Idempotency-Key
		wantOK      bool
		wantServed  int32 // requests the backend read in full
		wantDialled int32
	}{
		{
			name:   "reset after running the request",
			second: readThenReset,
			wantOK: false, wantServed: 2, wantDialled: 1,
		},
		{
			name:       "reset after running an idempotent request",
			second:     readThenReset,
			idempotent: true,
			wantOK:     true, wantServed: 3, wantDialled: 2,
		},
		{
			name: "closed with the request unread",
			second: func(_ **pooledRig, c *net.TCPConn, _ *bufio.Reader) {
				waitUnread(c) // the request is there, unread
				c.Close()     // a reset: data was unread
			},
			// Not proof: a reset after the whole request was written looks
			// the same whether the backend read it or not.
			wantOK: false, wantServed: 1, wantDialled: 1,
		},
		{
			name: "closed after reading the request",
			second: func(r **pooledRig, c *net.TCPConn, br *bufio.Reader) {
				if req, err := http.ReadRequest(br); err == nil {
					io.Copy(io.Discard, req.Body)
					(*r).served.Add(1)
				}
				c.Close() // a FIN: it may have acted on the request
			},
			wantOK: false, wantServed: 2, wantDialled: 1,
		},
		{
			name: "reset after the answer began",
			second: func(r **pooledRig, c *net.TCPConn, br *bufio.Reader) {
				if req, err := http.ReadRequest(br); err == nil {
					io.Copy(io.Discard, req.Body)
					(*r).served.Add(1)
				}
				const part = "HTTP/1.1 200 OK\r\n"
				io.WriteString(c, part)
				(*r).mu.Lock()
				client := (*r).conns[0]
				(*r).mu.Unlock()
				want := int64(len(pooledResponse) + len(part))
				for deadline := time.Now().Add(10 * time.Second); client.read.Load() < want && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				c.SetLinger(0)
				c.Close()
			},
			idempotent: true, // an answer began: not sent again, idempotent or not
			wantOK:     false, wantServed: 2, wantDialled: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r *pooledRig
			r = newPooledRig(t, plainTransport, func(c *net.TCPConn, br *bufio.Reader) { tt.second(&r, c, br) })
			r.idempotent = tt.idempotent
			if body, err := r.post(); err != nil || body != "ok" {
				t.Fatalf("first request: %q, %v", body, err)
			}
			r.firstConn(t)
			body, err := r.post()
			if ok := err == nil && body == "ok"; ok != tt.wantOK {
				t.Errorf("second request: %q, %v; want success %v", body, err, tt.wantOK)
			}
			if n := r.served.Load(); n != tt.wantServed {
				t.Errorf("backend read %d requests in full, want %d", n, tt.wantServed)
			}
			if n := r.accepted.Load(); n != tt.wantDialled {
				t.Errorf("backend accepted %d connections, want %d", n, tt.wantDialled)
			}
		})
	}
}

// readThenReset reads the next request in full, counts it served, and
// resets the connection without answering (SO_LINGER 0): a backend that
// ran a call and then aborted, or a sidecar in front of it that crashed.
func readThenReset(r **pooledRig, c *net.TCPConn, br *bufio.Reader) {
	if req, err := http.ReadRequest(br); err == nil {
		io.Copy(io.Discard, req.Body)
		(*r).served.Add(1)
	}
	c.SetLinger(0)
	c.Close()
}

// The backend closes an idle keep-alive connection just after the client's
// check and just before the request reaches it: the client reads a FIN
// where the answer should be, and then a reset, as the request reached a
// closed socket. That is not proof that the backend never read it (a
// retransmission of bytes it had read draws the same reset): a request that
// is not idempotent is not sent again, an idempotent one is.
func TestRequestReachesClosedSocket(t *testing.T) {
	for _, idempotent := range []bool{false, true} {
		t.Run(fmt.Sprintf("idempotent=%v", idempotent), func(t *testing.T) {
			closeNow := make(chan struct{})
			r := newPooledRig(t, plainTransport,
				func(c *net.TCPConn, _ *bufio.Reader) {
					<-closeNow
					c.Close() // nothing unread yet: a FIN
				})
			r.idempotent = idempotent
			if body, err := r.post(); err != nil || body != "ok" {
				t.Fatalf("first request: %q, %v", body, err)
			}
			first := r.firstConn(t)
			finArrived := make(chan error, 1)
			first.beforeWrite = func() { // after the client's check, before the request leaves
				close(closeNow)
				finArrived <- reachTCPState(first, tcpCloseWait)
			}
			body, err := r.post()
			if err := <-finArrived; err != nil {
				t.Fatalf("the backend's FIN: %v", err)
			}
			if ok := err == nil && body == "ok"; ok != idempotent {
				t.Fatalf("request that reached a closed socket: %q, %v; want success %v", body, err, idempotent)
			}
			wantAccepted := int32(1)
			if idempotent {
				wantAccepted = 2
			}
			if n := r.accepted.Load(); n != wantAccepted {
				t.Errorf("backend accepted %d connections, want %d", n, wantAccepted)
			}
		})
	}
}

// BenchmarkStaleCheck is the cost the check adds to each request on a
// pooled connection: one non-blocking peek.
func BenchmarkStaleCheck(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var p stateProbe
	p.init(c)
	b.ReportAllocs()
	for b.Loop() {
		if p.peerGone() {
			b.Fatal("idle open connection reported gone")
		}
	}
}

// resetFirstListener resets the first connection it accepts: at once
// (mode resetAtOnce, before the client wrote anything the server read),
// once a request's HEADERS have reached it unread (resetUnread: as a server
// shutting down closes a connection it has just accepted, or a closed
// listener resets those still in its accept queue), or after sending its
// connection preface (an empty SETTINGS frame) and reading a request's
// HEADERS (resetGreeted: as a server that crashes while it works on a
// request). Later connections are served.
type resetFirstListener struct {
	net.Listener
	mode     resetMode
	accepted atomic.Int32
	// dialled, in mode resetAtOnce, is closed once the client's dial has
	// returned: the reset comes after it, not as a dial error.
	dialled chan struct{}
}

type resetMode int

const (
	resetAtOnce resetMode = iota
	resetUnread
	resetGreeted
)

func (m resetMode) String() string {
	return [...]string{"at once", "unread", "greeted"}[m]
}

func (l *resetFirstListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.accepted.Add(1) > 1 {
			return c, err
		}
		tc := c.(*net.TCPConn)
		switch l.mode {
		case resetAtOnce:
			<-l.dialled
		case resetGreeted:
			tc.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}) // SETTINGS, no parameters
			readToHeaders(tc)
		case resetUnread:
			waitH2Headers(tc)
		}
		tc.SetLinger(0) // a reset, whatever was read
		tc.Close()
	}
}

// readToHeaders reads an HTTP/2 client's connection preface and its frames
// through the first HEADERS frame.
func readToHeaders(c net.Conn) {
	preface := make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	for {
		var head [9]byte // length (24 bits), type, flags, stream id
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		size := int64(head[0])<<16 | int64(head[1])<<8 | int64(head[2])
		if _, err := io.CopyN(io.Discard, c, size); err != nil || head[3] == 0x1 { // HEADERS
			return
		}
	}
}

// A new h2c connection reset before the client's connection preface could
// be written carries no stream the backend could have read: the failure is
// proof, and the request may be sent again (it then succeeds). A reset once
// the client's bytes are out is as ambiguous as a crash mid-request,
// whether the backend had greeted or not: only an idempotent request may be
// sent again. (Before issue 29 a reset before the backend's own preface was
// taken for proof.)
func TestH2CResetBeforePreface(t *testing.T) {
	for _, mode := range []resetMode{resetAtOnce, resetUnread, resetGreeted} {
		t.Run(mode.String(), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := &resetFirstListener{Listener: ln, mode: mode, dialled: make(chan struct{})}
			var served atomic.Int32
			var protos http.Protocols
			protos.SetUnencryptedHTTP2(true)
			srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				served.Add(1)
				io.WriteString(w, "ok")
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
			dial := Dial
			if mode == resetAtOnce {
				// The connection is handed to http2 once the reset has
				// arrived: its first write fails.
				var dials atomic.Int32
				dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := Dial(ctx, network, addr)
					if err == nil && dials.Add(1) == 1 {
						close(l.dialled)
						err = reachTCPState(c.(*net.TCPConn), tcpClose)
					}
					return c, err
				}
			}
			tr := NewTransportDial(true, dial)
			t.Cleanup(tr.CloseIdleConnections)

			post := func() (*http.Response, error) {
				req, err := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`))
				if err != nil {
					t.Fatal(err)
				}
				return tr.RoundTrip(req)
			}
			resp, err := post()
			if err == nil {
				resp.Body.Close()
				t.Fatalf("status %d from a connection reset %s; want the error", resp.StatusCode, mode)
			}
			if got, want := MayResend(err, false), mode == resetAtOnce; got != want {
				t.Fatalf("%v: mayResend of a tools/call %v, want %v", err, got, want)
			}
			if !MayResend(err, true) {
				t.Fatalf("%v: an idempotent request not sent again", err)
			}
			if resp, err = post(); err != nil {
				t.Fatalf("sent again: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "ok" || l.accepted.Load() != 2 {
				t.Fatalf("sent again: body %q, accepted %d; want ok, 2", body, l.accepted.Load())
			}
		})
	}
}
