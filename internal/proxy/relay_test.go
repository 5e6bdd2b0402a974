package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/testkit"
)

// Every event reaches the client before the backend writes the next one:
// the backend writes event N and then waits until the client has read it.
// A relay that held an event back (for a buffer to fill, a timer, the end
// of the stream) would leave both waiting until the deadline.
func TestEventsRelayedOneByOne(t *testing.T) {
	const events = 5
	for _, tc := range []struct {
		name   string
		method string
		eol    string
		split  bool // the blank line that ends an event comes in a write of its own
	}{
		{"post", http.MethodPost, "\n", false},
		{"post-crlf", http.MethodPost, "\r\n", false},
		{"post-split", http.MethodPost, "\n", true},
		{"post-split-crlf", http.MethodPost, "\r\n", true},
		{"get", http.MethodGet, "\n", false},
		{"get-split", http.MethodGet, "\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan int, events)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				flush := w.(http.Flusher).Flush
				for i := range events {
					fmt.Fprintf(w, "event: message%sdata: {\"n\":%d}%s", tc.eol, i, tc.eol)
					if tc.split {
						flush()
					}
					io.WriteString(w, tc.eol)
					flush()
					select {
					case n := <-seen:
						if n != i {
							return // the client saw the wrong event; it reports it
						}
					case <-r.Context().Done():
						return
					}
				}
			}))
			t.Cleanup(srv.Close)
			h := newStaticHarness(t, srv.URL)

			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var body io.Reader
			if tc.method == http.MethodPost {
				body = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}`)
			}
			req, err := http.NewRequestWithContext(ctx, tc.method, h.endpoint(), body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			sc := bufio.NewScanner(resp.Body)
			next := 0
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				var n int
				if _, err := fmt.Sscanf(data, `{"n":%d}`, &n); err != nil || n != next {
					t.Fatalf("event %q, want n=%d", data, next)
				}
				// The data line alone is not the event: wait for its end.
				if !sc.Scan() || sc.Text() != "" {
					t.Fatalf("event %d not ended by a blank line", n)
				}
				seen <- n
				next++
			}
			if next != events {
				t.Fatalf("the client saw %d of %d events before the stream ended (%v): an event was held back", next, events, sc.Err())
			}
		})
	}
}

// A GET stream's headers reach the client at once, before any event, so
// that the client knows its stream is open.
func TestStreamHeadersReachClientAtOnce(t *testing.T) {
	opened := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-opened:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: {}\n\n")
	}))
	t.Cleanup(srv.Close)
	h := newStaticHarness(t, srv.URL)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.endpoint(), nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no headers while the backend waits for the client to see them: %v", err)
	}
	defer resp.Body.Close()
	close(opened)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: {}\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
}

// countingListener counts the writes to every connection it accepts.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1) // before the write: the client may read it before Write returns
	return c.Conn.Write(p)
}

// An answer the backend has completed reaches the client in one write:
// headers, body and end together, whatever its content type. (A one-event
// SSE answer used to take three: the headers alone, the event, the final
// chunk.)
func TestCompleteAnswerInOneWrite(t *testing.T) {
	event := "event: message\ndata: " + `{"jsonrpc":"2.0","id":1,"result":{"text":"` + strings.Repeat("x", 3000) + `"}}` + "\n\n"
	for _, tc := range []struct {
		name, contentType, body string
	}{
		{"json", "application/json", `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{"sse-one-event", "text/event-stream", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"},
		// Longer than the backend server buffers before it chunks: a chunked
		// answer whose end arrives with its event.
		{"sse-chunked", "text/event-stream", event},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", tc.contentType)
				io.WriteString(w, tc.body) // no flush: the answer leaves whole
			}))
			t.Cleanup(srv.Close)
			h := newStaticHarness(t, srv.URL)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cl := &countingListener{Listener: ln}
			front := testkit.StartFront(t, h.proxy, cl)

			for i := range 3 {
				before := cl.writes.Load()
				req, _ := http.NewRequest(http.MethodPost, front.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(got) != tc.body {
					t.Fatalf("body %.60q…, %v", got, err)
				}
				if n := cl.writes.Load() - before; n != 1 {
					t.Errorf("request %d: answer sent in %d writes, want 1", i, n)
				}
			}
		})
	}
}

