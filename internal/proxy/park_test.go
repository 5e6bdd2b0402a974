package proxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// eventBackend is an SSE backend whose GET streams stay open, idle, until
// the test sends an event to all of them (send) or ends them (finish).
type eventBackend struct {
	srv  *httptest.Server
	mu   sync.Mutex
	next chan struct{} // closed to make every open stream send the event
	n    int           // the event's number
	open atomic.Int64  // streams whose handler runs
	done chan struct{} // closed to end every stream cleanly
}

func newEventBackend(t *testing.T) *eventBackend {
	b := &eventBackend{next: make(chan struct{}), done: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.open.Add(1)
		defer b.open.Add(-1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		sent := 0
		for {
			b.mu.Lock()
			next, n := b.next, b.n
			b.mu.Unlock()
			if n > sent {
				sent = n
				fmt.Fprintf(w, "id: %d\ndata: {\"n\":%d}\n\n", n, n)
				w.(http.Flusher).Flush()
				continue
			}
			select {
			case <-next:
			case <-b.done:
				return
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(func() {
		select {
		case <-b.done:
		default:
			close(b.done)
		}
		b.srv.Close()
	})
	return b
}

// send makes every open stream send the next event.
func (b *eventBackend) send() {
	b.mu.Lock()
	b.n++
	close(b.next)
	b.next = make(chan struct{})
	b.mu.Unlock()
}

// streamClient is a raw client connection holding a GET stream open.
type streamClient struct {
	conn    net.Conn
	br      *bufio.Reader
	pending string // chunk data read and not yet returned as lines
}

func openStream(t *testing.T, addr string) *streamClient {
	t.Helper()
	return openStreamAt(t, addr, "/mcp", 0)
}

// openStreamAt opens a GET stream at target; a receive buffer above 0 is
// set on the socket before it connects (so the window it offers is small).
func openStreamAt(t *testing.T, addr, target string, receiveBuffer int) *streamClient {
	t.Helper()
	d := net.Dialer{}
	if receiveBuffer > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, receiveBuffer)
			})
			return errors.Join(err, serr)
		}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: tether\r\nAccept: text/event-stream\r\n\r\n")
	c := &streamClient{conn: conn, br: bufio.NewReader(conn)}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("stream head: %d %v", resp.StatusCode, resp.TransferEncoding)
	}
	// The body is read raw, chunk by chunk (readLine): the response's own
	// reader would read ahead.
	return c
}

// tetherGoroutines counts the goroutines running tether's HTTP code (the
// client connections' and the relays'), not the test's or the backend's.
func tetherGoroutines() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "tether/internal/h1.(*conn)") || strings.Contains(g, "tether/internal/proxy.") {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An idle stream holds no goroutine of tether's: it parks between events,
// and a parked stream is woken by its backend's next event, relayed as it
// comes, or ended by its client's hang-up, which ends the backend's
// request and gives its --max-streams slot back.
func TestIdleStreamsHoldNoGoroutine(t *testing.T) {
	const streams = 40
	b := newEventBackend(t)
	h := newStaticHarness(t, b.srv.URL)
	addr := strings.TrimPrefix(h.front.URL, "http://")

	clients := make([]*streamClient, streams)
	for i := range clients {
		clients[i] = openStream(t, addr)
	}
	waitFor(t, "the backend to hold every stream", func() bool { return b.open.Load() == streams })
	// A handful for the server itself (none per stream): before parking,
	// each stream held two.
	idle := func() bool { return tetherGoroutines() <= 4 }
	waitFor(t, "the streams to park", idle)
	if got := h.proxy.LimitStats().OpenStreams; got != streams {
		t.Fatalf("open streams %d, want %d", got, streams)
	}

	for ev := 1; ev <= 3; ev++ {
		b.send()
		for i, c := range clients {
			if got := readEvent(t, c); got != ev {
				t.Fatalf("stream %d: event %d, want %d", i, got, ev)
			}
		}
		waitFor(t, "the streams to park again", idle)
	}

	// Half hang up: their backend requests end, their slots come back.
	for _, c := range clients[:streams/2] {
		c.conn.Close()
	}
	waitFor(t, "the backend to see the hang-ups", func() bool { return b.open.Load() == streams/2 })
	waitFor(t, "the slots to come back", func() bool { return h.proxy.LimitStats().OpenStreams == streams/2 })

	// The backend ends the others: each answer completes (its last chunk),
	// and the connection carries a next request.
	close(b.done)
	for i, c := range clients[streams/2:] {
		for {
			_, err := c.readLine()
			if err == io.EOF {
				break // the last chunk
			}
			if err != nil {
				t.Fatalf("stream %d did not end cleanly: %v", i, err)
			}
		}
		io.WriteString(c.conn, "GET /mcp HTTP/1.1\r\nHost: tether\r\nAccept: text/event-stream\r\n\r\n")
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("stream %d: the connection carries no next request after the stream: %v", i, err)
		}
		resp.Body.Close()
	}
	waitFor(t, "the slots to come back", func() bool { return h.proxy.LimitStats().OpenStreams == 0 })
}

