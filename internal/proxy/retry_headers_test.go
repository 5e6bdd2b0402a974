package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// headerBackend is a stateful MCP peer that records every request it gets
// and can forget its sessions, as a backend restarted in place does.
type headerBackend struct {
	*httptest.Server
	name string

	mu   sync.Mutex
	n    int
	sids map[string]bool
	got  []gotRequest
}

type gotRequest struct {
	method, host, uri, body string
	header                  http.Header
	status                  int
}

func newHeaderBackend(t *testing.T, name string) *headerBackend {
	b := &headerBackend{name: name, sids: map[string]bool{}}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		defer b.mu.Unlock()
		g := gotRequest{method: r.Method, host: r.Host, uri: r.RequestURI, body: string(body), header: r.Header.Clone()}
		sid := r.Header.Get("Mcp-Session-Id")
		switch {
		case strings.Contains(g.body, `"initialize"`):
			b.n++
			sid = fmt.Sprintf("%s-session-%d", name, b.n)
			b.sids[sid] = true
			w.Header().Set("Mcp-Session-Id", sid)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"x","version":"1"}}}`)
			g.status = http.StatusOK
		case !b.sids[sid]:
			http.Error(w, "session not found", http.StatusNotFound)
			g.status = http.StatusNotFound
		case strings.Contains(g.body, `"notifications/initialized"`):
			w.WriteHeader(http.StatusAccepted)
			g.status = http.StatusAccepted
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":2,"result":{"content":[]}}`)
			g.status = http.StatusOK
		}
		b.got = append(b.got, g)
	}))
	t.Cleanup(b.Close)
	return b
}

func (g gotRequest) attempt() string {
	if g.status == http.StatusNotFound {
		return "refused"
	}
	return "retried"
}

func (b *headerBackend) forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.sids)
}

// calls returns the tools/call requests the backend got.
func (b *headerBackend) calls() []gotRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	var calls []gotRequest
	for _, g := range b.got {
		if strings.Contains(g.body, `"tools/call"`) {
			calls = append(calls, g)
		}
	}
	return calls
}

// A request that a backend refused because it lost the session is sent
// again, after the session is re-initialized, with what changed between
// the attempts (the session id the new backend knows, a Last-Event-ID its
// generation drops) and everything else as the client sent it, hop-by-hop
// headers still removed: an attempt's request is rewritten for the next
// one, never patched.
func TestRetryAfterLostSessionSendsRewrittenRequest(t *testing.T) {
	a, b := newHeaderBackend(t, "a"), newHeaderBackend(t, "b")
	h := newTether(t, []string{a.URL, b.URL}, harnessOptions{picker: "round-robin"})

	// The session is bound to its creator's credentials (only the creator
	// may move it): the initialize's header as sent sets them.
	resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, "Authorization", "Bearer t0k3n")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	home, other := a, b
	if strings.HasPrefix(sid, "b-") {
		home, other = b, a
	}
	home.forget()

	const call = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}`
	resp = h.post(sid, call,
		"Authorization", "Bearer t0k3n",
		"X-Forwarded-For", "203.0.113.7",
		"User-Agent", "client/1",
		"Te", "trailers",
		"Connection", "keep-alive, X-Hop",
		"X-Hop", "must not pass",
		"Keep-Alive", "timeout=5",
		"Last-Event-ID", "e1",
	)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("tools/call: status %d", resp.StatusCode)
	}
	if got := resp.Header.Get("Mcp-Session-Id"); got != "" && got != sid {
		t.Errorf("answer carries session id %q, want the client's %q", got, sid)
	}

	// The first attempt went home; the retry to whichever backend took
	// the session (home again, restarted, or the other).
	calls := append(home.calls(), other.calls()...)
	if len(calls) != 2 {
		t.Fatalf("backends got %d tools/calls, want 2 (the refused one, then the retry)", len(calls))
	}
	first, retry := calls[0], calls[1]
	if first.status != http.StatusNotFound || retry.status != http.StatusOK {
		t.Fatalf("statuses %d then %d, want 404 then 200", first.status, retry.status)
	}
	newSID := retry.header.Get("Mcp-Session-Id")
	if newSID == sid || !strings.Contains(newSID, "-session-") {
		t.Errorf("retry carried session id %q, want the new backend session's (the first was %q)", newSID, sid)
	}
	if got := first.header.Get("Mcp-Session-Id"); got != sid {
		t.Errorf("first attempt carried session id %q, want %q", got, sid)
	}
	if got := first.header.Values("Last-Event-Id"); len(got) != 1 || got[0] != "e1" {
		t.Errorf("first attempt carried Last-Event-ID %q, want e1", got)
	}
	if got := retry.header.Values("Last-Event-Id"); len(got) != 0 {
		t.Errorf("retry carried Last-Event-ID %q, an id of the lost backend", got)
	}
	for _, g := range []gotRequest{first, retry} {
		if g.method != http.MethodPost || g.uri != "/mcp" || g.body != call {
			t.Errorf("backend got %s %s %q", g.method, g.uri, g.body)
		}
		if g.host != strings.TrimPrefix(h.front.URL, "http://") {
			t.Errorf("backend got Host %q, want the client's %q", g.host, strings.TrimPrefix(h.front.URL, "http://"))
		}
		for name, want := range map[string]string{
			"Authorization":   "Bearer t0k3n",
			"X-Forwarded-For": "203.0.113.7",
			"User-Agent":      "client/1",
			"Te":              "trailers",
			"Content-Type":    "application/json",
			"Accept":          "application/json, text/event-stream",
			"X-Hop":           "",
			"Keep-Alive":      "",
			"Connection":      "",
		} {
			if got := g.header.Get(name); got != want {
				t.Errorf("%s attempt: backend got %s %q, want %q", g.attempt(), name, got, want)
			}
		}
	}
}
