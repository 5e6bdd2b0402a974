package session_test

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// Run with: go test -run '^$' -bench Cache -benchmem ./session/
// Each benchmark starts its own redis-server (redistest).

// benchCache returns a Cache on a fresh redis-server holding n sessions
// created through it, their ids, and the counter of the Redis commands its
// client sends (set-up and health pings left out).
func benchCache(b *testing.B, n int, opts session.CacheOptions) (*session.Cache, []string, *cmdLog) {
	b.Helper()
	srv := redistest.Start(b)
	cmds := &cmdLog{}
	opts.Shared = sharedStore(b, srv, opts.Now, cmds, opts.TTL)
	c := session.NewCache(opts)
	b.Cleanup(func() { c.Close() })
	recs := benchRecords(n)
	ids := make([]string, n)
	ctx := b.Context()
	fill(b, n, func(i int) error {
		ids[i] = recs[i].ClientSID
		return c.Create(ctx, recs[i])
	})
	cmds.n.Store(0)
	return c, ids, cmds
}

// fill runs fn for 0..n-1 on a few goroutines: Redis round trips overlap.
func fill(b *testing.B, n int, fn func(i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := fn(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// BenchmarkCacheGetHit is the lookup of every follow-up request: no Redis
// command, and the real clock as in production.
func BenchmarkCacheGetHit(b *testing.B) {
	c, ids, cmds := benchCache(b, benchSessions, session.CacheOptions{})
	ctx := b.Context()
	misses := c.Stats().Misses
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := c.Get(ctx, ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(c.Stats().Misses-misses)/float64(i), "misses/op")
	b.ReportMetric(float64(cmds.n.Load())/float64(i), "redis-cmds/op")
}

func BenchmarkCacheGetHitParallel(b *testing.B) {
	c, ids, cmds := benchCache(b, benchSessions, session.CacheOptions{})
	ctx := b.Context()
	misses := c.Stats().Misses
	var start, ops atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(7919)) // each goroutine walks the ids from elsewhere
		n := 0
		for pb.Next() {
			if _, err := c.Get(ctx, ids[i%len(ids)]); err != nil {
				b.Error(err)
				return
			}
			i++
			n++
		}
		ops.Add(int64(n))
	})
	b.ReportMetric(float64(c.Stats().Misses-misses)/float64(ops.Load()), "misses/op")
	b.ReportMetric(float64(cmds.n.Load())/float64(ops.Load()), "redis-cmds/op")
}

// BenchmarkCacheGetMiss is a session this replica has not cached: one
// round trip to Redis (HGETALL) and the decoding of the record.
func BenchmarkCacheGetMiss(b *testing.B) {
	c, ids, cmds := benchCache(b, benchSessions, session.CacheOptions{})
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		c.Invalidate(id)
		if _, err := c.Get(ctx, id); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(cmds.n.Load())/float64(i), "redis-cmds/op")
}

// BenchmarkCacheTouch is the common Touch: the session's idle TTL was
// refreshed less than TTL/10 ago, so nothing is queued for Redis.
func BenchmarkCacheTouch(b *testing.B) {
	clock := newFakeClock()
	c, ids, cmds := benchCache(b, benchSessions, session.CacheOptions{Now: clock.Now})
	ctx := b.Context()
	now := clock.Now().Add(time.Minute) // within TTL/10 (6 min) of Create
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := c.Touch(ctx, ids[i%len(ids)], now); err != nil {
			b.Fatal(err)
		}
		i++
	}
	settle(cmds)
	b.ReportMetric(float64(cmds.n.Load())/float64(i), "redis-cmds/op")
}

// BenchmarkCacheFollowUp is the Redis cost of a follow-up request (Get and
// Touch, as the proxy does) at steady state, for sessions each used once
// per interval: a re-read every MaxStale (30 s) and a TTL refresh every
// TTL/10 (6 min) per session. Fake time; the first two refresh intervals
// are left out.
func BenchmarkCacheFollowUp(b *testing.B) {
	const n = 1000
	for _, every := range []time.Duration{time.Second, 10 * time.Second, time.Minute} {
		b.Run("every="+every.String(), func(b *testing.B) {
			clock := newFakeClock()
			c, ids, cmds := benchCache(b, n, session.CacheOptions{Now: clock.Now})
			ctx := b.Context()
			step := every / n
			followUp := func(i int) {
				clock.Advance(step)
				id := ids[i%n]
				if _, err := c.Get(ctx, id); err != nil {
					b.Fatal(err)
				}
				c.Touch(ctx, id, clock.Now())
			}
			warm := int(2 * (time.Hour / 10) / step)
			for i := range warm {
				followUp(i)
			}
			settle(cmds)
			cmds.n.Store(0)
			i := warm
			for b.Loop() {
				followUp(i)
				i++
			}
			settle(cmds)
			b.ReportMetric(float64(cmds.n.Load())/float64(i-warm), "redis-cmds/op")
			if d := c.Stats().TouchDrops; d != 0 {
				b.Logf("%d refreshes dropped (queue full) and retried", d)
			}
		})
	}
}

