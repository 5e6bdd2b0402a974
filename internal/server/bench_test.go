package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/testkit"
)

// BenchmarkFollowUp is one follow-up through the whole server, as the
// binary wires it: h1 in front, the proxy, the memory store, tether's
// backend client. The client and the backend are raw loops over
// pre-built bytes that allocate nothing per request, so allocs/op is the
// server's own, plumbing included.
//
//	go test -run '^$' -bench 'FollowUp$' -benchmem ./internal/server/
func BenchmarkFollowUp(b *testing.B) {
	body := `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"hello"}]}}`
	backend := testkit.CannedBackend(b, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: canned-session\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	s := startServer(b, testConfig(b, "http://"+backend))
	c, err := net.Dial("tcp", s.ClientAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: tether\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(init), init)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		b.Fatalf("initialize: %d, session %q", resp.StatusCode, sid)
	}
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`
	req := []byte(fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: tether\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: %s\r\nContent-Length: %d\r\n\r\n%s", sid, len(call), call))
	var buf []byte
	followUp := func() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if buf, err = testkit.ReadMessage(br, buf); err != nil {
			b.Fatal(err)
		}
	}
	for range 100 {
		followUp()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		followUp()
	}
}

// BenchmarkStreamOpen is one GET (SSE) stream opened through the whole
// server until it parks (issue 32): what a stream allocates on its way in
// is what the heap grows by while a thousand of them open, before any
// collection. The backend answers each stream's head from its accept loop
// and holds the connection, so the goroutines left are tether's; every
// 256 streams, with the timer stopped, all are closed. allocs/op includes
// the client's dial and the backend's accept (some 1 KB of it): the
// memory profile tells them apart. parked-B/stream is what the live heap
// held for each parked stream (the collector's count before the 256 are
// closed, less after), the test's two connections included (some 700
// bytes); -benchtime 2000x or more, for a batch to close.
//
//	go test -run '^$' -bench 'StreamOpen$' -benchtime 2000x -benchmem ./internal/server/
//	go test -run '^$' -bench 'StreamOpen$' -benchtime 2000x -memprofile /tmp/open.mem -memprofilerate 1 ./internal/server/
//	go tool pprof -sample_index alloc_space -top -focus 'tether-mcp' /tmp/open.mem
func BenchmarkStreamOpen(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	held := make(chan net.Conn, 256)
	go func() {
		buf := make([]byte, 4096)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if testkit.ReadHead(c, buf) != nil {
				c.Close()
				continue
			}
			io.WriteString(c, head)
			held <- c
		}
	}()
	s := startServer(b, testConfig(b, "http://"+ln.Addr().String()))
	addr := s.ClientAddr().String()
	req := []byte("GET /mcp HTTP/1.1\r\nHost: tether\r\nAccept: text/event-stream\r\n\r\n")
	buf := make([]byte, 4096)
	var clients, backends []net.Conn
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
		for _, c := range backends {
			c.Close()
		}
		clients, backends = clients[:0], backends[:0]
	}
	b.Cleanup(closeAll)
	base := runtime.NumGoroutine()
	// parked waits until the streams opened have parked: tether holds no
	// goroutine for them.
	parked := func() {
		deadline := time.Now().Add(20 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				b.Fatalf("%d goroutines, %d before the streams", runtime.NumGoroutine(), base)
			}
			time.Sleep(time.Millisecond)
		}
	}
	open := func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		clients = append(clients, c)
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if err := testkit.ReadHead(c, buf); err != nil {
			b.Fatalf("the stream's head: %v", err)
		}
		backends = append(backends, <-held)
		parked()
	}
	// The first streams make the pools and code paths.
	for range 16 {
		open()
	}
	closeAll()
	clients, backends = make([]net.Conn, 0, 256), make([]net.Conn, 0, 256)
	parked()

	// heap is the live heap: what the collector keeps.
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var kept, streams uint64
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		open()
		if i%256 == 255 {
			b.StopTimer()
			open := heap()
			n := len(clients)
			closeAll()
			parked()
			if closed := heap(); open > closed {
				kept, streams = kept+open-closed, streams+uint64(n)
			}
			b.StartTimer()
		}
	}
	if streams > 0 {
		b.ReportMetric(float64(kept)/float64(streams), "parked-B/stream")
	}
}
