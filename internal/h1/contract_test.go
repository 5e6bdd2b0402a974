//go:build unix

package h1

// The tests of the connection-level contract net/http keeps and the fast
// path must keep too (issue 29): the header deadline from the accept and
// across a hand-over, a request of its own for each request, the CRLF
// tolerated after a POST, the lingering close after an early answer, and
// the bound on a client that stops reading.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A connection that sends nothing is closed ReadHeaderTimeout after its
// accept, as net/http's, not IdleTimeout(×9/8) after it; and a first head
// that comes whole, but after ReadHeaderTimeout, is not answered.
func TestFirstHeadTimeoutFromAccept(t *testing.T) {
	const headTimeout = 100 * time.Millisecond
	addr, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) {
		std.ReadHeaderTimeout = headTimeout
		std.IdleTimeout = time.Minute
	})

	t.Run("silent", func(t *testing.T) {
		c := dial(t, addr) // a read deadline of 30 s: far past the wanted close
		if got, err := io.ReadAll(c); err != nil || len(got) != 0 {
			t.Errorf("read %q, %v; want the connection closed by the server", got, err)
		}
	})
	t.Run("head after the timeout", func(t *testing.T) {
		c := dial(t, addr)
		// Well past the header deadline from the accept, well within the
		// idle timeout.
		waitUntil(time.Now().Add(10 * headTimeout))
		io.WriteString(c, "GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
		if got, _ := io.ReadAll(c); len(got) != 0 {
			t.Errorf("a head that came %v after the accept was answered: %q", 10*headTimeout, got)
		}
	})
}

// A head begun on the fast path and handed to net/http mid-way (a line
// ended by a bare LF) keeps the header deadline it had: from the accept
// for the first, from its first byte for a later one; net/http does not
// give it ReadHeaderTimeout again. Likewise an h2c preface that comes in
// two parts.
func TestHeadTimeoutAcrossHandOff(t *testing.T) {
	const headTimeout = time.Second
	addr, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) {
		std.ReadHeaderTimeout = headTimeout
		std.IdleTimeout = time.Minute
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		std.Protocols = &p
	})
	// The head's second part comes at 7/10 of the header timeout (it is
	// handed over then), its end at 13/10: within ReadHeaderTimeout of the
	// hand-over, past it from the head's start. (Stimuli: the outcome is
	// asserted, with margins of 3/10 of the timeout either way.) What
	// comes back is read until the connection's end, or for 2 s (a head
	// that was served is answered at once; a PRI request net/http serves
	// as HTTP/1 waits for its body's end, and a client closing its write
	// side could make the h2c server leave before it writes).
	send := func(c net.Conn, start time.Time, first, second, end string) []byte {
		t.Helper()
		io.WriteString(c, first)
		waitUntil(start.Add(headTimeout * 7 / 10))
		io.WriteString(c, second)
		waitUntil(start.Add(headTimeout * 13 / 10))
		io.WriteString(c, end)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		got, _ := io.ReadAll(c)
		return got
	}
	cases := []struct {
		name                string
		first, second, end  string
		afterQuickRequests  bool
		answeredIfFreshTime string // what the answer would start with
	}{
		{"first head", "GET /slow HTTP/1.1\r\n", "Host: x\n", "\n", false, "HTTP/1.1 200"},
		{"later head", "GET /slow HTTP/1.1\r\n", "Host: x\n", "\n", true, "HTTP/1.1 200"},
		{"h2c preface", "PRI * HTTP/2.0", "\r\n\r\n", "SM\r\n\r\n", false, "\x00\x00"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			c := dial(t, addr)
			if tc.afterQuickRequests {
				br := bufio.NewReader(c)
				quickRequests(t, c, br, 3)
				start = time.Now()
			}
			got := send(c, start, tc.first, tc.second, tc.end)
			if bytes.HasPrefix(got, []byte(tc.answeredIfFreshTime)) {
				t.Errorf("a head not whole %v after its start was served: %q", headTimeout*13/10, got)
			}
		})
	}
}

// The first SetReadDeadline of net/http on a handed-over connection (its
// header deadline) gets the one already running when that is sooner; the
// later ones are net/http's own.
func TestHandedConnKeepsTheHeadDeadline(t *testing.T) {
	running := time.Now().Add(time.Second)
	for _, tc := range []struct {
		name        string
		running     time.Time
		first, want time.Time
	}{
		{"later", running, running.Add(time.Second), running},
		{"none", running, time.Time{}, running},
		{"sooner", running, running.Add(-time.Millisecond), running.Add(-time.Millisecond)},
		{"no head deadline", time.Time{}, running.Add(time.Second), running.Add(time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &deadlineConn{}
			c := newHandedConn(rec, nil, tc.running, 0)
			c.SetReadDeadline(tc.first)
			later := running.Add(time.Hour)
			c.SetReadDeadline(later)
			if len(rec.read) != 2 || !rec.read[0].Equal(tc.want) || !rec.read[1].Equal(later) {
				t.Errorf("read deadlines %v, want %v then %v", rec.read, tc.want, later)
			}
		})
	}
}

