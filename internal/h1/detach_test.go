package h1

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"testing"
	"time"
)

// detachingHandler writes "first" and flushes; then, on /detach and
// /abort, it detaches the answer and ends it from another goroutine, once
// the test says so (more): "second" and Finish, or Abort. On any other
// path it writes "second" and returns, as net/http's handlers do.
type detachingHandler struct {
	more     chan struct{}
	detached chan *http.Request // the requests whose answers were detached
	// cancelled, if set, gets Detach's cancelled calls.
	cancelled chan struct{}
}

func (h *detachingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "first\n\n")
	w.(http.Flusher).Flush()
	if r.URL.Path != "/detach" && r.URL.Path != "/abort" {
		io.WriteString(w, "second\n\n")
		return
	}
	if ClientConn(w) == nil {
		panic("a committed answer of the fast path has no connection")
	}
	var d *Detached
	var cancelled func()
	if h.cancelled != nil {
		cancelled = func() { h.cancelled <- struct{}{} }
	}
	d = Detach(w, nil, cancelled)
	if d == nil {
		panic("Detach refused an answer ClientConn took")
	}
	d.c.detach = func() {
		go func() {
			h.detached <- r
			<-h.more
			if r.URL.Path == "/abort" {
				d.Abort()
				return
			}
			io.WriteString(d, "second\n\n")
			d.FlushError()
			d.Header().Set(http.TrailerPrefix+"X-End", "yes")
			d.Finish()
		}()
	}
}

var dateLine = regexp.MustCompile(`Date: [^\r]*\r\n`)

// A detached answer reaches the client as the same answer written by its
// handler would: the same bytes (but the trailer it adds), the request's
// context live until it ends, the connection carrying the next request
// after it.
func TestDetachedAnswer(t *testing.T) {
	h := &detachingHandler{more: make(chan struct{}), detached: make(chan *http.Request, 1)}
	addr, _ := startH1(t, h)
	c := dial(t, addr)
	br := bufio.NewReader(c)

	io.WriteString(c, "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := io.ReadAll(resp.Body)

	io.WriteString(c, "GET /detach HTTP/1.1\r\nHost: x\r\n\r\n")
	r := <-h.detached
	if r.Context().Err() != nil {
		t.Fatal("the request's context ended with its handler, not with its answer")
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("first\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first\n\n" {
		t.Fatalf("first event %q, %v", first, err)
	}
	close(h.more)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the detached answer did not end cleanly: %v", err)
	}
	if got := string(first) + string(rest); !bytes.Equal([]byte(got), plain) {
		t.Errorf("detached body %q, the handler's %q", got, plain)
	}
	if resp.Trailer.Get("X-End") != "yes" {
		t.Errorf("trailer %v", resp.Trailer)
	}
	// The last chunk reaches the client just before the request ends.
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
		t.Error("the request's context is live after its answer ended")
	}

	io.WriteString(c, "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no next request after a detached answer: %v", err)
	}
	if again, _ := io.ReadAll(resp.Body); !bytes.Equal(again, plain) {
		t.Errorf("next answer %q", again)
	}
}

// The raw bytes of a detached answer are those of the same answer written
// by its handler, framing included (but the Date and the trailer).
func TestDetachedAnswerBytes(t *testing.T) {
	h := &detachingHandler{more: make(chan struct{}), detached: make(chan *http.Request, 1)}
	close(h.more)
	addr, _ := startH1(t, h)
	raw := func(path string) string {
		c := dial(t, addr)
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		b, _ := io.ReadAll(c)
		return dateLine.ReplaceAllString(string(b), "")
	}
	plain := raw("/plain")
	detached := raw("/detach")
	<-h.detached
	want := bytes.Replace([]byte(plain), []byte("0\r\n\r\n"), []byte("0\r\nX-End: yes\r\n\r\n"), 1)
	if detached != string(want) {
		t.Errorf("detached answer\n%q\nwant\n%q", detached, want)
	}

	// net/http's server, its handler writing the same answer itself,
	// trailer included: the same bytes (fields in any order).
	std := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "first\n\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, "second\n\n")
		w.Header().Set(http.TrailerPrefix+"X-End", "yes")
	}))
	t.Cleanup(std.Close)
	c := dial(t, std.Listener.Addr().String())
	io.WriteString(c, "GET /detach HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	if got, want := diffNormalAnswer(detached), diffNormalAnswer(dateLine.ReplaceAllString(string(b), "")); got != want {
		t.Errorf("detached answer\n%q\nnet/http's\n%q", got, want)
	}
}

