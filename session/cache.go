package session

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Cache is the local, bounded cache in front of the shared Redis store, and
// what keeps tether routing while Redis is unreachable.
//
// Reads are served from the cache (no Redis command on a hit); an entry is
// re-read from Redis when another replica announces a change (pub/sub),
// after the subscription was lost and re-established (announcements may
// have been missed meanwhile), and, as a last resort, once older than
// MaxStale.
// Idle-TTL refreshes are written asynchronously, at most once per TTL/10
// per session, so a follow-up request costs a small fraction of a Redis
// command on average.
//
// While Redis is unreachable (degraded): cached sessions keep routing; a
// session that is not cached cannot be routed (ErrUnavailable: its backend
// is unknowable); new sessions are kept locally and written to Redis when it
// returns (bounded by MaxPending; what could not be kept is counted); a
// record that Redis lost (restarted empty, expired while touches failed) is
// written back from the cache.
type Cache struct {
	shared   *Redis
	shards   []*lru.Cache[string, *cacheEntry]
	seed     maphash.Seed
	ttl      time.Duration
	maxStale time.Duration
	now      func() time.Time
	log      *slog.Logger

	degraded   atomic.Bool
	transition sync.Mutex // orders degraded transitions with their callbacks
	onDegraded func(bool)
	// staleBefore: entries loaded before this Unix ns are re-read on use
	// (set when the invalidation subscription was re-established).
	staleBefore atomic.Int64
	touches     chan string

	pendMu     sync.Mutex
	pending    map[string]*Record // kept locally, not yet in Redis
	maxPending int

	hits, misses, unwritten, touchDrops atomic.Int64

	stop context.CancelFunc
	wg   sync.WaitGroup
}

var _ Store = (*Cache)(nil)

type cacheEntry struct {
	rec      *Record
	loadedAt int64        // Unix ns when rec was read from or written to Redis
	lastUsed atomic.Int64 // Unix ns of the last use seen by this replica
	touched  atomic.Int64 // Unix ns of the last TTL refresh sent to Redis
}

// CacheOptions configures a Cache.
type CacheOptions struct {
	Shared     *Redis        // required
	Size       int           // entries kept, default 100000
	TTL        time.Duration // the sessions' idle TTL (the shared store's), default 1h
	MaxStale   time.Duration // re-read an entry older than this, default TTL/10
	MaxPending int           // records kept for writing during an outage, default Size
	Now        func() time.Time
	Logger     *slog.Logger
	// OnDegraded is called on every transition into (true) and out of
	// (false) degraded mode, e.g. to set a gauge.
	OnDegraded func(degraded bool)
}

// cacheShards spreads the LRU over independently locked parts: golang-lru
// takes one lock per operation, and one cache-wide lock would serialize
// every request of the process.
const cacheShards = 32