// settle waits (at most 5 s) until the asynchronous refreshes have been
// sent: the count stops moving.
func settle(h *cmdLog) {
	last := h.n.Load()
	for range 50 {
		time.Sleep(100 * time.Millisecond)
		n := h.n.Load()
		if n == last {
			return
		}
		last = n
	}
}

// footprintBackends are shared by all sessions, as the endpoint set's
// strings are in the proxy.
var footprintBackends = [...]struct{ id, url string }{
	{"10.0.1.7:8080/0f8fad5b-d9cb-469f-a165-70867728950e", "http://10.0.1.7:8080/mcp"},
	{"10.0.1.9:8080/7c9e6679-7425-40de-944b-e07fc1f90ae7", "http://10.0.1.9:8080/mcp"},
	{"10.0.2.3:8080/3f333df6-90a4-4fda-8dd3-9485d27cee36", "http://10.0.2.3:8080/mcp"},
}

// footprintID is session i's 36-character id, a fresh string on each call
// so that only what the cache keeps stays reachable.
func footprintID(i int) string { return uuid(rand.New(rand.NewPCG(uint64(i), 7))) }

func footprintRecord(i int) *session.Record {
	id := footprintID(i)
	be := footprintBackends[i%len(footprintBackends)]
	return &session.Record{
		ClientSID: id, BackendID: be.id, BackendURL: be.url, BackendSID: id,
		Init: initBody(i), ProtocolVersion: "2025-11-25",
		Host: strings.Clone(benchHost), Path: strings.Clone(benchPath),
	}
}

// BenchmarkCacheFootprint measures the heap 100k cached sessions take (the
// default --session-cache-size): live bytes after a full collection, before
// and after filling a new Cache, over the entries it holds. "created" are
// sessions this replica initialized (records built by the proxy, sharing the
// endpoint strings); "loaded" are sessions read from Redis (every field
// decoded into its own memory), as on the other replicas. ns/op is the
// time to fill the cache. The client's connections are opened beforehand.
func BenchmarkCacheFootprint(b *testing.B) {
	const n = 100_000
	if l := len(initBody(0)); l < 280 || l > 320 {
		b.Fatalf("initialize body is %d bytes, want about 300", l)
	}
	srv := redistest.Start(b)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	// measure fills a new Cache with add; reset (if set) runs before the
	// Cache starts.
	measure := func(b *testing.B, reset func(), add func(c *session.Cache, i int) error) {
		var heap, inuse, entries float64
		for b.Loop() {
			if reset != nil {
				reset()
			}
			shared := sharedStore(b, srv, nil, nil, 0)
			c := session.NewCache(session.CacheOptions{Shared: shared, Size: n})
			fill(b, 64, func(int) error { return shared.Ping(b.Context()) })
			before := memStats()
			fill(b, n, func(i int) error { return add(c, i) })
			after := memStats()
			st := c.Stats()
			c.Close()
			entries = float64(st.Entries)
			heap = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / entries
			inuse = float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / entries
		}
		b.ReportMetric(heap, "B/session")
		b.ReportMetric(heap*n/(1<<20), "MiB/100k-sessions")
		b.ReportMetric(inuse*n/(1<<20), "MiB-inuse/100k-sessions")
		b.ReportMetric(entries, "entries")
	}
	b.Run("created", func(b *testing.B) {
		// Sessions of an earlier round would hold the ids.
		reset := func() { raw.FlushAll(b.Context()) }
		measure(b, reset, func(c *session.Cache, i int) error { return c.Create(b.Context(), footprintRecord(i)) })
	})
	b.Run("loaded", func(b *testing.B) {
		shared := sharedStore(b, srv, nil, nil, 0)
		defer shared.Close()
		raw.FlushAll(b.Context())
		fill(b, n, func(i int) error { return shared.Create(b.Context(), footprintRecord(i)) })
		measure(b, nil, func(c *session.Cache, i int) error { _, err := c.Get(b.Context(), footprintID(i)); return err })
	})
}

// memStats reads the heap after a full collection.
func memStats() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}
