package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestClientLeavingAbortsTheBackendRequest: a client that closes its
// connection while its request waits for the backend's answer ends the
// backend request: tether closes that connection (h1's watch cancels the
// request, and tether's client's h1.AfterCancel closes it).
func TestClientLeavingAbortsTheBackendRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	requested, backendClosed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				// No answer: the connection stays until tether closes it.
				once.Do(func() {
					close(requested)
					io.Copy(io.Discard, br)
					close(backendClosed)
				})
			}()
		}
	}()

	s := startServer(t, testConfig(t, "http://"+ln.Addr().String()))
	c, err := net.Dial("tcp", s.ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: tether\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(init), init)
	select {
	case <-requested:
	case <-time.After(20 * time.Second):
		t.Fatal("the request did not reach the backend")
	}
	c.Close()
	select {
	case <-backendClosed:
	case <-time.After(20 * time.Second):
		t.Fatal("the backend connection stayed open after the client left")
	}
}
