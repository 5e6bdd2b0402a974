package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/testkit"
)

// Attacks on the client listener (issue 10, item 1): bodies announced and
// never sent, bodies that never finish, too many streams. Every attack is
// bounded in connections (at most 20), time (each wait has a deadline) and
// memory (the announced bodies are never sent).

const announcedBody = 4 << 20 // the default --max-body, announced by the attacks

// h2cClient speaks HTTP/2 without TLS by prior knowledge.
func h2cClient() *http.Client {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &protos, TLSClientConfig: &tls.Config{}}}
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// metricsText scrapes the admin listener.
func metricsText(t *testing.T, s *server.Server) string {
	t.Helper()
	resp, err := http.Get("http://" + s.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricValue is the value of one series in a scrape (-1 when absent).
func metricValue(text, series string) float64 {
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// checkRefusal checks a limit's answer: the status, a JSON-RPC error body,
// Retry-After on 503, and for a refused body the connection closed
// (HTTP/1.1: the rest of the body is unread).
func checkRefusal(t *testing.T, resp *http.Response, want int, bodyUnread bool) {
	t.Helper()
	if resp.StatusCode != want {
		t.Errorf("status %d, want %d", resp.StatusCode, want)
	}
	if want == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	var body struct {
		JSONRPC string `json:"jsonrpc"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.JSONRPC != "2.0" || body.Error.Code == 0 {
		t.Errorf("not a JSON-RPC error (%v): %+v", err, body)
	}
	if bodyUnread && resp.ProtoMajor == 1 && !resp.Close {
		t.Error("HTTP/1.1 refusal without Connection: close")
	}
}

// rawPost opens a connection and sends a POST's headers announcing
// contentLength bytes, followed by prefix (the part of the body that is
// sent). Its response, once one comes, arrives on the returned channel.
func rawPost(t *testing.T, addr string, contentLength int, prefix string) (net.Conn, <-chan *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", addr, contentLength, prefix)
	got := make(chan *http.Response, 1)
	go func() {
		conn.SetReadDeadline(time.Now().Add(60 * time.Second)) // bounds the goroutine
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			close(got)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		got <- resp
	}()
	return conn, got
}

// waitHeldOrRefused waits until the proxy has reserved more than prev body
// bytes (the request is held, waiting for its body) or the request was
// answered (refused). It returns the response, nil if held.
func waitHeldOrRefused(t *testing.T, s *server.Server, prev int64, answered <-chan *http.Response) *http.Response {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case resp, ok := <-answered:
			if !ok {
				t.Fatal("connection closed without an answer")
			}
			return resp
		case <-deadline:
			t.Fatal("request neither held nor refused")
		case <-time.After(5 * time.Millisecond):
			if s.LimitStats().InflightBodyBytes > prev {
				return nil
			}
		}
	}
}

// Bodies announced with Content-Length and never sent reserve a small
// chunk each, not their announced size; once the in-flight budget is
// spent, new requests get 503 (and Connection: close) instead of memory.
// Old main allocated every announced body in full before a byte arrived.
func TestAnnouncedBodiesHTTP1(t *testing.T) {
	const budget, attackers = 128 << 10, 20
	s := startServerWith(t, func(c *config) {
		c.MaxInflightBodyBytes = budget
		c.BodyTimeout = time.Minute // this test is about memory; see TestBodyTimeout
	}, testkit.PingBackend(t).URL)
	addr := s.ClientAddr().String()

	before := heapInUse()
	var held []net.Conn
	refused := 0
	for range attackers {
		prev := s.LimitStats().InflightBodyBytes
		conn, answered := rawPost(t, addr, announcedBody, "")
		resp := waitHeldOrRefused(t, s, prev, answered)
		if resp == nil {
			held = append(held, conn)
		} else {
			refused++
			checkRefusal(t, resp, http.StatusServiceUnavailable, true)
		}
		if got := s.LimitStats().InflightBodyBytes; got > budget {
			t.Fatalf("%d body bytes in flight, over the %d budget", got, budget)
		}
	}
	if grown := int64(heapInUse()) - int64(before); grown > 8<<20 {
		t.Errorf("heap grew by %d MiB for %d announced bodies", grown>>20, len(held))
	}
	if refused == 0 || len(held) == 0 {
		t.Fatalf("%d held, %d refused: want the budget to hold some and refuse the rest", len(held), refused)
	}
	t.Logf("%d requests held, %d refused", len(held), refused)

	// At the bound, an ordinary request is refused too; once the held
	// requests end, it passes again.
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	if s.LimitStats().InflightBodyBytes+int64(len(ping)) > budget {
		resp, err := http.Post("http://"+addr+"/mcp", "application/json", strings.NewReader(ping))
		if err != nil {
			t.Fatal(err)
		}
		checkRefusal(t, resp, http.StatusServiceUnavailable, true)
		resp.Body.Close()
		refused++
	}
	for _, c := range held {
		c.Close()
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return s.LimitStats().InflightBodyBytes == 0 }, "held bodies released")
	resp, err := http.Post("http://"+addr+"/mcp", "application/json", strings.NewReader(ping))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("after the attack: %d, want 200", resp.StatusCode)
	}
	if got := metricValue(metricsText(t, s), `tether_limit_rejections_total{limit="inflight_body"}`); got != float64(refused) {
		t.Errorf("tether_limit_rejections_total{limit=inflight_body} = %v, want %d", got, refused)
	}
}

// The same over h2c: many streams on a connection, each announcing a body
// it never sends (old main: 4 connections × 250 such streams, 4.2 GB).
func TestAnnouncedBodiesH2C(t *testing.T) {
	const budget, attackers = 128 << 10, 20
	s := startServerWith(t, func(c *config) {
		c.MaxInflightBodyBytes = budget
		c.BodyTimeout = time.Minute
	}, testkit.PingBackend(t).URL)
	url := "http://" + s.ClientAddr().String() + "/mcp"
	client := h2cClient()
	t.Cleanup(client.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	before := heapInUse()
	var bodies []*io.PipeWriter
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	held, refused := 0, 0
	for range attackers {
		pr, pw := io.Pipe()
		bodies = append(bodies, pw)
		t.Cleanup(func() { pw.Close() })
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = announcedBody
		req.Header.Set("Content-Type", "application/json")
		answered := make(chan *http.Response, 1)
		prev := s.LimitStats().InflightBodyBytes
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Do(req)
			if err != nil {
				close(answered)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(strings.NewReader(string(body)))
			answered <- resp
		}()
		resp := waitHeldOrRefused(t, s, prev, answered)
		if resp == nil {
			held++
		} else {
			refused++
			if resp.ProtoMajor != 2 {
				t.Fatalf("answered over %s, want HTTP/2", resp.Proto)
			}
			checkRefusal(t, resp, http.StatusServiceUnavailable, true)
		}
		if got := s.LimitStats().InflightBodyBytes; got > budget {
			t.Fatalf("%d body bytes in flight, over the %d budget", got, budget)
		}
	}
	if grown := int64(heapInUse()) - int64(before); grown > 8<<20 {
		t.Errorf("heap grew by %d MiB for %d announced bodies", grown>>20, held)
	}
	if refused == 0 || held == 0 {
		t.Fatalf("%d held, %d refused: want the budget to hold some and refuse the rest", held, refused)
	}
	cancel()
	for _, pw := range bodies {
		pw.CloseWithError(errors.New("test over"))
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return s.LimitStats().InflightBodyBytes == 0 }, "held bodies released")
}

// A body that starts and never finishes is given --body-timeout, then
// answered 408 and its connection closed (HTTP/1.1) or its stream ended
// (h2c). Old main waited for ever (connections open after 150 s).
func TestBodyTimeout(t *testing.T) {
	s := startServerWith(t, func(c *config) { c.BodyTimeout = 500 * time.Millisecond }, testkit.PingBackend(t).URL)
	addr := s.ClientAddr().String()
	const slow = 3

	t.Run("HTTP/1.1", func(t *testing.T) {
		var answers []<-chan *http.Response
		var conns []net.Conn
		for range slow {
			conn, answered := rawPost(t, addr, announcedBody, `{"jsonrpc":"2.0","id":1,`)
			conns, answers = append(conns, conn), append(answers, answered)
		}
		for i, answered := range answers {
			resp, ok := <-answered // the reader has a 60 s deadline
			if !ok {
				t.Fatalf("connection %d closed without an answer", i)
			}
			checkRefusal(t, resp, http.StatusRequestTimeout, true)
			// And the connection is closed: nothing more to read.
			conns[i].SetReadDeadline(time.Now().Add(20 * time.Second))
			if n, err := conns[i].Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Errorf("connection %d after the 408: read %d, %v; want EOF", i, n, err)
			}
		}
	})

	t.Run("h2c", func(t *testing.T) {
		client := h2cClient()
		defer client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for range slow {
			pr, pw := io.Pipe()
			defer pw.Close()
			go pw.Write([]byte(`{"jsonrpc":"2.0","id":1,`)) // then nothing
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/mcp", pr)
			req.ContentLength = announcedBody
			wg.Go(func() {
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("h2c: %v", err)
					return
				}
				defer resp.Body.Close()
				checkRefusal(t, resp, http.StatusRequestTimeout, true)
			})
		}
		wg.Wait()
	})

	testkit.Eventually(t, 10*time.Second, func() bool { return s.LimitStats().InflightBodyBytes == 0 }, "bodies released")
	if got := metricValue(metricsText(t, s), `tether_limit_rejections_total{limit="body_timeout"}`); got != 2*slow {
		t.Errorf("tether_limit_rejections_total{limit=body_timeout} = %v, want %d", got, 2*slow)
	}
}

// sseBackend answers every request with an event stream: events events,
// gap apart (events < 0: none, and the stream stays open until the client
// leaves or the test ends).
func sseBackend(t *testing.T, events int, gap time.Duration) *httptest.Server {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for i := range events {
			select {
			case <-time.After(gap):
			case <-r.Context().Done():
				return
			case <-stop:
				return
			}
			fmt.Fprintf(w, "id: %d\ndata: {\"n\":%d}\n\n", i, i)
			w.(http.Flusher).Flush()
		}
		if events < 0 {
			select {
			case <-r.Context().Done():
			case <-stop:
			}
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs first: handlers return, Close does not wait
	return srv
}

// The body deadline ends with the body: a response streamed for longer
// than --body-timeout arrives whole, over HTTP/1.1 and h2c. A read deadline
// in force while the server's background read runs would cancel the
// request and cut the stream (golang/go#70834). This guards the property;
// old main had no body deadline to get wrong.
func TestBodyTimeoutSparesLongResponses(t *testing.T) {
	const events = 5
	backend := sseBackend(t, events, 250*time.Millisecond) // 1.25 s > the body timeout
	s := startServerWith(t, func(c *config) { c.BodyTimeout = 500 * time.Millisecond }, backend.URL)
	url := "http://" + s.ClientAddr().String() + "/mcp"
	for name, client := range map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "h2c": h2cClient()} {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("stream cut after %q: %v", body, err)
			}
			if got := strings.Count(string(body), "data: "); resp.StatusCode != 200 || got != events {
				t.Errorf("%d with %d of %d events: %q", resp.StatusCode, got, events, body)
			}
		})
	}
}

// --max-streams caps the GET streams open at once: one more gets 503 with
// Retry-After, counted; when a stream ends, its slot is free again.
func TestStreamCap(t *testing.T) {
	const maxStreams = 3
	backend := sseBackend(t, -1, 0)
	s := startServerWith(t, func(c *config) { c.MaxStreams = maxStreams }, backend.URL)
	url := "http://" + s.ClientAddr().String() + "/mcp"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(client *http.Client) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	h2c := h2cClient()
	defer h2c.CloseIdleConnections()
	var streams []*http.Response
	for i := range maxStreams {
		client := http.DefaultClient
		if i%2 == 1 {
			client = h2c // the cap counts streams, whatever carries them
		}
		resp := open(client)
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		streams = append(streams, resp)
	}
	if got := s.LimitStats().OpenStreams; got != maxStreams {
		t.Errorf("%d open streams counted, want %d", got, maxStreams)
	}
	for _, client := range []*http.Client{http.DefaultClient, h2c} {
		resp := open(client)
		checkRefusal(t, resp, http.StatusServiceUnavailable, false)
		resp.Body.Close()
	}
	text := metricsText(t, s)
	if got := metricValue(text, `tether_limit_rejections_total{limit="streams"}`); got != 2 {
		t.Errorf("tether_limit_rejections_total{limit=streams} = %v, want 2", got)
	}
	if got := metricValue(text, "tether_open_streams"); got != maxStreams {
		t.Errorf("tether_open_streams = %v, want %d", got, maxStreams)
	}

	streams[0].Body.Close()
	testkit.Eventually(t, 10*time.Second, func() bool { return s.LimitStats().OpenStreams == maxStreams-1 }, "the closed stream's slot freed")
	resp := open(http.DefaultClient)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("after a stream ended: %d, want 200", resp.StatusCode)
	}
}

// A subscriptions/listen stream (MCP 2026-07-28) takes a --max-streams
// slot as a GET stream does, and is refused past the cap.
func TestStreamCapCountsListenStreams(t *testing.T) {
	const maxStreams = 2
	backend := sseBackend(t, -1, 0)
	s := startServerWith(t, func(c *config) { c.MaxStreams = maxStreams }, backend.URL)
	url := "http://" + s.ClientAddr().String() + "/mcp"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const body = `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"notifications":{"toolsListChanged":true}}}`
	listen := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "subscriptions/listen")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var open []*http.Response
	for i := range maxStreams {
		resp := listen()
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("listen stream %d: %d", i, resp.StatusCode)
		}
		open = append(open, resp)
	}
	if got := s.LimitStats().OpenStreams; got != maxStreams {
		t.Errorf("%d open streams counted, want %d", got, maxStreams)
	}
	resp := listen()
	checkRefusal(t, resp, http.StatusServiceUnavailable, false)
	resp.Body.Close()

	open[0].Body.Close()
	testkit.Eventually(t, 10*time.Second, func() bool { return s.LimitStats().OpenStreams == maxStreams-1 }, "the closed listen stream's slot freed")
}

// An initialize over --max-init-body, or sent to a Host or path too long
// to keep with its session, is refused before it is stored or forwarded,
// and counted with the other limits.
func TestInitializeLimitsCounted(t *testing.T) {
	backend := testkit.PingBackend(t)
	s := startServerWith(t, func(c *config) { c.MaxInitBody = 1024 }, backend.URL)
	url := "http://" + s.ClientAddr().String() + "/mcp"
	big := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"` + strings.Repeat("x", 2048) + `","version":"1"}}}`
	resp, err := http.Post(url, "application/json", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	checkRefusal(t, resp, http.StatusRequestEntityTooLarge, false)
	resp.Body.Close()

	small := `{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`
	resp, err = http.Post(url+"/"+strings.Repeat("p", 9000), "application/json", strings.NewReader(small))
	if err != nil {
		t.Fatal(err)
	}
	checkRefusal(t, resp, http.StatusBadRequest, false)
	resp.Body.Close()

	text := metricsText(t, s)
	for _, series := range []string{`tether_limit_rejections_total{limit="init_body_size"}`, `tether_limit_rejections_total{limit="init_address"}`} {
		if got := metricValue(text, series); got != 1 {
			t.Errorf("%s = %v, want 1", series, got)
		}
	}
}
