package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Host and Origin reach the backend unchanged (MCP DNS-rebinding checks
// must work through tether); hop-by-hop and upgrade headers do not; the
// forwarding headers of the proxy in front are kept as they were.
func TestHeadersForwarded(t *testing.T) {
	rb := newRecordingBackend(t, nil)
	h := newStaticHarness(t, rb.URL)

	req, _ := http.NewRequest(http.MethodPost, h.endpoint(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	req.Host = "mcp.example.test:8080"
	req.Header.Set("Origin", "https://app.example.test")
	req.Header.Set("Authorization", "Bearer t0k3n")
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("Connection", "keep-alive, X-Hop")
	req.Header.Set("X-Hop", "must not pass")
	req.Header.Set("Keep-Alive", "timeout=5")
	req.Header.Set("Upgrade", "h2c")
	req.Header.Set("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")
	req.Header.Set("Mcp-Session-Id", "") // none
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got, body := rb.last()
	if got == nil {
		t.Fatal("nothing reached the backend")
	}
	if got.Host != "mcp.example.test:8080" {
		t.Errorf("Host %q, want it unchanged", got.Host)
	}
	for name, want := range map[string]string{
		"Origin":          "https://app.example.test",
		"Authorization":   "Bearer t0k3n",
		"X-Forwarded-For": "203.0.113.7",
		"X-Hop":           "",
		"Keep-Alive":      "",
		"Upgrade":         "",
		"Http2-Settings":  "",
	} {
		if v := got.Header.Get(name); v != want {
			t.Errorf("backend saw %s: %q, want %q", name, v, want)
		}
	}
	if c := got.Header.Get("Connection"); strings.Contains(strings.ToLower(c), "upgrade") {
		t.Errorf("backend saw Connection: %q", c)
	}
	if body != `{"jsonrpc":"2.0","id":1,"method":"ping"}` {
		t.Errorf("backend saw body %q", body)
	}
}

// Requests without a session that are not initialize are balanced per
// request, and no record is created for them.
func TestStatelessRequestsArePickedPerRequest(t *testing.T) {
	var hits [3]atomic.Int64
	var urls []string
	for i := range hits {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits[i].Add(1)
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Mcp-Session-Id", "should-be-ignored") // e.g. server/discover answered by a 2025 server
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	h := newTether(t, urls, harnessOptions{picker: "round-robin"})
	for range 30 {
		resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "Mcp-Method", "tools/list")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	for i := range hits {
		if n := hits[i].Load(); n != 10 {
			t.Errorf("backend %d got %d requests, want 10 (round-robin)", i, n)
		}
	}
	if n := h.mem.Len(); n != 0 {
		t.Errorf("%d session records created by stateless requests", n)
	}
}

// An SSE response is relayed event by event: the client reads the first
// event while the backend is still holding back the second.
func TestEventStreamIsNotBuffered(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
	}))
	t.Cleanup(srv.Close)
	defer close(release)
	h := newStaticHarness(t, srv.URL)

	resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}`)
	defer resp.Body.Close()
	events := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data:") {
				events <- sc.Text()
			}
		}
		close(events)
	}()
	select {
	case ev := <-events:
		if !strings.Contains(ev, "progress") {
			t.Errorf("first event %q", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first event was held back until the stream ended")
	}
}

// A request whose backend connection breaks after it was sent is answered
// 502 and never sent again: it may have run (a tools/call must not run
// twice behind the client's back).
func TestBrokenAfterSendIsNotRetried(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // the backend dies mid-request
		}
	}))
	t.Cleanup(srv.Close)
	other := newRecordingBackend(t, nil)
	h := newTether(t, []string{srv.URL, other.URL}, harnessOptions{picker: "round-robin"})

	for range 4 { // round-robin: two of the four go to the broken backend
		resp := h.post("", `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"charge_card"}}`)
		if resp.StatusCode == http.StatusBadGateway {
			code, id := jsonrpcError(t, resp)
			if code != -32010 || string(id) != "9" {
				t.Errorf("502 body: code %d id %s", code, id)
			}
		} else {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	other.mu.Lock()
	otherCalls := len(other.requests)
	other.mu.Unlock()
	if got := calls.Load() + int64(otherCalls); got != 4 {
		t.Errorf("4 client requests reached backends %d times, want exactly 4", got)
	}
	if calls.Load() != 2 {
		t.Errorf("the broken backend saw %d requests, want 2 (each once, none retried)", calls.Load())
	}
}

// DELETE ends the session on its backend and in the store; DELETE of a
// session whose backend is gone ends it in the store and succeeds.
func TestDelete(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 2})
	ctx := testContext(t)

	cs := h.connect(ctx)
	if _, err := whoami(ctx, cs); err != nil {
		t.Fatal(err)
	}
	sid := cs.ID()
	if err := cs.Close(); err != nil { // sends DELETE
		t.Fatal(err)
	}
	if _, err := h.store.Get(ctx, sid); err == nil {
		t.Error("record survives the session's DELETE")
	}

	cs2 := h.connect(ctx)
	home, err := whoami(ctx, cs2)
	if err != nil {
		t.Fatal(err)
	}
	h.backend(home).Kill(50 * time.Millisecond)
	req, _ := http.NewRequest(http.MethodDelete, h.endpoint(), nil)
	req.Header.Set("Mcp-Session-Id", cs2.ID())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Errorf("DELETE with the backend gone: status %d, want 2xx", resp.StatusCode)
	}
	if _, err := h.store.Get(ctx, cs2.ID()); err == nil {
		t.Error("record survives DELETE")
	}
	if total := h.countedSessions(); total != 0 {
		t.Errorf("%d live sessions counted after both were deleted", total)
	}
}

// A session tether does not know gets 404 with a JSON-RPC error whose id is
// null: the go-sdk client takes that as the end of the session
// (ErrSessionMissing) and reconnects, as MCP requires.
func TestUnknownSessionEndsClientSession(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 1})
	ctx := testContext(t)
	cs := h.connect(ctx)
	defer cs.Close()
	if _, err := whoami(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Delete(ctx, cs.ID()); err != nil { // as if it had expired
		t.Fatal(err)
	}
	_, err := whoami(ctx, cs)
	if !errors.Is(err, mcp.ErrSessionMissing) {
		t.Errorf("call on an unknown session: %v, want ErrSessionMissing", err)
	}
}

var _ = context.Background

// An initialize that arrives with a session id starts a new session: the id
// is not forwarded, and the backend's new id creates the record.
func TestInitializeWithSessionIDIsNew(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if got := r.Header.Get("Mcp-Session-Id"); got != "" {
			t.Errorf("backend received session id %q with initialize", got)
		}
		w.Header().Set("Mcp-Session-Id", "fresh-session")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-03-26"}}`)
	}))
	t.Cleanup(srv.Close)
	h := newStaticHarness(t, srv.URL)
	// A 2025-03-26 batch holding initialize is a new session too.
	resp := h.post("stale-session", `[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}]`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := resp.Header.Get("Mcp-Session-Id"); got != "fresh-session" {
		t.Errorf("client got session id %q", got)
	}
	rec, err := h.store.Get(t.Context(), "fresh-session")
	if err != nil {
		t.Fatalf("no record for the new session: %v", err)
	}
	if string(rec.Init) != `[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}]` {
		t.Errorf("record keeps initialize body %q", rec.Init)
	}
}