// NewCache starts the cache's background work (asynchronous TTL refreshes,
// invalidations, outage recovery); Close stops it.
func NewCache(opts CacheOptions) *Cache {
	c := &Cache{
		shared:     opts.Shared,
		seed:       maphash.MakeSeed(),
		ttl:        opts.TTL,
		maxStale:   opts.MaxStale,
		now:        opts.Now,
		log:        opts.Logger,
		onDegraded: opts.OnDegraded,
		maxPending: opts.MaxPending,
		pending:    map[string]*Record{},
		touches:    make(chan string, 4096),
	}
	size := opts.Size
	if size <= 0 {
		size = 100000
	}
	if c.ttl <= 0 {
		c.ttl = time.Hour
	}
	if c.maxStale <= 0 {
		// Changes arrive by pub/sub; this only bounds the damage of one
		// missed without a disconnect. With TTL/10, a session re-read costs
		// no more than its TTL refreshes.
		c.maxStale = c.ttl / 10
	}
	if c.maxPending <= 0 {
		c.maxPending = size
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.onDegraded == nil {
		c.onDegraded = func(bool) {}
	}
	per := max(size/cacheShards, 1)
	for range cacheShards {
		l, _ := lru.New[string, *cacheEntry](per) // only fails for size <= 0
		c.shards = append(c.shards, l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	c.wg.Add(3)
	go func() { defer c.wg.Done(); c.touchLoop(ctx) }()
	go func() {
		defer c.wg.Done()
		c.shared.Invalidations(ctx, c.Invalidate, func() { c.staleBefore.Store(c.now().UnixNano()) })
	}()
	go func() { defer c.wg.Done(); c.healthLoop(ctx) }()
	return c
}

func (c *Cache) shard(sid string) *lru.Cache[string, *cacheEntry] {
	return c.shards[maphash.String(c.seed, sid)%cacheShards]
}

func (c *Cache) put(rec *Record, now time.Time) *cacheEntry {
	e := &cacheEntry{rec: rec, loadedAt: now.UnixNano()}
	e.lastUsed.Store(now.UnixNano())
	// Redis's idle TTL runs from the record's LastUsed, not from when this
	// replica read it: re-reads (every MaxStale) must not postpone refreshes.
	e.touched.Store(rec.LastUsed.UnixNano())
	c.shard(rec.ClientSID).Add(rec.ClientSID, e)
	return e
}

// Invalidate drops the cached copy of a session; the next use reads Redis.
func (c *Cache) Invalidate(clientSID string) { c.shard(clientSID).Remove(clientSID) }

// alive reports whether a cached entry's session is still within its idle
// TTL as this replica has seen it used.
func (c *Cache) alive(e *cacheEntry, now time.Time) bool {
	return now.UnixNano()-e.lastUsed.Load() < c.ttl.Nanoseconds()
}

// Get returns the cached record, reading Redis only on a miss or for an
// entry past MaxStale.
func (c *Cache) Get(ctx context.Context, clientSID string) (*Record, error) {
	now := c.now()
	e, ok := c.shard(clientSID).Get(clientSID)
	if ok && !c.alive(e, now) {
		ok = false
	}
	if ok && ((now.UnixNano()-e.loadedAt < c.maxStale.Nanoseconds() && e.loadedAt >= c.staleBefore.Load()) || c.degraded.Load()) {
		c.hits.Add(1)
		return e.rec, nil
	}
	c.misses.Add(1)
	if c.degraded.Load() {
		// Redis is known to be down: answer now rather than after a timeout.
		if p := c.pendingRecord(clientSID); p != nil {
			return p, nil
		}
		return nil, ErrUnavailable
	}
	var cached *cacheEntry
	if ok {
		cached = e
	}
	return c.load(ctx, clientSID, cached, now)
}

// Reload reads the authoritative record from Redis, bypassing the cache:
// a replica about to re-initialize a session first checks that no other
// replica already did.
func (c *Cache) Reload(ctx context.Context, clientSID string) (*Record, error) {
	now := c.now()
	e, ok := c.shard(clientSID).Peek(clientSID)
	if !ok || !c.alive(e, now) {
		e = nil
	}
	return c.load(ctx, clientSID, e, now)
}

func (c *Cache) load(ctx context.Context, sid string, cached *cacheEntry, now time.Time) (*Record, error) {
	rec, err := c.shared.Get(ctx, sid)
	switch {
	case err == nil:
		e := c.put(rec, now)
		if cached != nil {
			e.lastUsed.Store(cached.lastUsed.Load())
		}
		return rec, nil
	case errors.Is(err, ErrNotFound):
		if cached == nil {
			return nil, ErrNotFound
		}
		// Redis lost a session this replica is still serving (Redis
		// restarted empty, or the record expired while refreshes failed):
		// write it back rather than end a live session.
		if rerr := c.shared.Restore(ctx, cached.rec); rerr != nil {
			c.markDegraded(rerr)
			return cached.rec, nil
		}
		c.log.Info("session store: restored a record missing from Redis", "session_record_version", cached.rec.Version)
		c.put(cached.rec, now)
		return cached.rec, nil
	default:
		c.markDegraded(err)
		if cached != nil {
			return cached.rec, nil
		}
		if p := c.pendingRecord(sid); p != nil {
			return p, nil
		}
		return nil, ErrUnavailable
	}
}

// Create writes the new record through to Redis; while Redis is
// unreachable the record is kept locally and written when it returns.
func (c *Cache) Create(ctx context.Context, r *Record) error {
	if r.ClientSID == "" {
		return errors.New("session: empty ClientSID")
	}
	now := c.now()
	stored := r.Clone()
	stored.Init = bytes.Clone(r.Init) // the caller may reuse its buffer
	stored.Version = 1
	stored.LastUsed = now.Truncate(time.Millisecond).UTC()
	if stored.Created.IsZero() {
		stored.Created = stored.LastUsed
	}
	if !c.degraded.Load() {
		err := c.shared.Create(ctx, stored)
		if err == nil {
			c.put(stored, now)
			return nil
		}
		if !errors.Is(err, ErrUnavailable) {
			return err
		}
		c.markDegraded(err)
	}
	c.put(stored, now)
	c.addPending(stored)
	return nil
}

// Swap is the compare-and-swap in Redis; it needs Redis (a re-initialization
// decided by one replica alone could split a session across two backends).
func (c *Cache) Swap(ctx context.Context, old, next *Record) (*Record, error) {
	if c.degraded.Load() {
		return nil, ErrUnavailable
	}
	now := c.now()
	cur, err := c.shared.Swap(ctx, old, next)
	if errors.Is(err, ErrNotFound) && c.pendingRecord(old.ClientSID) != nil {
		// Created during an outage and not flushed yet: write it, then swap.
		if err = c.flushOne(ctx, old.ClientSID); err == nil {
			cur, err = c.shared.Swap(ctx, old, next)
		}
	}
	switch {
	case err == nil, errors.Is(err, ErrConflict):
		c.put(cur, now)
		return cur, err
	case errors.Is(err, ErrNotFound):
		c.Invalidate(old.ClientSID)
		return nil, err
	default:
		c.markDegraded(err)
		return nil, err
	}
}

// Touch records the use and, at most once per TTL/10 per session, queues
// an idle-TTL refresh for Redis. It never waits for Redis.
func (c *Cache) Touch(_ context.Context, clientSID string, now time.Time) error {
	e, ok := c.shard(clientSID).Peek(clientSID)
	if !ok {
		return nil // not cached: nothing is known here to refresh
	}
	if !c.alive(e, now) {
		return ErrNotFound // idle past the TTL: a Touch never revives a session
	}
	ns := now.UnixNano()
	e.lastUsed.Store(ns)
	prev := e.touched.Load()
	if ns-prev < c.ttl.Nanoseconds()/10 || !e.touched.CompareAndSwap(prev, ns) {
		return nil
	}
	select {
	case c.touches <- clientSID:
	default:
		e.touched.Store(prev) // queue full: the next request tries again
		c.touchDrops.Add(1)
	}
	return nil
}

func (c *Cache) touchLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case sid := <-c.touches:
			e, ok := c.shard(sid).Peek(sid)
			if !ok {
				continue
			}
			now := time.Unix(0, e.lastUsed.Load())
			err := c.shared.Touch(ctx, sid, now)
			switch {
			case err == nil:
			case errors.Is(err, ErrNotFound):
				if c.alive(e, c.now()) {
					if rerr := c.shared.Restore(ctx, withLastUsed(e.rec, now)); rerr != nil {
						c.markDegraded(rerr)
						c.addPending(withLastUsed(e.rec, now))
					}
				}
			default:
				c.markDegraded(err)
				c.addPending(withLastUsed(e.rec, now))
			}
		}
	}
}

