package session

import (
	"bytes"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Limits of the in-process stores (the memory store, and the cache in front
// of Redis). cmd/tether's flags default to them.
const (
	// DefaultMaxSessions bounds the records one process holds. It is a
	// safety net, not a capacity target: each live session also holds a
	// backend session, which costs the backend far more. A record costs
	// about 340 bytes when clients send identical initialize bodies, about
	// 420 bytes plus its body when they differ (BenchmarkMemoryFootprint,
	// BenchmarkCacheFootprint), so the bound is about 100 MiB at most,
	// besides the bodies (DefaultMaxInitBytes): within a sidecar's 512 MiB.
	DefaultMaxSessions = 250_000
	// DefaultMaxInitBytes bounds the initialize bodies one process holds,
	// each distinct body counted once (identical bodies are shared). 128 MiB
	// keeps 2,000 sessions with distinct bodies at the 64 KiB
	// initialize limit (the proxy's --max-init-body), or about 40,000 with real (1-4 KB) distinct
	// bodies; most clients of one proxy send byte-identical bodies, which
	// cost nothing more. The initialize requests' Hosts and Paths count
	// too, each distinct one once: a few dozen bytes in all when clients
	// use one endpoint, and a bound on what clients that vary them (up to
	// MaxAddressLen each) can make a process hold.
	DefaultMaxInitBytes = 128 << 20
)

// Eviction reasons, as in the tether_session_evictions_total metric.
const (
	EvictMaxSessions  = "max_sessions"
	EvictMaxInitBytes = "max_init_bytes"
)

// table is the bounded map both in-process stores keep their entries in:
// sharded (no lock is global), bounded by a count of entries and by the
// bytes of the distinct initialize bodies they hold, and evicting the least
// recently used entries when a bound is reached, never growing past it.
//
// Recency is kept the way CLOCK does, so that a lookup only reads a shard
// under its read lock and sets a flag: each shard keeps its entries in a
// queue; a lookup marks its entry used; eviction takes the entry at the
// tail, and if it was used since it was queued it gets a second chance (it
// goes back to the head, unmarked) instead of being evicted. An entry used
// since the last eviction pass therefore outlives every entry that was not.
// Entries the owner reports dead (idle past the TTL) go first, whatever
// their mark.
//
// Each shard is bounded as part of the whole: an insertion over a bound
// evicts from its own shard first (under the lock it holds), then from the
// others in turn. Shards hold at least 1024 entries each (fewer shards for
// small bounds), so eviction order is close to a global LRU, and exact for
// bounds under 2048 (one shard).
type table[V any] struct {
	shards   []tableShard[V]
	mask     uint64
	seed     maphash.Seed
	maxLen   int64
	maxBytes int64
	// dead reports an entry that is over anyway (idle past the TTL); it is
	// evicted first and reported as expired rather than evicted.
	dead func(v *V, now int64) bool
	// keyOf and initOf read an entry's key and its interned initialize body
	// (released when the entry leaves), so that nodes need not hold them;
	// addrOf its interned Host and Path (nil: entries hold none).
	keyOf  func(v *V) string
	initOf func(v *V) []byte
	addrOf func(v *V) (host, path string)

	n      atomic.Int64 // entries held
	bodies bodies
	// addrs interns the records' Hosts and Paths apart from the bodies (so
	// that the bodies' figures stay theirs), within the same byte bound: a
	// client chooses both, and every session of one endpoint repeats them.
	addrs  bodies
	cursor atomic.Uint64 // the shard where the next cross-shard eviction starts

	evictedLen, evictedBytes atomic.Int64 // evictions by reason
}

const (
	cacheLine      = 64
	maxShards      = 64 // a power of two, so a shard is picked with a mask
	minShardLen    = 1024
	tableShardSize = unsafe.Sizeof(struct {
		mu         sync.RWMutex
		m          map[string]*byte
		head, tail *byte
	}{})
)

// tableShard is one slice of the map. It is padded to whole cache lines so
// that locking one shard does not invalidate its neighbour in other cores'
// caches.
type tableShard[V any] struct {
	mu sync.RWMutex
	m  map[string]*node[V]
	// head is the most recently queued entry, tail the next eviction
	// candidate; both and every node's links are guarded by mu (written
	// under the write lock only).
	head, tail *node[V]
	_          [cacheLine - tableShardSize%cacheLine]byte
}

// node is one entry of the table: 32 bytes besides V, as every session has
// one.
type node[V any] struct {
	val  V
	used atomic.Bool
	// prev is towards the head, next towards the tail.
	prev, next *node[V]
}

// newTable returns a table bounded by maxLen entries and maxBytes of
// distinct initialize bodies, Hosts and Paths (each > 0). Entries' bodies
// must have been acquired from t.bodies, their Hosts and Paths from t.addrs.
func newTable[V any](maxLen, maxBytes int64, dead func(*V, int64) bool, keyOf func(*V) string, initOf func(*V) []byte,
	addrOf func(*V) (host, path string)) *table[V] {
	shards := 1
	for shards < maxShards && int64(shards)*2*minShardLen <= maxLen {
		shards *= 2
	}
	t := &table[V]{
		shards:   make([]tableShard[V], shards),
		mask:     uint64(shards - 1),
		seed:     maphash.MakeSeed(),
		maxLen:   maxLen,
		maxBytes: maxBytes,
		dead:     dead,
		keyOf:    keyOf,
		initOf:   initOf,
		addrOf:   addrOf,
	}
	t.bodies.m = make(map[string]bodyRef)
	t.addrs.m = make(map[string]bodyRef)
	for i := range t.shards {
		t.shards[i].m = make(map[string]*node[V])
	}
	return t
}

func (t *table[V]) shard(key string) *tableShard[V] {
	return &t.shards[maphash.String(t.seed, key)&t.mask]
}

// get returns key's entry and marks it used. It takes only the shard's read
// lock and does not allocate.
func (t *table[V]) get(key string) *node[V] {
	s := t.shard(key)
	s.mu.RLock()
	n := s.m[key]
	s.mu.RUnlock()
	if n != nil && !n.used.Load() { // a load first: most lookups find it set and write nothing
		n.used.Store(true)
	}
	return n
}

// peek returns key's entry without marking it used.
func (t *table[V]) peek(key string) *node[V] {
	s := t.shard(key)
	s.mu.RLock()
	n := s.m[key]
	s.mu.RUnlock()
	return n
}

// Len returns the number of entries.
func (t *table[V]) len() int { return int(t.n.Load()) }

// insertLocked adds n at the head of s; no entry for its key may be
// present. The caller holds s's write lock.
func (t *table[V]) insertLocked(s *tableShard[V], n *node[V]) {
	s.m[t.keyOf(&n.val)] = n
	n.prev, n.next = nil, s.head
	if s.head != nil {
		s.head.prev = n
	} else {
		s.tail = n
	}
	s.head = n
	t.n.Add(1)
}

// removeLocked takes n out of s and releases its body. The caller holds
// s's write lock.
func (t *table[V]) removeLocked(s *tableShard[V], n *node[V]) {
	s.unlinkLocked(n)
	delete(s.m, t.keyOf(&n.val))
	t.n.Add(-1)
	t.bodies.release(t.initOf(&n.val))
	if t.addrOf != nil {
		host, path := t.addrOf(&n.val)
		t.addrs.releaseString(host)
		t.addrs.releaseString(path)
	}
}

// releaseRecord drops the references r holds (its body, Host and Path),
// for a record acquired but never inserted.
func (t *table[V]) releaseRecord(r *Record) {
	t.bodies.release(r.Init)
	t.addrs.releaseString(r.Host)
	t.addrs.releaseString(r.Path)
}

// recordBytes is what r counts against a table's byte bound when nothing
// it holds is shared: its body, Host and Path.
func recordBytes(r *Record) int64 { return int64(len(r.Init) + len(r.Host) + len(r.Path)) }

func (s *tableShard[V]) unlinkLocked(n *node[V]) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		s.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		s.tail = n.prev
	}
	n.prev, n.next = nil, nil
}