// readEvent reads one event off a stream's chunked body and returns its
// number.
func readEvent(t *testing.T, c *streamClient) int {
	t.Helper()
	var data string
	for {
		line, err := c.readLine()
		if err != nil {
			t.Fatalf("reading an event: %v", err)
		}
		if line == "" && data != "" {
			var n int
			if _, err := fmt.Sscanf(data, `{"n":%d}`, &n); err != nil {
				t.Fatalf("event data %q", data)
			}
			return n
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = d
		}
	}
}

// readLine reads a line of the event stream out of the chunked body,
// whose chunks tether sends whole events in.
func (c *streamClient) readLine() (string, error) {
	for {
		if c.pending != "" {
			line, rest, ok := strings.Cut(c.pending, "\n")
			if ok {
				c.pending = rest
				return line, nil
			}
		}
		size, err := c.br.ReadString('\n')
		if err != nil {
			return "", err
		}
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(size), "%x", &n); err != nil {
			return "", fmt.Errorf("chunk size %q", size)
		}
		if n == 0 {
			if end, err := c.br.ReadString('\n'); err != nil || end != "\r\n" {
				return "", fmt.Errorf("after the last chunk: %q, %v", end, err)
			}
			return "", io.EOF
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.br, buf); err != nil {
			return "", err
		}
		c.pending += string(buf[:n])
	}
}

// A stream that stalls, its client not reading or its backend stopping in
// the middle of an event, holds up no other: a wake relays on the
// poller's goroutine only until a read or a write would wait.
func TestStalledStreamsHoldUpNoOther(t *testing.T) {
	var slowWritten atomic.Int64
	halfRest, halfSent := make(chan struct{}), make(chan struct{})
	next := make(chan struct{})
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		switch r.URL.Query().Get("kind") {
		case "slow":
			// Small events, more than the sockets between here and a
			// client that reads nothing can hold: the backend's and the
			// client's buffers are small (below), tether's own sockets
			// keep the kernel's sizes. Bounded at 16 MiB.
			event := "data: " + strings.Repeat("x", 1000) + "\n\n"
			for range 16 << 10 {
				if _, err := io.WriteString(w, event); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				slowWritten.Add(int64(len(event)))
			}
		case "half":
			io.WriteString(w, "data: {\"n\":")
			w.(http.Flusher).Flush()
			close(halfSent)
			select {
			case <-halfRest:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "1}\n\n")
			w.(http.Flusher).Flush()
		default:
			for n := 1; ; n++ {
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
				fmt.Fprintf(w, "data: {\"n\":%d}\n\n", n)
				w.(http.Flusher).Flush()
			}
		}
		<-r.Context().Done()
	}))
	backend.Listener = smallSendBuffers{backend.Listener}
	backend.Start()
	t.Cleanup(backend.Close)
	h := newStaticHarness(t, backend.URL)
	addr := strings.TrimPrefix(h.front.URL, "http://")

	ok := openStreamAt(t, addr, "/mcp?kind=ok", 0)
	waitFor(t, "the stream to park", func() bool { return tetherGoroutines() <= 4 })
	next <- struct{}{}
	if got := readEvent(t, ok); got != 1 {
		t.Fatalf("event %d, want 1", got)
	}

	// The slow stream's client reads nothing: once the sockets are full,
	// the backend's writes stop.
	openStreamAt(t, addr, "/mcp?kind=slow", 4<<10)
	waitFor(t, "the slow stream's sockets to fill", func() bool {
		before := slowWritten.Load()
		time.Sleep(50 * time.Millisecond)
		return before > 0 && slowWritten.Load() == before
	})
	if slowWritten.Load() >= 16<<10*1008 {
		t.Fatalf("the slow stream's backend wrote all %d bytes: nothing stalled", slowWritten.Load())
	}
	t.Logf("the slow stream stalled after %d KiB", slowWritten.Load()>>10)
	next <- struct{}{}
	if got := readEvent(t, ok); got != 2 {
		t.Fatalf("event %d, want 2", got)
	}

	// Half an event, then nothing: its relay waits for the rest.
	half := openStreamAt(t, addr, "/mcp?kind=half", 0)
	<-halfSent
	next <- struct{}{}
	if got := readEvent(t, ok); got != 3 {
		t.Fatalf("event %d, want 3", got)
	}
	close(halfRest)
	if got := readEvent(t, half); got != 1 {
		t.Fatalf("the half event completed as %d, want 1", got)
	}
}

// smallSendBuffers gives each accepted connection a small send buffer, so
// that a client that reads nothing stops the backend's writes early.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}
