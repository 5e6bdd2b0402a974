package session

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Memory is the embedded in-process Store: the default when tether runs
// without Redis, and the reference for the semantics every Store shares.
//
// The map is split into shards, each behind its own RWMutex, so that no lock
// is global and a lookup contends only with writes to the same shard. Each
// map value is an entry whose record pointer is atomic: Get and Touch take
// only a shard's read lock, and Touch publishes a fresh copy of the record
// rather than modifying the shared one. Because that refresh happens at most
// once per TTL/10, the idle clock may lag the real last use by up to TTL/10:
// a session idle for between 0.9·TTL and TTL may already be gone.
//
// Who removes what, so that OnExpire runs exactly once per expired record and
// never for a deleted one: an idle-expired record is reported as absent by
// every method (Get, Touch, Swap, Delete), but only the sweeper (Sweep) or a
// Create of the same id removes it, both under the shard's write lock. Delete
// removes only live records and hands them to its caller. A record leaves the
// store either through Delete's return value or through OnExpire, never both.
type Memory struct {
	ttl        time.Duration
	touchEvery time.Duration // Touch refreshes LastUsed at most this often
	sweepEvery time.Duration
	now        func() time.Time
	onExpire   func(*Record)
	seed       maphash.Seed

	shards [shardCount]shard

	closeOnce sync.Once
	stop      chan struct{} // closed by Close
	done      chan struct{} // closed when the sweeper has returned
}

var _ Store = (*Memory)(nil)

// MemoryOptions configures NewMemory. The zero value is usable.
type MemoryOptions struct {
	// TTL is the idle time after which a session is gone. Default 1h.
	TTL time.Duration
	// Now is the store's clock; nil means time.Now. Tests inject a fake.
	Now func() time.Time
	// SweepInterval is how often expired records are removed (expired
	// records are invisible before that anyway; the sweep frees their memory
	// and fires OnExpire). Default TTL/10, limited to [1s, 1m].
	SweepInterval time.Duration
	// OnExpire, if set, is called once for each record that leaves the store
	// without being returned by Delete: a record removed by the sweeper after
	// idle expiry, and a record replaced by Create with the same ClientSID.
	// Either way the session is over, which is what a per-backend
	// live-session counter needs to know. It is called outside any lock and
	// may use the store, but must not call Close (Close waits for the
	// sweeper, which may be the caller).
	OnExpire func(*Record)
}

const (
	defaultTTL  = time.Hour
	minSweep    = time.Second
	maxSweep    = time.Minute
	shardCount  = 64 // a power of two, so a shard is picked with a mask
	cacheLine   = 64
	shardFields = unsafe.Sizeof(struct {
		mu sync.RWMutex
		m  map[string]*entry
	}{})
)

// shard is one slice of the map. It is padded to whole cache lines so that
// locking one shard does not invalidate its neighbour in other cores' caches.
type shard struct {
	mu sync.RWMutex
	m  map[string]*entry
	_  [cacheLine - shardFields%cacheLine]byte
}

// entry is the map value. The record pointer is atomic so that Touch can
// publish a refreshed copy under the shard's read lock; Create, Swap, Delete
// and Sweep change it only under the write lock.
type entry struct {
	rec atomic.Pointer[Record]
}

var (
	errEmptyID = errors.New("session: empty ClientSID")
	errSwapID  = errors.New("session: Swap must keep ClientSID")
)

