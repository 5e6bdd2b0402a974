//go:build unix

package h1

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkServe is one request through the fast path on a keep-alive
// connection, with a handler that does to h1 what tether's proxy does: a
// body deadline set and cleared through http.ResponseController around
// the body's read, an AfterCancel on the request's context (its backend
// client's), under a cancellable base context (tether's BaseContext).
// The client is a raw loop over pre-built bytes.
//
//	go test -run '^$' -bench Serve -benchmem ./internal/h1/
func BenchmarkServe(b *testing.B) { benchServe(b, 0) }

// BenchmarkServeSendTimeout is BenchmarkServe with a SendTimeout, as
// tether serves (--client-send-timeout): the cost of the bound on each
// write.
func BenchmarkServeSendTimeout(b *testing.B) { benchServe(b, time.Minute) }

func benchServe(b *testing.B, sendTimeout time.Duration) {
	answer := `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"hello"}]}}`
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	addr, _ := startH1(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.SetReadDeadline(time.Now().Add(30 * time.Second))
		var buf [512]byte
		for {
			if _, err := r.Body.Read(buf[:]); err != nil {
				break
			}
		}
		rc.SetReadDeadline(time.Time{})
		stop := AfterCancel(r.Context(), func() {})
		defer stop()
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{fmt.Sprint(len(answer))}
		io.WriteString(w, answer)
	}), func(std *http.Server, s *Server) {
		std.BaseContext = func(net.Listener) context.Context { return base }
		s.SendTimeout = sendTimeout
	})
	c := dial(b, addr)
	c.SetDeadline(time.Time{})
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`
	req := []byte(fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: tether\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: 0123456789abcdef\r\nContent-Length: %d\r\n\r\n%s", len(call), call))
	// Every answer has the length of the first: its only varying part is
	// the Date, of fixed width.
	if _, err := c.Write(req); err != nil {
		b.Fatal(err)
	}
	first := make([]byte, 4096)
	n := 0
	for !strings.HasSuffix(string(first[:n]), answer) {
		m, err := c.Read(first[n:])
		if err != nil {
			b.Fatal(err)
		}
		n += m
	}
	buf := make([]byte, n)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for range b.N {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	// ns/op is a round trip's latency; the CPU the process spent (client
	// loop included, which is the same for any server) is the cost.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
