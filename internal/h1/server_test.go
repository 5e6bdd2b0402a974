package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echo answers with the request as the handler saw it, and its body.
func echo(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "%s %s %s body=%q", r.Method, r.URL, r.Proto, body)
}

// TestHandedOver sends what the fast path leaves to net/http, and checks
// net/http's answer arrives.
func TestHandedOver(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) {
		std.MaxHeaderBytes = 1 << 10
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		std.Protocols = &p
	})
	for _, tc := range []struct{ name, req, want string }{
		{"chunked body", "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", `POST /c HTTP/1.1 body="abc"`},
		{"HTTP/1.0", "GET /old HTTP/1.0\r\n\r\n", `GET /old HTTP/1.0 body=""`},
		{"bare LF", "GET /lf HTTP/1.1\nHost: x\n\n", `GET /lf HTTP/1.1 body=""`},
		{"absolute form", "GET http://x/abs HTTP/1.1\r\nHost: x\r\n\r\n", `GET http://x/abs HTTP/1.1 body=""`},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", "400 Bad Request"},
		{"malformed", "GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "400 Bad Request"},
		{"head too large", "GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", "431 Request Header Fields Too Large"},
		{"after a fast request", "GET /fast HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.0\r\n\r\n", `GET /slow HTTP/1.0 body=""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			io.WriteString(c, tc.req)
			if cw, ok := c.(*net.TCPConn); ok && !strings.Contains(tc.req, "/fast") {
				cw.CloseWrite()
			}
			all, _ := io.ReadAll(c)
			if !bytes.Contains(all, []byte(tc.want)) {
				t.Errorf("answer %q, want it to contain %q", all, tc.want)
			}
		})
	}

	t.Run("Expect", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/e", strings.NewReader("body"))
		req.Header.Set("Expect", "100-continue")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); string(b) != `POST /e HTTP/1.1 body="body"` {
			t.Errorf("answer %q", b)
		}
	})
	t.Run("h2c", func(t *testing.T) {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		client := &http.Client{Transport: &http.Transport{Protocols: &p}}
		defer client.CloseIdleConnections()
		resp, err := client.Post("http://"+addr+"/h2", "text/plain", strings.NewReader("two"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); string(b) != `POST /h2 HTTP/2.0 body="two"` {
			t.Errorf("answer %q", b)
		}
	})
}

// TestKeepAliveAndPipelining: requests in one write are answered in order
// on one connection.
func TestKeepAliveAndPipelining(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(echo))
	c := dial(t, addr)
	var reqs strings.Builder
	for i := range 20 {
		fmt.Fprintf(&reqs, "POST /%d HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n%d", i, i%10)
	}
	io.WriteString(c, reqs.String())
	br := bufio.NewReader(c)
	for i := range 20 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if want := fmt.Sprintf(`POST /%d HTTP/1.1 body="%d"`, i, i%10); string(b) != want {
			t.Fatalf("answer %d: %q, want %q", i, b, want)
		}
	}
}

// TestClientLeavingCancelsTheRequest: a client that closes its connection
// while its request runs cancels the request's context, with a body read
// or without.
func TestClientLeavingCancelsTheRequest(t *testing.T) {
	for _, req := range []string{
		"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /call HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
	} {
		started, cancelled := make(chan struct{}), make(chan struct{})
		addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body)
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			close(started)
			<-r.Context().Done()
			close(cancelled)
		}))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, req)
		<-started
		c.Close()
		select {
		case <-cancelled:
		case <-time.After(20 * time.Second):
			t.Fatalf("%q: the request's context was not cancelled after the client left", req)
		}
	}
}

// TestWatchKeepsAPipelinedByte: the watch's read takes the first byte of
// a request pipelined behind a slow one; that request is still served
// whole.
func TestWatchKeepsAPipelinedByte(t *testing.T) {
	watching := make(chan struct{})
	var srv *Server
	var once sync.Once
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // the watch starts once the body is read
		if r.URL.Path == "/slow" {
			c := onlyConn(srv)
			waitFor(func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.watch == watchReading })
			once.Do(func() { close(watching) })
			waitFor(func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.hasPeeked })
		}
		fmt.Fprintf(w, "%s %s %s body=%q", r.Method, r.URL, r.Proto, body)
	}), func(_ *http.Server, s *Server) {
		s.watchDelay = time.Millisecond
		srv = s // before Serve starts, so before any handler reads it
	})
	c := dial(t, addr)
	io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na")
	<-watching
	io.WriteString(c, "POST /next HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb")
	br := bufio.NewReader(c)
	for _, want := range []string{`POST /slow HTTP/1.1 body="a"`, `POST /next HTTP/1.1 body="b"`} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != want {
			t.Errorf("answer %q, want %q", b, want)
		}
	}
}

// onlyConn is the server's one connection.
func onlyConn(s *Server) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		return c
	}
	return nil
}

// waitFor polls cond off the test goroutine, where testkit.Eventually
// cannot fail the test; the test's own deadline catches a hang.
func waitFor(cond func() bool) {
	for deadline := time.Now().Add(20 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// TestShutdown: idle connections are closed, a request in flight finishes
// with "Connection: close", and new connections are refused.
func TestShutdown(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{})
	addr, s := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(inHandler)
			<-release
		}
		io.WriteString(w, "done")
	}))
	idle := dial(t, addr)
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	idleBR := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(idleBR, nil); err != nil {
		t.Fatal(err)
	} else {
		io.ReadAll(resp.Body)
	}

	busy := dial(t, addr)
	io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-inHandler

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	if _, err := idleBR.ReadByte(); err == nil {
		t.Error("the idle connection got data instead of being closed")
	}
	// (testkit imports this package: its Eventually is out of reach.)
	waitFor(func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the listener still accepts")
	}
	close(release)
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "done" || !resp.Close {
		t.Errorf("answer %q close %v, want done and Connection: close", b, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestShutdownDeadline: a stream still open when Shutdown's context ends
// makes it return the context's error; Close then cuts it.
func TestShutdownDeadline(t *testing.T) {
	streaming := make(chan struct{})
	addr, s := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		close(streaming)
		<-r.Context().Done()
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-streaming
	ctx, cancel := context.WithCancel(context.Background())
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	cancel()
	if err := <-shut; !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown: %v, want context.Canceled", err)
	}
	s.Close()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("after Close the stream did not end: %v", err)
	}
}

// TestTimeouts: a connection idle past IdleTimeout, or whose head is not
// whole within ReadHeaderTimeout, is closed.
func TestTimeouts(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) {
		std.IdleTimeout = 50 * time.Millisecond
		std.ReadHeaderTimeout = 50 * time.Millisecond
	})
	for _, first := range []string{"", "GET / HTTP/1.1\r\nHost"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, first)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil || len(got) != 0 {
			t.Errorf("after %q: read %q, %v; want the connection closed", first, got, err)
		}
		c.Close()
	}
}

// TestBodyDeadline: http.ResponseController's read deadline bounds the
// body's reads, and the connection is not reused after it fired.
func TestBodyDeadline(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "slow body", http.StatusRequestTimeout)
			return
		}
		io.WriteString(w, "ok")
	}))
	c := dial(t, addr)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Errorf("status %d close %v, want 408 and the connection closed", resp.StatusCode, resp.Close)
	}
}

// TestContextAndPanics: the request's context carries the base context
// and the server; a handler's panic is logged and ends its connection
// only.
func TestContextAndPanics(t *testing.T) {
	type key struct{}
	var logged bytes.Buffer
	var logMu sync.Mutex
	var std *http.Server
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("boom")
		}
		fmt.Fprintf(w, "%v %v", r.Context().Value(key{}), r.Context().Value(http.ServerContextKey) == std)
	}), func(s *http.Server, _ *Server) {
		std = s
		s.BaseContext = func(net.Listener) context.Context { return context.WithValue(context.Background(), key{}, "base") }
		s.ErrorLog = log.New(lockedWriter{&logMu, &logged}, "", 0)
	})
	if _, err := http.Get("http://" + addr + "/panic"); err == nil {
		t.Error("a panicking handler's request got an answer")
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); string(b) != "base true" {
		t.Errorf("context values %q, want \"base true\"", b)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logged.String(), "panic serving") || !strings.Contains(logged.String(), "boom") {
		t.Errorf("log %q does not report the panic", logged.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestStalledUnreadBody: a client that stops sending a body the handler
// did not read still gets its answer (with the connection closed after
// it), rather than holding the connection's goroutine for good.
func TestStalledUnreadBody(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "refused", http.StatusServiceUnavailable)
	}))
	c := dial(t, addr)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a request whose body stalled: %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Errorf("status %d close %v, want 503 and the connection closed", resp.StatusCode, resp.Close)
	}
}

// FuzzConn sends arbitrary bytes on a connection: the server answers or
// closes, within the test's deadline, and its own code never panics (a
// handler's panic is the handler's; this one has none).
func FuzzConn(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
	var logged bytes.Buffer
	var logMu sync.Mutex
	addr, _ := startH1(f, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if len(b)%2 == 1 {
			w.(http.Flusher).Flush()
		}
		w.Write(b)
	}), func(std *http.Server, _ *Server) {
		std.ErrorLog = log.New(lockedWriter{&logMu, &logged}, "", 0)
		std.ReadHeaderTimeout = time.Second
		std.IdleTimeout = time.Second
	})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := dial(t, addr)
		c.Write(in)
		c.(*net.TCPConn).CloseWrite()
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%q: the connection neither closed nor answered: %v", in, err)
		}
		logMu.Lock()
		defer logMu.Unlock()
		if strings.Contains(logged.String(), "h1: panic") {
			t.Fatalf("%q: %s", in, logged.String())
		}
	})
}

// quickRequests sends n requests on c, one after the other, and reads
// their answers.
func quickRequests(t *testing.T, c net.Conn, br *bufio.Reader, n int) {
	t.Helper()
	for i := range n {
		fmt.Fprintf(c, "GET /quick/%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("quick request %d: %v", i, err)
		}
		io.ReadAll(resp.Body)
	}
}

// waitUntil returns once the clock has passed t: the tests below wait for
// a deadline of the server's to pass, which nothing else signals.
func waitUntil(t time.Time) {
	<-time.After(time.Until(t))
}

// TestIdleTimeoutAfterQuickRequests: the idle deadline a busy connection
// keeps from one request to the next still closes it once it is idle, and
// not before IdleTimeout has passed since its last request.
func TestIdleTimeoutAfterQuickRequests(t *testing.T) {
	const idle = 100 * time.Millisecond
	addr, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) { std.IdleTimeout = idle })
	c := dial(t, addr)
	br := bufio.NewReader(c)
	// Requests for half of IdleTimeout: a deadline set at the first wait
	// and kept would close the connection too early.
	for start := time.Now(); time.Since(start) < idle/2; {
		quickRequests(t, c, br, 1)
	}
	last := time.Now()
	quickRequests(t, c, br, 1)
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("read %q, %v; want the idle connection closed", b, err)
	}
	if d := time.Since(last); d < idle {
		t.Errorf("closed %v after the last request was sent, before IdleTimeout %v", d, idle)
	}
}

// TestReadHeaderTimeoutAfterQuickRequests: a head that stalls gets
// ReadHeaderTimeout, not the idle deadline kept on the connection.
func TestReadHeaderTimeoutAfterQuickRequests(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) {
		std.ReadHeaderTimeout = 50 * time.Millisecond
	})
	c := dial(t, addr)
	br := bufio.NewReader(c)
	quickRequests(t, c, br, 5)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost")
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("read %q, %v; want the connection closed after ReadHeaderTimeout", b, err)
	}
}

// TestKeptIdleDeadlineSparesRequests: a request that arrives just before
// the idle deadline kept on the connection passes is not cut by it: its
// body's read, and the watch's, happen after that deadline.
func TestKeptIdleDeadlineSparesRequests(t *testing.T) {
	const idle = 200 * time.Millisecond
	// Past it the deadline the connection had when the request arrived is
	// over (see idleSlack), with a margin for a slow machine.
	const past = idle + idle/idleSlack + 50*time.Millisecond
	started := make(chan time.Time, 1)
	cancelled := make(chan struct{})
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/body":
			started <- time.Now()
			echo(w, r)
		case "/stream":
			w.(http.Flusher).Flush()
			started <- time.Now()
			<-r.Context().Done()
			close(cancelled)
		default:
			echo(w, r)
		}
	}), func(std *http.Server, s *Server) {
		std.IdleTimeout = idle
		s.watchDelay = time.Millisecond
	})

	c := dial(t, addr)
	br := bufio.NewReader(c)
	quickRequests(t, c, br, 5)
	io.WriteString(c, "POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabc")
	waitUntil((<-started).Add(past))
	io.WriteString(c, "def")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || string(b) != `POST /body HTTP/1.1 body="abcdef"` {
		t.Errorf("answer %d %q, want the whole body read", resp.StatusCode, b)
	}

	c = dial(t, addr)
	br = bufio.NewReader(c)
	quickRequests(t, c, br, 5)
	io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
	waitUntil((<-started).Add(past))
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(20 * time.Second):
		t.Fatal("the stream's context was not cancelled when its client left after the idle deadline")
	}
}

// TestBodyDeadlineAfterQuickRequests: a body deadline set through
// http.ResponseController bounds a body read that needs the socket, on a
// connection with a kept idle deadline; one cleared before the read does
// not; one set while a read waits on the socket reaches that read.
func TestBodyDeadlineAfterQuickRequests(t *testing.T) {
	var srv *Server
	started := make(chan time.Time, 1)
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		switch r.URL.Path {
		case "/stalled":
			rc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		case "/cleared":
			rc.SetReadDeadline(time.Now().Add(time.Millisecond))
			rc.SetReadDeadline(time.Time{})
			started <- time.Now()
		case "/waiting":
			read := make(chan error, 1)
			go func() {
				_, err := io.ReadAll(r.Body)
				read <- err
			}()
			// (The connections of the requests before may not be
			// untracked yet.)
			waitFor(func() bool {
				srv.mu.Lock()
				defer srv.mu.Unlock()
				for c := range srv.conns {
					c.mu.Lock()
					reading := c.socketRead
					c.mu.Unlock()
					if reading {
						return true
					}
				}
				return false
			})
			rc.SetReadDeadline(time.Now())
			if err := <-read; err != nil {
				http.Error(w, "slow body", http.StatusRequestTimeout)
				return
			}
			io.WriteString(w, "ok")
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "slow body", http.StatusRequestTimeout)
			return
		}
		io.WriteString(w, "ok")
	}), func(_ *http.Server, s *Server) { srv = s })

	for _, path := range []string{"/stalled", "/waiting"} {
		c := dial(t, addr)
		br := bufio.NewReader(c)
		quickRequests(t, c, br, 5)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
			t.Errorf("%s: status %d close %v, want 408 and the connection closed", path, resp.StatusCode, resp.Close)
		}
		c.Close()
	}

	c := dial(t, addr)
	br := bufio.NewReader(c)
	quickRequests(t, c, br, 5)
	io.WriteString(c, "POST /cleared HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabc")
	waitUntil((<-started).Add(50 * time.Millisecond))
	io.WriteString(c, "def")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Errorf("/cleared: answer %d %q, want the body read after its deadline was cleared", resp.StatusCode, b)
	}
}

// TestWatchAfterQuickRequests: on a connection that has carried many
// quick requests, a request is watched no sooner than clientWatchDelay
// after it started (not when the timer a quick request armed fires), and
// a client leaving then cancels it.
func TestWatchAfterQuickRequests(t *testing.T) {
	const delay = 200 * time.Millisecond
	var srv *Server
	watchedAfter := make(chan time.Duration, 1)
	cancelled := make(chan struct{})
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			echo(w, r)
			return
		}
		start := time.Now()
		w.(http.Flusher).Flush()
		c := onlyConn(srv)
		waitFor(func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.watch == watchReading })
		watchedAfter <- time.Since(start)
		<-r.Context().Done()
		close(cancelled)
	}), func(_ *http.Server, s *Server) {
		s.watchDelay = delay
		srv = s
	})
	c := dial(t, addr)
	br := bufio.NewReader(c)
	// The first quick request arms the timer: the stream starts shortly
	// before it fires.
	first := time.Now()
	quickRequests(t, c, br, 50)
	waitUntil(first.Add(delay * 4 / 5))
	io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
	if d := <-watchedAfter; d < delay*3/4 {
		t.Errorf("the stream was watched %v after it started, want clientWatchDelay %v", d, delay)
	}
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(20 * time.Second):
		t.Fatal("the stream's context was not cancelled when its client left")
	}
}

// TestBaseContextCancelsRequests: a BaseContext that ends cancels the
// running requests' contexts with its cause, and a request that starts
// after it ended gets a cancelled context; a BaseContext's deadline is
// its requests' deadline.
func TestBaseContextCancelsRequests(t *testing.T) {
	type key struct{}
	base, cancelBase := context.WithCancelCause(context.WithValue(context.Background(), key{}, "base"))
	defer cancelBase(nil)
	errGone := errors.New("base gone")
	started := make(chan struct{}, 1)
	addr, s := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		started <- struct{}{}
		ctx := r.Context()
		<-ctx.Done()
		fmt.Fprintf(w, "%v %v %v", ctx.Value(key{}), ctx.Err(), context.Cause(ctx))
	}), func(std *http.Server, _ *Server) {
		std.BaseContext = func(net.Listener) context.Context { return base }
	})
	answer := func(c net.Conn, br *bufio.Reader) string {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	want := "base context canceled base gone"

	c := dial(t, addr)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /running HTTP/1.1\r\nHost: x\r\n\r\n")
	<-started
	cancelBase(errGone)
	if got := answer(c, br); got != want {
		t.Errorf("running request: %q, want %q", got, want)
	}
	io.WriteString(c, "GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
	<-started
	if got := answer(c, br); got != want {
		t.Errorf("request after the base ended: %q, want %q", got, want)
	}

	s.Close()
	waitFor(func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.conns) == 0 })
	s.mu.Lock()
	if s.stopBase != nil {
		t.Error("the closed server still waits for its base context")
	}
	s.mu.Unlock()

	deadline := time.Now().Add(time.Hour)
	timed, cancelTimed := context.WithDeadline(context.Background(), deadline)
	defer cancelTimed()
	addr, _ = startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := r.Context().Deadline()
		fmt.Fprint(w, ok && d.Equal(deadline))
	}), func(std *http.Server, _ *Server) {
		std.BaseContext = func(net.Listener) context.Context { return timed }
	})
	c = dial(t, addr)
	br = bufio.NewReader(c)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := answer(c, br); got != "true" {
		t.Errorf("the request's context has not the base's deadline: %q", got)
	}
}

// fieldsEcho is a FieldsHandler: it answers with the header it was given
// (ServeFields: the list, in order; ServeHTTP: the map's names, sorted),
// and whether r.Header was nil; on ServeFields it then edits the list,
// which the connection's next request must not see.
type fieldsEcho struct{}

func (fieldsEcho) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var names []string
	for k, vv := range r.Header {
		names = append(names, k+"="+strings.Join(vv, ","))
	}
	slices.Sort(names)
	fmt.Fprintf(w, "map %s", strings.Join(names, ";"))
}

func (fieldsEcho) ServeFields(w http.ResponseWriter, r *http.Request, f Fields) {
	var lines []string
	for _, fl := range f {
		lines = append(lines, fl.Name+"="+fl.Value)
	}
	fmt.Fprintf(w, "fields %s header-nil=%v host=%s", strings.Join(lines, ";"), r.Header == nil, r.Host)
	f = append(f, Field{"X-Added", "by the handler"}) // the list is the handler's until it returns
	f.Set("X-Echo", "seen")
	f.Del("X-Dup")
}

// A FieldsHandler gets the fields of the requests h1 serves as a list in
// the order they came, without Host and without a map; what it does to
// the list is gone at the connection's next request, whose fields are its
// own; a head with more fields than keptFields is served as well, and the
// requests handed to net/http reach ServeHTTP with their map.
func TestFieldsHandler(t *testing.T) {
	addr, _ := startH1(t, fieldsEcho{})
	c := dial(t, addr)
	br := bufio.NewReader(c)
	get := func(req string) string {
		t.Helper()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got, want := get("GET /a HTTP/1.1\r\nx-dup: 1\r\nHost: h\r\nmcp-session-id: s1\r\nX-Dup: 2\r\n\r\n"),
		"fields X-Dup=1;Mcp-Session-Id=s1;X-Dup=2 header-nil=true host=h"; got != want {
		t.Errorf("first request: %q, want %q", got, want)
	}
	if got, want := get("GET /b HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n"),
		"fields Accept=*/* header-nil=true host=h"; got != want {
		t.Errorf("second request on the connection: %q, want %q", got, want)
	}
	var many strings.Builder
	var want []string
	for i := range keptFields + 8 {
		fmt.Fprintf(&many, "X-F%d: %d\r\n", i, i)
		want = append(want, fmt.Sprintf("X-F%d=%d", i, i))
	}
	if got := get("GET /c HTTP/1.1\r\nHost: h\r\n" + many.String() + "\r\n"); got != "fields "+strings.Join(want, ";")+" header-nil=true host=h" {
		t.Errorf("a head of %d fields: %q", keptFields+8, got)
	}
	if got, want := get("GET /d HTTP/1.1\r\nHost: h\r\nPragma: no-cache\r\n\r\n"),
		"fields Pragma=no-cache;Cache-Control=no-cache header-nil=true host=h"; got != want {
		t.Errorf("after it: %q, want %q", got, want)
	}
	if got, want := get("POST /e HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n0\r\n\r\n"),
		"map X-A=1"; got != want {
		t.Errorf("a request handed to net/http: %q, want %q", got, want)
	}
}

// A connection's list of fields holds no head between requests, and no
// more room than keptFields.
func TestReleaseFields(t *testing.T) {
	c := &conn{fields: make(Fields, 3, keptFields)}
	c.fields[0] = Field{"A", "head"}
	grown := append(c.fields, Field{"B", "added by a handler"})
	c.releaseFields()
	if len(c.fields) != 0 || cap(c.fields) != keptFields {
		t.Fatalf("list after a request: len %d cap %d, want 0 and %d", len(c.fields), cap(c.fields), keptFields)
	}
	for i, f := range grown {
		if f != (Field{}) {
			t.Errorf("field %d still %+v", i, f)
		}
	}
	c.fields = make(Fields, 0, keptFields+1)
	c.releaseFields()
	if c.fields != nil {
		t.Errorf("a list of %d kept", cap(c.fields))
	}
}

// TestBodyBuffered: a body that came whole with its head is reported as
// buffered (a handler need not bound its reads); one still arriving is
// not.
func TestBodyBuffered(t *testing.T) {
	asked := make(chan bool, 1)
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := r.Body.(interface{ Buffered() bool })
		asked <- ok && b.Buffered()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(body)
	}))
	c := dial(t, addr)
	br := bufio.NewReader(c)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	if !<-asked {
		t.Error("a body that came with its head: not buffered")
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
	if <-asked {
		t.Error("a body 7 bytes short: buffered")
	}
	io.WriteString(c, "defghij")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if string(got) != "abcdefghij" {
		t.Errorf("body %q, want abcdefghij", got)
	}
}

// idleConn waits for the one connection of s to wait for its next request,
// and returns it.
func idleConn(t *testing.T, s *Server) *conn {
	t.Helper()
	var idle *conn
	for deadline := time.Now().Add(10 * time.Second); idle == nil; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		for sc := range s.conns {
			if sc.state.Load() == stateIdle {
				idle = sc
			}
		}
		s.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the connection is not idle 10 s after its answer")
		}
	}
	return idle
}

// TestIdleKeepsNoRequest: a connection waiting for its next request
// keeps nothing of its last one (its fields would point into the head).
func TestIdleKeepsNoRequest(t *testing.T) {
	addr, s := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Path)
	}))
	c := dial(t, addr)
	br := bufio.NewReader(c)
	quickRequests(t, c, br, 2)
	idle := idleConn(t, s)
	if kept := idle.fields[:cap(idle.fields)]; len(idle.fields) != 0 || slices.ContainsFunc(kept, func(f Field) bool { return f != (Field{}) }) {
		t.Errorf("idle: fields %q kept", kept)
	}
}