// NewMemory returns an empty store and starts its sweeper; Close stops it.
func NewMemory(opts MemoryOptions) *Memory {
	ttl := opts.TTL
	if ttl <= 0 {
		ttl = defaultTTL
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	sweep := opts.SweepInterval
	if sweep <= 0 {
		sweep = min(max(ttl/10, minSweep), maxSweep)
	}
	m := &Memory{
		ttl:        ttl,
		touchEvery: ttl / 10,
		sweepEvery: sweep,
		now:        now,
		onExpire:   opts.OnExpire,
		seed:       maphash.MakeSeed(),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	for i := range m.shards {
		m.shards[i].m = make(map[string]*entry)
	}
	go m.sweepLoop()
	return m
}

func (m *Memory) sweepLoop() {
	defer close(m.done)
	t := time.NewTicker(m.sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep(m.now())
		}
	}
}

// Close stops the sweeper and waits for it to return. The records stay
// readable; Close only ends background work. It is safe to call more than
// once.
func (m *Memory) Close() error {
	m.closeOnce.Do(func() { close(m.stop) })
	<-m.done
	return nil
}

func (m *Memory) shard(id string) *shard {
	return &m.shards[maphash.String(m.seed, id)&(shardCount-1)]
}

// expired reports whether r has been idle for a full TTL at now.
func (m *Memory) expired(r *Record, now time.Time) bool {
	return now.Sub(r.LastUsed) >= m.ttl
}

// Get returns the stored record for clientSID. It does not allocate. The
// context is unused: the memory store never waits on anything but a shard's
// read lock.
func (m *Memory) Get(_ context.Context, clientSID string) (*Record, error) {
	s := m.shard(clientSID)
	s.mu.RLock()
	e := s.m[clientSID]
	s.mu.RUnlock()
	if e == nil {
		return nil, ErrNotFound
	}
	// Loading after the unlock is fine: a concurrent Delete or Swap is then
	// simply ordered after this Get.
	r := e.rec.Load()
	if m.expired(r, m.now()) {
		// Leave the removal to the sweeper, which owns OnExpire.
		return nil, ErrNotFound
	}
	return r, nil
}

// Reload is Get: the memory store is its own authority.
func (m *Memory) Reload(ctx context.Context, clientSID string) (*Record, error) {
	return m.Get(ctx, clientSID)
}

// Create stores a copy of r (see Store.Create). A replaced record, live or
// expired, is handed to OnExpire.
func (m *Memory) Create(_ context.Context, r *Record) error {
	if r.ClientSID == "" {
		return errEmptyID
	}
	now := m.now()
	rec := own(r, nil)
	rec.Version = 1
	rec.LastUsed = now
	if rec.Created.IsZero() {
		rec.Created = now
	}

	s := m.shard(rec.ClientSID)
	s.mu.Lock()
	e := s.m[rec.ClientSID]
	var replaced *Record
	if e == nil {
		e = new(entry)
		// Keyed by the store's own copy of the id, which rec shares.
		s.m[rec.ClientSID] = e
	} else {
		replaced = e.rec.Load()
	}
	e.rec.Store(rec)
	s.mu.Unlock()

	if replaced != nil && m.onExpire != nil {
		m.onExpire(replaced)
	}
	return nil
}

// Swap is a compare-and-swap on Version (see Store.Swap).
func (m *Memory) Swap(_ context.Context, old, next *Record) (*Record, error) {
	if next.ClientSID != old.ClientSID {
		return nil, errSwapID
	}
	now := m.now()

	s := m.shard(old.ClientSID)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[old.ClientSID]
	if e == nil {
		return nil, ErrNotFound
	}
	cur := e.rec.Load()
	if m.expired(cur, now) {
		return nil, ErrNotFound
	}
	if cur.Version != old.Version {
		return cur, ErrConflict
	}
	// Copied against the stored record: next normally shares its strings
	// and Init with it, and those are reused rather than copied again.
	rec := own(next, cur)
	rec.Version = cur.Version + 1
	// A swap is a use of the session (it happens on a request); never move
	// the idle clock backwards.
	rec.LastUsed = now
	if cur.LastUsed.After(now) {
		rec.LastUsed = cur.LastUsed
	}
	e.rec.Store(rec)
	return rec, nil
}

// Touch refreshes clientSID's idle clock as of now (see Store.Touch). It
// takes only the shard's read lock, and does nothing (without allocating)
// when the last accepted use is less than TTL/10 old; otherwise it publishes
// a copy of the record with LastUsed = now. That copy is the only write, once
// per TTL/10 per session, and it keeps the stored records immutable.
func (m *Memory) Touch(_ context.Context, clientSID string, now time.Time) error {
	s := m.shard(clientSID)
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.m[clientSID]
	if e == nil {
		return ErrNotFound
	}
	for {
		cur := e.rec.Load()
		if m.expired(cur, now) {
			return ErrNotFound
		}
		if now.Sub(cur.LastUsed) < m.touchEvery {
			return nil
		}
		next := cur.Clone()
		next.LastUsed = now
		// Only another Touch can race here (every other writer holds the
		// write lock); after losing, the winner's LastUsed is usually recent
		// enough for the check above to return.
		if e.rec.CompareAndSwap(cur, next) {
			return nil
		}
	}
}

// Delete removes a live record and returns it (see Store.Delete). An
// expired record is not removed here: it belongs to the sweeper, which
// reports it through OnExpire.
func (m *Memory) Delete(_ context.Context, clientSID string) (*Record, error) {
	now := m.now()
	s := m.shard(clientSID)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[clientSID]
	if e == nil {
		return nil, ErrNotFound
	}
	r := e.rec.Load()
	if m.expired(r, now) {
		return nil, ErrNotFound
	}
	delete(s.m, clientSID)
	return r, nil
}

// Sweep removes the records expired at now, calls OnExpire for each (outside
// the locks) and returns how many it removed. The sweeper calls it
// periodically; tests call it with a fake clock.
func (m *Memory) Sweep(now time.Time) int {
	n := 0
	var gone []*Record
	for i := range m.shards {
		s := &m.shards[i]
		// Look under the read lock first: most sweeps find nothing, and then
		// they never block Get or Touch.
		if !m.anyExpired(s, now) {
			continue
		}
		s.mu.Lock()
		for id, e := range s.m {
			if r := e.rec.Load(); m.expired(r, now) {
				delete(s.m, id)
				gone = append(gone, r)
			}
		}
		s.mu.Unlock()
		n += len(gone)
		if m.onExpire != nil {
			for _, r := range gone {
				m.onExpire(r)
			}
		}
		clear(gone) // drop the references before reusing the slice
		gone = gone[:0]
	}
	return n
}

func (m *Memory) anyExpired(s *shard, now time.Time) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, e := range s.m {
		if m.expired(e.rec.Load(), now) {
			return true
		}
	}
	return false
}

