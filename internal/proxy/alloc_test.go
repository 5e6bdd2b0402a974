//go:build !race

package proxy_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/testkit"
)

// maxOwnAllocs bounds the allocations of tether's own path for a sticky
// follow-up (classify, session lookup, the outgoing request, the relay)
// through a transport other than tether's own client, which gets an
// *http.Request (TestFollowUpAllocationsDirect has tether's client):
// issue 12 sets 15. It is at 12 now (go test -run TestFollowUpAllocations
// -v): the body, and for the rest the *http.Request such a transport gets
// (its URL and body reader, never the pooled exchange's since the
// transport may read them after RoundTrip; its header list and map, its
// GetBody, its context copy), the answer made one with header fields
// (h1.AnswerOf) and the client's header map it is copied into.
const maxOwnAllocs = 15

// sink keeps what the harness builds on the heap, as ServeHTTP does.
var sink any

// BenchmarkServeHTTPFollowUp counts the request, the writer and the canned
// answer along with tether's allocations; this takes them out. (Not under
// the race detector, which allocates on its own.)
func TestFollowUpAllocations(t *testing.T) {
	serve := cannedProxy(t, proxy.Config{})
	ctx := context.Background()
	canned := cannedTransport{sid: "bench-session"}
	harness := func() {
		w, r, f := cannedFollowUp(ctx)
		resp, _ := canned.RoundTrip(r) // reads the request's body, as tether does
		io.Copy(io.Discard, resp.Body)
		sink, sink, sink = w, resp, f
	}
	base := testing.AllocsPerRun(1000, harness)
	total := testing.AllocsPerRun(1000, serve)
	own := total - base
	t.Logf("allocations per follow-up: %.0f, of which the harness %.0f, tether %.0f", total, base, own)
	if own > maxOwnAllocs {
		t.Errorf("tether's own path allocates %.0f times per follow-up, want at most %d", own, maxOwnAllocs)
	}
	if own < 1 {
		t.Errorf("tether's own path allocates %.0f times: the harness count is off", own)
	}
}

// maxDirectAllocs bounds the allocations of tether's own path for a sticky
// follow-up over tether's own HTTP/1.1 client, as the binary runs it
// (TestFollowUpAllocations's transport is a canned one, handed the
// *http.Request that other transports get). It is at 5 now (7 before the
// exchange was pooled): the body, the backend's answer as h1.ReadAnswer
// reads it (the answer with its response, body and header fields, and its
// head as a string), the client's wrapper of the answer's body, and what
// h1.AfterCancel falls back to for this test's context (context.AfterFunc).
// For the context of a request h1 serves, as in the
// binary, AfterCancel makes none of them, nor the Done channel and the
// children's map AfterFunc would make there (internal/server's
// BenchmarkFollowUp counts the whole server's allocations). No header
// map or *http.Request is made for the request to the backend, nor a
// header map for the answer: its fields become the client's (the writer
// adopts them, as h1's does).
const maxDirectAllocs = 7

func TestFollowUpAllocationsDirect(t *testing.T) {
	body := `{"jsonrpc":"2.0","id":2,"result":{"content":[]}}`
	canned := testkit.CannedBackend(t, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: bench-session\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	transport := backend.NewTransport(false)
	t.Cleanup(transport.CloseIdleConnections)
	serve := cannedProxyAt(t, proxy.Config{Transport: transport}, "http://"+canned, true)
	ctx := context.Background()
	harness := func() {
		w, r, f := cannedFollowUp(ctx)
		io.Copy(io.Discard, r.Body) // read, as tether does
		sink, sink, sink = w, r, f
	}
	serve() // dials
	base := testing.AllocsPerRun(1000, harness)
	total := testing.AllocsPerRun(1000, serve)
	// The canned backend allocates once per answer (io.WriteString).
	own := total - base - 1
	t.Logf("allocations per follow-up: %.0f, of which the harness %.0f and the backend 1, tether %.0f", total, base, own)
	if own > maxDirectAllocs {
		t.Errorf("tether's own path allocates %.0f times per follow-up, want at most %d", own, maxDirectAllocs)
	}
	if own < 1 {
		t.Errorf("tether's own path allocates %.0f times: the harness count is off", own)
	}
}
