package backend

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/testkit"
)

// rawBackend accepts connections and answers each request read on them
// with answer(request number on the connection, request); it counts the
// connections.
type rawBackend struct {
	addr     string
	accepted atomic.Int32
}

func startRawBackend(t *testing.T, answer func(c net.Conn, n int, req *http.Request) bool) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	b := &rawBackend{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if !answer(c, n, req) {
						return
					}
				}
			}()
		}
	}()
	return b
}

// answerHello answers every request with a 200 "hello" of known length.
func answerHello(c net.Conn, _ int, _ *http.Request) bool {
	_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	return err == nil
}

func clientPost(ctx context.Context, c *Client, addr, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	return c.RoundTrip(req)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("body: %v", err)
	}
	return string(b)
}

// A body read to its end gives the connection back: sequential requests
// share one connection. A body closed early closes its connection, and the
// next request dials.
func TestClientReusesConnections(t *testing.T) {
	b := startRawBackend(t, answerHello)
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	ctx := context.Background()
	for i := range 3 {
		resp, err := clientPost(ctx, c, b.addr, `{}`)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := readAll(t, resp); got != "hello" {
			t.Fatalf("request %d: body %q", i, got)
		}
	}
	if n := b.accepted.Load(); n != 1 {
		t.Fatalf("3 sequential requests took %d connections, want 1", n)
	}

	resp, err := clientPost(ctx, c, b.addr, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // unread: the connection cannot carry another request
	if resp, err = clientPost(ctx, c, b.addr, `{}`); err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := b.accepted.Load(); n != 2 {
		t.Fatalf("after a body closed early: %d connections, want 2", n)
	}
}

// Connections waiting in the pool hold no buffer: the reader of each goes
// back to backendReaders when its answer has been read (the writer, when
// its request has been written), and a connection taken again gets one.
func TestClientIdleConnectionsHoldNoBuffers(t *testing.T) {
	b := startRawBackend(t, answerHello)
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	const n = 8
	// n answers whose bodies are still to be read hold n connections.
	var resps []*http.Response
	for i := range n {
		resp, err := clientPost(context.Background(), c, b.addr, `{}`)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resps = append(resps, resp)
	}
	for _, resp := range resps {
		if got := readAll(t, resp); got != "hello" {
			t.Fatalf("body %q", got)
		}
	}
	c.mu.Lock()
	idle := c.idle[b.addr]
	held := 0
	for _, pc := range idle {
		if pc.br != nil {
			held++
		}
	}
	c.mu.Unlock()
	if len(idle) != n || held != 0 {
		t.Fatalf("%d idle connections, %d of them holding a reader; want %d, 0", len(idle), held, n)
	}
	// Each is used again.
	for i := range 2 * n {
		resp, err := clientPost(context.Background(), c, b.addr, `{}`)
		if err != nil {
			t.Fatalf("request %d after the pool: %v", i, err)
		}
		if got := readAll(t, resp); got != "hello" {
			t.Fatalf("body %q", got)
		}
	}
	if got := b.accepted.Load(); got != n {
		t.Fatalf("%d connections dialled, want %d", got, n)
	}
}

// Chunked answers with trailers, after informational answers, are read as
// net/http reads them, and the connection is reused after them.
func TestClientChunkedTrailers(t *testing.T) {
	b := startRawBackend(t, func(c net.Conn, _ int, _ *http.Request) bool {
		_, err := io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n"+
			"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"+
			"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Done\r\n\r\n"+
			"7\r\ndata: 1\r\n1\r\n\n\r\n0\r\nX-Done: yes\r\n\r\n")
		return err == nil
	})
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	for i := range 2 {
		resp, err := clientPost(context.Background(), c, b.addr, `{}`)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("status %d, want 200 (the 1xx skipped)", resp.StatusCode)
		}
		if got := readAll(t, resp); got != "data: 1\n" {
			t.Fatalf("body %q", got)
		}
		if got := resp.Trailer.Get("X-Done"); got != "yes" {
			t.Fatalf("request %d: trailer X-Done %q, want yes", i, got)
		}
	}
	if n := b.accepted.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