// Len returns the number of records held, including expired ones the
// sweeper has not removed yet. It is cheap: it does not inspect records.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}

// Range calls f for each live (unexpired) record, in no particular order,
// until f returns false. It is meant for status and explain output. f runs
// outside the store's locks, so it may use the store; records created or
// removed during Range may or may not be seen.
func (m *Memory) Range(f func(*Record) bool) {
	now := m.now()
	var buf []*Record
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.RLock()
		for _, e := range s.m {
			if r := e.rec.Load(); !m.expired(r, now) {
				buf = append(buf, r)
			}
		}
		s.mu.RUnlock()
		for _, r := range buf {
			if !f(r) {
				return
			}
		}
		clear(buf)
		buf = buf[:0]
	}
}

// own returns a copy of r that the store can keep: it shares no memory
// with the caller except what is immutable by contract and already owned by
// the store (the fields of prev, a record the store handed out). Strings are
// copied so that a session id sliced out of a large buffer does not pin that
// buffer for the session's lifetime, and Init is copied so that the caller
// may reuse its body buffer and so that spare capacity is not kept.
func own(r, prev *Record) *Record {
	c := *r
	if prev != nil && c.ClientSID == prev.ClientSID {
		c.ClientSID = prev.ClientSID
	} else {
		c.ClientSID = strings.Clone(c.ClientSID)
	}
	switch {
	case prev != nil && c.BackendSID == prev.BackendSID:
		c.BackendSID = prev.BackendSID
	case c.BackendSID == c.ClientSID:
		c.BackendSID = c.ClientSID
	default:
		c.BackendSID = strings.Clone(c.BackendSID)
	}
	if prev == nil || !sameBytes(c.Init, prev.Init) {
		c.Init = bytes.Clone(c.Init)
	}
	// BackendID, BackendURL and ProtocolVersion are shared by many sessions
	// and come from long-lived values (the endpoint set, a header); they are
	// kept as given.
	return &c
}

// sameBytes reports whether a and b are the same slice of the same array.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