func withLastUsed(r *Record, t time.Time) *Record {
	c := r.Clone()
	c.LastUsed = t.Truncate(time.Millisecond).UTC()
	return c
}

// Delete removes the session everywhere it can; while Redis is unreachable
// the Redis record is left to expire.
func (c *Cache) Delete(ctx context.Context, clientSID string) (*Record, error) {
	e, cached := c.shard(clientSID).Peek(clientSID)
	c.Invalidate(clientSID)
	pending := c.takePending(clientSID)
	if c.degraded.Load() {
		switch {
		case cached:
			return e.rec, nil
		case pending != nil:
			return pending, nil
		}
		return nil, ErrUnavailable
	}
	rec, err := c.shared.Delete(ctx, clientSID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		c.markDegraded(err)
		if cached {
			return e.rec, nil
		}
		return nil, err
	}
	if errors.Is(err, ErrNotFound) && pending != nil {
		return pending, nil
	}
	return rec, err
}

func (c *Cache) addPending(r *Record) {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	if _, ok := c.pending[r.ClientSID]; !ok && len(c.pending) >= c.maxPending {
		c.unwritten.Add(1)
		return
	}
	c.pending[r.ClientSID] = r
}

func (c *Cache) pendingRecord(sid string) *Record {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	return c.pending[sid]
}

