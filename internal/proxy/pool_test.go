package proxy_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
)

// lateTransport answers at once and keeps each request's body unread, as
// http.Transport may go on writing a body after RoundTrip has returned
// (an answer that came before the body was sent).
type lateTransport struct {
	mu   sync.Mutex
	held []io.ReadCloser
}

func (lt *lateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	lt.mu.Lock()
	lt.held = append(lt.held, req.Body)
	lt.mu.Unlock()
	body := `{"jsonrpc":"2.0","id":1,"result":{}}`
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}, "Mcp-Session-Id": {"late-session"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}, nil
}

// A request's state is reused once the request is over (the exchange
// pool), but a transport's late read of a body still reads that request's
// body, not a later request's nor an emptied one.
func TestTransportReadsBodyAfterRoundTrip(t *testing.T) {
	picker, _ := balancer.NewPicker("p2c", nil)
	bal := balancer.New(balancer.Options{Picker: picker})
	src, _ := discovery.NewStatic([]string{"http://127.0.0.1:9"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	synced := make(chan struct{})
	go src.Run(ctx, func(s discovery.Snapshot) { bal.Update(s); close(synced) })
	<-synced
	store := session.NewMemory(session.MemoryOptions{})
	defer store.Close()
	lt := &lateTransport{}
	p := proxy.New(proxy.Config{Balancer: bal, Store: store, Transport: lt, Logger: slog.New(slog.DiscardHandler)})

	post := func(sid, body string) int {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			r.Header.Set("Mcp-Session-Id", sid)
		}
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		return w.Code
	}
	bodies := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"first"}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"the second, longer than the first"}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"text":"3"}}}`,
	}
	for i, b := range bodies {
		sid := "late-session"
		if i == 0 {
			sid = ""
		}
		if code := post(sid, b); code != http.StatusOK {
			t.Fatalf("request %d: status %d", i, code)
		}
	}
	if len(lt.held) != len(bodies) {
		t.Fatalf("%d requests reached the transport, want %d", len(lt.held), len(bodies))
	}
	for i, rc := range lt.held {
		got, err := io.ReadAll(rc)
		if err != nil {
			t.Fatalf("request %d: late read of its body: %v", i, err)
		}
		if string(got) != bodies[i] {
			t.Errorf("request %d: a late read of its body gave %q, want %q", i, got, bodies[i])
		}
	}
}
