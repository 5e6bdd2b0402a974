package session

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Memory is the embedded in-process Store: the default when tether runs
// without Redis, and the reference for the semantics every Store shares.
//
// Records live in a table (see table): sharded, each shard behind its own
// RWMutex, so no lock is global and a lookup contends only with writes to
// the same shard. Each entry's record pointer is atomic: Get and Touch take
// only a shard's read lock, and Touch publishes a fresh copy of the record
// rather than modifying the shared one. Because that refresh happens at most
// once per TTL/10, the idle clock may lag the real last use by up to TTL/10:
// a session idle for between 0.9·TTL and TTL may already be gone.
//
// The store is bounded (MaxSessions records, MaxInitBytes of distinct
// initialize bodies): a Create past a bound evicts the least recently used
// records (idle ones first), and byte-identical initialize bodies are kept
// once.
//
// Who removes what, so that OnChange hears exactly once of each record that
// ends (Deleted or Expired): an idle-expired record is reported as absent by every
// method (Get, Touch, Swap, Delete), but only the sweeper (Sweep), an
// eviction or a Create of the same id removes it, all under the shard's
// write lock. Delete removes only live records and hands them to its
// caller. A record leaves the store either through Delete (a Deleted
// change) or as an Expired change, never both.
type Memory struct {
	ttl        time.Duration
	touchEvery time.Duration // Touch refreshes LastUsed at most this often
	sweepEvery time.Duration
	now        func() time.Time
	onChange   func(Change)
	onEvict    func(reason string)

	tab *table[memEntry]
	// tasks are the task records (see TaskRecord), bounded by MaxTasks.
	tasks       *table[taskEntry]
	onTaskEvict func()

	closeOnce sync.Once
	stop      chan struct{} // closed by Close
	done      chan struct{} // closed when the sweeper has returned
}

var (
	_ Store         = (*Memory)(nil)
	_ BackendLister = (*Memory)(nil)
)

// MemoryOptions configures NewMemory. The zero value is usable.
type MemoryOptions struct {
	// TTL is the idle time after which a session is gone. Default 1h.
	TTL time.Duration
	// Now is the store's clock; nil means time.Now. Tests inject a fake.
	Now func() time.Time
	// SweepInterval is how often expired records are removed (expired
	// records are invisible before that anyway; the sweep frees their memory
	// and tells OnChange). Default TTL/10, limited to [1s, 1m].
	SweepInterval time.Duration
	// MaxSessions bounds the records held; default DefaultMaxSessions.
	MaxSessions int
	// MaxInitBytes bounds the bytes of the distinct initialize bodies held,
	// and of the distinct Hosts and Paths; default DefaultMaxInitBytes. A
	// Create whose body, Host and Path alone are larger fails with
	// errInitTooLarge.
	MaxInitBytes int64
	// OnChange, if set, is told of every change (see Change): Created,
	// Moved (Swap), Deleted, and Expired for a record that leaves the store
	// without being returned by Delete (removed by the sweeper after idle
	// expiry, evicted to respect a bound, or an expired record replaced by
	// Create with the same ClientSID). It is called outside any lock and
	// may use the store, but must not call Close (Close waits for the
	// sweeper, which may be the caller).
	OnChange func(Change)
	// OnEvict, if set, is called (outside any lock) for each record evicted
	// to respect a bound, with the bound's name (EvictMaxSessions,
	// EvictMaxInitBytes), e.g. to count evictions in a metric. OnChange
	// hears of the record's expiry too.
	OnEvict func(reason string)
	// MaxTasks bounds the task records held; default defaultMaxTasks.
	MaxTasks int
	// OnTaskEvict, if set, is called (outside any lock) for each task
	// record evicted at MaxTasks.
	OnTaskEvict func()
}

// memEntry is a table entry of the memory store. The record pointer is
// atomic so that Touch can publish a refreshed copy under the shard's read
// lock; Create, Swap, Delete, sweep and eviction change it only under the
// write lock.
type memEntry struct {
	rec atomic.Pointer[Record]
}

const (
	defaultTTL = time.Hour
	minSweep   = time.Second
	maxSweep   = time.Minute
)

