package session_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// fakeStore is a Redis store whose server is a fake answering with handle.
func fakeStore(t *testing.T, handle func(cmd []string) []byte) *session.Redis {
	t.Helper()
	f := redistest.StartFake(t, handle)
	opt, err := redis.ParseURL(f.URL())
	if err != nil {
		t.Fatal(err)
	}
	s := session.NewRedis(session.RedisOptions{Client: session.NewRedisClient(opt, cacheBudget), Timeout: cacheBudget})
	t.Cleanup(func() { s.Close() })
	return s
}

// answering returns a fake handler that answers command name (EVALSHA for
// every script) with reply.
func answering(name string, reply []byte) func([]string) []byte {
	return func(cmd []string) []byte {
		if strings.EqualFold(cmd[0], name) {
			return reply
		}
		return nil
	}
}

// hostileRecord is a stored record's hash with one field replaced.
func hostileRecord(field, value string) []byte {
	f := map[string]string{"v": "1", "b": "pod-1", "u": "http://10.0.1.7:8080/mcp", "bs": "s", "i": "{}",
		"pv": "2025-11-25", "p": "", "h": "mcp.example.com:8443", "pa": "/mcp",
		"c": "1772366400000", "l": "1772366400000", "e": "99999999999999", "r": "0"}
	f[field] = value
	var ss []string
	for k, v := range f {
		ss = append(ss, k, v)
	}
	return redistest.Bulks(ss...)
}

