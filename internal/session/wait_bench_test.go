package session_test

import (
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// What a WAIT for one replica would add to a session write (tether does
// not WAIT: see docs/operations.md, "Running Redis for tether"): a record write alone,
// and followed by WAIT 1 on the same connection (one pipeline), on a
// Sentinel-managed primary with one replica over loopback.
//
//	go test -run '^$' -bench RedisWait -benchtime 2000x ./internal/session/
func BenchmarkRedisWait(b *testing.B) {
	d := redistest.StartSentinel(b)
	target, err := session.ParseRedisURL(d.URL())
	if err != nil {
		b.Fatal(err)
	}
	client := session.NewRedisTargetClient(target, 0)
	defer client.Close()
	ctx := b.Context()
	fields := []any{"v", 1, "b", "10.0.1.7:8080/pod-uid-0", "i", `{"jsonrpc":"2.0","id":1,"method":"initialize"}`}
	for _, wait := range []bool{false, true} {
		name := "write"
		if wait {
			name = "write+WAIT1"
		}
		b.Run(name, func(b *testing.B) {
			for i := range b.N {
				pipe := client.Pipeline()
				pipe.HSet(ctx, "bench:s:"+strconv.Itoa(i), fields...)
				var acked *redis.Cmd
				if wait {
					acked = pipe.Do(ctx, "WAIT", 1, 100)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
				if acked != nil {
					if n, _ := acked.Int64(); n != 1 {
						b.Fatalf("WAIT answered %d replicas", n)
					}
				}
			}
		})
	}
}
