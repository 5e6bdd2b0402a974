package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
// The cache is bounded like the memory store (MaxSessions entries,
// MaxInitBytes of distinct initialize bodies, least recently used entries
// evicted); an evicted entry stays in Redis and is read again on its next
// use.
//
// Degraded mode: only an outage degrades, and an outage is a failed call
// that a health probe confirms (a PING unanswered within four budgets). A slow reply from a Redis that
// answers pings (a large value, a busy moment) fails or retries that one
// call and nothing else. While degraded: cached sessions keep routing; a
// session that is not cached cannot be routed (ErrUnavailable: its backend
// is unknowable); new sessions are kept locally and written to Redis when
// it returns (bounded by MaxPending and MaxInitBytes; what could not be
// kept is counted), and at Close within CloseTimeout (what could not be
// written is logged and counted); a record that Redis lost (restarted
// empty, expired while touches failed) is written back from the cache.
//
// Recovery, when Redis lost its data (restarted empty, failed over to an
// empty replica): Redis holds an epoch marker (see Redis); a replica that
// finds it missing re-creates it and announces the loss on the invalidation
// channel, and every replica then writes back the records it cached before
// the loss (most recently used first, pipelined). For RecoveryGrace after
// the marker's (re-)creation, a miss does not answer ErrNotFound at once: it
// waits for the write-backs, re-reading as replicas announce they are done,
// so that a session cached only by another replica is not reported lost.
// Each replica also checks the marker with its health probe, so a replica
// that missed the announcement (its subscription broke with the restart)
// learns of the loss within a second.
type Cache struct {
	shared   *Redis
	tab      *table[cacheEntry]
	ttl      time.Duration
	maxStale time.Duration
	now      func() time.Time
	log      *slog.Logger

	degraded   atomic.Bool
	degradedBy atomic.Pointer[error] // the failure that last degraded it (wraps ErrUnavailable)
	transition sync.Mutex            // orders degraded transitions with their callbacks
	onDegraded func(bool)
	onChange   func(Change)
	// staleBefore: entries loaded before this Unix ns are re-read on use
	// (set when the invalidation subscription was re-established).
	staleBefore atomic.Int64
	touches     chan string

	probeMu sync.Mutex
	probing chan struct{} // closed when the outage probe in flight is done

	pendMu          sync.Mutex
	pending         map[string]*Record // kept locally, not yet in Redis
	pendingBytes    int64              // their initialize bodies
	maxPending      int
	maxPendingBytes int64

	// Recovery (see Cache).
	grace        time.Duration
	marker       atomic.Int64 // the epoch marker last seen (Unix ms), 0 before the first
	recoverUntil atomic.Int64 // Unix ns: misses wait until then, at least
	writeBefore  atomic.Int64 // Unix ns: entries loaded before it are to be written back
	writeBack    chan struct{}
	checkMarker  chan struct{}
	wakeMu       sync.Mutex
	wake         chan struct{} // closed (and replaced) when a replica finished a write-back
	waiting      atomic.Int64
	writingBack  atomic.Bool
	badMarker    atomic.Bool // logged an unreadable marker

	names names // interned backend ids, URLs and protocol versions of loaded records

	closeTimeout time.Duration

	hits, misses, unwritten, touchDrops    atomic.Int64
	slowReplies, recoveries, writtenBack   atomic.Int64
	collisions, unflushed, flushedAtClose  atomic.Int64
	recoveryWaits, recoveryFound, notFound atomic.Int64

	stop      context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var (
	_ Store         = (*Cache)(nil)
	_ BackendLister = (*Cache)(nil)
)

// cacheEntry is a table entry of the cache. rec and loadedAt never change:
// a re-read inserts a new entry.
type cacheEntry struct {
	rec      *Record
	loadedAt int64        // Unix ns when rec was read from or written to Redis
	lastUsed atomic.Int64 // Unix ns of the last use seen by this replica
	touched  atomic.Int64 // Unix ns of the last TTL refresh sent to Redis
}

// CacheOptions configures a Cache.
type CacheOptions struct {
	Shared *Redis // required
	// Size bounds the entries kept (see MaxSessions in cmd/tether); default
	// DefaultMaxSessions.
	Size int
	// MaxInitBytes bounds the bytes of the distinct initialize bodies (and
	// Hosts and Paths) cached, and separately those of the records kept
	// during an outage; default DefaultMaxInitBytes.
	MaxInitBytes int64
	TTL          time.Duration // the sessions' idle TTL (the shared store's), default 1h
	MaxStale     time.Duration // re-read an entry older than this, default TTL/10
	MaxPending   int           // records kept for writing during an outage, default Size
	// RecoveryGrace is how long after Redis lost its data a miss waits for
	// the replicas' write-backs before answering ErrNotFound; default 2s, a
	// negative value disables the wait.
	RecoveryGrace time.Duration
	// CloseTimeout bounds the writing of pending records at Close; default
	// 2s.
	CloseTimeout time.Duration
	Now          func() time.Time
	Logger       *slog.Logger
	// OnDegraded is called on every transition into (true) and out of
	// (false) degraded mode, e.g. to set a gauge.
	OnDegraded func(degraded bool)
	// OnChange, if set, is told of each change this replica makes (see
	// Change): Created (written to Redis, or kept for it during an outage),
	// Moved (a won Swap), Deleted (a Delete that returned the record). An
	// evicted cache entry is no change (the session lives on in Redis);
	// what other replicas and Redis's own expiry change is not told.
	OnChange func(Change)
}

const (
	defaultRecoveryGrace = 2 * time.Second
	defaultCloseTimeout  = 2 * time.Second
	// recoveryPoll is how often a waiting miss re-reads Redis when no
	// announcement wakes it first.
	recoveryPoll = 200 * time.Millisecond
	// maxRecoveryWaiters bounds the misses waiting at once; beyond it a miss
	// answers ErrUnavailable (a 503, which clients retry) rather than wait
	// or report the session lost.
	maxRecoveryWaiters = 1024
)

// NewCache starts the cache's background work (asynchronous TTL refreshes,
// invalidations, outage and loss recovery); Close stops it. It reads (or
// sets) the epoch marker first, within the call budget.
func NewCache(opts CacheOptions) *Cache {
	c := &Cache{
		shared:          opts.Shared,
		ttl:             opts.TTL,
		maxStale:        opts.MaxStale,
		now:             opts.Now,
		log:             opts.Logger,
		onDegraded:      opts.OnDegraded,
		onChange:        opts.OnChange,
		maxPending:      opts.MaxPending,
		maxPendingBytes: opts.MaxInitBytes,
		pending:         map[string]*Record{},
		touches:         make(chan string, 4096),
		grace:           opts.RecoveryGrace,
		closeTimeout:    opts.CloseTimeout,
		writeBack:       make(chan struct{}, 1),
		checkMarker:     make(chan struct{}, 1),
		wake:            make(chan struct{}),
	}
	size := int64(opts.Size)
	if size <= 0 {
		size = DefaultMaxSessions
	}
	if c.maxPendingBytes <= 0 {
		c.maxPendingBytes = DefaultMaxInitBytes
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
		c.maxPending = int(size)
	}
	switch {
	case c.grace == 0:
		c.grace = defaultRecoveryGrace
	case c.grace < 0:
		c.grace = 0
	}
	if c.closeTimeout <= 0 {
		c.closeTimeout = defaultCloseTimeout
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
	if c.onChange == nil {
		c.onChange = func(Change) {}
	}
	c.tab = newTable(size, c.maxPendingBytes,
		func(e *cacheEntry, now int64) bool { return now-e.lastUsed.Load() >= c.ttl.Nanoseconds() },
		func(e *cacheEntry) string { return e.rec.ClientSID },
		func(e *cacheEntry) []byte { return e.rec.Init },
		func(e *cacheEntry) (string, string) { return e.rec.Host, e.rec.Path })
	c.names.m = make(map[string]string)
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	// Learn the epoch before serving, so that the first miss knows it. A
	// Redis down at start is an outage like any other: the health loop
	// finds out.
	c.checkEpoch(ctx)
	c.wg.Add(4)
	go func() { defer c.wg.Done(); c.touchLoop(ctx) }()
	go func() {
		defer c.wg.Done()
		c.shared.invalidations(ctx, c.Invalidate, c.resubscribed, c.control)
	}()
	go func() { defer c.wg.Done(); c.healthLoop(ctx) }()
	go func() { defer c.wg.Done(); c.writeBackLoop(ctx) }()
	return c
}

// put caches rec as read from or written to Redis at now and returns the
// entry. Its Init, Host and Path are replaced by the interned copies (rec
// is cloned for that if needed: callers may share rec). A record whose
// body, Host and Path alone exceed the byte bound is not cached; the
// returned entry is then not in the table.
func (c *Cache) put(rec *Record, now time.Time) *cacheEntry {
	n := new(node[cacheEntry])
	keep := recordBytes(rec) <= c.tab.maxBytes
	if keep {
		init := c.tab.bodies.acquire(rec.Init)
		host, path := c.tab.addrs.acquireString(rec.Host), c.tab.addrs.acquireString(rec.Path)
		if !sameBytes(rec.Init, init) || !sameString(rec.Host, host) || !sameString(rec.Path, path) {
			rec = rec.Clone()
			rec.Init, rec.Host, rec.Path = init, host, path
		}
	}
	e := &n.val
	e.rec, e.loadedAt = rec, now.UnixNano()
	e.lastUsed.Store(now.UnixNano())
	// Redis's idle TTL runs from the record's LastUsed, not from when this
	// replica read it: re-reads (every MaxStale) must not postpone refreshes.
	e.touched.Store(rec.LastUsed.UnixNano())
	if !keep {
		return e // too large to keep
	}

	s := c.tab.shard(rec.ClientSID)
	s.mu.Lock()
	if old := s.m[rec.ClientSID]; old != nil {
		c.tab.removeLocked(s, old)
	}
	c.tab.insertLocked(s, n)
	if _, over := c.tab.over(); over {
		c.tab.evictLocked(s, n, now.UnixNano(), nil)
	}
	s.mu.Unlock()
	if _, over := c.tab.over(); over {
		c.tab.evictElsewhere(s, now.UnixNano(), nil)
	}
	return e
}

// Invalidate drops the cached copy of a session; the next use reads Redis.
func (c *Cache) Invalidate(clientSID string) {
	s := c.tab.shard(clientSID)
	s.mu.Lock()
	if n := s.m[clientSID]; n != nil {
		c.tab.removeLocked(s, n)
	}
	s.mu.Unlock()
}

// alive reports whether a cached entry's session is still within its idle
// TTL as this replica has seen it used.
func (c *Cache) alive(e *cacheEntry, now time.Time) bool {
	return now.UnixNano()-e.lastUsed.Load() < c.ttl.Nanoseconds()
}

// lookup returns the live cached entry for sid, or nil. mark says whether
// this is a use (for the eviction order).
func (c *Cache) lookup(sid string, now time.Time, mark bool) *cacheEntry {
	var n *node[cacheEntry]
	if mark {
		n = c.tab.get(sid)
	} else {
		n = c.tab.peek(sid)
	}
	if n == nil || !c.alive(&n.val, now) {
		return nil
	}
	return &n.val
}

// Get returns the cached record, reading Redis only on a miss or for an
// entry past MaxStale. A hit takes one shard's read lock and does not
// allocate.
func (c *Cache) Get(ctx context.Context, clientSID string) (*Record, error) {
	now := c.now()
	e := c.lookup(clientSID, now, true)
	if e != nil && ((now.UnixNano()-e.loadedAt < c.maxStale.Nanoseconds() && e.loadedAt >= c.staleBefore.Load()) || c.degraded.Load()) {
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
	return c.load(ctx, clientSID, e, now)
}

// Reload reads the authoritative record from Redis, bypassing the cache:
// a replica about to re-initialize a session first checks that no other
// replica already did.
func (c *Cache) Reload(ctx context.Context, clientSID string) (*Record, error) {
	now := c.now()
	return c.load(ctx, clientSID, c.lookup(clientSID, now, false), now)
}

// outage reports whether err, from a failed call, means Redis is down. A
// transport failure or timeout is confirmed by a health probe (one at a
// time; concurrent callers share its answer) before the cache degrades: a
// slow reply from a Redis that answers pings is not an outage. A caller
// that gave up (cancelled context) or a caller's mistake never degrades.
func (c *Cache) outage(err error) bool {
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) {
		return false
	}
	if c.degraded.Load() {
		return true
	}
	c.probeMu.Lock()
	if ch := c.probing; ch != nil {
		c.probeMu.Unlock()
		<-ch
		return c.degraded.Load()
	}
	ch := make(chan struct{})
	c.probing = ch
	c.probeMu.Unlock()

	down := c.shared.probe(context.Background()) != nil // bounded
	if down {
		c.markDegraded(err)
	} else {
		c.slowReplies.Add(1)
		c.log.Debug("session store: a call failed but Redis answers pings; not degrading", "err", err)
	}
	c.probeMu.Lock()
	c.probing = nil
	c.probeMu.Unlock()
	close(ch)
	return down
}

func (c *Cache) load(ctx context.Context, sid string, cached *cacheEntry, now time.Time) (*Record, error) {
	hint := 0
	if cached != nil {
		hint = len(cached.rec.Init)
	}
	rec, err := c.shared.get(ctx, sid, c.shared.budget(hint))
	if errors.Is(err, ErrUnavailable) && ctx.Err() == nil && !c.outage(err) {
		// Redis answers pings: the reply was slow, not lost (a large
		// record?). Once more, with time for a large one.
		rec, err = c.shared.get(ctx, sid, c.shared.slowReadBudget())
		if err != nil && !errors.Is(err, ErrNotFound) {
			c.outage(err)
		}
	}
	switch {
	case err == nil:
		e := c.put(c.adopt(rec), now)
		if cached != nil {
			e.lastUsed.Store(cached.lastUsed.Load())
		}
		return e.rec, nil
	case errors.Is(err, ErrNotFound):
		if cached == nil {
			if p := c.pendingRecord(sid); p != nil {
				return p, nil // kept during an outage, not written yet
			}
			return c.missed(ctx, sid, now)
		}
		// Redis lost a session this replica is still serving (Redis
		// restarted empty, or the record expired while refreshes failed):
		// write it back rather than end a live session, and have the
		// health loop look at the epoch marker now.
		c.askMarkerCheck()
		switch rerr := c.shared.restore(ctx, withLastUsed(cached.rec, time.Unix(0, cached.lastUsed.Load()))); {
		case errors.Is(rerr, ErrExists):
			return nil, c.collision(cached.rec)
		case errors.Is(rerr, errDeleted):
			return nil, c.deletedMeanwhile(cached.rec)
		case rerr != nil:
			c.outage(rerr)
			return cached.rec, nil
		}
		c.log.Info("session store: restored a record missing from Redis", "session_record_version", cached.rec.Version)
		e := c.put(cached.rec, now)
		e.lastUsed.Store(cached.lastUsed.Load())
		return e.rec, nil
	default:
		if cached != nil {
			return cached.rec, nil
		}
		if p := c.pendingRecord(sid); p != nil {
			return p, nil
		}
		if errors.Is(err, errBadReply) {
			return nil, err
		}
		return nil, ErrUnavailable
	}
}

// adopt prepares a record just read from Redis for caching: its id (the
// table's key) is copied out of whatever buffer the caller's id came from,
// and the strings every session repeats are shared.
func (c *Cache) adopt(rec *Record) *Record {
	sid := rec.ClientSID
	rec.ClientSID = strings.Clone(sid)
	if rec.BackendSID == sid {
		rec.BackendSID = rec.ClientSID
	}
	rec.BackendID, rec.BackendURL, rec.ProtocolVersion = c.names.get(rec.BackendID), c.names.get(rec.BackendURL), c.names.get(rec.ProtocolVersion)
	return rec
}

// collision handles a record this replica kept (pending, or cached and lost
// by Redis) whose id another live session took in Redis meanwhile: two
// backends minted the same id. Redis's session is kept; this one is
// dropped here and reported lost (ErrNotFound) rather than routed to the
// other session's backend.
// deletedMeanwhile drops the local copy of a session that a write-back
// found deleted in Redis (another replica ended it meanwhile).
func (c *Cache) deletedMeanwhile(r *Record) error {
	c.takePending(r.ClientSID)
	c.Invalidate(r.ClientSID)
	return ErrNotFound
}

func (c *Cache) collision(r *Record) error {
	c.collisions.Add(1)
	c.takePending(r.ClientSID)
	c.Invalidate(r.ClientSID)
	c.log.Warn("session store: a session kept locally lost its id to another session in Redis (two backends minted the same id); dropping the local one",
		"backend", r.BackendURL)
	return ErrNotFound
}

// Create writes the new record through to Redis. If a live record holds
// its id (in Redis, in this cache, or kept locally during an outage), it
// returns ErrExists and stores nothing. While Redis is unreachable, or
// slow to take the record, it is kept locally and written later.
func (c *Cache) Create(ctx context.Context, r *Record) error {
	if r.ClientSID == "" {
		return errors.New("session: empty ClientSID")
	}
	if err := checkAddress(r); err != nil {
		return err
	}
	if recordBytes(r) > c.tab.maxBytes {
		return errInitTooLarge
	}
	now := c.now()
	if c.lookup(r.ClientSID, now, false) != nil || c.pendingRecord(r.ClientSID) != nil {
		return ErrExists
	}
	stored := r.Clone()
	stored.ClientSID = strings.Clone(r.ClientSID)
	if r.BackendSID == r.ClientSID {
		stored.BackendSID = stored.ClientSID
	}
	stored.Init = c.tab.bodies.shared(r.Init) // the caller may reuse its buffer
	stored.Host, stored.Path = c.tab.addrs.sharedString(r.Host), c.tab.addrs.sharedString(r.Path)
	stored.Version = 1
	stored.LastUsed = now.Truncate(time.Millisecond).UTC()
	if stored.Created.IsZero() {
		stored.Created = stored.LastUsed
	}
	if !c.degraded.Load() {
		err := c.shared.Create(ctx, stored)
		switch {
		case err == nil:
			e := c.put(stored, now)
			c.onChange(Change{Kind: Created, New: e.rec})
			return nil
		case errors.Is(err, ErrExists), !errors.Is(err, ErrUnavailable):
			return err
		}
		// Down, or too slow to say (the write may even have happened: the
		// flush's restore then finds the same session and keeps it).
		c.outage(err)
	}
	e := c.put(stored, now)
	c.addPending(e.rec)
	c.onChange(Change{Kind: Created, New: e.rec})
	return nil
}

// Swap is the compare-and-swap in Redis; it needs Redis (a re-initialization
// decided by one replica alone could split a session across two backends).
func (c *Cache) Swap(ctx context.Context, old, next *Record) (*Record, error) {
	if err := checkAddress(next); err != nil {
		return nil, err // the caller's mistake: the cached copy stays right
	}
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
		e := c.put(cur, now)
		if err == nil {
			c.onChange(Change{Kind: Moved, Old: old, New: e.rec})
		}
		return e.rec, err
	case errors.Is(err, ErrNotFound):
		c.Invalidate(old.ClientSID)
		return nil, err
	default:
		if !c.outage(err) {
			// Redis is up but the answer did not arrive: the swap may have
			// happened. The next read asks Redis.
			c.Invalidate(old.ClientSID)
		}
		return nil, err
	}
}

// Touch records the use and, at most once per TTL/10 per session, queues
// an idle-TTL refresh for Redis. It never waits for Redis.
func (c *Cache) Touch(_ context.Context, clientSID string, now time.Time) error {
	n := c.tab.peek(clientSID)
	if n == nil {
		return nil // not cached: nothing is known here to refresh
	}
	e := &n.val
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
			n := c.tab.peek(sid)
			if n == nil {
				continue
			}
			e := &n.val
			now := time.Unix(0, e.lastUsed.Load())
			err := c.shared.Touch(ctx, sid, now)
			switch {
			case err == nil:
			case errors.Is(err, ErrNotFound):
				if c.alive(e, c.now()) {
					c.askMarkerCheck()
					switch rerr := c.shared.restore(ctx, withLastUsed(e.rec, now)); {
					case errors.Is(rerr, ErrExists):
						c.collision(e.rec)
					case errors.Is(rerr, errDeleted):
						c.deletedMeanwhile(e.rec)
					case rerr != nil:
						c.outage(rerr)
						c.addPending(withLastUsed(e.rec, now))
					}
				}
			case errors.Is(err, ErrUnavailable):
				c.outage(err)
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
	rec, err := c.delete(ctx, clientSID)
	if err == nil {
		c.onChange(Change{Kind: Deleted, Old: rec})
	}
	return rec, err
}

func (c *Cache) delete(ctx context.Context, clientSID string) (*Record, error) {
	var cached *Record
	if n := c.tab.peek(clientSID); n != nil {
		cached = n.val.rec
	}
	c.Invalidate(clientSID)
	pending := c.takePending(clientSID)
	if c.degraded.Load() {
		switch {
		case cached != nil:
			return cached, nil
		case pending != nil:
			return pending, nil
		}
		return nil, ErrUnavailable
	}
	hint := 0
	if cached != nil {
		hint = len(cached.Init)
	}
	rec, err := c.shared.del(ctx, clientSID, c.shared.budget(hint))
	if err != nil && !errors.Is(err, ErrNotFound) {
		c.outage(err)
		if cached != nil {
			return cached, nil
		}
		return nil, err
	}
	if errors.Is(err, ErrNotFound) && pending != nil {
		return pending, nil
	}
	return rec, err
}

// addPending keeps r for writing to Redis later, within MaxPending records
// and MaxInitBytes of their bodies, Hosts and Paths (counted without sharing: pending
// records are few, and the bound must hold however many the cache evicts).
func (c *Cache) addPending(r *Record) {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	prev, ok := c.pending[r.ClientSID]
	size := recordBytes(r)
	if ok {
		size -= recordBytes(prev)
	}
	if (!ok && len(c.pending) >= c.maxPending) || c.pendingBytes+size > c.maxPendingBytes {
		c.unwritten.Add(1)
		return
	}
	c.pending[r.ClientSID] = r
	c.pendingBytes += size
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
	if r != nil {
		delete(c.pending, sid)
		c.pendingBytes -= recordBytes(r)
	}
	return r
}

// dropPending forgets r once written, unless it was replaced meanwhile.
func (c *Cache) dropPending(r *Record) {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	if c.pending[r.ClientSID] == r {
		delete(c.pending, r.ClientSID)
		c.pendingBytes -= recordBytes(r)
	}
}

func (c *Cache) pendingRecords() []*Record {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	batch := make([]*Record, 0, len(c.pending))
	for _, r := range c.pending {
		batch = append(batch, r)
	}
	return batch
}

func (c *Cache) flushOne(ctx context.Context, sid string) error {
	r := c.pendingRecord(sid)
	if r == nil {
		return nil
	}
	switch err := c.shared.restore(ctx, r); {
	case errors.Is(err, ErrExists):
		return c.collision(r)
	case errors.Is(err, errDeleted):
		c.deletedMeanwhile(r)
		return nil
	case err != nil:
		return err
	}
	c.dropPending(r)
	return nil
}

func (c *Cache) markDegraded(err error) {
	c.transition.Lock()
	defer c.transition.Unlock()
	if c.degraded.CompareAndSwap(false, true) {
		c.degradedBy.Store(&err)
		c.log.Warn("session store degraded: Redis unreachable; serving cached sessions, keeping new ones locally", "err", err)
		c.onDegraded(true)
	}
}

// healthLoop probes Redis (every second while healthy, so an outage shows
// even when every request is a cache hit; four times a second while
// degraded). While healthy the probe is a read of the epoch marker, which
// also detects a Redis that lost its data; when Redis answers again after
// an outage, the records kept meanwhile are written and the cache leaves
// degraded mode.
func (c *Cache) healthLoop(ctx context.Context) {
	const healthyEvery, degradedEvery = time.Second, 250 * time.Millisecond
	t := time.NewTimer(healthyEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.checkMarker:
		}
		if !c.degraded.Load() {
			if err := c.checkEpoch(ctx); err != nil && ctx.Err() == nil && c.outage(err) {
				t.Reset(degradedEvery)
				continue
			}
			// A record created while the last outage was ending, or whose
			// write was slow, may still be waiting.
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
		// Changes announced by other replicas during the outage were
		// missed: the resubscription marks every entry for a re-read, and a
		// re-initialization always re-reads first (Reload). Redis may also
		// have come back empty: look at the marker at once.
		c.askMarkerCheck()
		t.Reset(healthyEvery)
	}
}

func (c *Cache) askMarkerCheck() {
	select {
	case c.checkMarker <- struct{}{}:
	default:
	}
}

func (c *Cache) flushPending(ctx context.Context) error {
	batch := c.pendingRecords()
	written := 0
	for _, r := range batch {
		switch err := c.flushOne(ctx, r.ClientSID); {
		case errors.Is(err, ErrNotFound): // a collision, handled
		case err != nil:
			return err
		default:
			written++
		}
	}
	if written > 0 {
		c.log.Info("session store: wrote records kept during the outage", "records", written)
	}
	return nil
}

// checkEpoch reads the epoch marker: missing, Redis lost its data (or this
// is its first tether); changed since last seen, another replica found the
// loss. It returns the read's error, if any.
func (c *Cache) checkEpoch(ctx context.Context) error {
	ms, ok, err := c.shared.Marker(ctx)
	switch {
	case errors.Is(err, errBadReply):
		if !c.badMarker.Swap(true) { // once, not every second
			c.log.Warn("session store: unreadable epoch marker; Redis data loss cannot be detected", "err", err)
		}
		return nil
	case err != nil:
		return err
	case !ok:
		c.markerMissing(ctx)
	default:
		c.sawMarker(ms, false)
	}
	c.badMarker.Store(false)
	return nil
}

// markerMissing re-creates the epoch marker and, if this replica did,
// announces the loss so that every replica writes back what it caches.
func (c *Cache) markerMissing(ctx context.Context) {
	ms, created, err := c.shared.ensureMarker(ctx)
	if err != nil {
		return // the health loop tries again
	}
	if created {
		if c.marker.Load() != 0 {
			c.log.Warn("session store: Redis lost its data (epoch marker missing); replicas write back the sessions they cache",
				"grace", c.grace.String())
		}
		if err := c.shared.announce(ctx, ctlRecovering+strconv.FormatInt(ms, 10)); err != nil {
			c.log.Debug("session store: announcing the recovery failed; replicas learn of it from the marker", "err", err)
		}
	}
	c.sawMarker(ms, created)
}

// sawMarker notes the epoch marker's value. A change (or a marker this
// replica created over a missing one) means Redis lost its data: the
// entries cached before it are written back, and misses wait for a grace.
func (c *Cache) sawMarker(ms int64, created bool) {
	old := c.marker.Swap(ms)
	if old == ms {
		return
	}
	if old != 0 || created {
		now := c.now().UnixNano()
		if until := now + c.grace.Nanoseconds(); until > c.recoverUntil.Load() {
			c.recoverUntil.Store(until)
		}
		if old != 0 {
			c.recoveries.Add(1)
		}
	}
	// Entries read or written before the marker's time came from the Redis
	// that was lost (or from an outage): write them back.
	before := ms * int64(time.Millisecond)
	for {
		cur := c.writeBefore.Load()
		if before <= cur || c.writeBefore.CompareAndSwap(cur, before) {
			break
		}
	}
	select {
	case c.writeBack <- struct{}{}:
	default:
	}
}

// control handles a control message from another replica (or this one).
func (c *Cache) control(msg string) {
	switch {
	case strings.HasPrefix(msg, ctlRecovering):
		ms, err := strconv.ParseInt(strings.TrimPrefix(msg, ctlRecovering), 10, 64)
		if err != nil || ms <= 0 || ms > maxMillis {
			return
		}
		if until := c.now().UnixNano() + c.grace.Nanoseconds(); until > c.recoverUntil.Load() {
			c.recoverUntil.Store(until)
		}
		c.sawMarker(ms, false)
	case msg == ctlRestored:
		c.wakeWaiters()
	}
}

// resubscribed runs when the invalidation subscription was re-established:
// announcements may have been missed, entries are re-read on use, and the
// marker is checked at once (a Redis restart breaks the subscription).
func (c *Cache) resubscribed() {
	c.staleBefore.Store(c.now().UnixNano())
	c.askMarkerCheck()
}

func (c *Cache) wakeWaiters() {
	c.wakeMu.Lock()
	close(c.wake)
	c.wake = make(chan struct{})
	c.wakeMu.Unlock()
}

func (c *Cache) wakeChan() <-chan struct{} {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	return c.wake
}

// graceEnd is when misses stop waiting for write-backs (Unix ns of the
// cache's clock): RecoveryGrace after the marker was (re-)created, or after
// this replica learned of it, whichever is later.
func (c *Cache) graceEnd() int64 {
	if c.grace <= 0 {
		return 0
	}
	end := c.marker.Load()*int64(time.Millisecond) + c.grace.Nanoseconds()
	return max(end, c.recoverUntil.Load())
}

// missed answers a session Redis does not hold. Within a recovery grace it
// waits for the replicas' write-backs first (see Cache).
func (c *Cache) missed(ctx context.Context, sid string, now time.Time) (*Record, error) {
	if c.grace > 0 {
		// A loss not yet noticed shows here first: the marker is missing
		// (or new) too.
		switch ms, ok, err := c.shared.Marker(ctx); {
		case errors.Is(err, ErrUnavailable):
			// Cannot tell whether Redis just lost its data: a transient
			// answer, never "lost".
			c.outage(err)
			return nil, ErrUnavailable
		case err != nil:
		case !ok:
			c.markerMissing(ctx)
		default:
			c.sawMarker(ms, false)
		}
	}
	wait := time.Duration(c.graceEnd() - now.UnixNano())
	if wait <= 0 {
		c.notFound.Add(1)
		return nil, ErrNotFound
	}
	if c.waiting.Add(1) > maxRecoveryWaiters {
		c.waiting.Add(-1)
		return nil, ErrUnavailable
	}
	defer c.waiting.Add(-1)
	c.recoveryWaits.Add(1)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTicker(recoveryPoll)
	defer poll.Stop()
	for last := false; ; {
		select {
		case <-ctx.Done():
			return nil, ErrUnavailable
		case <-deadline.C:
			last = true
		case <-c.wakeChan():
		case <-poll.C:
		}
		rec, err := c.shared.get(ctx, sid, c.shared.timeout)
		if err == nil {
			c.recoveryFound.Add(1)
			return c.put(c.adopt(rec), c.now()).rec, nil
		}
		if p := c.pendingRecord(sid); p != nil {
			return p, nil
		}
		if last {
			c.notFound.Add(1)
			if errors.Is(err, ErrNotFound) {
				return nil, ErrNotFound
			}
			return nil, ErrUnavailable
		}
	}
}

// writeBackLoop writes back, when asked (see sawMarker), the entries cached
// before the loss, most recently used first, and the pending records; then
// it announces that it is done, so that waiting misses re-read.
func (c *Cache) writeBackLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.writeBack:
		}
		c.writingBack.Store(true)
		c.writeBackOnce(ctx, c.writeBefore.Load())
		c.writingBack.Store(false)
	}
}

