package session_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/session"
)

// boundedMemory is a memory store with bounds, recording OnExpire and
// OnEvict calls.
type boundedMemory struct {
	*session.Memory
	expired *expiries
	mu      sync.Mutex
	evicted map[string]int // by reason
}

func newBoundedMemory(t *testing.T, clock *fakeClock, maxSessions int, maxBytes int64) *boundedMemory {
	b := &boundedMemory{expired: &expiries{}, evicted: map[string]int{}}
	b.Memory = session.NewMemory(session.MemoryOptions{
		TTL: ttl, Now: clock.Now, SweepInterval: 24 * time.Hour,
		MaxSessions: maxSessions, MaxInitBytes: maxBytes,
		OnChange: onExpired(b.expired.add),
		OnEvict: func(reason string) {
			b.mu.Lock()
			b.evicted[reason]++
			b.mu.Unlock()
		},
	})
	t.Cleanup(func() { b.Close() })
	return b
}

// Regression (issue 10, item 2): the memory store kept every record it was
// given (155 sessions with 4 MB initialize bodies held 805 MB for the whole
// TTL). It now holds at most MaxSessions records: a Create beyond evicts
// the least recently used, records used since the last eviction pass
// outliving those that were not, and each evicted record goes through
// OnExpire once (the per-backend count follows).
func TestMemoryEvictsLeastRecentlyUsed(t *testing.T) {
	clock := newFakeClock()
	m := newBoundedMemory(t, clock, 4, 1<<20)
	ctx := t.Context()
	create := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if err := m.Create(ctx, rec(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	create("a", "b", "c", "d")
	if _, err := m.Get(ctx, "a"); err != nil { // in use
		t.Fatal(err)
	}
	if err := m.Touch(ctx, "c", clock.Now()); err != nil { // in use
		t.Fatal(err)
	}
	create("e")
	if got := m.expired.take(); !cmp.Equal(got, []string{"b"}) {
		t.Errorf("after the 5th Create, evicted %v, want [b] (the least recently used)", got)
	}
	create("f")
	if got := m.expired.take(); !cmp.Equal(got, []string{"d"}) {
		t.Errorf("after the 6th Create, evicted %v, want [d]", got)
	}
	for _, id := range []string{"a", "c", "e", "f"} {
		if _, err := m.Get(ctx, id); err != nil {
			t.Errorf("Get(%s): %v", id, err)
		}
	}
	for _, id := range []string{"b", "d"} {
		if _, err := m.Get(ctx, id); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("Get(evicted %s) = %v, want ErrNotFound", id, err)
		}
	}
	if st := m.Stats(); st.Sessions != 4 || st.EvictedMaxSessions != 2 || m.evicted[session.EvictMaxSessions] != 2 {
		t.Errorf("stats %+v, OnEvict %v; want 4 sessions, 2 evictions", st, m.evicted)
	}
}

// An expired record goes first, whatever its recency, and is reported as an
// expiry (OnExpire), not an eviction.
func TestMemoryEvictsExpiredFirst(t *testing.T) {
	clock := newFakeClock()
	m := newBoundedMemory(t, clock, 2, 1<<20)
	ctx := t.Context()
	if err := m.Create(ctx, rec("old")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl / 2)
	if err := m.Create(ctx, rec("young")); err != nil {
		t.Fatal(err)
	}
	m.Get(ctx, "old") // used, but it will expire first
	clock.Advance(ttl/2 + time.Second)
	if err := m.Create(ctx, rec("new")); err != nil {
		t.Fatal(err)
	}
	if got := m.expired.take(); !cmp.Equal(got, []string{"old"}) {
		t.Errorf("removed %v, want [old]", got)
	}
	if st := m.Stats(); st.EvictedMaxSessions != 0 || len(m.evicted) != 0 {
		t.Errorf("an expiry counted as an eviction: %+v, %v", st, m.evicted)
	}
}

// The initialize bodies held are bounded too, each distinct body counted
// once; a body larger than the bound is refused.
func TestMemoryInitBytesBound(t *testing.T) {
	const body = 4 << 10
	addr := int64(len(rec("").Host) + len(rec("").Path)) // the same for all: counted once
	clock := newFakeClock()
	m := newBoundedMemory(t, clock, 1000, 3*body+addr)
	ctx := t.Context()
	for i := range 10 {
		r := rec(fmt.Sprintf("s%d", i))
		r.Init = bytes.Repeat([]byte{byte('a' + i)}, body)
		if err := m.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		if st := m.Stats(); st.InitBytes > 3*body {
			t.Fatalf("after %d creates: %d bytes held, bound %d", i+1, st.InitBytes, 3*body)
		}
	}
	if st := m.Stats(); st.Sessions != 3 || st.EvictedMaxInitBytes != 7 || m.evicted[session.EvictMaxInitBytes] != 7 {
		t.Errorf("stats %+v, OnEvict %v; want 3 sessions, 7 evictions for bytes", st, m.evicted)
	}
	if got := m.expired.take(); len(got) != 7 {
		t.Errorf("OnExpire for %d evicted records, want 7", len(got))
	}
	big := rec("big")
	big.Init = make([]byte, 3*body+1)
	if err := m.Create(ctx, big); !errors.Is(err, session.ErrInitTooLarge) {
		t.Errorf("Create with a body over the bound = %v, want ErrInitTooLarge", err)
	}
}

// Hosts and Paths count in the byte bound, each distinct one once: clients
// that vary them (up to MaxAddressLen each) cannot make the store hold more
// than MaxInitBytes, and the Host and Path every session of an endpoint
// repeats cost one copy, which goes when the last session holding it does.
func TestMemoryAddressBytes(t *testing.T) {
	const bound = 64 << 10
	clock := newFakeClock()
	m := newBoundedMemory(t, clock, 1000, bound)
	ctx := t.Context()
	host, path := rec("").Host, rec("").Path
	var first *session.Record
	for i := range 100 {
		r := rec(fmt.Sprintf("same-%d", i)) // a fresh Host and Path per request
		if err := m.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		got, err := m.Get(ctx, r.ClientSID)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = got
		} else if unsafe.StringData(got.Host) != unsafe.StringData(first.Host) || unsafe.StringData(got.Path) != unsafe.StringData(first.Path) {
			t.Fatalf("session %d holds its own copy of the Host or Path", i)
		}
	}
	if got, want := m.AddressBytes(), int64(len(host)+len(path)); got != want {
		t.Errorf("%d address bytes held for one Host and Path, want %d", got, want)
	}

	// A swap to another path: the new one is held, the old one still by
	// the 99 others.
	cur, _ := m.Get(ctx, "same-0")
	next := cur.Clone()
	next.Path = "/v2/mcp"
	if _, err := m.Swap(ctx, cur, next); err != nil {
		t.Fatal(err)
	}
	if got, want := m.AddressBytes(), int64(len(host)+len(path)+len("/v2/mcp")); got != want {
		t.Errorf("after a swap to a new path: %d address bytes, want %d", got, want)
	}

	// Sessions each with their own long path: the bound holds, evicting.
	for i := range 20 {
		r := rec(fmt.Sprintf("long-%d", i))
		r.Path = "/" + strings.Repeat(string(rune('a'+i)), session.MaxAddressLen-1)
		if err := m.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		if held := m.Stats().InitBytes + m.AddressBytes(); held > bound {
			t.Fatalf("after %d long paths: %d bytes held, bound %d", i+1, held, bound)
		}
	}
	if st := m.Stats(); st.EvictedMaxInitBytes == 0 {
		t.Errorf("no eviction for bytes after 20 paths of 8 KiB under a bound of 64 KiB: %+v", st)
	}

	clock.Advance(2 * ttl)
	m.Sweep(clock.Now())
	if st := m.Stats(); st.Sessions != 0 || st.InitBytes != 0 || m.AddressBytes() != 0 {
		t.Errorf("after every session expired: %+v, %d address bytes", st, m.AddressBytes())
	}
}

