package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tether-mcp/tether/internal/testkit"
)

// TestSessionRecordsKeepNoHeads: a session record keeps a few short
// strings, not the request and answer heads they were read from. h1 reads
// a head into substrings of one string; a record that kept a substring
// (the session id, the protocol version) kept the whole head, about 0.4
// KiB per session with small heads, here 8 KiB.
func TestSessionRecordsKeepNoHeads(t *testing.T) {
	const sessions = 300
	pad := strings.Repeat("p", 4<<10)
	var n atomic.Int64
	backend := testkit.StartServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Mcp-Session-Id", fmt.Sprintf("session-%d", n.Add(1)))
		w.Header().Set("X-Pad", pad)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	}))
	h := newStaticHarness(t, backend.URL)
	initialize := func() {
		resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
			"Mcp-Protocol-Version", "2025-06-18", "X-Client-Pad", pad)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" {
			t.Fatalf("initialize: %d", resp.StatusCode)
		}
	}
	for range 20 { // warm pools and buffers
		initialize()
	}
	before := liveHeap()
	for range sessions {
		initialize()
	}
	perSession := (liveHeap() - before) / sessions
	if perSession > 4<<10 {
		t.Errorf("%d bytes of live heap per session: records keep the heads they were read from", perSession)
	}
}

// liveHeap is the heap in use by live objects, after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