// deadlineConn records the read deadlines it is given.
type deadlineConn struct {
	net.Conn
	read []time.Time
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.read = append(c.read, t)
	return nil
}

// Each request has its own *http.Request, URL and Body, as net/http's: a
// handler that keeps r past its return (an access log written later, a
// goroutine of its own) reads its own request there, however many
// requests the connection carries after it; its body's reads fail once it
// has returned (http.ErrBodyReadAfterClose), and never read the next
// request's body.
func TestRequestsAreTheirOwn(t *testing.T) {
	kept := make(chan *http.Request, 3)
	lateRead := make(chan struct{})
	lateReadDone := make(chan struct{})
	var late struct {
		sync.Mutex
		path, uri, host, method string
		urlNil, ctxDone         bool
	}
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/1":
			// A goroutine that reads r after the handler has returned.
			go func() {
				<-lateRead
				late.Lock()
				defer late.Unlock()
				late.urlNil = r.URL == nil
				if r.URL != nil {
					late.path = r.URL.Path
				}
				late.uri, late.host, late.method = r.RequestURI, r.Host, r.Method
				late.ctxDone = r.Context().Err() != nil
				close(lateReadDone)
			}()
		case "/3":
			// The request before is over: its kept Body is read now,
			// while this one's body is the connection's.
			<-lateRead
			<-lateReadDone
		}
		kept <- r
		io.WriteString(w, r.URL.Path)
	}))
	c := dial(t, addr)
	io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: one\r\n\r\n"+
		"POST /2?q=2 HTTP/1.1\r\nHost: two\r\nContent-Length: 4\r\n\r\naaaa"+
		"POST /3 HTTP/1.1\r\nHost: three\r\nContent-Length: 8\r\n\r\nbbbb")
	br := bufio.NewReader(c)
	for _, want := range []string{"/1", "/2"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != want {
			t.Fatalf("answer %q, want %q", b, want)
		}
	}
	r1, r2 := <-kept, <-kept
	// /3 runs, its body half sent: read what /2's handler kept.
	close(lateRead)
	// One read: the body of /3 still waits for half of it.
	buf := make([]byte, 16)
	n, err := r2.Body.Read(buf)
	if n != 0 || !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Errorf("/2's body read after its handler returned: %q, %v; want http.ErrBodyReadAfterClose", buf[:n], err)
	}
	<-lateReadDone
	io.WriteString(c, "bbbb")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	r3 := <-kept

	if r1 == r2 || r2 == r3 || r1.URL == r2.URL || r2.URL == r3.URL {
		t.Fatal("a connection's requests share their *http.Request or URL")
	}
	late.Lock()
	if late.urlNil || late.path != "/1" || late.uri != "/1" || late.host != "one" || late.method != "GET" || !late.ctxDone {
		t.Errorf("/1 read after its handler returned: %+v", &late)
	}
	late.Unlock()
	for _, tc := range []struct {
		r                       *http.Request
		method, uri, path, host string
		contentLength           int64
	}{
		{r1, "GET", "/1", "/1", "one", 0},
		{r2, "POST", "/2?q=2", "/2", "two", 4},
		{r3, "POST", "/3", "/3", "three", 8},
	} {
		r := tc.r
		if r.Method != tc.method || r.RequestURI != tc.uri || r.URL == nil || r.URL.Path != tc.path ||
			r.Host != tc.host || r.ContentLength != tc.contentLength || r.Context().Err() == nil {
			t.Errorf("%s kept: %s %q %v %q %d, context %v", tc.uri, r.Method, r.RequestURI, r.URL, r.Host, r.ContentLength, r.Context().Err())
		}
	}
}