var (
	errEmptyID = errors.New("session: empty ClientSID")
	errSwapID  = errors.New("session: Swap must keep ClientSID")
	// errInitTooLarge reports a record whose initialize body alone exceeds
	// the store's byte bound: it cannot be kept without evicting everything
	// else. The proxy refuses such bodies long before (--max-init-body, 64 KiB).
	errInitTooLarge = errors.New("session: initialize body larger than the store's byte bound")
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
	maxLen := int64(opts.MaxSessions)
	if maxLen <= 0 {
		maxLen = DefaultMaxSessions
	}
	maxBytes := opts.MaxInitBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxInitBytes
	}
	m := &Memory{
		ttl:         ttl,
		touchEvery:  ttl / 10,
		sweepEvery:  sweep,
		now:         now,
		onChange:    opts.OnChange,
		onEvict:     opts.OnEvict,
		onTaskEvict: opts.OnTaskEvict,
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	m.tab = newTable(maxLen, maxBytes,
		func(e *memEntry, now int64) bool { return m.expired(e.rec.Load(), time.Unix(0, now)) },
		func(e *memEntry) string { return e.rec.Load().ClientSID },
		func(e *memEntry) []byte { return e.rec.Load().Init },
		func(e *memEntry) (string, string) { r := e.rec.Load(); return r.Host, r.Path })
	maxTasks := int64(opts.MaxTasks)
	if maxTasks <= 0 {
		maxTasks = defaultMaxTasks
	}
	m.tasks = newTaskTable(maxTasks)
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
			now := m.now()
			m.Sweep(now)
			m.SweepTasks(now)
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

// expired reports whether r has been idle for a full TTL at now.
func (m *Memory) expired(r *Record, now time.Time) bool {
	return now.Sub(r.LastUsed) >= m.ttl
}

// Get returns the stored record for clientSID. It does not allocate. The
// context is unused: the memory store never waits on anything but a shard's
// read lock.
func (m *Memory) Get(_ context.Context, clientSID string) (*Record, error) {
	n := m.tab.get(clientSID)
	if n == nil {
		return nil, ErrNotFound
	}
	// Loading after the unlock is fine: a concurrent Delete or Swap is then
	// simply ordered after this Get.
	r := n.val.rec.Load()
	if m.expired(r, m.now()) {
		// Leave the removal to the sweeper, which tells OnChange.
		return nil, ErrNotFound
	}
	return r, nil
}

// Reload is Get: the memory store is its own authority.
func (m *Memory) Reload(ctx context.Context, clientSID string) (*Record, error) {
	return m.Get(ctx, clientSID)
}

// Create stores a copy of r (see Store.Create). A live record with the same
// id is kept and ErrExists returned; an expired one is replaced (an
// Expired change). Past a bound, the least recently used records are
// evicted (Expired changes too).
func (m *Memory) Create(_ context.Context, r *Record) error {
	if r.ClientSID == "" {
		return errEmptyID
	}
	if err := checkAddress(r); err != nil {
		return err
	}
	if recordBytes(r) > m.tab.maxBytes {
		return errInitTooLarge
	}
	now := m.now()
	// Interned before taking the shard lock: a new body is copied here.
	rec := own(r, nil, m.tab.bodies.acquire(r.Init))
	rec.Host, rec.Path = m.tab.addrs.acquireString(r.Host), m.tab.addrs.acquireString(r.Path)
	rec.Version = 1
	rec.LastUsed = now
	if rec.Created.IsZero() {
		rec.Created = now
	}
	n := new(node[memEntry]) // keyed by the store's own copy of the id
	n.val.rec.Store(rec)

	s := m.tab.shard(rec.ClientSID)
	s.mu.Lock()
	var replaced *Record
	if old := s.m[rec.ClientSID]; old != nil {
		cur := old.val.rec.Load()
		if !m.expired(cur, now) {
			s.mu.Unlock()
			m.tab.releaseRecord(rec)
			return ErrExists
		}
		replaced = cur
		m.tab.removeLocked(s, old)
	}
	m.tab.insertLocked(s, n)
	var gone []evicted[memEntry]
	if _, over := m.tab.over(); over {
		gone = m.tab.evictLocked(s, n, now.UnixNano(), nil)
	}
	s.mu.Unlock()
	if _, over := m.tab.over(); over {
		gone = m.tab.evictElsewhere(s, now.UnixNano(), gone)
	}

	if m.onChange != nil {
		if replaced != nil {
			m.onChange(Change{Kind: Expired, Old: replaced})
		}
		m.onChange(Change{Kind: Created, New: rec})
	}
	m.report(gone)
	return nil
}

// report tells OnEvict and OnChange of records taken out by eviction.
func (m *Memory) report(gone []evicted[memEntry]) {
	for _, e := range gone {
		if !e.expired && m.onEvict != nil {
			m.onEvict(e.reason)
		}
		if m.onChange != nil {
			m.onChange(Change{Kind: Expired, Old: e.node.val.rec.Load()})
		}
	}
}

// Swap is a compare-and-swap on Version (see Store.Swap). The stored copy
// keeps the session's Principal: a session never changes hands.
func (m *Memory) Swap(_ context.Context, old, next *Record) (*Record, error) {
	if next.ClientSID != old.ClientSID {
		return nil, errSwapID
	}
	if err := checkAddress(next); err != nil {
		return nil, err
	}
	now := m.now()

	s := m.tab.shard(old.ClientSID)
	s.mu.Lock()
	cur, rec, err := m.swapLocked(s, old, next, now)
	s.mu.Unlock()
	if err == nil && m.onChange != nil {
		m.onChange(Change{Kind: Moved, Old: cur, New: rec})
	}
	if errors.Is(err, ErrConflict) {
		return cur, err
	}
	return rec, err
}

// swapLocked is Swap under the shard's write lock; it returns the record
// it found and the one it stored.
func (m *Memory) swapLocked(s *tableShard[memEntry], old, next *Record, now time.Time) (cur, rec *Record, err error) {
	n := s.m[old.ClientSID]
	if n == nil {
		return nil, nil, ErrNotFound
	}
	cur = n.val.rec.Load()
	if m.expired(cur, now) {
		return nil, nil, ErrNotFound
	}
	if cur.Version != old.Version {
		return cur, nil, ErrConflict
	}
	// Copied against the stored record: next normally shares its strings
	// and Init with it, and those are reused rather than copied again.
	init := cur.Init
	if !sameBytes(next.Init, cur.Init) {
		init = m.tab.bodies.acquire(next.Init)
		m.tab.bodies.release(cur.Init)
	}
	rec = own(next, cur, init)
	rec.Principal = cur.Principal
	rec.Host = m.tab.addrs.swapString(cur.Host, next.Host)
	rec.Path = m.tab.addrs.swapString(cur.Path, next.Path)
	rec.Version = cur.Version + 1
	// A swap is a use of the session (it happens on a request); never move
	// the idle clock backwards.
	rec.LastUsed = now
	if cur.LastUsed.After(now) {
		rec.LastUsed = cur.LastUsed
	}
	n.val.rec.Store(rec)
	n.used.Store(true)
	return cur, rec, nil
}

// Touch refreshes clientSID's idle clock as of now (see Store.Touch). It
// takes only the shard's read lock, and does nothing (without allocating)
// when the last accepted use is less than TTL/10 old; otherwise it publishes
// a copy of the record with LastUsed = now. That copy is the only write, once
// per TTL/10 per session, and it keeps the stored records immutable.
func (m *Memory) Touch(_ context.Context, clientSID string, now time.Time) error {
	s := m.tab.shard(clientSID)
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := s.m[clientSID]
	if n == nil {
		return ErrNotFound
	}
	if !n.used.Load() {
		n.used.Store(true)
	}
	for {
		cur := n.val.rec.Load()
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
		if n.val.rec.CompareAndSwap(cur, next) {
			return nil
		}
	}
}

// Delete removes a live record and returns it (see Store.Delete). An
// expired record is not removed here: it belongs to the sweeper, which
// tells of it as Expired.
func (m *Memory) Delete(_ context.Context, clientSID string) (*Record, error) {
	now := m.now()
	s := m.tab.shard(clientSID)
	s.mu.Lock()
	r := m.deleteLocked(s, clientSID, now)
	s.mu.Unlock()
	if r == nil {
		return nil, ErrNotFound
	}
	if m.onChange != nil {
		m.onChange(Change{Kind: Deleted, Old: r})
	}
	return r, nil
}

// deleteLocked removes the live record of clientSID and returns it, or nil.
func (m *Memory) deleteLocked(s *tableShard[memEntry], clientSID string, now time.Time) *Record {
	n := s.m[clientSID]
	if n == nil {
		return nil
	}
	r := n.val.rec.Load()
	if m.expired(r, now) {
		return nil
	}
	m.tab.removeLocked(s, n)
	return r
}

// Sweep removes the records expired at now, tells OnChange of each (outside
// the locks) and returns how many it removed. The sweeper calls it
// periodically; tests call it with a fake clock.
func (m *Memory) Sweep(now time.Time) int {
	n := 0
	var gone []*Record
	for i := range m.tab.shards {
		s := &m.tab.shards[i]
		// Look under the read lock first: most sweeps find nothing, and then
		// they never block Get or Touch.
		if !m.anyExpired(s, now) {
			continue
		}
		s.mu.Lock()
		for _, e := range s.m {
			if r := e.val.rec.Load(); m.expired(r, now) {
				m.tab.removeLocked(s, e)
				gone = append(gone, r)
			}
		}
		s.mu.Unlock()
		n += len(gone)
		if m.onChange != nil {
			for _, r := range gone {
				m.onChange(Change{Kind: Expired, Old: r})
			}
		}
		clear(gone) // drop the references before reusing the slice
		gone = gone[:0]
	}
	return n
}

func (m *Memory) anyExpired(s *tableShard[memEntry], now time.Time) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, e := range s.m {
		if m.expired(e.val.rec.Load(), now) {
			return true
		}
	}
	return false
}

