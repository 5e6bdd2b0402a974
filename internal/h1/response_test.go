package h1

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// startH1 serves h through a wrapped server on loopback and returns its
// address; the wrapped server's settings come from configure.
func startH1(t testing.TB, h http.Handler, configure ...func(*http.Server, *Server)) (string, *Server) {
	t.Helper()
	std := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		ErrorLog: log.New(io.Discard, "", 0)}
	s := Wrap(std)
	for _, f := range configure {
		f(std, s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), s
}

// dial connects to addr for the rest of the test, with a deadline a
// loaded machine meets: a server that neither answers nor closes fails
// the test instead of hanging it.
func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// startStd serves h with net/http's server alone, for comparison.
func startStd(t testing.TB, h http.Handler) string {
	t.Helper()
	std := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go std.Serve(ln)
	t.Cleanup(func() { std.Close() })
	return ln.Addr().String()
}

// exchange is what a client saw of one request, and whether the
// connection then carried another.
type exchange struct {
	Status     int
	Header     http.Header
	Body       string
	Length     int64
	Chunked    bool
	Trailer    http.Header
	BodyErr    bool
	Close      bool
	ReusedOK   bool
	ReusedBody string
}

func (x exchange) String() string {
	if len(x.Body) > 64 {
		x.Body = fmt.Sprintf("%.32s... (%d bytes)", x.Body, len(x.Body))
	}
	type plain exchange
	return fmt.Sprintf("%+v", plain(x))
}

// send writes raw on a new connection, reads the answer, then sends a
// second request on the same connection to learn whether it stayed open.
func send(t *testing.T, addr, raw string) exchange {
	t.Helper()
	c := dial(t, addr)
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", raw, err)
	}
	body, err := io.ReadAll(resp.Body)
	x := exchange{Status: resp.StatusCode, Header: resp.Header, Body: string(body), Length: resp.ContentLength,
		Chunked: len(resp.TransferEncoding) > 0, Trailer: resp.Trailer, BodyErr: err != nil, Close: resp.Close}
	delete(x.Header, "Date")
	if err != nil {
		return x
	}
	if _, err := io.WriteString(c, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n"); err == nil {
		if resp2, err := http.ReadResponse(br, nil); err == nil {
			b, err := io.ReadAll(resp2.Body)
			x.ReusedOK, x.ReusedBody = err == nil, string(b)
		}
	}
	return x
}

// again answers the second request send makes.
func again(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/again" {
			io.WriteString(w, "again")
			return
		}
		h(w, r)
	}
}

// TestResponsesAsNetHTTP compares, handler by handler, what a client sees
// of the fast path's answer with net/http's.
func TestResponsesAsNetHTTP(t *testing.T) {
	get := "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
	post := func(body string) string {
		return fmt.Sprintf("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	for _, tc := range []struct {
		name string
		req  string
		h    http.HandlerFunc
	}{
		{"empty", get, func(w http.ResponseWriter, r *http.Request) {}},
		{"small", get, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }},
		{"typed", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
		}},
		{"sniffed", get, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html><body>hi</body></html>") }},
		{"nosniff", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Content-Type-Options", "nosniff")
			io.WriteString(w, "<html>")
		}},
		{"large", get, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(strings.Repeat("x", 10000))) }},
		{"many writes", get, func(w http.ResponseWriter, r *http.Request) {
			for range 5 {
				w.Write([]byte(strings.Repeat("y", 1000)))
			}
		}},
		{"declared length", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello")
		}},
		{"short of its length", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "hello")
		}},
		{"flushed", get, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			io.WriteString(w, "b")
		}},
		{"flushed empty", get, func(w http.ResponseWriter, r *http.Request) { w.(http.Flusher).Flush() }},
		{"sse", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "data: 1\n\n")
			http.NewResponseController(w).Flush()
			io.WriteString(w, "data: 2\n\n")
		}},
		{"204 with a body", get, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			io.WriteString(w, "x")
		}},
		{"304", get, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotModified) }},
		{"status twice", get, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			w.WriteHeader(http.StatusInternalServerError)
		}},
		{"unknown status", get, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(599) }},
		{"handler closes", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		}},
		{"client closes", "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "bye")
		}},
		// Not a token list Request.Close counts, but net/http's server
		// closes the connection for it (its wantsClose).
		{"client closes, spaced", "GET /x HTTP/1.1\r\nHost: x\r\nConnection: Close 0\r\n\r\n", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "close %v", r.Close)
		}},
		{"client closes, second field", "GET /x HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "close %v", r.Close)
		}},
		{"declared trailer", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-T")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "a")
			w.Header().Set("X-T", "v")
		}},
		{"prefixed trailer", get, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			w.Header().Set(http.TrailerPrefix+"X-U", "w")
		}},
		{"header after the status", get, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			w.Header().Set("X-Late", "1")
			io.WriteString(w, "a")
		}},
		{"line break in a value", get, func(w http.ResponseWriter, r *http.Request) {
			w.Header()["X-N"] = []string{"a\r\nX-Injected: b"}
			io.WriteString(w, "a")
		}},
		{"aborted", get, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}},
		{"echo", post("ping"), func(w http.ResponseWriter, r *http.Request) { io.Copy(w, r.Body) }},
		{"small body unread", post(strings.Repeat("z", 1000)), func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }},
		{"large body unread", post(strings.Repeat("z", 300<<10)), func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }},
		{"request seen", "DELETE /p?q=1 HTTP/1.1\r\nHost: h:1\r\nmcp-session-id: s\r\n\r\n", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s %s %q %d %q %v", r.Method, r.URL, r.Host, r.Header, r.ContentLength, r.RequestURI, r.Close)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := again(tc.h)
			fast, _ := startH1(t, h)
			std := startStd(t, h)
			got, want := send(t, fast, tc.req), send(t, std, tc.req)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("fast path:\n%s\nnet/http:\n%s", got, want)
			}
		})
	}
}

// A chunk's size line is the same however full the write buffer is: it
// goes into the buffer's free space, flushed first when it would not fit
// (writeChunkSize).
func TestChunkSizeLine(t *testing.T) {
	for _, size := range []int{1, 15, 16, 255, 256, 4095, 4096, 1 << 20} {
		p := []byte(strings.Repeat("x", size))
		want := fmt.Sprintf("%x\r\n%s\r\n", size, p)
		for fill := range 64 {
			var got strings.Builder
			w := &response{o: &out{bw: bufio.NewWriterSize(&got, 64)}, chunked: true}
			filler := strings.Repeat("f", fill)
			w.o.bw.WriteString(filler)
			w.writeBody(p)
			w.flush()
			if w.err != nil {
				t.Fatal(w.err)
			}
			if got.String() != filler+want {
				t.Fatalf("chunk of %d after %d buffered bytes: %q, want %q", size, fill, got.String()[:min(got.Len(), 80)], (filler + want)[:min(len(filler+want), 80)])
			}
		}
	}
}

// A chunk costs no allocation (a parked stream's event is one).
func TestChunkAllocatesNothing(t *testing.T) {
	w := &response{o: &out{bw: bufio.NewWriterSize(io.Discard, writeBufferSize)}, chunked: true}
	p := []byte("data: {}\n\n")
	if n := testing.AllocsPerRun(100, func() { w.writeBody(p) }); n != 0 {
		t.Fatalf("%v allocations a chunk, want 0", n)
	}
}