func (c *Cache) writeBackOnce(ctx context.Context, before int64) {
	now := c.now()
	type item struct {
		rec  *Record
		used int64
	}
	var items []item
	for i := range c.tab.shards {
		s := &c.tab.shards[i]
		s.mu.RLock()
		for n := s.head; n != nil; n = n.next {
			e := &n.val
			if e.loadedAt < before && c.alive(e, now) {
				items = append(items, item{e.rec, e.lastUsed.Load()})
			}
		}
		s.mu.RUnlock()
	}
	for _, r := range c.pendingRecords() {
		items = append(items, item{r, r.LastUsed.UnixNano()})
	}
	if len(items) == 0 {
		c.announceRestored(ctx)
		return
	}
	// The sessions in use now are the ones about to be asked for.
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(b.used, a.used) })
	recs := make([]*Record, len(items))
	for i, it := range items {
		recs[i] = it.rec
		if it.used > it.rec.LastUsed.UnixNano() {
			recs[i] = withLastUsed(it.rec, time.Unix(0, it.used))
		}
	}
	start := time.Now()
	results := c.shared.restoreAll(ctx, recs)
	written, failed := 0, 0
	var cause error
	for i, err := range results {
		switch {
		case err == nil:
			written++
			c.dropPending(items[i].rec)
		case errors.Is(err, ErrExists):
			c.collision(items[i].rec)
		case errors.Is(err, errDeleted):
			c.deletedMeanwhile(items[i].rec)
		default:
			failed++
			cause = err
		}
	}
	c.writtenBack.Add(int64(written))
	c.log.Info("session store: wrote back cached sessions after Redis lost its data",
		"written", written, "failed", failed, "took", time.Since(start).Round(time.Millisecond).String())
	if failed > 0 {
		c.outage(cause)
	}
	c.announceRestored(ctx)
}

