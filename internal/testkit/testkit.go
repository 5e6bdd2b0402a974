package testkit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/mcpbackend"
)

// pollInterval is how often Eventually checks: short enough not to slow
// a test down, long enough not to busy a loaded 2-core machine.
const pollInterval = 10 * time.Millisecond

// Eventually polls cond until it is true, and fails the test when timeout
// passes first. It is for states reached by another goroutine or process
// (a background loop, a server's bookkeeping after the client has its
// answer), never for asserting how long something takes: the timeout is a
// bound for a loaded machine, not an expectation. format and args say what
// was awaited.
func Eventually(tb testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, fmt.Sprintf(format, args...))
		}
		time.Sleep(pollInterval)
	}
}

// EventuallyNoError is Eventually for a check that explains itself: it
// polls check until it returns nil, and on timeout fails the test with the
// last error check returned.
func EventuallyNoError(tb testing.TB, timeout time.Duration, check func() error, format string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s:\n%v", timeout, fmt.Sprintf(format, args...), err)
		}
		time.Sleep(pollInterval)
	}
}

// FreeAddr returns a loopback host:port that was free a moment ago, for a
// process or listener the test starts later, or for an address nothing
// listens on. Another process may take it in between; callers that bind it
// themselves retry when that matters (redistest does).
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return freeTCPAddr(tb).String()
}

// FreePort is FreeAddr's port.
func FreePort(tb testing.TB) int {
	tb.Helper()
	return freeTCPAddr(tb).Port
}

func freeTCPAddr(tb testing.TB) *net.TCPAddr {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr)
}

// StartBackends starts n go-sdk MCP backends named backend-0 to
// backend-(n-1) on free loopback ports; they close when the test ends.
func StartBackends(tb testing.TB, n int) []*mcpbackend.Backend {
	tb.Helper()
	return StartBackendsWith(tb, n, mcpbackend.Options{})
}

// StartBackendsWith is StartBackends with options (stateless backends).
func StartBackendsWith(tb testing.TB, n int, o mcpbackend.Options) []*mcpbackend.Backend {
	tb.Helper()
	backends := make([]*mcpbackend.Backend, 0, n)
	for i := range n {
		b, err := mcpbackend.StartWith(fmt.Sprintf("backend-%d", i), "127.0.0.1:0", o)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(b.Close)
		backends = append(backends, b)
	}
	return backends
}

// URLs are the backends' base URLs, in order: what a static endpoint
// source takes.
func URLs(backends []*mcpbackend.Backend) []string {
	urls := make([]string, len(backends))
	for i, b := range backends {
		urls[i] = b.URL()
	}
	return urls
}

// StartServer serves h on a free loopback address (http://127.0.0.1:port
// in the returned server's URL) until the test ends.
func StartServer(tb testing.TB, h http.Handler) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return srv
}

// PingBackend is an HTTP server that answers every request with an empty
// JSON-RPC result: a backend for tests of the server's plumbing rather
// than of MCP. It closes when the test ends.
func PingBackend(tb testing.TB) *httptest.Server {
	tb.Helper()
	return StartServer(tb, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	}))
}

// Status is the status code of a GET of url, or -1 when it fails (within
// a second).
func Status(url string) int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return -1
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Front is a handler served as tether's client listener serves it: through
// h1 (internal/h1) wrapping a net/http server.
type Front struct {
	URL      string       // http://127.0.0.1:port
	Listener net.Listener // what it accepts on
	srv      *h1.Server
	done     chan error
	once     sync.Once
}

// StartFront serves h through h1 on ln, or on a free loopback address when
// ln is nil, until the test ends.
func StartFront(tb testing.TB, h http.Handler, ln net.Listener) *Front {
	tb.Helper()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			tb.Fatal(err)
		}
	}
	f := &Front{URL: "http://" + ln.Addr().String(), Listener: ln, done: make(chan error, 1),
		srv: h1.Wrap(&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute})}
	go func() { f.done <- f.srv.Serve(ln) }()
	tb.Cleanup(f.Close)
	return f
}

// Close stops the listener and cuts every connection at once.
func (f *Front) Close() {
	f.once.Do(func() {
		f.srv.Close()
		<-f.done
	})
}

// CannedBackend answers every request on a free loopback address with
// answer, a whole HTTP/1.1 response, and returns the address: a backend for
// benchmarks of the path in front of it, allocating nothing per request.
// Requests must carry their body, if any, with a Content-Length.
func CannedBackend(tb testing.TB, answer string) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var buf []byte
				for {
					if buf, err = ReadMessage(br, buf); err != nil {
						return
					}
					if _, err := io.WriteString(c, answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// ReadMessage reads one HTTP/1.1 message whose body, if any, has a
// Content-Length, and returns its body in buf, allocating only to grow it.
func ReadMessage(br *bufio.Reader, buf []byte) ([]byte, error) {
	length := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return buf[:0], err
		}
		if len(line) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return buf[:0], err
			}
		}
	}
	buf = slices.Grow(buf[:0], length)[:length]
	_, err := io.ReadFull(br, buf)
	return buf, err
}

// LockedBuffer is a log destination safe for concurrent writes, read while
// the logger may still write.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ReadHead reads from r, into buf, until the end of an HTTP head (the
// blank line), for a peer that sends nothing after it before it is
// answered; it fails when buf fills first.
func ReadHead(r io.Reader, buf []byte) error {
	n := 0
	for !bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
		if n == len(buf) {
			return errors.New("testkit: head longer than the buffer")
		}
		m, err := r.Read(buf[n:])
		if err != nil {
			return err
		}
		n += m
	}
	return nil
}
