package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/tether-mcp/tether/internal/backend"
)

// A connection that breaks before the request's last byte left is proof
// that the backend did not get the request: tether sends it again, and the
// backend runs it once. The backend reads the head and part of a large
// body, then resets; small socket buffers on both sides keep the rest of
// the body in tether's write when the reset comes.
func TestResendAfterPartialWrite(t *testing.T) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var partial, full atomic.Int32
	serveRaw(t, ln, func(c net.Conn, n int32) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		if n == 1 {
			// Part of the body, then a reset with the rest in flight.
			io.CopyN(io.Discard, req.Body, 16<<10)
			partial.Add(1)
			c.(*net.TCPConn).SetLinger(0)
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		full.Add(1)
		io.WriteString(c, okAnswer)
	})
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096) })
		}}
		return d.DialContext(ctx, network, addr)
	}
	h := newTether(t, []string{"http://" + ln.Addr().String()}, harnessOptions{transport: backend.NewTransportDial(false, dial)})
	arg := strings.Repeat("x", 2<<20)
	resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"upload","arguments":{"data":"`+arg+`"}}}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d (%s), want 200: a request cut off before its end is sent again", resp.StatusCode, body)
	}
	if p, f := partial.Load(), full.Load(); p != 1 || f != 1 {
		t.Errorf("the backend read %d requests in part and %d in full, want 1 and 1", p, f)
	}
}
