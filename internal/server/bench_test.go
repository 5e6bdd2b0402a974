package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

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
