package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/testkit"
)

// BenchmarkParkedStreamEvent is one event through a parked GET stream:
// the backend writes it, the poller wakes the stream, which relays it to
// the client and parks again. The backend and the client are raw sockets
// that allocate nothing per event, so -benchmem's allocations are
// tether's (issue 32: a parked stream's event takes its buffer from a
// pool and allocates nothing else).
func BenchmarkParkedStreamEvent(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	h := newTether(b, []string{"http://" + ln.Addr().String()}, harnessOptions{})

	client, err := net.Dial("tcp", strings.TrimPrefix(h.front.URL, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	client.SetDeadline(time.Now().Add(5 * time.Minute))
	io.WriteString(client, "GET /mcp HTTP/1.1\r\nHost: tether\r\nAccept: text/event-stream\r\n\r\n")

	var backend net.Conn
	select {
	case backend = <-accepted:
	case <-time.After(20 * time.Second):
		b.Fatal("tether did not reach the backend")
	}
	b.Cleanup(func() { backend.Close() })
	backend.SetDeadline(time.Now().Add(5 * time.Minute))
	if err := testkit.ReadHead(backend, make([]byte, 4096)); err != nil {
		b.Fatalf("reading tether's request: %v", err)
	}
	io.WriteString(backend, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	br := bufio.NewReader(client)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("stream head: %v %v", resp, err)
	}
	if br.Buffered() > 0 {
		b.Fatal("bytes past the head before any event")
	}

	data := "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"ping\"}}\n\n"
	event := []byte(fmt.Sprintf("%x\r\n%s\r\n", len(data), data))
	// tether relays the event as one chunk of its own: the same bytes.
	got := make([]byte, len(event))
	relay := func() {
		if _, err := backend.Write(event); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(client, got); err != nil {
			b.Fatal(err)
		}
		if !bytes.Equal(got, event) {
			b.Fatalf("relayed %q, want %q", got, event)
		}
	}
	// The stream parks (no goroutine of tether's left) before the first.
	deadline := time.Now().Add(20 * time.Second)
	for tetherGoroutines() > 4 {
		if time.Now().After(deadline) {
			b.Fatal("the stream did not park")
		}
		time.Sleep(10 * time.Millisecond)
	}
	relay()

	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		relay()
	}
}