// After a POST, the CR and LF bytes net/http drops before the next
// request (up to 4, RFC 9112 §2.2) are dropped by the fast path too, in
// the same write as the body or later; more of them, or after another
// method, get net/http's 400 from both.
func TestLeadingCRLFAfterPost(t *testing.T) {
	h := http.HandlerFunc(echo)
	fast, _ := startH1(t, h)
	std := startStd(t, h)
	post := "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
	next := "GET /next HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, tc := range []struct {
		name  string
		parts []string // written with a pause between them
		want  string   // net/http's statuses
	}{
		{"CRLF with the body", []string{post + "\r\n" + next}, "200 200"},
		{"CRLF apart", []string{post, "\r\n", next}, "200 200"},
		{"CR then LF and the request apart", []string{post + "\r", "\n", next}, "200 200"},
		{"LF alone", []string{post + "\n" + next}, "200 200"},
		{"four", []string{post + "\r\n\r\n" + next}, "200 200"},
		{"five", []string{post + "\r\n\r\n\n" + next}, "200 400"},
		{"after a GET", []string{next + "\r\n" + next}, "200 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := statuses(t, fast, tc.parts), statuses(t, std, tc.parts)
			if want != tc.want {
				t.Fatalf("net/http answers %q, the test expects %q", want, tc.want)
			}
			if got != want {
				t.Errorf("fast path answers %q, net/http %q", got, want)
			}
		})
	}
}

// The CR after a POST's body, in the same write, is waited past as an idle
// connection is: with IdleTimeout, not for good.
func TestLeadingCRLFWaitIsIdle(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) {
		std.IdleTimeout = 100 * time.Millisecond
	})
	c := dial(t, addr) // a read deadline of 30 s: far past the wanted close
	io.WriteString(c, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}\r")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("after the answer: %q, %v; want the idle connection closed", rest, err)
	}
}

// A head whole but one byte over net/http's limit (MaxHeaderBytes and
// 4 KiB) is answered 431, as net/http answers it; one at the limit is
// served. (The fast path's buffer holds a byte more than the limit, to see
// it passed.)
func TestHeadLimitAsNetHTTP(t *testing.T) {
	const maxHeaderBytes = 1 << 10
	configure := func(std *http.Server) { std.MaxHeaderBytes = maxHeaderBytes }
	fast, _ := startH1(t, http.HandlerFunc(echo), func(std *http.Server, _ *Server) { configure(std) })
	std := &http.Server{Handler: http.HandlerFunc(echo)}
	configure(std)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go std.Serve(ln)
	t.Cleanup(func() { std.Close() })
	limit := maxHeaderBytes + 4096
	for _, size := range []int{limit, limit + 1} {
		start := "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: "
		head := start + strings.Repeat("a", size-len(start)-len("\r\n\r\n")) + "\r\n\r\n"
		got, want := statuses(t, fast, []string{head}), statuses(t, ln.Addr().String(), []string{head})
		if got != want {
			t.Errorf("a head of %d bytes (limit %d): fast path answers %q, net/http %q", size, limit, got, want)
		}
	}
}

// statuses sends parts on a new connection, a few milliseconds apart,
// closes its write side, and returns the status codes of the answers.
func statuses(t *testing.T, addr string, parts []string) string {
	t.Helper()
	c := dial(t, addr)
	for i, p := range parts {
		if i > 0 {
			time.Sleep(5 * time.Millisecond) // a stimulus: the parts most likely come apart
		}
		io.WriteString(c, p)
	}
	c.(*net.TCPConn).CloseWrite()
	br := bufio.NewReader(c)
	var codes []string
	for range 10 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.ReadAll(resp.Body)
		codes = append(codes, fmt.Sprint(resp.StatusCode))
	}
	return strings.Join(codes, " ")
}

// dialSmallWindow connects to addr with a small receive buffer, so that an
// answer the client does not read fills it quickly.
func dialSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// An answer sent before a large body was read (a 413) reaches a client
// still sending that body, followed by the connection's end, not by a
// reset: the connection is closed as net/http closes it
// (closeWriteAndWait), on the fast path and on a connection handed over
// (a chunked body). Closed at once with the body's bytes unread, it
// would reset: the client reads the answer and then a reset, or, when
// part of the answer was still in the server's socket, a cut answer.
func TestLingeringCloseAfterEarlyAnswer(t *testing.T) {
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	}))
	const size = 4 << 20
	body := strings.Repeat("z", size)
	for _, tc := range []struct{ name, head, body string }{
		{"fast path", fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size), body},
		{"handed over", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", size, body)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			go func() {
				// Fails once the server closes; the answer is what counts.
				io.WriteString(c, tc.head+tc.body)
			}()
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge || string(got) != "too large\n" {
				t.Fatalf("answer %d %q, %v", resp.StatusCode, got, err)
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Errorf("after the answer: %q, %v; want the connection's end", rest, err)
			}
		})
	}
}