// The request's context ends a round trip blocked on the backend and a
// body read blocked mid-stream, by closing the connection; neither
// connection goes back to the pool.
func TestClientContextCancel(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	b := startRawBackend(t, func(c net.Conn, n int, req *http.Request) bool {
		if req.URL.Path == "/stream" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n7\r\ndata: 1\r\n")
		}
		<-release // then nothing more
		return false
	})
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := clientPost(ctx, c, b.addr, `{}`)
		done <- err
	}()
	waitAccepted(t, b, 1)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("round trip after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("round trip not ended by its context")
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.addr+"/stream", nil)
	resp, err := c.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) != "data: 1" {
		t.Fatalf("first chunk: %q, %v", buf[:n], err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(buf)
		read <- err
	}()
	cancel()
	select {
	case err := <-read:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("body read after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("body read not ended by the request's context")
	}
	resp.Body.Close()
	if n := idleCount(c); n != 0 {
		t.Fatalf("%d idle connections after cancelled requests, want 0", n)
	}
}

// A dial runs under a context of its own (dialFor), which the request's
// cancellation still ends, with its cause.
func TestClientDialEndsWithTheRequest(t *testing.T) {
	dialing := make(chan struct{})
	c := NewClient(func(ctx context.Context, network, addr string) (net.Conn, error) {
		close(dialing)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := clientPost(ctx, c, "127.0.0.1:1", `{}`)
		done <- err
	}()
	<-dialing
	stop := errors.New("the client went away")
	cancel(stop)
	select {
	case err := <-done:
		if !errors.Is(err, stop) && !errors.Is(err, context.Canceled) {
			t.Fatalf("round trip after cancel: %v, want the cancellation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a dial not ended by its request's context")
	}
}

// A request's deadline is its dial's: a dial past it fails as a timeout,
// as net.Dialer's under the request's own context does.
func TestClientDialKeepsTheDeadline(t *testing.T) {
	c := NewClient(func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("the dial has no deadline")
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := clientPost(ctx, c, "127.0.0.1:1", `{}`)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("round trip past its deadline: %v, want context.DeadlineExceeded", err)
	}
}

// A request without a deadline still dials within dialTimeout: the dial's
// context carries it, so that the dialer derives no context of its own.
func TestClientDialTimeout(t *testing.T) {
	var got time.Duration
	c := NewClient(func(ctx context.Context, network, addr string) (net.Conn, error) {
		d, ok := ctx.Deadline()
		if !ok {
			return nil, errors.New("the dial has no deadline")
		}
		got = time.Until(d)
		return nil, errors.New("refused")
	})
	if _, err := clientPost(context.Background(), c, "127.0.0.1:1", `{}`); err == nil || strings.Contains(err.Error(), "no deadline") {
		t.Fatalf("round trip: %v, want the dial's own error", err)
	}
	if got <= 0 || got > dialTimeout {
		t.Fatalf("the dial's deadline is %v away, want within %v", got, dialTimeout)
	}
}

// A GET that got no byte of answer on a pooled connection is sent again on
// a fresh one, as net/http does; a POST is not (the backend may have read
// it).
func TestClientReplaysIdempotentOnly(t *testing.T) {
	b := startRawBackend(t, func(c net.Conn, n int, _ *http.Request) bool {
		if n == 1 {
			return false // read the second request, then close without a word
		}
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return err == nil
	})
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	ctx := context.Background()
	get := func() (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.addr+"/mcp", nil)
		return c.RoundTrip(req)
	}
	resp, err := get()
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp, err = get(); err != nil {
		t.Fatalf("GET on a connection closed after reading it: %v", err)
	}
	readAll(t, resp)
	if n := b.accepted.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the GET sent again on a fresh one)", n)
	}

	// The next request on that connection is its second too.
	if _, err := clientPost(ctx, c, b.addr, `{}`); err == nil {
		t.Fatal("POST read by the backend, then the connection closed: succeeded, want an error")
	}
}

