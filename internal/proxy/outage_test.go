package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/testkit"
)

// Redis killed, frozen, and restarted empty on the same port, during
// traffic: cached sessions keep routing with no error and no request waits
// on Redis; a session this replica has never seen gets 503 with
// Retry-After; new sessions are placed and their records reach Redis when
// it returns.
func TestRedisOutage(t *testing.T) {
	f := newFleet(t, 2, 2, harnessOptions{redisTimeout: 100 * time.Millisecond})
	a, b := f.replicas[0], f.replicas[1]
	ctx := testContext(t)

	var cached []*mcp.ClientSession
	for range 4 {
		cs := a.connect(ctx)
		defer cs.Close()
		if _, err := whoami(ctx, cs); err != nil {
			t.Fatal(err)
		}
		cached = append(cached, cs)
	}
	onlyB := b.connect(ctx) // a session replica A has never seen
	defer onlyB.Close()
	raw := redis.NewClient(&redis.Options{Addr: f.redis.Addr()})
	defer raw.Close()

	for _, outage := range []struct {
		name          string
		start, finish func()
	}{
		{"killed, restarted empty", f.redis.Kill, f.redis.Restart},
		{"frozen", f.redis.Freeze, f.redis.Thaw},
	} {
		t.Run(outage.name, func(t *testing.T) {
			outage.start()

			for i, cs := range cached {
				for range 3 {
					start := time.Now()
					if _, err := whoami(ctx, cs); err != nil {
						t.Errorf("cached session %d during the outage: %v", i, err)
					}
					if d := time.Since(start); d > 2*time.Second {
						t.Errorf("a call waited %v on Redis", d)
					}
				}
			}

			// The outage shows even though every request so far was a cache hit.
			testkit.Eventually(t, 15*time.Second, a.cache.Degraded, "replica A reports the outage")

			fresh := a.connect(ctx) // placed during the outage
			defer fresh.Close()
			if _, err := whoami(ctx, fresh); err != nil {
				t.Fatalf("new session during the outage: %v", err)
			}

			resp := a.post(onlyB.ID(), `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "Mcp-Protocol-Version", "2025-06-18")
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Errorf("unknowable session during the outage: %d (Retry-After %q), want 503 with Retry-After",
					resp.StatusCode, resp.Header.Get("Retry-After"))
			}

			outage.finish()
			testkit.Eventually(t, 15*time.Second, func() bool { return !a.cache.Degraded() }, "replica A recovers")

			n, err := raw.Exists(ctx, "tether:s:"+fresh.ID()).Result()
			if err != nil || n != 1 {
				t.Errorf("record created during the outage is not in Redis after it: %d, %v", n, err)
			}
			if st := a.cache.Stats(); st.Unwritten != 0 || st.Pending != 0 {
				t.Errorf("after recovery: %d records unwritten, %d pending", st.Unwritten, st.Pending)
			}
			// Sessions from before the outage still work, through either
			// replica (Redis lost them when killed; A writes them back).
			for i, cs := range cached {
				if _, err := whoami(ctx, cs); err != nil {
					t.Errorf("cached session %d after the outage: %v", i, err)
				}
			}
		})
	}
}

var _ = fmt.Sprintf