func (s *tableShard[V]) pushHeadLocked(n *node[V]) {
	s.unlinkLocked(n)
	n.next = s.head
	if s.head != nil {
		s.head.prev = n
	} else {
		s.tail = n
	}
	s.head = n
}

// over reports which bound, if any, the table is past.
func (t *table[V]) over() (reason string, ok bool) {
	switch {
	case t.n.Load() > t.maxLen:
		return EvictMaxSessions, true
	case t.bodies.total.Load()+t.addrs.total.Load() > t.maxBytes:
		return EvictMaxInitBytes, true
	}
	return "", false
}

// evicted is an entry taken out to respect a bound.
type evicted[V any] struct {
	node    *node[V]
	reason  string // EvictMaxSessions or EvictMaxInitBytes
	expired bool   // dead anyway: reported as an expiry, not an eviction
}

// evictLocked evicts from s, whose write lock the caller holds, until the
// table is within its bounds or s has nothing left to give but keep (the
// entry just inserted, never evicted). It appends what it took to out.
func (t *table[V]) evictLocked(s *tableShard[V], keep *node[V], now int64, out []evicted[V]) []evicted[V] {
	for {
		reason, ok := t.over()
		if !ok {
			return out
		}
		n := t.victimLocked(s, keep, now)
		if n == nil {
			return out
		}
		out = append(out, t.take(s, n, reason, now))
	}
}