// A client that stops reading an answer that goes on (a stream) fails
// the handler's writes within SendTimeout, which cancels the request's
// context, on the fast path and on the connections handed to net/http:
// HTTP/1.0, and h2c.
func TestSendTimeout(t *testing.T) {
	type outcome struct {
		writeErr   error
		ctxErr     error
		cause      error
		iterations int
	}
	// By path: a handler whose client leaves late must not answer for
	// another's.
	outcomes := map[string]chan outcome{"/fast": make(chan outcome, 1), "/http10": make(chan outcome, 1), "/": make(chan outcome, 1)}
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte("data: stream\n\n"), 1<<10)
		rc := http.NewResponseController(w)
		var o outcome
		// Bounded: the client's buffers and the server's take a few MiB.
		for o.iterations = 0; o.iterations < 1<<14; o.iterations++ {
			if _, o.writeErr = w.Write(chunk); o.writeErr != nil {
				break
			}
			if o.writeErr = rc.Flush(); o.writeErr != nil {
				break
			}
		}
		if o.writeErr != nil {
			// The context's end may follow the error by a goroutine's
			// hop on a connection net/http serves.
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}
		o.ctxErr, o.cause = r.Context().Err(), context.Cause(r.Context())
		outcomes[r.URL.Path] <- o
	}), func(std *http.Server, s *Server) {
		s.SendTimeout = 100 * time.Millisecond
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		std.Protocols = &p
	})
	for _, tc := range []struct {
		name, path string
		start      func(t *testing.T, c net.Conn)
		fastPath   bool
	}{
		{"fast path", "/fast", func(_ *testing.T, c net.Conn) { io.WriteString(c, "GET /fast HTTP/1.1\r\nHost: x\r\n\r\n") }, true},
		{"HTTP/1.0", "/http10", func(_ *testing.T, c net.Conn) { io.WriteString(c, "GET /http10 HTTP/1.0\r\nHost: x\r\n\r\n") }, false},
		{"h2c", "/", startH2CStream, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialSmallWindow(t, addr)
			tc.start(t, c) // and never read (but an h2c SETTINGS frame)
			var o outcome
			select {
			case o = <-outcomes[tc.path]:
			case <-time.After(20 * time.Second):
				t.Fatal("the handler's writes to a client that reads nothing did not fail")
			}
			if o.writeErr == nil || o.iterations == 1<<14 {
				t.Fatalf("the handler wrote %d chunks to a client that reads nothing, error %v", o.iterations, o.writeErr)
			}
			if o.ctxErr == nil {
				t.Errorf("write failed (%v), the request's context not cancelled", o.writeErr)
			}
			if tc.fastPath && (!errors.Is(o.writeErr, os.ErrDeadlineExceeded) || !errors.Is(o.cause, os.ErrDeadlineExceeded)) {
				t.Errorf("write error %v, context's cause %v; want the send deadline's", o.writeErr, o.cause)
			}
		})
	}
}

// startH2CStream starts a GET on c by h2c prior knowledge, with the
// largest flow-control windows (so that only TCP holds the answer back),
// and acknowledges the server's SETTINGS (which the server otherwise
// closes the connection for): from then on it reads nothing.
func startH2CStream(t *testing.T, c net.Conn) {
	t.Helper()
	frame := func(typ, flags byte, stream uint32, payload []byte) []byte {
		b := make([]byte, 9, 9+len(payload))
		b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		b[3], b[4] = typ, flags
		binary.BigEndian.PutUint32(b[5:], stream)
		return append(b, payload...)
	}
	const (
		typeHeaders, typeSettings, typeWindowUpdate = 0x1, 0x4, 0x8
		flagAck, flagEndStream, flagEndHeaders      = 0x1, 0x1, 0x4
		settingInitialWindowSize                    = 0x4
		maxWindow                                   = 1<<31 - 1
	)
	var out []byte
	out = append(out, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"...)
	settings := binary.BigEndian.AppendUint16(nil, settingInitialWindowSize)
	settings = binary.BigEndian.AppendUint32(settings, maxWindow)
	out = append(out, frame(typeSettings, 0, 0, settings)...)
	out = append(out, frame(typeWindowUpdate, 0, 0, binary.BigEndian.AppendUint32(nil, maxWindow-65535))...)
	// :method GET, :scheme http, :path / (static table), :authority x.
	block := []byte{0x82, 0x86, 0x84, 0x41, 0x01, 'x'}
	out = append(out, frame(typeHeaders, flagEndStream|flagEndHeaders, 1, block)...)
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	// The server's first frame is its SETTINGS.
	var head [9]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		t.Fatal(err)
	}
	if head[3] != typeSettings || head[4]&flagAck != 0 {
		t.Fatalf("first frame %x, want the server's SETTINGS", head)
	}
	n := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
	if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(frame(typeSettings, flagAck, 0, nil)); err != nil {
		t.Fatal(err)
	}
}