// Regression (issue 10, item 3): a malformed reply to the compare-and-swap
// script panicked in Swap (res[0].(int64) on whatever came back), inside the
// proxy's singleflight, killing the process. Every reply tether reads is now
// checked: each hostile shape below is an error for that one call, never a
// panic, never a success, and never mistaken for "not found" or "conflict".
func TestRedisHostileReplies(t *testing.T) {
	v1 := stored(rec("s"), epoch)
	swap := func(ctx context.Context, s *session.Redis) error {
		got, err := s.Swap(ctx, v1, v1.Clone())
		if got != nil {
			t.Errorf("Swap returned a record %+v with %v", got, err)
		}
		return err
	}
	get := func(ctx context.Context, s *session.Redis) error {
		got, err := s.Get(ctx, "s")
		if got != nil {
			t.Errorf("Get returned a record %+v with %v", got, err)
		}
		return err
	}
	del := func(ctx context.Context, s *session.Redis) error {
		got, err := s.Delete(ctx, "s")
		if got != nil {
			t.Errorf("Delete returned a record %+v with %v", got, err)
		}
		return err
	}
	create := func(ctx context.Context, s *session.Redis) error { return s.Create(ctx, rec("s")) }
	restore := func(ctx context.Context, s *session.Redis) error { return s.Restore(ctx, v1) }
	touch := func(ctx context.Context, s *session.Redis) error { return s.Touch(ctx, "s", time.Now()) }
	counts := func(ctx context.Context, s *session.Redis) error {
		got, err := s.BackendSessions(ctx, []string{"pod-1"})
		if got != nil {
			t.Errorf("BackendSessions returned %v with %v", got, err)
		}
		return err
	}
	list := func(ctx context.Context, s *session.Redis) error {
		got, err := s.SessionsOn(ctx, "pod-1", 2)
		if got != nil {
			t.Errorf("SessionsOn returned %q with %v", got, err)
		}
		return err
	}
	marker := func(ctx context.Context, s *session.Redis) error { _, _, err := s.Marker(ctx); return err }
	ensure := func(ctx context.Context, s *session.Redis) error { _, _, err := s.EnsureMarker(ctx); return err }

	const bad, down = "bad reply", "unavailable"
	r := redistest.Raw
	tests := []struct {
		name  string
		cmd   string // the command answered with reply
		reply []byte
		call  func(context.Context, *session.Redis) error
		want  string // bad or down
	}{
		// The compare-and-swap script: {0} | {1, fields...} | {2, version}.
		{"swap: empty array (the reported panic)", "EVALSHA", redistest.Array(), swap, bad},
		{"swap: integer instead of array", "EVALSHA", redistest.Int(2), swap, bad},
		{"swap: status instead of array", "EVALSHA", redistest.Status("OK"), swap, bad},
		{"swap: nil", "EVALSHA", redistest.NilBulk(), swap, bad},
		{"swap: nil array", "EVALSHA", redistest.NilArray(), swap, bad},
		{"swap: code as a string", "EVALSHA", redistest.Bulks("2", "2"), swap, bad},
		{"swap: swapped without a version", "EVALSHA", redistest.Array(redistest.Int(2)), swap, bad},
		{"swap: non-numeric version", "EVALSHA", redistest.Array(redistest.Int(2), redistest.Bulk("x")), swap, bad},
		{"swap: version not old+1", "EVALSHA", redistest.Array(redistest.Int(2), redistest.Int(99)), swap, bad},
		{"swap: negative version", "EVALSHA", redistest.Array(redistest.Int(2), redistest.Int(-1)), swap, bad},
		{"swap: huge version", "EVALSHA", redistest.Array(redistest.Int(2), redistest.Int(1<<62)), swap, bad},
		{"swap: extra elements", "EVALSHA", redistest.Array(redistest.Int(2), redistest.Int(2), redistest.Int(3)), swap, bad},
		{"swap: unknown code", "EVALSHA", redistest.Array(redistest.Int(7)), swap, bad},
		{"swap: conflict without a record", "EVALSHA", redistest.Array(redistest.Int(1)), swap, bad},
		{"swap: conflict with odd pairs", "EVALSHA", redistest.Array(redistest.Int(1), redistest.Bulk("v")), swap, bad},
		{"swap: conflict with integer fields", "EVALSHA", redistest.Array(redistest.Int(1), redistest.Int(5), redistest.Int(6)), swap, bad},
		{"swap: conflict with a nested array", "EVALSHA", redistest.Array(redistest.Int(1), redistest.Bulk("v"), redistest.Array()), swap, bad},
		{"swap: integer overflow", "EVALSHA", r("*2\r\n:2\r\n:99999999999999999999\r\n"), swap, down},
		{"swap: error reply", "EVALSHA", redistest.Error("ERR boom"), swap, down},
		// Records read whole (HGETALL), and the fields they must have.
		{"get: non-numeric version", "HGETALL", hostileRecord("v", "abc"), get, bad},
		{"get: version beyond 2^53", "HGETALL", hostileRecord("v", "99999999999999999999"), get, bad},
		{"get: non-numeric expiry", "HGETALL", hostileRecord("e", "soon"), get, bad},
		{"get: negative creation time", "HGETALL", hostileRecord("c", "-5"), get, bad},
		{"get: reinits beyond uint32", "HGETALL", hostileRecord("r", "4294967296"), get, bad},
		{"get: no backend", "HGETALL", hostileRecord("b", ""), get, bad},
		{"get: version 0", "HGETALL", hostileRecord("v", "0"), get, bad},
		{"get: Host beyond MaxAddressLen", "HGETALL", hostileRecord("h", strings.Repeat("h", session.MaxAddressLen+1)), get, bad},
		{"get: path beyond MaxAddressLen", "HGETALL", hostileRecord("pa", "/"+strings.Repeat("p", session.MaxAddressLen)), get, bad},
		{"get: integer instead of a hash", "HGETALL", redistest.Int(1), get, down},
		{"get: odd field count", "HGETALL", redistest.Bulks("v", "1", "b"), get, down},
		{"get: nil", "HGETALL", redistest.NilArray(), get, bad},
		// Scripts returning numbers.
		{"create: unknown result", "EVALSHA", redistest.Int(7), create, bad},
		{"create: string result", "EVALSHA", redistest.Bulk("x"), create, bad},
		{"create: array result", "EVALSHA", redistest.Array(), create, bad},
		{"create: nil", "EVALSHA", redistest.NilBulk(), create, bad},
		{"restore: unknown result", "EVALSHA", redistest.Int(-1), restore, bad},
		{"touch: unknown result", "EVALSHA", redistest.Int(5), touch, bad},
		{"touch: status result", "EVALSHA", redistest.Status("OK"), touch, bad},
		// Delete returns the removed record's pairs.
		{"delete: odd pairs", "EVALSHA", redistest.Bulks("v", "1", "b"), del, bad},
		{"delete: integer pairs", "EVALSHA", redistest.Array(redistest.Int(1), redistest.Int(2)), del, bad},
		{"delete: integer", "EVALSHA", redistest.Int(1), del, bad},
		{"delete: malformed record", "EVALSHA", hostileRecord("l", "yesterday"), del, bad},
		// Fleet-wide counts.
		{"counts: negative", "ZCARD", redistest.Int(-5), counts, bad},
		{"counts: string", "ZCARD", redistest.Bulk("x"), counts, down},
		// A backend's sessions (limit 2).
		{"list: more members than the limit", "ZRANGEBYSCORE", redistest.Bulks("a", "b", "c"), list, bad},
		{"list: an empty id", "ZRANGEBYSCORE", redistest.Bulks("a", ""), list, bad},
		{"list: a nil id", "ZRANGEBYSCORE", redistest.Array(redistest.Bulk("a"), redistest.NilBulk()), list, bad},
		{"list: nil", "ZRANGEBYSCORE", redistest.NilArray(), list, bad},
		{"list: integer instead of an array", "ZRANGEBYSCORE", redistest.Int(2), list, down},
		{"list: a nested array", "ZRANGEBYSCORE", redistest.Array(redistest.Bulk("a"), redistest.Array()), list, down},
		{"list: length out of range", "ZRANGEBYSCORE", r("*99999999999999\r\n"), list, down},
		{"list: error reply", "ZRANGEBYSCORE", redistest.Error("ERR unknown command"), list, down},
		// The epoch marker.
		{"marker: non-numeric", "GET", redistest.Bulk("yesterday"), marker, bad},
		{"marker script: short", "EVALSHA", redistest.Array(redistest.Int(1)), ensure, bad},
		{"marker script: non-numeric value", "EVALSHA", redistest.Array(redistest.Int(1), redistest.Bulk("x")), ensure, bad},
		// Lengths meant to exhaust memory, or to panic go-redis' reader
		// (make([]any, n) with n out of range): the connection breaks first.
		{"array length out of range", "EVALSHA", r("*99999999999999\r\n"), swap, down},
		{"map length out of range", "HGETALL", r("*99999999999998\r\n"), get, down},
		{"bulk of 2 GB", "HGETALL", r("*2\r\n$1\r\nv\r\n$2000000000\r\n"), get, down},
		{"bulk length overflowing int64", "EVALSHA", r("$9223372036854775807\r\n"), create, down},
		{"nesting 100 deep", "EVALSHA", r(strings.Repeat("*1\r\n", 100) + ":1\r\n"), swap, down},
		{"a line without an end", "EVALSHA", r("+" + strings.Repeat("a", 100<<10)), touch, down},
		{"unknown type", "EVALSHA", r("@1\r\n"), touch, down},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fakeStore(t, func(cmd []string) []byte {
				if strings.EqualFold(cmd[0], tt.cmd) {
					return tt.reply
				}
				if strings.EqualFold(cmd[0], "ZREMRANGEBYSCORE") {
					return redistest.Int(0)
				}
				return nil
			})
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := tt.call(ctx, s)
			switch {
			case err == nil:
				t.Fatal("no error")
			case errors.Is(err, session.ErrNotFound), errors.Is(err, session.ErrConflict), errors.Is(err, session.ErrExists):
				t.Fatalf("error %v: a malformed reply must not look like an answer", err)
			case tt.want == bad && !errors.Is(err, session.ErrBadReply):
				t.Errorf("error %v, want ErrBadReply", err)
			case tt.want == down && !errors.Is(err, session.ErrUnavailable):
				t.Errorf("error %v, want ErrUnavailable", err)
			}
		})
	}
}