// Identical initialize bodies are stored once, however many sessions send
// them, and the copy goes when the last of them does.
func TestMemoryInternsInitBodies(t *testing.T) {
	clock := newFakeClock()
	m := newBoundedMemory(t, clock, 1000, 1<<20)
	ctx := t.Context()
	body := rec("").Init
	var first []byte
	for i := range 100 {
		r := rec(fmt.Sprintf("s%d", i))
		r.Init = bytes.Clone(body) // a fresh buffer per request, as the proxy's
		if err := m.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		got, err := m.Get(ctx, r.ClientSID)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = got.Init
		} else if &got.Init[0] != &first[0] {
			t.Fatalf("session %d holds its own copy of an identical body", i)
		}
	}
	if st := m.Stats(); st.DistinctInits != 1 || st.InitBytes != int64(len(body)) {
		t.Errorf("stats %+v, want one body of %d bytes", st, len(body))
	}
	for i := range 100 {
		if _, err := m.Delete(ctx, fmt.Sprintf("s%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if st := m.Stats(); st.DistinctInits != 0 || st.InitBytes != 0 || st.Sessions != 0 {
		t.Errorf("after deleting every session: %+v", st)
	}
}

// Under an attack creating sessions with distinct large bodies as fast as
// it can, from several goroutines, the store never holds more than its
// bounds (plus one record per creator in flight), and every record that
// leaves it is reported exactly once.
func TestMemoryBoundsHoldUnderConcurrentCreates(t *testing.T) {
	const (
		workers  = 4
		creates  = 2000 // per worker
		maxRecs  = 64
		body     = 1 << 10
		maxBytes = 32 * body
	)
	clock := newFakeClock()
	var expired atomic.Int64
	m := session.NewMemory(session.MemoryOptions{
		TTL: ttl, Now: clock.Now, SweepInterval: 24 * time.Hour,
		MaxSessions: maxRecs, MaxInitBytes: maxBytes,
		OnChange: onExpired(func(*session.Record) { expired.Add(1) }),
	})
	t.Cleanup(func() { m.Close() })
	ctx := t.Context()
	var created, deleted atomic.Int64
	var peakLen, peakBytes atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			buf := make([]byte, body)
			for i := range creates {
				r := rec(fmt.Sprintf("w%d-%d", w, i))
				for j := range buf {
					buf[j] = byte(rng.Uint32())
				}
				r.Init = buf
				if err := m.Create(ctx, r); err != nil {
					t.Error(err)
					return
				}
				created.Add(1)
				if rng.IntN(10) == 0 {
					if _, err := m.Delete(ctx, r.ClientSID); err == nil {
						deleted.Add(1)
					}
				}
				st := m.Stats()
				for peak, v := range map[*atomic.Int64]int64{&peakLen: int64(st.Sessions), &peakBytes: st.InitBytes} {
					for old := peak.Load(); v > old && !peak.CompareAndSwap(old, v); old = peak.Load() {
					}
				}
			}
		})
	}
	wg.Wait()
	if p := peakLen.Load(); p > maxRecs+workers {
		t.Errorf("held up to %d records, bound %d (+%d in flight)", p, maxRecs, workers)
	}
	if p := peakBytes.Load(); p > maxBytes+workers*body {
		t.Errorf("held up to %d body bytes, bound %d (+%d in flight)", p, maxBytes, workers*body)
	}
	left := int64(m.Len())
	if got, want := deleted.Load()+expired.Load()+left, created.Load(); got != want {
		t.Errorf("deleted %d + expired/evicted %d + left %d = %d, want created %d",
			deleted.Load(), expired.Load(), left, got, want)
	}
}