func (c *Cache) takePending(sid string) *Record {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	r := c.pending[sid]
	delete(c.pending, sid)
	return r
}

func (c *Cache) flushOne(ctx context.Context, sid string) error {
	r := c.pendingRecord(sid)
	if r == nil {
		return nil
	}
	if err := c.shared.Restore(ctx, r); err != nil {
		return err
	}
	c.pendMu.Lock()
	if c.pending[sid] == r {
		delete(c.pending, sid)
	}
	c.pendMu.Unlock()
	return nil
}

func (c *Cache) markDegraded(err error) {
	// Only an unreachable Redis degrades the cache, not a caller's mistake
	// or a caller that gave up (cancelled context).
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) {
		return
	}
	c.transition.Lock()
	defer c.transition.Unlock()
	if c.degraded.CompareAndSwap(false, true) {
		c.log.Warn("session store degraded: Redis unreachable; serving cached sessions, keeping new ones locally", "err", err)
		c.onDegraded(true)
	}
}

// healthLoop pings Redis (every second while healthy, so an outage shows
// even when every request is a cache hit; four times a second while
// degraded); when Redis answers again, the records kept meanwhile are
// written and the cache leaves degraded mode.
func (c *Cache) healthLoop(ctx context.Context) {
	const healthyEvery, degradedEvery = time.Second, 250 * time.Millisecond
	t := time.NewTimer(healthyEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !c.degraded.Load() {
			if err := c.shared.Ping(ctx); err != nil && ctx.Err() == nil {
				c.markDegraded(err)
				t.Reset(degradedEvery)
				continue
			}
			// A record created while the last outage was ending may still
			// be waiting.
			c.flushPending(ctx)
			t.Reset(healthyEvery)
			continue
		}
		t.Reset(degradedEvery)
		if c.shared.Ping(ctx) != nil || c.flushPending(ctx) != nil {
			continue
		}
		c.transition.Lock()
		if c.degraded.CompareAndSwap(true, false) {
			c.log.Info("session store recovered: Redis reachable again")
			c.onDegraded(false)
		}
		c.transition.Unlock()
		t.Reset(healthyEvery)
		// Changes announced by other replicas during the outage were
		// missed: the resubscription marks every entry for a re-read, and a
		// re-initialization always re-reads first (Reload).
	}
}

func (c *Cache) flushPending(ctx context.Context) error {
	c.pendMu.Lock()
	batch := make([]*Record, 0, len(c.pending))
	for _, r := range c.pending {
		batch = append(batch, r)
	}
	c.pendMu.Unlock()
	for _, r := range batch {
		if err := c.flushOne(ctx, r.ClientSID); err != nil {
			return err
		}
	}
	if len(batch) > 0 {
		c.log.Info("session store: wrote records kept during the outage", "records", len(batch))
	}
	return nil
}

// CacheStats are the cache's counters.
type CacheStats struct {
	Hits, Misses int64
	Degraded     bool
	Pending      int   // records kept locally, waiting for Redis
	Unwritten    int64 // records that could not even be kept (MaxPending reached)
	TouchDrops   int64 // refreshes skipped because the queue was full (retried later)
	Entries      int
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() CacheStats {
	c.pendMu.Lock()
	pending := len(c.pending)
	c.pendMu.Unlock()
	n := 0
	for _, s := range c.shards {
		n += s.Len()
	}
	return CacheStats{
		Hits: c.hits.Load(), Misses: c.misses.Load(), Degraded: c.degraded.Load(),
		Pending: pending, Unwritten: c.unwritten.Load(), TouchDrops: c.touchDrops.Load(), Entries: n,
	}
}

// Degraded reports whether Redis is currently considered unreachable.
func (c *Cache) Degraded() bool { return c.degraded.Load() }

// BackendSessions is the shared store's fleet-wide count.
func (c *Cache) BackendSessions(ctx context.Context, backendIDs []string) (map[string]int64, error) {
	if c.degraded.Load() {
		return nil, ErrUnavailable
	}
	return c.shared.BackendSessions(ctx, backendIDs)
}

// Close stops the background work and closes the shared store.
func (c *Cache) Close() error {
	c.stop()
	c.wg.Wait()
	return c.shared.Close()
}