func waitAccepted(t *testing.T, b *rawBackend, n int32) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.accepted.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("backend accepted %d connections, want %d", b.accepted.Load(), n)
		}
	}
}

func idleCount(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nidle
}

// A backend that answers before reading a body it will not take, then
// closes, fails the rest of the write; its answer still reaches the caller,
// as with net/http, and the connection is not reused.
func TestClientEarlyAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil { // the headers only
			c.Close()
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbig")
		c.Close() // the body unread: a reset
	}()
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	body := strings.Repeat("x", 64<<20) // beyond any socket buffer
	resp, err := clientPost(context.Background(), c, ln.Addr().String(), body)
	if err != nil {
		t.Fatalf("early answer lost: %v", err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
	if got := readAll(t, resp); got != "big" {
		t.Fatalf("body %q", got)
	}
	if n := idleCount(c); n != 0 {
		t.Fatalf("%d idle connections, want 0", n)
	}
}

// A head without end fails the request once maxResponseHeadBytes are read,
// rather than filling memory; so does a head longer than the read buffer
// (read by net/http) with no end. A head of 8 KiB, longer than the buffer
// but within the bound, is read.
func TestClientBoundsTheHead(t *testing.T) {
	long := "HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("a", 8<<10) + "\r\nContent-Length: 2\r\n\r\nok"
	b := startRawBackend(t, func(c net.Conn, n int, _ *http.Request) bool {
		if n == 0 {
			_, err := io.WriteString(c, long)
			return err == nil
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Endless: ")
		chunk := []byte(strings.Repeat("a", 64<<10))
		for {
			if _, err := c.Write(chunk); err != nil {
				return false // the client gave up
			}
		}
	})
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	resp, err := clientPost(context.Background(), c, b.addr, `{}`)
	if err != nil {
		t.Fatalf("8 KiB head: %v", err)
	}
	if got := readAll(t, resp); got != "ok" || len(resp.Header.Get("X-Long")) != 8<<10 {
		t.Fatalf("8 KiB head: body %q, X-Long of %d bytes", got, len(resp.Header.Get("X-Long")))
	}
	_, err = clientPost(context.Background(), c, b.addr, `{}`)
	if !errors.Is(err, errHeadTooLong) {
		t.Fatalf("endless head: %v, want errHeadTooLong", err)
	}
}

// A backend that stalls in the middle of an answer's head fails the request
// once headStallTimeout has passed since the head's first bytes, rather
// than holding the connection until the client leaves (issue 29, item 8).
// A backend slow to begin its answer is not bounded: a tool call may run
// long before its first byte.
func TestClientBoundsAStalledHead(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	b := startRawBackend(t, func(c net.Conn, n int, _ *http.Request) bool {
		if n == 0 {
			<-time.After(300 * time.Millisecond) // slow to begin: not a stall
			_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return err == nil
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-") // and nothing more
		<-release
		return false
	})
	c := NewClient(Dial)
	c.headStallTimeout = 100 * time.Millisecond
	t.Cleanup(c.CloseIdleConnections)
	resp, err := clientPost(context.Background(), c, b.addr, `{}`)
	if err != nil {
		t.Fatalf("answer slow to begin: %v", err)
	}
	if got := readAll(t, resp); got != "ok" {
		t.Fatalf("answer slow to begin: body %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = clientPost(ctx, c, b.addr, `{}`)
	if !errors.Is(err, errHeadStalled) {
		t.Fatalf("stalled head: %v, want errHeadStalled", err)
	}
}

// An answer without a length (HTTP/1.0, or no framing at all) runs to the
// close: its body is read whole, and its connection is not reused.
func TestClientCloseDelimited(t *testing.T) {
	for _, answer := range []string{
		"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it",
	} {
		b := startRawBackend(t, func(c net.Conn, _ int, _ *http.Request) bool {
			io.WriteString(c, answer)
			return false
		})
		c := NewClient(Dial)
		t.Cleanup(c.CloseIdleConnections)
		for i := range 2 {
			resp, err := clientPost(context.Background(), c, b.addr, `{}`)
			if err != nil {
				t.Fatalf("%.8q, request %d: %v", answer, i, err)
			}
			if got := readAll(t, resp); got != "all of it" || !resp.Close || resp.ContentLength != -1 {
				t.Fatalf("%.8q: body %q, Close %v, ContentLength %d", answer, got, resp.Close, resp.ContentLength)
			}
		}
		if n := b.accepted.Load(); n != 2 {
			t.Fatalf("%.8q: %d connections, want 2", answer, n)
		}
	}
}

// An https backend is spoken to over TLS (by http.Transport): the
// handshake is what fails against a certificate nobody trusts.
func TestClientHTTPSBackend(t *testing.T) {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(ts.Close)
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/mcp", nil)
	_, err := c.RoundTrip(req)
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("https backend with an untrusted certificate: %v, want x509.UnknownAuthorityError", err)
	}
}

// BenchmarkBackendRoundTrip is one follow-up's round trip to a backend
// (a one-event SSE answer, chunked, as go-sdk sends it) through tether's
// client and through the http.Transport it replaced; the backend is a raw
// loop in this process that allocates nothing per request.
func BenchmarkBackendRoundTrip(b *testing.B) {
	const answer = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: s1\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"4a\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[],\"x\":\"y\"}}\r\n\r\n\r\n0\r\n\r\n"
	url := "http://" + testkit.CannedBackend(b, answer) + "/mcp"
	body := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`)
	for _, tt := range []struct {
		name string
		rt   Transport
	}{
		{"client", NewClient(Dial)},
		{"http.Transport", newHTTPTransport(Dial)},
	} {
		b.Run(tt.name, func(b *testing.B) {
			defer tt.rt.CloseIdleConnections()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			buf := make([]byte, 512)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header["Content-Type"] = []string{"application/json"}
				resp, err := tt.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				for {
					if _, err := resp.Body.Read(buf); err != nil {
						break
					}
				}
				resp.Body.Close()
			}
		})
	}
}

// A Request that fails on a pooled connection the backend closed after
// reading it is sent again on a fresh one when it is idempotent, and the
// copy is the request itself: the same head and body. One that is not
// idempotent is not sent again. (The proxy decides which a request is:
// its MCP method, or an Idempotency-Key as sent, see
// proxy.TestDirectRequestAsOutgoing.)
func TestClientResendsRequest(t *testing.T) {
	type seen struct {
		uri, host string
		header    http.Header
		body      string
	}
	run := func(t *testing.T, idempotent bool) ([]seen, error) {
		var mu sync.Mutex
		var got []seen
		b := startRawBackend(t, func(c net.Conn, n int, req *http.Request) bool {
			mu.Lock()
			got = append(got, seen{req.RequestURI, req.Host, req.Header.Clone(), ""})
			mu.Unlock()
			if n == 1 {
				return false // read the second request, then close without a word
			}
			_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return err == nil
		})
		c := NewClient(Dial)
		t.Cleanup(c.CloseIdleConnections)
		r := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/mcp"}}).WithContext(context.Background())
		d := &Request{
			Client: r,
			URL:    url.URL{Scheme: "http", Host: b.addr, Path: "/mcp"},
			Host:   "front:8080",
			Body:   []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`),
			Fields: h1.Fields{
				{Name: "Content-Type", Value: "application/json"},
				{Name: "Mcp-Session-Id", Value: "sid-backend"},
				{Name: "User-Agent", Value: "client/1"},
			},
			Idempotent: idempotent,
		}
		for i := range 2 {
			resp, err := c.Send(d)
			mu.Lock()
			sofar := slices.Clone(got)
			mu.Unlock()
			if err != nil {
				return sofar, err
			}
			if body := readAll(t, resp.Response); body != "ok" {
				t.Fatalf("request %d: body %q", i, body)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got), nil
	}

	got, err := run(t, true)
	if err != nil {
		t.Fatalf("idempotent request on a connection closed after reading it: %v", err)
	}
	if len(got) != 3 {
		t.Fatalf("backend read %d requests, want 3 (the second one twice)", len(got))
	}
	for i, s := range got {
		if !reflect.DeepEqual(s, got[0]) {
			t.Errorf("request %d: %+v\nwant what the first was: %+v", i, s, got[0])
		}
	}
	want := http.Header{
		"Content-Type":   {"application/json"},
		"Mcp-Session-Id": {"sid-backend"},
		"User-Agent":     {"client/1"},
		"Content-Length": {"46"},
	}
	if s := got[0]; s.uri != "/mcp" || s.host != "front:8080" || !reflect.DeepEqual(s.header, want) {
		t.Errorf("backend got %s for %s with %v\nwant /mcp for front:8080 with %v", s.uri, s.host, s.header, want)
	}

	got, err = run(t, false)
	if err == nil {
		t.Error("a request that is not idempotent was sent again")
	}
	if len(got) != 2 {
		t.Errorf("backend read %d requests, want 2", len(got))
	}
}

// A stream's body parks between events: with nothing buffered, its reader
// goes back to the pool (the connection holds none), and the next read
// takes one again and reads on where the stream was. With bytes buffered
// it does not park.
func TestClientBodyParks(t *testing.T) {
	more := make(chan struct{})
	b := startRawBackend(t, func(c net.Conn, n int, _ *http.Request) bool {
		if n > 0 {
			return answerHello(c, n, nil)
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"9\r\ndata: 1\n\n\r\n")
		<-more
		// The next event in two chunks, the second with the stream's end.
		io.WriteString(c, "9\r\ndata: 2\n\n\r\n")
		_, err := io.WriteString(c, "9\r\ndata: 3\n\n\r\n0\r\n\r\n")
		return err == nil
	})
	c := NewClient(Dial)
	t.Cleanup(c.CloseIdleConnections)
	resp, err := clientPost(context.Background(), c, b.addr, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	body := resp.Body.(*clientBody)
	buf := make([]byte, 64)
	if n, err := body.Read(buf); err != nil || string(buf[:n]) != "data: 1\n\n" {
		t.Fatalf("first event %q, %v", buf[:n], err)
	}
	conn, ok := body.Park()
	if !ok || conn == nil {
		t.Fatal("an idle body did not park")
	}
	if body.pc.br != nil {
		t.Fatal("a parked body holds its reader")
	}
	close(more)
	var got []byte
	small := make([]byte, 4)
	parkedWithBytes := false
	for {
		n, err := body.Read(small)
		got = append(got, small[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after parking: %v", err)
		}
		if body.pc.br != nil && body.pc.br.Buffered() > 0 {
			if _, ok := body.Park(); ok {
				parkedWithBytes = true
			}
		}
	}
	if string(got) != "data: 2\n\ndata: 3\n\n" {
		t.Fatalf("after parking: %q", got)
	}
	if parkedWithBytes {
		t.Fatal("a body with bytes buffered parked")
	}
	// Parked, the connection slept (h1.Sleep): read to its end, it is
	// closed, not pooled (its poller registration is under the sleeping
	// descriptor).
	if !h1.Asleep(body.pc.conn) {
		t.Fatalf("a parked body's connection is %T, not asleep", body.pc.conn)
	}
	c.mu.Lock()
	idle := c.nidle
	c.mu.Unlock()
	if idle != 0 {
		t.Fatalf("%d idle connections after the stream's end, want none", idle)
	}
	if _, err := body.pc.conn.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the stream's connection after its end: %v, want it closed", err)
	}
}
