package proxy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// jsonrpcError decodes a JSON-RPC error answer.
func jsonrpcError(t *testing.T, resp *http.Response) (code int, id json.RawMessage) {
	t.Helper()
	defer resp.Body.Close()
	var body struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("error body is not JSON: %v", err)
	}
	if body.JSONRPC != "2.0" || body.Error.Message == "" {
		t.Errorf("not a JSON-RPC error: %+v", body)
	}
	return body.Error.Code, body.ID
}

func TestBadInput(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 2, maxBody: 1024})
	ctx := testContext(t)
	cs := h.connect(ctx) // a live session, to show that it survives
	defer cs.Close()

	tests := []struct {
		name       string
		sid        string
		body       string
		wantStatus int
		wantCode   int
		wantID     string
	}{
		{"not JSON", "", `{"jsonrpc":"2.0",`, 400, -32700, "null"},
		{"not JSON-RPC", "", `{"hello":"world"}`, 400, -32600, "null"},
		{"wrong version", "", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, 400, -32600, "null"},
		{"method not a string", "", `{"jsonrpc":"2.0","id":1,"method":5}`, 400, -32600, "null"},
		{"empty batch", "", `[]`, 400, -32600, "null"},
		{"bad batch member", "", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"x":1}]`, 400, -32600, "null"},
		{"empty body", "", ``, 400, -32600, "null"},
		{"too large", "", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":"` + strings.Repeat("a", 2000) + `"}}`, 413, -32600, "null"},
		{"session id with a space", "a b", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 400, -32600, "null"},
		{"session id too long", strings.Repeat("x", 257), `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 400, -32600, "null"},
		{"unknown session", "no-such-session", `{"jsonrpc":"2.0","id":3,"method":"ping"}`, 404, -32001, "null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := h.post(tt.sid, tt.body)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			code, id := jsonrpcError(t, resp)
			if code != tt.wantCode || string(id) != tt.wantID {
				t.Errorf("error code %d id %s, want %d id %s", code, id, tt.wantCode, tt.wantID)
			}
		})
	}
	// Nothing bad reached a backend: each saw only the live session's traffic.
	if _, err := whoami(ctx, cs); err != nil {
		t.Errorf("live session after bad input: %v", err)
	}
	assertHealthy(t, h)
}

// A body over the limit is refused from its Content-Length, before it is
// sent: tether answers while the client is still blocked writing.
func TestOversizedBodyRefusedWithoutReadingIt(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 1, maxBody: 1024})
	conn, err := net.Dial("tcp", h.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const declared = 64 << 20
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"jsonrpc\":", h.front.Listener.Addr(), declared)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", resp.StatusCode)
	}
	if !resp.Close {
		t.Error("connection left open with an unread body")
	}
	assertHealthy(t, h)
}

// Content-Length together with Transfer-Encoding is the classic request
// smuggling vector. Go's server keeps the chunked framing and drops the
// Content-Length before a handler can see it, so tether never lets the
// connection carry another request: whatever follows the chunked body is
// never read, and so never forwarded.
func TestContentLengthWithTransferEncodingNeverSmuggles(t *testing.T) {
	var seen []string
	backend := newRecordingBackend(t, func(r *http.Request) { seen = append(seen, r.Method+" "+r.URL.Path) })
	h := newStaticHarness(t, backend.URL)
	conn, err := net.Dial("tcp", h.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n%s",
		len(body)+5, len(body), body, smuggled)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !resp.Close {
		t.Error("the connection stays open after a chunked request")
	}
	if _, err := http.ReadResponse(br, nil); err == nil {
		t.Error("a second response came back on the connection: the trailing bytes were read as a request")
	}
	for _, s := range seen {
		if strings.Contains(s, "smuggled") {
			t.Errorf("backend received the smuggled request %q", s)
		}
	}
	assertHealthyStatic(t, h)
}

// assertHealthy checks that tether still routes a new session end to end.
func assertHealthy(t *testing.T, h *harness) {
	t.Helper()
	ctx := testContext(t)
	cs := h.connect(ctx)
	defer cs.Close()
	if _, err := whoami(ctx, cs); err != nil {
		t.Errorf("tether unhealthy afterwards: %v", err)
	}
}