// Len returns the number of records held, including expired ones the
// sweeper has not removed yet. It is cheap: one atomic load.
func (m *Memory) Len() int { return m.tab.len() }

// MemoryStats describes what the memory store holds.
type MemoryStats struct {
	Sessions      int   // records held (expired ones not yet swept included)
	InitBytes     int64 // bytes of the distinct initialize bodies held
	DistinctInits int   // distinct initialize bodies held
	// Evictions are records evicted to respect a bound, by bound.
	EvictedMaxSessions, EvictedMaxInitBytes int64
	// Tasks are the task records held (expired ones not yet swept
	// included); EvictedMaxTasks those evicted at MaxTasks.
	Tasks           int
	EvictedMaxTasks int64
}

// Stats returns a snapshot of what the store holds.
func (m *Memory) Stats() MemoryStats {
	return MemoryStats{
		Sessions:            m.tab.len(),
		InitBytes:           m.tab.bodies.total.Load(),
		DistinctInits:       m.tab.bodies.distinct(),
		EvictedMaxSessions:  m.tab.evictedLen.Load(),
		EvictedMaxInitBytes: m.tab.evictedBytes.Load(),
		Tasks:               m.tasks.len(),
		EvictedMaxTasks:     m.tasks.evictedLen.Load(),
	}
}

