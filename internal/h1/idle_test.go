package h1

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"
)

// A keep-alive connection waiting for its next request holds no read
// buffer: after a request each, idle connections cost less heap, both of
// their ends together, than one read buffer apiece.
func TestIdleConnectionsHoldNoReadBuffer(t *testing.T) {
	if raceEnabled {
		t.Skip("heap figures are the race detector's own")
	}
	addr, s := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	const n = 400
	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // the pools' victims too
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	conns := make([]net.Conn, n)
	for i := range conns {
		c := dial(t, addr)
		conns[i] = c
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Every connection of the server waits for a request.
	for deadline := time.Now().Add(30 * time.Second); ; {
		idle := 0
		s.mu.Lock()
		for c := range s.conns {
			if c.state.Load() == stateIdle {
				idle++
			}
		}
		s.mu.Unlock()
		if idle == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections idle", idle, n)
		}
		time.Sleep(time.Millisecond)
	}
	per := (int64(heap()) - int64(before)) / n
	t.Logf("%d idle connections: %d bytes of heap each, both ends", n, per)
	if per >= readBufferSize {
		t.Errorf("an idle connection costs %d bytes of heap, as much as a read buffer (%d)", per, readBufferSize)
	}
	runtime.KeepAlive(conns)
}