// evictElsewhere evicts from the shards other than skip, one at a time and
// in turn, until the table is within its bounds or no shard gives anything.
// It takes no lock while another is held.
func (t *table[V]) evictElsewhere(skip *tableShard[V], now int64, out []evicted[V]) []evicted[V] {
	idle := 0 // consecutive shards that gave nothing
	for idle < len(t.shards) {
		reason, ok := t.over()
		if !ok {
			break
		}
		s := &t.shards[t.cursor.Add(1)&t.mask]
		if s == skip {
			idle++
			continue
		}
		s.mu.Lock()
		n := t.victimLocked(s, nil, now)
		if n != nil {
			out = append(out, t.take(s, n, reason, now))
		}
		s.mu.Unlock()
		if n == nil {
			idle++
		} else {
			idle = 0
		}
	}
	return out
}

func (t *table[V]) take(s *tableShard[V], n *node[V], reason string, now int64) evicted[V] {
	e := evicted[V]{node: n, reason: reason, expired: t.dead(&n.val, now)}
	t.removeLocked(s, n)
	if !e.expired {
		if reason == EvictMaxSessions {
			t.evictedLen.Add(1)
		} else {
			t.evictedBytes.Add(1)
		}
	}
	return e
}

// victimLocked picks s's eviction candidate (CLOCK, see table), or nil when
// s holds nothing but keep. The caller holds s's write lock.
func (t *table[V]) victimLocked(s *tableShard[V], keep *node[V], now int64) *node[V] {
	// Two passes at most: the first clears every mark it passes.
	for i, limit := 0, 2*len(s.m)+1; i < limit; i++ {
		n := s.tail
		switch {
		case n == nil:
			return nil
		case n == keep:
			if n.prev == nil {
				return nil // keep is all there is
			}
			s.pushHeadLocked(n)
		case t.dead(&n.val, now) || !n.used.Load():
			return n
		default:
			n.used.Store(false)
			s.pushHeadLocked(n)
		}
	}
	return nil
}

// bodies interns initialize bodies: records whose bodies are byte-identical
// (most clients of one proxy send the same initialize) share one copy. It
// counts references, so it knows the bytes of the distinct bodies held,
// which is what the byte bound limits. Its lock is taken only to add or
// remove a record, never to read one.
type bodies struct {
	mu    sync.Mutex
	m     map[string]bodyRef // keyed by the kept copy's bytes
	total atomic.Int64       // bytes of the distinct bodies in m
}

// bodyRef is the kept copy of a body (its bytes are the map key's, its
// length the key's length) and how many entries hold it.
type bodyRef struct {
	data *byte
	refs int
}

// acquire returns the kept copy of p (copying p if it is new) with one more
// reference; nil for an empty body. The copy is never modified.
func (b *bodies) acquire(p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.m[string(p)]; ok { // the conversion does not allocate
		r.refs++
		b.m[string(p)] = r
		return unsafe.Slice(r.data, len(p))
	}
	data := bytes.Clone(p)
	// The key shares data's memory: neither is ever modified.
	b.m[unsafe.String(&data[0], len(data))] = bodyRef{data: &data[0], refs: 1}
	b.total.Add(int64(len(data)))
	return data
}

// shared returns the kept copy of p if there is one, else a copy of p,
// without taking a reference: for a record about to be written elsewhere
// first and cached (acquire) after.
func (b *bodies) shared(p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	b.mu.Lock()
	r, ok := b.m[string(p)]
	b.mu.Unlock()
	if ok {
		return unsafe.Slice(r.data, len(p))
	}
	return bytes.Clone(p)
}

// release drops a reference to the body with p's bytes (acquired before;
// nil is fine); the last one removes it. Records that share the bytes keep
// them alive (they are garbage collected); they only stop being counted and
// found.
func (b *bodies) release(p []byte) {
	if len(p) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.m[string(p)]
	switch {
	case !ok:
	case r.refs > 1:
		r.refs--
		b.m[string(p)] = r
	default:
		delete(b.m, string(p))
		b.total.Add(-int64(len(p)))
	}
}

// acquireString is acquire for a string (a Host, a Path): it returns the
// kept copy of s.
func (b *bodies) acquireString(s string) string {
	if s == "" {
		return ""
	}
	kept := b.acquire(unsafe.Slice(unsafe.StringData(s), len(s)))
	return unsafe.String(&kept[0], len(kept))
}

// sharedString is shared for a string.
func (b *bodies) sharedString(s string) string {
	if s == "" {
		return ""
	}
	kept := b.shared(unsafe.Slice(unsafe.StringData(s), len(s)))
	return unsafe.String(&kept[0], len(kept))
}

// releaseString is release for a string acquired with acquireString.
func (b *bodies) releaseString(s string) {
	if s != "" {
		b.release(unsafe.Slice(unsafe.StringData(s), len(s)))
	}
}

// swapString is a record's string going from cur (acquired) to next: the
// kept copy of next, with cur's reference dropped, or cur itself when equal.
func (b *bodies) swapString(cur, next string) string {
	if next == cur {
		return cur
	}
	kept := b.acquireString(next)
	b.releaseString(cur)
	return kept
}

// distinct returns the number of distinct bodies held.
func (b *bodies) distinct() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
