package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// sseBackend is a minimal stateful MCP peer that records the Last-Event-ID
// of each GET and answers it with one SSE event.
type sseBackend struct {
	*httptest.Server
	name string
	mu   sync.Mutex
	gets []string // Last-Event-ID of each GET ("-" when absent)
	sids map[string]bool
}

func newSSEBackend(t *testing.T, name string) *sseBackend {
	b := &sseBackend{name: name, sids: map[string]bool{}}
	n := 0
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		defer b.mu.Unlock()
		sid := r.Header.Get("Mcp-Session-Id")
		switch {
		case r.Method == http.MethodPost && strings.Contains(string(body), `"initialize"`):
			n++
			sid = fmt.Sprintf("%s-session-%d", name, n)
			b.sids[sid] = true
			w.Header().Set("Mcp-Session-Id", sid)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"x","version":"1"}}}`)
		case !b.sids[sid]:
			http.Error(w, "session not found", http.StatusNotFound)
		case r.Method == http.MethodPost:
			w.WriteHeader(http.StatusAccepted)
		case r.Method == http.MethodGet:
			id := "-"
			if v := r.Header.Values("Last-Event-Id"); len(v) > 0 {
				id = v[0]
			}
			b.gets = append(b.gets, id)
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "id: %s_7\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n", name)
		}
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *sseBackend) lastGet() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.gets) == 0 {
		return ""
	}
	return b.gets[len(b.gets)-1]
}

// get opens the session's GET stream with a Last-Event-ID and returns the
// id of the event it receives.
func (h *harness) get(sid, lastEventID string) (status int, eventID string) {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.endpoint(), nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get("Mcp-Session-Id"); got != "" && got != sid {
		h.t.Errorf("response carries session id %q, want the client's %q", got, sid)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			return resp.StatusCode, id
		}
	}
	return resp.StatusCode, ""
}

// Last-Event-ID only ever reaches the backend that issued the event: after
// a re-initialization the old id is dropped, and the new backend's ids are
// tagged so they can be told apart from the old ones.
func TestLastEventIDOnlyReachesItsIssuer(t *testing.T) {
	a, b := newSSEBackend(t, "a"), newSSEBackend(t, "b")
	h := newTether(t, []string{a.URL, b.URL}, harnessOptions{picker: "round-robin"})

	resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	home, other := a, b
	if strings.HasPrefix(sid, "b-") {
		home, other = b, a
	}

	// Before any move: ids pass through untouched, both ways.
	status, eid := h.get(sid, "")
	if status != 200 || eid != home.name+"_7" {
		t.Fatalf("first GET: status %d, event id %q", status, eid)
	}
	h.get(sid, eid)
	if got := home.lastGet(); got != home.name+"_7" {
		t.Errorf("home backend saw Last-Event-ID %q, want %q", got, eid)
	}

	// The home backend goes away; the client resumes with its old id.
	home.Close()
	status, eid2 := h.get(sid, eid)
	if status != 200 {
		t.Fatalf("GET after the backend died: status %d", status)
	}
	if got := other.lastGet(); got != "-" {
		t.Errorf("new backend was sent the lost backend's Last-Event-ID %q", got)
	}
	if want := "tether.1." + other.name + "_7"; eid2 != want {
		t.Errorf("event id after the move %q, want %q", eid2, want)
	}

	// Resuming with an id the new backend issued reaches it, untagged; an
	// id of the old backend still does not.
	h.get(sid, eid2)
	if got := other.lastGet(); got != other.name+"_7" {
		t.Errorf("new backend saw Last-Event-ID %q, want %q", got, other.name+"_7")
	}
	h.get(sid, eid)
	if got := other.lastGet(); got != "-" {
		t.Errorf("stale Last-Event-ID %q reached the new backend", got)
	}
}
