package proxy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// resetBackend is a raw HTTP/1.1 backend: each request it reads in full
// is counted, and answered with okAnswer, or, when answer returns false,
// the connection is reset (SO_LINGER 0).
func resetBackend(t *testing.T, answer func(n int32) bool) (addr string, runs *atomic.Int32) {
	return rawAnswerBackend(t, func(c net.Conn, n int32) bool {
		if !answer(n) {
			c.(*net.TCPConn).SetLinger(0)
			return false
		}
		_, err := io.WriteString(c, okAnswer)
		return err == nil
	})
}

// rawAnswerBackend is a raw HTTP/1.1 backend: each request it reads in
// full is counted and given to answer with the connection, to write its
// answer; the connection is closed when answer returns false.
func rawAnswerBackend(t *testing.T, answer func(c net.Conn, n int32) bool) (addr string, runs *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runs = new(atomic.Int32)
	serveRaw(t, ln, func(c net.Conn, _ int32) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return
			}
			if !answer(c, runs.Add(1)) {
				return
			}
		}
	})
	return ln.Addr().String(), runs
}

// serveRaw accepts connections on ln and gives each, with its number (1
// for the first), to serve on a goroutine of its own; the connection is
// closed when serve returns. At the test's end ln and every connection are
// closed, and the goroutines waited for.
func serveRaw(t *testing.T, ln net.Listener, serve func(c net.Conn, n int32)) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	var accepted int32
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			accepted++
			n := accepted
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				serve(c, n)
			})
		}
	})
}

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n" + `{"jsonrpc":"2.0","id":1,"result":{}}`

// The retry contract through the whole path (retry.go): a backend reads a
// request in full, then resets the connection without answering
// (SO_LINGER 0): what a backend that ran a call and aborted does, or a
// crashing sidecar, a mesh proxy, a middlebox. A tools/call reaches the
// backend once and the client gets a 502 that says it was not retried; a
// read-only method, or a request with an Idempotency-Key, is sent again.
// (Issue 29: the tools/call ran three times.)
func TestAtMostOnceAfterReset(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		header   []string
		resets   int32 // the backend resets this many requests, then answers
		wantRuns int32 // requests the backend read in full
		wantOK   bool
		wantMsg  string // in the 502's JSON-RPC error message
	}{
		{
			name:     "tools/call",
			body:     `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge"}}`,
			resets:   100,
			wantRuns: 1,
			wantMsg:  "not retried",
		},
		{
			name:     "tools/call, reset once",
			body:     `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge"}}`,
			resets:   1,
			wantRuns: 1,
			wantMsg:  "not retried",
		},
		{
			name:     "tools/list, reset twice",
			body:     `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
			resets:   2,
			wantRuns: 3,
			wantOK:   true,
		},
		{
			name:     "resources/read, always reset",
			body:     `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}`,
			resets:   100,
			wantRuns: 3, // sent twice again
			wantMsg:  "idempotent and was sent 3 times",
		},
		{
			name:     "tools/call with an Idempotency-Key",
			body:     `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge"}}`,
			header:   []string{"Idempotency-Key", "order-7"},
			resets:   1,
			wantRuns: 2,
			wantOK:   true,
		},
		{
			name:     "batch of read-only methods",
			body:     `[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"ping"}]`,
			resets:   1,
			wantRuns: 1,
			wantMsg:  "not retried",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, runs := resetBackend(t, func(n int32) bool { return n > tt.resets })
			h := newTether(t, []string{"http://" + addr}, harnessOptions{})
			resp := h.post("", tt.body, tt.header...)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ok := resp.StatusCode == http.StatusOK; ok != tt.wantOK {
				t.Fatalf("status %d (%s), want success %v", resp.StatusCode, body, tt.wantOK)
			}
			if n := runs.Load(); n != tt.wantRuns {
				t.Errorf("the backend read the request %d times, want %d", n, tt.wantRuns)
			}
			if tt.wantOK {
				return
			}
			if resp.StatusCode != http.StatusBadGateway {
				t.Errorf("status %d, want 502", resp.StatusCode)
			}
			var msg struct {
				Error struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &msg); err != nil || msg.Error.Code != -32010 || !strings.Contains(msg.Error.Message, tt.wantMsg) {
				t.Errorf("answer %s; want JSON-RPC error -32010 saying %q", body, tt.wantMsg)
			}
		})
	}
}

// An answer whose body breaks before its first byte (a bad chunk size, a
// connection cut after the head) is a 502 with a JSON-RPC error, not a
// client connection cut with nothing on it (issue 29, item 11).
func TestAnswerBrokenBeforeItsBodyIs502(t *testing.T) {
	for name, answer := range map[string]string{
		"bad chunk size": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
		"cut after head": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			addr, _ := rawAnswerBackend(t, func(c net.Conn, _ int32) bool {
				io.WriteString(c, answer)
				return false
			})
			h := newTether(t, []string{"http://" + addr}, harnessOptions{})
			resp, err := h.tryPost("", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`)
			if err != nil {
				t.Fatalf("no answer at all: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "-32010") {
				t.Fatalf("status %d %s, want 502 with JSON-RPC error -32010", resp.StatusCode, body)
			}
		})
	}
}

// An answer whose framing is ambiguous is a 502 and its connection is never
// reused: no byte the backend sent after what one reading calls its end
// reaches the next request, whoever sends it (issue 29, item 11: with
// "Transfer-Encoding : chunked" beside a Content-Length, net/http's reader
// framed the answer by the length, and the rest of the chunked body was
// served as the answer to the next request on the pooled connection).
func TestAmbiguousAnswerCrossesNoRequest(t *testing.T) {
	smuggled := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n" + `{"jsonrpc":"2.0","id":1,"result":"STOLEN"}`
	for name, answer := range map[string]string{
		"space before colon": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding : chunked\r\n\r\n" +
			fmt.Sprintf("4\r\n{}\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(smuggled), smuggled),
		"two lengths":  "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 4\r\n\r\n{}\r\n" + smuggled,
		"status 000":   "HTTP/1.1 000 OK\r\nContent-Length: 2\r\n\r\n{}" + smuggled,
		"TE beside CL": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}" + smuggled,
	} {
		t.Run(name, func(t *testing.T) {
			addr, runs := rawAnswerBackend(t, func(c net.Conn, n int32) bool {
				if n == 1 {
					_, err := io.WriteString(c, answer)
					return err == nil // and keep the connection open
				}
				_, err := io.WriteString(c, okAnswer)
				return err == nil
			})
			h := newTether(t, []string{"http://" + addr}, harnessOptions{})
			resp, err := h.tryPost("", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}}`)
			if err != nil {
				t.Fatalf("first client: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "malformed answer") {
				t.Errorf("first client: %d %s, want 502 saying the answer was malformed", resp.StatusCode, body)
			}
			// Another client, on a connection of its own.
			other := &http.Client{Transport: &http.Transport{}}
			defer other.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodPost, h.endpoint(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"b"}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err = other.Do(req)
			if err != nil {
				t.Fatalf("second client: %v", err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "STOLEN") {
				t.Errorf("second client: %d %s, want its own answer", resp.StatusCode, body)
			}
			if n := runs.Load(); n != 2 {
				t.Errorf("the backend read %d requests, want 2 (none sent again)", n)
			}
		})
	}
}