func (c *Cache) announceRestored(ctx context.Context) {
	if err := c.shared.announce(ctx, ctlRestored); err != nil {
		c.wakeWaiters() // at least this replica's waiters
	}
}

// names interns the few strings every loaded record repeats (backend ids
// and URLs, protocol versions), so that records read from Redis share them
// as records created here do. It holds at most namesMax strings and starts
// over when full (ids of endpoints long gone are not kept forever).
type names struct {
	mu sync.Mutex
	m  map[string]string
}

const namesMax = 4096

func (n *names) get(s string) string {
	if s == "" {
		return ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if v, ok := n.m[s]; ok {
		return v
	}
	if len(n.m) >= namesMax {
		clear(n.m)
	}
	n.m[s] = s
	return s
}

// CacheStats are the cache's counters.
type CacheStats struct {
	Hits, Misses int64
	Degraded     bool
	Pending      int   // records kept locally, waiting for Redis
	Unwritten    int64 // records that could not even be kept (MaxPending or MaxInitBytes reached)
	TouchDrops   int64 // refreshes skipped because the queue was full (retried later)
	Entries      int
	// InitBytes and DistinctInits describe the cached initialize bodies.
	InitBytes     int64
	DistinctInits int
	// Evictions to respect a bound, by bound.
	EvictedMaxSessions, EvictedMaxInitBytes int64
	// SlowReplies are calls that failed or timed out while Redis answered
	// the health probe: not outages.
	SlowReplies int64
	// Recoveries counts the times this replica learned that Redis lost its
	// data; WrittenBack the records it wrote back then.
	Recoveries, WrittenBack int64
	// RecoveryWaits are misses that waited for write-backs; RecoveryFound
	// those that found their session; NotFound every miss answered
	// ErrNotFound.
	RecoveryWaits, RecoveryFound, NotFound int64
	// WritingBack is true while a write-back runs.
	WritingBack bool
	// Collisions are sessions kept locally that lost their id to another
	// session in Redis (see Cache.collision).
	Collisions int64
	// FlushedAtClose and UnflushedAtClose are the pending records Close
	// wrote, and could not write (those sessions are lost).
	FlushedAtClose, UnflushedAtClose int64
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() CacheStats {
	c.pendMu.Lock()
	pending := len(c.pending)
	c.pendMu.Unlock()
	return CacheStats{
		Hits: c.hits.Load(), Misses: c.misses.Load(), Degraded: c.degraded.Load(),
		Pending: pending, Unwritten: c.unwritten.Load(), TouchDrops: c.touchDrops.Load(), Entries: c.tab.len(),
		InitBytes: c.tab.bodies.total.Load(), DistinctInits: c.tab.bodies.distinct(),
		EvictedMaxSessions: c.tab.evictedLen.Load(), EvictedMaxInitBytes: c.tab.evictedBytes.Load(),
		SlowReplies: c.slowReplies.Load(), Recoveries: c.recoveries.Load(), WrittenBack: c.writtenBack.Load(),
		RecoveryWaits: c.recoveryWaits.Load(), RecoveryFound: c.recoveryFound.Load(), NotFound: c.notFound.Load(),
		WritingBack: c.writingBack.Load() || len(c.writeBack) > 0, Collisions: c.collisions.Load(),
		FlushedAtClose: c.flushedAtClose.Load(), UnflushedAtClose: c.unflushed.Load(),
	}
}

// SessionsOn is the shared store's listing (see Redis.SessionsOn): this
// replica caches only the sessions it served. It needs Redis: while
// degraded, or when the listing fails, it returns an error wrapping the
// cause (ErrUnavailable). Records kept here during an outage are listed
// once written to Redis.
func (c *Cache) SessionsOn(ctx context.Context, backendID string, limit int) ([]string, error) {
	if c.degraded.Load() {
		return nil, c.degradedErr()
	}
	sids, err := c.shared.SessionsOn(ctx, backendID, limit)
	if err != nil {
		c.outage(err) // a failure like any other call's: a probe tells whether Redis is down
		return nil, err
	}
	return sids, nil
}

// degradedErr is the answer of a call that needs Redis while degraded: the
// failure that degraded the cache, which wraps ErrUnavailable.
func (c *Cache) degradedErr() error {
	if p := c.degradedBy.Load(); p != nil {
		return fmt.Errorf("session: store degraded: %w", *p)
	}
	return ErrUnavailable
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

// Close stops the background work, writes the pending records (within
// CloseTimeout; what could not be written is logged with its count and
// counted in UnflushedAtClose), and closes the shared store. Calls after
// the first return the first one's result.
func (c *Cache) Close() error {
	c.closeOnce.Do(func() {
		c.stop()
		c.wg.Wait()
		c.flushAtClose()
		c.closeErr = c.shared.Close()
	})
	return c.closeErr
}

// flushAtClose writes the pending records, retrying until CloseTimeout
// (Redis may be restarting too), and says how many it could not write.
func (c *Cache) flushAtClose() {
	recs := c.pendingRecords()
	if len(recs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.closeTimeout)
	defer cancel()
	written := 0
	var cause error
	for {
		var left []*Record
		for i, err := range c.shared.restoreAll(ctx, recs) {
			switch {
			case err == nil:
				written++
				c.dropPending(recs[i])
			case errors.Is(err, ErrExists):
				c.collision(recs[i]) // counted and logged there
			case errors.Is(err, errDeleted):
				c.deletedMeanwhile(recs[i])
			default:
				left = append(left, recs[i])
				cause = err
			}
		}
		recs = left
		if len(recs) == 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
			continue
		}
		break
	}
	c.flushedAtClose.Add(int64(written))
	c.unflushed.Add(int64(len(recs)))
	if len(recs) > 0 {
		c.log.Warn("session store: at shutdown, sessions created during the Redis outage could not be written; they are lost",
			"written", written, "lost", len(recs), "err", cause)
		return
	}
	c.log.Info("session store: at shutdown, wrote the sessions created during the Redis outage", "written", written)
}
