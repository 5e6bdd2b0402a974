package session_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/session"
)

// Run with: go test -run x -bench . -benchmem ./session/

const benchSessions = 10_000

// uuid returns a 36-character id shaped like the ones go-sdk servers mint.
func uuid(rng *rand.Rand) string {
	return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x",
		rng.Uint32(), rng.Uint32()&0xffff, rng.Uint32()&0xfff,
		0x8000|rng.Uint32()&0x3fff, rng.Uint64()&0xffffffffffff)
}

// initBody is a go-sdk client's initialize request, distinct per client.
func initBody(i int) []byte {
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",`+
		`"capabilities":{"roots":{"listChanged":true},"sampling":{"context":{},"tools":{}},"elicitation":{"form":{},"url":{}}},`+
		`"clientInfo":{"name":"client-%06d","title":"Benchmark Client","version":"1.0.0"}}}`, i)
}

// benchRecords returns n records as the routing layer creates them: a few
// backends shared by all sessions, a distinct id and body per session.
func benchRecords(n int) []*session.Record {
	rng := rand.New(rand.NewPCG(1, 2))
	backends := []struct{ id, url string }{
		{"10.0.1.7:8080/0f8fad5b-d9cb-469f-a165-70867728950e", "http://10.0.1.7:8080/mcp"},
		{"10.0.1.9:8080/7c9e6679-7425-40de-944b-e07fc1f90ae7", "http://10.0.1.9:8080/mcp"},
		{"10.0.2.3:8080/3f333df6-90a4-4fda-8dd3-9485d27cee36", "http://10.0.2.3:8080/mcp"},
	}
	recs := make([]*session.Record, n)
	for i := range recs {
		id := uuid(rng)
		b := backends[i%len(backends)]
		recs[i] = &session.Record{
			ClientSID:       id,
			BackendID:       b.id,
			BackendURL:      b.url,
			BackendSID:      id,
			Init:            initBody(i),
			ProtocolVersion: "2025-11-25",
			// From each request's own buffer, as the proxy passes them.
			Host: strings.Clone(benchHost),
			Path: strings.Clone(benchPath),
		}
	}
	return recs
}

// benchHost and benchPath are where the benchmark's clients send their
// initialize.
const benchHost, benchPath = "mcp.example.com:8443", "/tenants/acme/mcp"

func benchMemory(b *testing.B, clock *fakeClock, n int) (*session.Memory, []string) {
	m := session.NewMemory(session.MemoryOptions{TTL: time.Hour, Now: clock.Now})
	b.Cleanup(func() { m.Close() })
	recs := benchRecords(n)
	ids := make([]string, n)
	for i, r := range recs {
		if err := m.Create(b.Context(), r); err != nil {
			b.Fatal(err)
		}
		ids[i] = r.ClientSID
	}
	return m, ids
}

func BenchmarkMemoryGet(b *testing.B) {
	m, ids := benchMemory(b, newFakeClock(), benchSessions)
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := m.Get(ctx, ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkMemoryGetParallel(b *testing.B) {
	m, ids := benchMemory(b, newFakeClock(), benchSessions)
	ctx := b.Context()
	var start atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(7919)) // each goroutine walks the ids from elsewhere
		for pb.Next() {
			if _, err := m.Get(ctx, ids[i%len(ids)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

func BenchmarkMemoryTouch(b *testing.B) {
	// The common case: the session was used less than TTL/10 ago, so Touch
	// only reads.
	b.Run("within-ttl10", func(b *testing.B) {
		clock := newFakeClock()
		m, ids := benchMemory(b, clock, benchSessions)
		ctx := b.Context()
		now := clock.Now()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := m.Touch(ctx, ids[i%len(ids)], now); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	// Every Touch is past TTL/10 and publishes a refreshed record (once per
	// TTL/10 per session in real traffic).
	b.Run("refresh", func(b *testing.B) {
		clock := newFakeClock()
		m, ids := benchMemory(b, clock, benchSessions)
		ctx := b.Context()
		now := clock.Now()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i%len(ids) == 0 {
				now = now.Add(6 * time.Minute) // TTL/10 of 1h
				clock.Advance(6 * time.Minute)
			}
			if err := m.Touch(ctx, ids[i%len(ids)], now); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel-within-ttl10", func(b *testing.B) {
		clock := newFakeClock()
		m, ids := benchMemory(b, clock, benchSessions)
		ctx := b.Context()
		now := clock.Now()
		var start atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(start.Add(7919))
			for pb.Next() {
				if err := m.Touch(ctx, ids[i%len(ids)], now); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}

// BenchmarkMemoryCreate is a new session at the bound: every Create evicts
// the least recently used record (ids cycle through twice the bound, so an
// id comes back only after its record was evicted).
func BenchmarkMemoryCreate(b *testing.B) {
	recs := benchRecords(benchSessions)
	m := session.NewMemory(session.MemoryOptions{MaxSessions: benchSessions / 2})
	b.Cleanup(func() { m.Close() })
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := m.Create(ctx, recs[i%len(recs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkMemoryFootprint measures the heap a live session costs in the
// memory store: the record, its copies of the id and the initialize body,
// the map slot and entry. The inputs are built first and kept alive, so
// only what the store retains is counted. ns/op is the time to create all
// of them. "distinct": every client sends its own body (a different client
// name each); "identical": every client sends the same bytes (one client
// application behind the proxy, the common case), each in its own buffer.
func BenchmarkMemoryFootprint(b *testing.B) {
	const n = 100_000
	distinct := benchRecords(n)
	if l := len(distinct[0].Init); l < 280 || l > 320 {
		b.Fatalf("initialize body is %d bytes, want about 300", l)
	}
	identical := benchRecords(n)
	for _, r := range identical {
		r.Init = initBody(0)
	}
	for _, bc := range []struct {
		name string
		recs []*session.Record
	}{{"distinct", distinct}, {"identical", identical}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := b.Context()
			var perSession float64
			for b.Loop() {
				before := liveHeap()
				m := session.NewMemory(session.MemoryOptions{})
				for _, r := range bc.recs {
					if err := m.Create(ctx, r); err != nil {
						b.Fatal(err)
					}
				}
				after := liveHeap()
				if m.Len() != n {
					b.Fatalf("Len = %d, want %d", m.Len(), n)
				}
				m.Close()
				perSession = float64(int64(after)-int64(before)) / n
			}
			runtime.KeepAlive(bc.recs)
			b.ReportMetric(perSession, "B/session")
			b.ReportMetric(float64(len(bc.recs[0].Init)), "B/init-body")
		})
	}
}

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