// Range calls f for each live (unexpired) record, in no particular order,
// until f returns false. It is meant for status and explain output. f runs
// outside the store's locks, so it may use the store; records created or
// removed during Range may or may not be seen.
func (m *Memory) Range(f func(*Record) bool) {
	now := m.now()
	var buf []*Record
	for i := range m.tab.shards {
		s := &m.tab.shards[i]
		s.mu.RLock()
		for _, e := range s.m {
			if r := e.val.rec.Load(); !m.expired(r, now) {
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

// SessionsOn lists up to limit live sessions whose record names backendID
// (see BackendLister), in map order, which differs from call to call. It
// scans the whole table, one shard's read lock at a time, holding each only
// while it compares that shard's records (no allocation but the result's);
// it stops at limit.
func (m *Memory) SessionsOn(ctx context.Context, backendID string, limit int) ([]string, error) {
	limit = min(limit, MaxSessionsOn)
	if limit <= 0 {
		return nil, nil
	}
	now := m.now()
	var out []string
	for i := range m.tab.shards {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s := &m.tab.shards[i]
		s.mu.RLock()
		for _, e := range s.m {
			if r := e.val.rec.Load(); r.BackendID == backendID && !m.expired(r, now) {
				out = append(out, r.ClientSID)
				if len(out) == limit {
					break
				}
			}
		}
		s.mu.RUnlock()
		if len(out) == limit {
			break
		}
	}
	return out, nil
}

// own returns a copy of r that the store can keep, with init (the store's
// interned copy of r's body) as its Init: it shares no memory with the
// caller except what is immutable by contract and already owned by the
// store (the fields of prev, a record the store handed out). Strings are
// copied so that a session id sliced out of a large buffer does not pin
// that buffer for the session's lifetime.
func own(r, prev *Record, init []byte) *Record {
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
	if prev != nil && c.Principal == prev.Principal {
		c.Principal = prev.Principal
	} else {
		c.Principal = strings.Clone(c.Principal)
	}
	c.Init = init
	// BackendID, BackendURL and ProtocolVersion are shared by many sessions
	// and come from long-lived values (the endpoint set, a header); they are
	// kept as given. Host and Path are the caller's to intern (see
	// table.addrs): they come from each request, and count in the bound.
	return &c
}

// sameBytes reports whether a and b are the same slice of the same array.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// sameString reports whether a and b are the same bytes in memory.
func sameString(a, b string) bool {
	return len(a) == len(b) && (len(a) == 0 || unsafe.StringData(a) == unsafe.StringData(b))
}