// The backend's hop-by-hop headers stop at tether, its other headers and
// its trailers (announced or not) reach the client.
func TestAnswerHeadersAndTrailersRelayed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Connection", "X-Backend-Hop")
		h.Set("X-Backend-Hop", "must not pass")
		h.Set("Keep-Alive", "timeout=5")
		h.Add("X-Kept", "a")
		h.Add("X-Kept", "b")
		h.Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
		h.Set("X-Checksum", "c0ffee")
		h.Set(http.TrailerPrefix+"X-Late", "unannounced")
	}))
	t.Cleanup(srv.Close)
	h := newStaticHarness(t, srv.URL)

	resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != `{"jsonrpc":"2.0","id":1,"result":{}}` {
		t.Fatalf("body %q, %v", body, err)
	}
	if got := resp.Header.Values("X-Kept"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("X-Kept %q, want [a b]", got)
	}
	for _, name := range []string{"X-Backend-Hop", "Keep-Alive"} {
		if v := resp.Header.Get(name); v != "" {
			t.Errorf("client got hop-by-hop %s: %q", name, v)
		}
	}
	if got := resp.Trailer.Get("X-Checksum"); got != "c0ffee" {
		t.Errorf("announced trailer X-Checksum %q, want c0ffee", got)
	}
	if got := resp.Trailer.Get("X-Late"); got != "unannounced" {
		t.Errorf("unannounced trailer X-Late %q", got)
	}
}

// opaqueTransport hides tether's own client from the proxy: the answers
// come through RoundTrip, as an *http.Response with a header map, as any
// other transport's would.
type opaqueTransport struct{ http.RoundTripper }

// An answer's header reaches the client the same whichever way it went:
// read by tether's client as fields and adopted by h1's writer, read into
// a map by another transport, or copied into net/http's writer. On every
// way the hop-by-hop fields stop at tether, the others pass in order, the
// session id is the client's after the session moved to a new backend
// session, and two session ids are refused.
func TestAnswerHeaderAlikeOnEveryPath(t *testing.T) {
	const result = `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}`
	var minted atomic.Int32
	var known sync.Map // the backend's live session ids
	upstream := testkit.StartServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := w.Header()
		switch {
		case strings.Contains(string(body), `"method":"initialize"`):
			sid := fmt.Sprintf("backend-%d", minted.Add(1))
			known.Store(sid, true)
			h.Set("Mcp-Session-Id", sid)
			h.Set("Content-Type", "application/json")
			io.WriteString(w, result)
			return
		case strings.Contains(string(body), `"method":"notifications/initialized"`):
			w.WriteHeader(http.StatusAccepted)
			return
		}
		sid := r.Header.Get("Mcp-Session-Id")
		if _, ok := known.Load(sid); !ok {
			http.Error(w, "session not found", http.StatusNotFound)
			return
		}
		h.Set("Content-Type", "application/json")
		h.Set("Mcp-Session-Id", sid)
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "must not pass")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Proxy-Authenticate", "Basic")
		h.Add("X-Kept", "a")
		h.Set("X-Other", "o")
		h.Add("X-Kept", "b")
		if strings.Contains(string(body), "twice") {
			h.Add("Mcp-Session-Id", "another")
		}
		io.WriteString(w, result)
	}))

	type seen struct {
		Moved     http.Header // a follow-up's answer after the session moved
		Refused   int         // the status of an answer with two session ids
		RefusedID []string
	}
	ctx := testContext(t)
	run := func(t *testing.T, opaque, netHTTPFront bool) seen {
		t.Helper()
		o := harnessOptions{}
		if opaque {
			o.transport = opaqueTransport{backend.NewTransport(false)}
		}
		h := newTether(t, []string{upstream.URL}, o)
		url := h.endpoint()
		if netHTTPFront {
			url = testkit.StartServer(t, h.proxy).URL + "/mcp"
		}
		client := &http.Client{}
		status, hdr, _, err := mcpPost(ctx, client, url, "", initializeBody)
		sid := hdr.Get("Mcp-Session-Id")
		if err != nil || status != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d %v %v", status, hdr, err)
		}
		known.Delete(sid) // the backend lost it: tether re-initializes
		status, moved, _, err := mcpPost(ctx, client, url, sid, whoamiBody)
		if err != nil || status != http.StatusOK {
			t.Fatalf("follow-up after the backend lost the session: %d %v", status, err)
		}
		delete(moved, "Date")
		status, refused, _, err := mcpPost(ctx, client, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"twice","arguments":{}}}`)
		if err != nil {
			t.Fatal(err)
		}
		return seen{Moved: moved, Refused: status, RefusedID: refused.Values("Mcp-Session-Id")}
	}

	want := seen{
		Moved: http.Header{
			"Content-Type":   {"application/json"},
			"Content-Length": {fmt.Sprint(len(result))},
			"X-Kept":         {"a", "b"},
			"X-Other":        {"o"},
		},
		Refused: http.StatusBadGateway,
	}
	for _, tc := range []struct {
		name                 string
		opaque, netHTTPFront bool
	}{
		{"fields adopted by h1", false, false},
		{"map of another transport", true, false},
		{"fields into net/http's writer", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := minted.Load() + 1 // the id the client keeps
			want.Moved["Mcp-Session-Id"] = []string{fmt.Sprintf("backend-%d", first)}
			got := run(t, tc.opaque, tc.netHTTPFront)
			if minted.Load() != first+1 {
				t.Fatalf("backend minted %d session ids, want 2: the session did not move", minted.Load()-first+1)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("client saw\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}
