package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
)

// BenchmarkFollowUp is one follow-up through the whole server, as the
// binary wires it: h1 in front, the proxy, the memory store, tether's
// backend client. The client and the backend are raw loops over
// pre-built bytes that allocate nothing per request, so allocs/op is the
// server's own, plumbing included.
//
//	go test -run '^$' -bench 'FollowUp$' -benchmem ./internal/server/
func BenchmarkFollowUp(b *testing.B) {
	backend := cannedBackend(b)
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
		if buf, err = readCanned(br, buf); err != nil {
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

// cannedBackend answers every request with a JSON-RPC result of known
// length and a session id, from bytes built once.
func cannedBackend(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	body := `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"hello"}]}}`
	answer := []byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: canned-session\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
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
					if buf, err = readCanned(br, buf); err != nil {
						return
					}
					if _, err := c.Write(answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// readCanned reads one HTTP message with a Content-Length body (or none)
// into buf, allocating only to grow it.
func readCanned(br *bufio.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	length := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return buf, err
		}
		if len(line) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return buf, err
			}
		}
	}
	buf = append(buf, make([]byte, length)...)
	_, err := io.ReadFull(br, buf[:length])
	return buf, err
}
