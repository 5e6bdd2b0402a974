//go:build !race

package proxy_test

import (
	"context"
	"io"
	"testing"

	"github.com/tether-mcp/tether/internal/proxy"
)

// maxOwnAllocs bounds the allocations of tether's own path for a sticky
// follow-up (classify, session lookup, the outgoing request, the relay):
// issue 12 sets 15. It is at 7 now: the exchange, the body, the outgoing
// request, its header map (two), the body's GetBody, and the growth of the
// client's header map.
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
		w, r := cannedFollowUp(ctx)
		resp, _ := canned.RoundTrip(r) // reads the request's body, as tether does
		io.Copy(io.Discard, resp.Body)
		sink, sink = w, resp
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