// An aborted detached answer is cut off (no last chunk), its connection
// closed and its request's context cancelled.
func TestDetachedAnswerAborted(t *testing.T) {
	h := &detachingHandler{more: make(chan struct{}), detached: make(chan *http.Request, 1)}
	addr, _ := startH1(t, h)
	c := dial(t, addr)
	io.WriteString(c, "GET /abort HTTP/1.1\r\nHost: x\r\n\r\n")
	r := <-h.detached
	close(h.more)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err != io.ErrUnexpectedEOF {
		t.Errorf("aborted body read: %v, want it cut off", err)
	}
	<-r.Context().Done()
}

// Shutdown waits for a detached answer, as for a handler's; the
// connection closes after it.
func TestShutdownWaitsForDetachedAnswer(t *testing.T) {
	h := &detachingHandler{more: make(chan struct{}), detached: make(chan *http.Request, 1)}
	addr, s := startH1(t, h)
	c := dial(t, addr)
	io.WriteString(c, "GET /detach HTTP/1.1\r\nHost: x\r\n\r\n")
	<-h.detached
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	// Shutdown has closed the listener, and still tracks the connection
	// (it returns once there is none): the detached answer's.
	waitFor(func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	s.mu.Lock()
	tracked := len(s.conns)
	s.mu.Unlock()
	if tracked != 1 {
		t.Fatalf("Shutdown tracks %d connections while a detached answer runs, want 1", tracked)
	}
	close(h.more)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("body: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// The connection closed after the answer: the server is shut.
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("read %d bytes after the shutdown's last answer", n)
	}
}

// Close cuts a detached answer's connection, and tells its holder, who
// waits on it with no goroutine of the connection's to see the cut.
func TestCloseTellsDetachedAnswer(t *testing.T) {
	h := &detachingHandler{more: make(chan struct{}), detached: make(chan *http.Request, 1), cancelled: make(chan struct{}, 1)}
	addr, s := startH1(t, h)
	c := dial(t, addr)
	io.WriteString(c, "GET /detach HTTP/1.1\r\nHost: x\r\n\r\n")
	<-h.detached
	defer close(h.more)
	s.Close()
	select {
	case <-h.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("Close cut a detached answer without telling its holder")
	}
}

// A detached answer lives as long as its stream, idle for most of it: it
// keeps nothing of its request, which its handler no longer has either.
// The request is collected while the answer goes on, and the answer still
// ends as it should.
func TestDetachedAnswerKeepsNoRequest(t *testing.T) {
	collected := make(chan struct{})
	ready := make(chan struct{})
	ds := make(chan *Detached, 1)
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "first\n\n")
		w.(http.Flusher).Flush()
		runtime.AddCleanup(r, func(ch chan struct{}) { close(ch) }, collected)
		ds <- Detach(w, func() { close(ready) }, nil)
	}))
	c := dial(t, addr)
	io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
	d := <-ds
	<-ready
	if !Asleep(d.Conn()) {
		t.Errorf("a detached answer's connection is %T, not asleep", d.Conn())
	}
	deadline := time.Now().Add(10 * time.Second)
	for done := false; !done; {
		runtime.GC()
		select {
		case <-collected:
			done = true
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("the detached answer keeps its request")
			}
		}
	}
	io.WriteString(d, "second\n\n")
	d.FlushError()
	d.Finish()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(resp.Body); err != nil || string(body) != "first\n\nsecond\n\n" {
		t.Errorf("body %q, %v", body, err)
	}
}