// Regression: go-redis's own pub/sub receiver asserts types on messages
// without checking (an empty array, a channel that is not a string), in a
// goroutine nothing can recover: one malformed message killed the process.
// The invalidation loop receives messages itself and skips malformed ones.
func TestRedisHostilePubSubMessages(t *testing.T) {
	const channel = "tether:invalidate"
	s := fakeStore(t, func(cmd []string) []byte {
		if !strings.EqualFold(cmd[0], "SUBSCRIBE") {
			return nil
		}
		b, n := redistest.Bulk, redistest.Int
		return slices.Concat(
			redistest.Array(b("subscribe"), b(channel), n(1)),
			redistest.Array(), // empty: go-redis indexes [0]
			redistest.Array(b("message"), n(5), b("x")), // channel not a string
			redistest.Array(b("subscribe"), b(channel)), // no count
			redistest.Array(n(3)),                       // kind not a string
			redistest.Array(b("message"), b(channel), b("s-1")),
			redistest.Array(b("message"), b(channel), b(" restored")),
		)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	var sids, controls []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Invalidations(ctx, func(sid string) {
			mu.Lock()
			sids = append(sids, sid)
			mu.Unlock()
		}, func() {}, func(msg string) {
			mu.Lock()
			controls = append(controls, msg)
			mu.Unlock()
			cancel() // the last message
		})
	}()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(sids, ",") != "s-1" || strings.Join(controls, ",") != " restored" {
		t.Errorf("invalidations %q, control messages %q; want [s-1] and [ restored]", sids, controls)
	}
}

// A malformed record is an error for the request that read it; it does not
// degrade the cache (Redis is not down).
func TestCacheBadReplyDoesNotDegrade(t *testing.T) {
	f := redistest.StartFake(t, func(cmd []string) []byte {
		switch strings.ToUpper(cmd[0]) {
		case "GET": // the epoch marker
			return redistest.Bulk("1")
		case "SUBSCRIBE":
			return redistest.Array(redistest.Bulk("subscribe"), redistest.Bulk(cmd[1]), redistest.Int(1))
		case "HGETALL":
			return hostileRecord("v", "abc")
		}
		return nil
	})
	opt, err := redis.ParseURL(f.URL())
	if err != nil {
		t.Fatal(err)
	}
	tr := &transitions{}
	c := session.NewCache(session.CacheOptions{
		Shared:     session.NewRedis(session.RedisOptions{Client: session.NewRedisClient(opt, cacheBudget), Timeout: cacheBudget}),
		OnDegraded: tr.add,
	})
	t.Cleanup(func() { c.Close() })
	got, err := c.Get(t.Context(), "s")
	if !errors.Is(err, session.ErrBadReply) || got != nil {
		t.Errorf("Get = %v, %v; want ErrBadReply", got, err)
	}
	if c.Degraded() || len(tr.list()) != 0 {
		t.Errorf("degraded after a malformed reply (transitions %v)", tr.list())
	}
}

// Regression: the repair of the backend sets (counts apart, and a cluster
// listing of a backend's sessions) indexed the fields of each HMGET reply
// unchecked: a short reply panicked in a background goroutine, killing
// the process. It is an error now.
func TestRedisRepairShortReply(t *testing.T) {
	s := fakeStore(t, func(cmd []string) []byte {
		switch strings.ToUpper(cmd[0]) {
		case "ZSCAN":
			return redistest.Array(redistest.Bulk("0"), redistest.Bulks("s-1", "1772366400000"))
		case "HMGET":
			return redistest.Bulks("pod-1")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, _, err := s.RepairCounts(ctx, []string{"pod-1"}); !errors.Is(err, session.ErrBadReply) {
		t.Errorf("RepairCounts with a short HMGET reply: %v, want ErrBadReply", err)
	}
}
