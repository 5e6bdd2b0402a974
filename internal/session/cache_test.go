package session_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

// cacheBudget is the Redis call budget of the caches under test: generous
// for -race on two cores, and the yardstick for "fast" answers.
const cacheBudget = 200 * time.Millisecond

// cmdLog is a go-redis hook recording the commands a client sends, leaving
// out connection set-up and the cache's health probes and recovery
// signalling (pings, the epoch marker, control messages: they run on a
// real timer and would make counts flaky).
type cmdLog struct {
	n atomic.Int64 // commands recorded

	mu    sync.Mutex
	names []string // recorded command names, when keep is set
	keep  bool
	gate  chan struct{} // when set, script runs wait for it after Redis answered
}

func (h *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		name := cmd.Name()
		if h.record(cmd, err) && (name == "evalsha" || name == "eval") {
			h.mu.Lock()
			gate := h.gate
			h.mu.Unlock()
			if gate != nil {
				<-gate
			}
		}
		return err
	}
}

func (h *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.record(c, c.Err())
		}
		return err
	}
}

// record notes one command and reports whether it counted.
func (h *cmdLog) record(cmd redis.Cmder, err error) bool {
	name := cmd.Name()
	switch name {
	case "hello", "auth", "select", "client", "ping", "readonly":
		return false // connection set-up, the health probe
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && (strings.HasSuffix(s, ":epoch") || strings.HasPrefix(s, " ")) {
			return false // the epoch marker, a control message
		}
	}
	if name == "evalsha" && redis.HasErrorPrefix(err, "NOSCRIPT") {
		return false // go-redis sends the script again with EVAL: one script run
	}
	h.n.Add(1)
	if h.keep {
		h.mu.Lock()
		h.names = append(h.names, name)
		h.mu.Unlock()
	}
	return true
}

// take returns the names recorded since the last take and restarts the
// count.
func (h *cmdLog) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.names
	h.names = nil
	h.n.Store(0)
	return n
}

// hold makes script runs (the asynchronous TTL refreshes) wait after Redis
// answered until the returned function is called.
func (h *cmdLog) hold() (release func()) {
	gate := make(chan struct{})
	h.mu.Lock()
	h.gate = gate
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		h.gate = nil
		h.mu.Unlock()
		close(gate)
	}
}

// redisDeployment is the Redis a test's stores use: one server
// (*redistest.Server), a Sentinel deployment or a cluster, by its URL.
type redisDeployment interface{ URL() string }

// replica is one tether replica's session store: a Cache on its own client.
type replica struct {
	*session.Cache
	cmds     *cmdLog
	degraded *transitions
}

// transitions records OnDegraded calls.
type transitions struct {
	mu  sync.Mutex
	got []bool
}

func (tr *transitions) add(d bool) {
	tr.mu.Lock()
	tr.got = append(tr.got, d)
	tr.mu.Unlock()
}

func (tr *transitions) list() []bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.got)
}

func newReplica(tb testing.TB, srv redisDeployment, clock *fakeClock, opts session.CacheOptions) *replica {
	tb.Helper()
	return newReplicaOn(tb, srv, clock.Now, cacheBudget, opts)
}

// newReplicaOn is newReplica with a clock (nil: the real one) and a Redis
// call budget.
func newReplicaOn(tb testing.TB, srv redisDeployment, now func() time.Time, budget time.Duration, opts session.CacheOptions) *replica {
	tb.Helper()
	r := &replica{cmds: &cmdLog{keep: true}, degraded: &transitions{}}
	opts.Shared = sharedStoreBudget(tb, srv, now, r.cmds, opts.TTL, budget)
	opts.Now = now
	opts.OnDegraded = r.degraded.add
	r.Cache = session.NewCache(opts)
	tb.Cleanup(func() { r.Close() })
	return r
}

// sharedStore is a Redis store as tether builds it, on a client of its own
// observed by hook (if any). The caller closes it (Cache.Close does).
func sharedStore(tb testing.TB, srv redisDeployment, now func() time.Time, hook redis.Hook, ttl time.Duration) *session.Redis {
	tb.Helper()
	return sharedStoreBudget(tb, srv, now, hook, ttl, cacheBudget)
}

func sharedStoreBudget(tb testing.TB, srv redisDeployment, now func() time.Time, hook redis.Hook, ttl, budget time.Duration) *session.Redis {
	tb.Helper()
	target, err := session.ParseRedisURL(srv.URL())
	if err != nil {
		tb.Fatal(err)
	}
	client := session.NewRedisTargetClient(target, budget)
	if hook != nil {
		client.AddHook(hook)
	}
	return session.NewRedis(session.RedisOptions{Client: client, TTL: ttl, Timeout: budget, Now: now,
		Sentinel: target.Topology == session.RedisSentinel})
}

// authority is a plain Redis store (no cache) on the same clock: what any
// replica reading Redis would see.
func authority(t *testing.T, srv redisDeployment, clock *fakeClock, ttl time.Duration) *session.Redis {
	s := sharedStore(t, srv, clock.Now, nil, ttl)
	t.Cleanup(func() { s.Close() })
	return s
}

func rawClient(t *testing.T, srv *redistest.Server) *redis.Client {
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// waitSubscribed waits until n caches listen for invalidations.
func waitSubscribed(t *testing.T, raw *redis.Client, n int64) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool {
		m, err := raw.PubSubNumSub(t.Context(), "tether:invalidate").Result()
		return err == nil && m["tether:invalidate"] >= n
	}, "caches subscribed to invalidations")
}

// A hit costs Redis nothing; a miss one read, after which the entry is
// served locally until it is MaxStale old; Reload always reads Redis.
func TestCacheReads(t *testing.T) {
	const maxStale = 30 * time.Second
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, session.CacheOptions{MaxStale: maxStale})
	b := newReplica(t, srv, clock, session.CacheOptions{MaxStale: maxStale})
	ctx := t.Context()
	if err := a.Create(ctx, rec("s")); err != nil {
		t.Fatal(err)
	}
	a.cmds.take()

	const get, reload = "Get", "Reload"
	tests := []struct {
		name    string
		r       *replica
		op      string
		id      string
		advance time.Duration // fake time passed before the call
		want    []string      // Redis commands sent
		wantErr error
	}{
		{name: "hit after Create", r: a, op: get, id: "s"},
		{name: "hit just before MaxStale", r: a, op: get, id: "s", advance: maxStale - time.Nanosecond},
		{name: "re-read at MaxStale", r: a, op: get, id: "s", advance: time.Nanosecond, want: []string{"hgetall"}},
		{name: "hit after the re-read", r: a, op: get, id: "s"},
		{name: "Reload reads Redis", r: a, op: reload, id: "s", want: []string{"hgetall"}},
		{name: "Reload reads Redis again", r: a, op: reload, id: "s", want: []string{"hgetall"}},
		{name: "hit after Reload", r: a, op: get, id: "s"},
		{name: "other replica misses", r: b, op: get, id: "s", want: []string{"hgetall"}},
		{name: "other replica hits", r: b, op: get, id: "s"},
		{name: "absent", r: b, op: get, id: "nope", want: []string{"hgetall"}, wantErr: session.ErrNotFound},
		{name: "absence is not cached", r: b, op: get, id: "nope", want: []string{"hgetall"}, wantErr: session.ErrNotFound},
	}
	for _, tt := range tests {
		clock.Advance(tt.advance)
		var got *session.Record
		var err error
		if tt.op == reload {
			got, err = tt.r.Reload(ctx, tt.id)
		} else {
			got, err = tt.r.Get(ctx, tt.id)
		}
		if !errors.Is(err, tt.wantErr) {
			t.Fatalf("%s: %s(%q) error = %v, want %v", tt.name, tt.op, tt.id, err, tt.wantErr)
		}
		if diff := cmp.Diff(tt.r.cmds.take(), tt.want); diff != "" {
			t.Errorf("%s: Redis commands (-got +want):\n%s", tt.name, diff)
		}
		if tt.wantErr == nil {
			if diff := cmp.Diff(got, stored(rec("s"), epoch)); diff != "" {
				t.Errorf("%s: record (-got +want):\n%s", tt.name, diff)
			}
		}
	}
	if st := a.Stats(); st.Hits != 4 || st.Misses != 1 {
		t.Errorf("replica a: %d hits, %d misses; want 4, 1", st.Hits, st.Misses)
	}
}

// A hit is the lookup of every follow-up request: no allocation.
func TestCacheGetHitDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	srv := redistest.Start(t)
	a := newReplica(t, srv, newFakeClock(), session.CacheOptions{})
	ctx := t.Context()
	if err := a.Create(ctx, rec("s")); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := a.Get(ctx, "s"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Get (hit): %v allocs/op, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { a.Touch(ctx, "s", epoch) }); n != 0 {
		t.Errorf("Touch within TTL/10: %v allocs/op, want 0", n)
	}
}

// The store contract, as far as the cache keeps it. Touch is not part of
// it: the cache answers for what it holds (a session it does not hold is
// not refreshed and not reported absent, see TestCacheTouch*).
func TestCacheStoreContract(t *testing.T) {
	srv := redistest.Start(t)
	newStore := func(t *testing.T, now func() time.Time) session.Store {
		raw := rawClient(t, srv)
		if err := raw.FlushAll(t.Context()).Err(); err != nil { // a fresh key space per subtest
			t.Fatal(err)
		}
		shared := sharedStore(t, srv, now, nil, 0)
		c := session.NewCache(session.CacheOptions{Shared: shared, Now: now})
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, tt := range []struct {
		name string
		fn   func(*testing.T, newStoreFunc)
	}{
		{"GetAbsent", testGetAbsent}, {"CreateGet", testCreateGet},
		{"CreateCopies", testCreateCopies}, // regression: the cache kept the caller's Init buffer
		{"CreateExists", testCreateExists}, {"CreateReplacesExpired", testCreateReplacesExpired},
		{"CreateEmptyID", testCreateEmptyID},
		{"Swap", testSwap}, {"SwapVersions", testSwapVersions}, {"SwapKeepsPrincipal", testSwapKeepsPrincipal},
		{"Address", testAddress},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore) })
	}
}

// A re-initialization or a DELETE through one replica evicts the session
// from the others' caches, so they read the new state at once rather than
// after MaxStale.
func TestCacheInvalidation(t *testing.T) {
	tests := []struct {
		name    string
		change  func(t *testing.T, b *replica, cur *session.Record)
		check   func(t *testing.T, got *session.Record, err error)
		wantCmd []string // what replica a sends on its next Get
	}{
		{
			name: "Swap",
			change: func(t *testing.T, b *replica, cur *session.Record) {
				next := cur.Clone()
				next.BackendID, next.BackendSID, next.Reinits = "10.0.2.3:8080/pod-uid-2", "new-sid", 1
				if _, err := b.Swap(t.Context(), cur, next); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, got *session.Record, err error) {
				if err != nil {
					t.Fatal(err)
				}
				if got.Version != 2 || got.BackendID != "10.0.2.3:8080/pod-uid-2" || got.BackendSID != "new-sid" {
					t.Errorf("after another replica's Swap: %+v, want version 2 on pod-uid-2", got)
				}
			},
		},
		{
			name: "Delete",
			change: func(t *testing.T, b *replica, cur *session.Record) {
				if _, err := b.Delete(t.Context(), cur.ClientSID); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, got *session.Record, err error) {
				if !errors.Is(err, session.ErrNotFound) {
					t.Errorf("after another replica's Delete: %v, %v; want ErrNotFound", got, err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t)
			clock := newFakeClock()
			a := newReplica(t, srv, clock, session.CacheOptions{})
			b := newReplica(t, srv, clock, session.CacheOptions{})
			waitSubscribed(t, rawClient(t, srv), 2)
			// Past the recovery grace that follows the fleet's start (the
			// epoch marker's creation), when a miss answers at once.
			clock.Advance(time.Minute)
			ctx := t.Context()
			if err := a.Create(ctx, rec("s")); err != nil {
				t.Fatal(err)
			}
			cur, err := b.Get(ctx, "s") // b caches it too
			if err != nil {
				t.Fatal(err)
			}
			if a.Stats().Entries != 1 {
				t.Fatalf("replica a caches %d entries, want 1", a.Stats().Entries)
			}

			tt.change(t, b, cur)
			testkit.Eventually(t, 10*time.Second, func() bool { return a.Stats().Entries == 0 }, "replica a drops its copy")
			a.cmds.take()
			got, err := a.Get(ctx, "s")
			tt.check(t, got, err)
			if diff := cmp.Diff(a.cmds.take(), []string{"hgetall"}); diff != "" {
				t.Errorf("replica a's Get after the invalidation (-got +want):\n%s", diff)
			}
		})
	}
}

// Touch records the use at once and refreshes Redis at most once per TTL/10
// per session, in the background.
func TestCacheTouchRateLimit(t *testing.T) {
	const ttl = 10 * time.Minute // refreshes at most once a minute
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, session.CacheOptions{TTL: ttl, MaxStale: time.Hour})
	ctx := t.Context()
	if err := a.Create(ctx, rec("s")); err != nil {
		t.Fatal(err)
	}
	a.cmds.take()
	raw := rawClient(t, srv)

	// Each step touches at epoch+at; refreshes is how many refreshes Redis
	// has received in total afterwards. A refresh is asynchronous, so steps
	// that must not refresh are followed by one that must: the queue is
	// FIFO, so a refresh wrongly queued earlier would show in that count.
	tests := []struct {
		at        time.Duration
		refreshes int64
	}{
		{at: 0, refreshes: 0},                // Create wrote the TTL
		{at: 30 * time.Second, refreshes: 0}, // within TTL/10 of Create
		{at: 59 * time.Second, refreshes: 0}, //
		{at: time.Minute, refreshes: 1},      // TTL/10 after Create
		{at: time.Minute, refreshes: 1},      // same instant again
		{at: time.Minute + 59*time.Second, refreshes: 1},
		{at: 2 * time.Minute, refreshes: 2}, // TTL/10 after the last refresh
		{at: 2*time.Minute + time.Second, refreshes: 2},
		{at: 7 * time.Minute, refreshes: 3},
	}
	for _, tt := range tests {
		clock.ns.Store(epoch.Add(tt.at).UnixNano())
		if err := a.Touch(ctx, "s", clock.Now()); err != nil {
			t.Fatalf("Touch at +%v: %v", tt.at, err)
		}
		if tt.refreshes > a.cmds.n.Load() {
			testkit.Eventually(t, 10*time.Second, func() bool { return a.cmds.n.Load() >= tt.refreshes }, "refresh at +%v", tt.at)
		}
		if got := a.cmds.n.Load(); got != tt.refreshes {
			t.Fatalf("after a Touch at +%v: %d refreshes, want %d", tt.at, got, tt.refreshes)
		}
		// The last refresh sets the expiry TTL after the touch that caused it.
		if tt.refreshes > 0 {
			e, err := raw.HGet(ctx, "tether:s:s", "e").Int64()
			if err != nil {
				t.Fatal(err)
			}
			if e < epoch.Add(tt.at).Add(ttl).UnixMilli()-time.Minute.Milliseconds() {
				t.Errorf("after a Touch at +%v: Redis expiry %v", tt.at, time.UnixMilli(e).UTC())
			}
		}
	}
	if diff := cmp.Diff(a.cmds.take(), []string{"eval", "evalsha", "evalsha"}); diff != "" {
		t.Errorf("refreshes (-got +want):\n%s", diff)
	}
	if st := a.Stats(); st.TouchDrops != 0 || st.Degraded {
		t.Errorf("stats %+v", st)
	}
}

// Touch returns before Redis is written; the refresh then moves the expiry
// Redis judges the session by.
func TestCacheTouchIsAsynchronous(t *testing.T) {
	const ttl = 10 * time.Minute
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, session.CacheOptions{TTL: ttl, MaxStale: time.Hour})
	other := authority(t, srv, clock, ttl)
	raw := rawClient(t, srv)
	ctx := t.Context()
	if err := a.Create(ctx, rec("s")); err != nil {
		t.Fatal(err)
	}
	a.cmds.take()
	expiry := func() time.Time {
		t.Helper()
		e, err := raw.HGet(ctx, "tether:s:s", "e").Int64()
		if err != nil {
			t.Fatal(err)
		}
		return time.UnixMilli(e).UTC()
	}
	if got, want := expiry(), epoch.Add(ttl); !got.Equal(want) {
		t.Fatalf("expiry after Create %v, want %v", got, want)
	}

	clock.Advance(5 * time.Minute)
	release := a.cmds.hold() // the refresh cannot complete while held
	done := make(chan error, 1)
	go func() { done <- a.Touch(ctx, "s", clock.Now()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		release()
		t.Fatal("Touch waited for Redis")
	}
	release()
	want := epoch.Add(5*time.Minute + ttl)
	testkit.Eventually(t, 10*time.Second, func() bool { return expiry().Equal(want) }, "the refresh reaches Redis")
	if ms, err := raw.PTTL(ctx, "tether:s:s").Result(); err != nil || ms < ttl-time.Minute {
		t.Errorf("key TTL %v, %v; want about %v", ms, err, ttl)
	}

	// Past the original expiry, every replica still finds the session.
	clock.Advance(ttl - time.Minute) // epoch+14m
	if _, err := other.Get(ctx, "s"); err != nil {
		t.Errorf("another replica at +14m: %v", err)
	}
	if _, err := a.Reload(ctx, "s"); err != nil {
		t.Errorf("Reload at +14m: %v", err)
	}
}

// Regression: every re-read from Redis (each MaxStale) reset the refresh
// rate limit, so under steady traffic the idle TTL in Redis was never
// refreshed and the session expired for every other replica TTL after its
// creation, however busy it was.
func TestCacheTouchRefreshesUnderSteadyTraffic(t *testing.T) {
	const ttl, maxStale, every = 10 * time.Minute, 30 * time.Second, 20 * time.Second
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, session.CacheOptions{TTL: ttl, MaxStale: maxStale})
	other := authority(t, srv, clock, ttl)
	ctx := t.Context()
	if err := a.Create(ctx, rec("s")); err != nil {
		t.Fatal(err)
	}
	// A request every 20 s for 1.2 TTLs, as the proxy serves it.
	for range int(ttl*12/10/every) + 1 {
		clock.Advance(every)
		if _, err := a.Get(ctx, "s"); err != nil {
			t.Fatalf("Get at +%v: %v", clock.Now().Sub(epoch), err)
		}
		if err := a.Touch(ctx, "s", clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	raw := rawClient(t, srv)
	testkit.Eventually(t, 10*time.Second, func() bool {
		e, err := raw.HGet(ctx, "tether:s:s", "e").Int64()
		return err == nil && e > clock.Now().Add(ttl-2*ttl/10).UnixMilli()
	}, "Redis holds a refreshed expiry")
	if _, err := other.Get(ctx, "s"); err != nil {
		t.Errorf("another replica after 1.2 TTLs of steady use: %v", err)
	}
}

// Regression: a Touch after the idle TTL revived the session, locally and
// (through the write-back of records Redis lost) in Redis.
func TestCacheTouchDoesNotRevive(t *testing.T) {
	const ttl = 10 * time.Minute
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, session.CacheOptions{TTL: ttl})
	other := authority(t, srv, clock, ttl)
	ctx := t.Context()
	if err := a.Create(ctx, rec("s")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl)
	if err := a.Touch(ctx, "s", clock.Now()); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Touch after the TTL = %v, want ErrNotFound", err)
	}
	if got, err := a.Get(ctx, "s"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Get after the TTL = %+v, %v; want ErrNotFound", got, err)
	}
	time.Sleep(50 * time.Millisecond) // a wrongly queued refresh would run meanwhile
	if got, err := other.Get(ctx, "s"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Redis after the TTL = %+v, %v; want ErrNotFound", got, err)
	}
}

// Regression: only an unreachable Redis degrades the cache. A caller that
// gave up (cancelled context) or a caller's mistake used to switch the
// whole replica to degraded mode (no re-initializations, 503 for every
// uncached session) until the next health probe.
func TestCacheCallerErrorsDoNotDegrade(t *testing.T) {
	srv := redistest.Start(t)
	a := newReplica(t, srv, newFakeClock(), session.CacheOptions{})
	ctx := t.Context()
	if err := a.Create(ctx, rec("s")); err != nil {
		t.Fatal(err)
	}
	cur, err := a.Get(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	tests := []struct {
		name string
		call func() error
	}{
		{"Get with a cancelled context", func() error { _, err := a.Get(cancelled, "uncached"); return err }},
		{"Reload with a cancelled context", func() error { a.Reload(cancelled, "s"); return errAny }}, // may serve the cached copy
		{"Swap with a cancelled context", func() error { _, err := a.Swap(cancelled, cur, cur.Clone()); return err }},
		{"Delete with a cancelled context", func() error { _, err := a.Delete(cancelled, "uncached"); return err }},
		{"Swap changing the ClientSID", func() error {
			next := cur.Clone()
			next.ClientSID = "other"
			_, err := a.Swap(ctx, cur, next)
			return err
		}},
	}
	for _, tt := range tests {
		if err := tt.call(); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
		if a.Degraded() {
			t.Fatalf("%s: the cache is degraded", tt.name)
		}
	}
	if got := a.degraded.list(); len(got) != 0 {
		t.Errorf("OnDegraded calls %v, want none", got)
	}
}

// While Redis is unreachable, cached sessions keep routing, uncached ones
// fail fast, new ones are kept locally (up to MaxPending) and written when
// Redis is back.
//
// On Sentinel and Cluster the outage is every process frozen (SIGSTOP) and
// thawed: a Redis that came back empty is TestCacheRedisRestartedEmptyLosesNoSession's.
func TestCacheDegraded(t *testing.T) {
	for _, tt := range []struct {
		name         string
		outage, mend func(*redistest.Server)
	}{
		{name: "killed and restarted empty", outage: (*redistest.Server).Kill, mend: (*redistest.Server).Restart},
		{name: "frozen and thawed", outage: (*redistest.Server).Freeze, mend: (*redistest.Server).Thaw},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t)
			testCacheDegraded(t, srv, func() { tt.outage(srv) }, func() { tt.mend(srv) })
		})
	}
	if testing.Short() {
		return // starts a Sentinel deployment and a cluster
	}
	t.Run("Sentinel/frozen and thawed", func(t *testing.T) {
		d := redistest.StartSentinel(t)
		testCacheDegraded(t, d, d.Freeze, d.Thaw)
	})
	t.Run("Cluster/frozen and thawed", func(t *testing.T) {
		redistest.RequireCLI(t)
		c := redistest.StartCluster(t)
		testCacheDegraded(t, c, c.Freeze, c.Thaw)
	})
}

// testCacheDegraded: outage makes the deployment unreachable, mend brings
// it back (empty or not).
func testCacheDegraded(t *testing.T, srv redisDeployment, outage, mend func()) {
	const maxStale = 30 * time.Second
	clock := newFakeClock()
	a := newReplica(t, srv, clock, session.CacheOptions{MaxStale: maxStale, MaxPending: 2})
	other := authority(t, srv, clock, 0)
	ctx := t.Context()
	for _, id := range []string{"cached", "deleted"} {
		if err := a.Create(ctx, rec(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Create(ctx, rec("uncached")); err != nil {
		t.Fatal(err)
	}

	outage()
	// The first call to find Redis gone costs up to the budget and
	// switches the cache to degraded mode.
	if _, err := a.Get(ctx, "uncached"); !errors.Is(err, session.ErrUnavailable) {
		t.Fatalf("Get(uncached) = %v, want ErrUnavailable", err)
	}
	if !a.Degraded() {
		t.Fatal("not degraded after a failed call")
	}
	start := time.Now()
	_, err := a.Get(ctx, "uncached")
	if d := time.Since(start); d > cacheBudget/4 {
		t.Errorf("degraded Get(uncached) took %v, want well under the %v budget", d, cacheBudget)
	}
	if !errors.Is(err, session.ErrUnavailable) {
		t.Errorf("degraded Get(uncached) = %v, want ErrUnavailable", err)
	}

	clock.Advance(maxStale + time.Second) // stale entries are still served
	if got, err := a.Get(ctx, "cached"); err != nil || got.ClientSID != "cached" {
		t.Errorf("Get(cached) = %v, %v; want the cached record", got, err)
	}
	created := clock.Now()
	for _, id := range []string{"new-1", "new-2", "new-3"} { // one more than MaxPending
		if err := a.Create(ctx, rec(id)); err != nil {
			t.Errorf("Create(%s) while degraded: %v", id, err)
		}
		if got, err := a.Get(ctx, id); err != nil || got.Version != 1 {
			t.Errorf("Get(%s) while degraded = %v, %v", id, got, err)
		}
	}
	cur, _ := a.Get(ctx, "cached")
	next := cur.Clone()
	next.BackendID = "elsewhere"
	start = time.Now()
	if got, err := a.Swap(ctx, cur, next); !errors.Is(err, session.ErrUnavailable) || got != nil {
		t.Errorf("Swap while degraded = %v, %v; want nil, ErrUnavailable", got, err)
	}
	if got, err := a.Delete(ctx, "deleted"); err != nil || got == nil || got.ClientSID != "deleted" {
		t.Errorf("Delete(cached) while degraded = %v, %v; want the record", got, err)
	}
	// A drain's listing needs Redis: an error that says why.
	if got, err := a.SessionsOn(ctx, rec("").BackendID, 10); !errors.Is(err, session.ErrUnavailable) || got != nil {
		t.Errorf("SessionsOn while degraded = %q, %v; want nil, ErrUnavailable", got, err)
	}
	if d := time.Since(start); d > cacheBudget/4 {
		t.Errorf("degraded Swap, Delete and SessionsOn took %v, want well under the %v budget", d, cacheBudget)
	}
	st := a.Stats()
	if !st.Degraded || st.Pending != 2 || st.Unwritten != 1 {
		t.Errorf("stats while degraded: %+v; want degraded, 2 pending, 1 unwritten", st)
	}

	mend()
	mended := time.Now()
	testkit.Eventually(t, 30*time.Second, func() bool { return !a.Degraded() }, "recovery")
	t.Logf("recovered (out of degraded mode, records kept meanwhile written) %v after Redis was back",
		time.Since(mended).Round(10*time.Millisecond))
	if got, want := a.degraded.list(), []bool{true, false}; !slices.Equal(got, want) {
		t.Errorf("OnDegraded calls %v, want %v", got, want)
	}
	if st := a.Stats(); st.Pending != 0 || st.Unwritten != 1 {
		t.Errorf("stats after recovery: %+v; want 0 pending, 1 unwritten", st)
	}
	for _, id := range []string{"new-1", "new-2"} {
		got, err := other.Get(ctx, id)
		if err != nil {
			t.Errorf("%s in Redis after recovery: %v", id, err)
			continue
		}
		if diff := cmp.Diff(got, stored(rec(id), created)); diff != "" {
			t.Errorf("%s in Redis after recovery (-got +want):\n%s", id, diff)
		}
	}
	if _, err := other.Get(ctx, "new-3"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("new-3 (beyond MaxPending) in Redis: %v, want ErrNotFound", err)
	}
	// Listed with their backend once written.
	if got, err := a.SessionsOn(ctx, rec("").BackendID, 10); err != nil || !slices.Contains(got, "new-1") || !slices.Contains(got, "new-2") {
		t.Errorf("SessionsOn after recovery = %q, %v; want new-1 and new-2 among them", got, err)
	}
	// Kept by Redis, or written back from the cache when Redis came
	// back empty.
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, err := other.Get(ctx, "cached")
		return err == nil
	}, "the record from before the outage in Redis")
}

// When Redis restarts empty, a session a replica still serves is written
// back when its entry is re-read; a session another replica deleted
// afterwards is gone for good once the invalidation arrived.
func TestCacheRedisRestartedEmpty(t *testing.T) {
	const maxStale = 30 * time.Second
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, session.CacheOptions{MaxStale: maxStale})
	b := newReplica(t, srv, clock, session.CacheOptions{MaxStale: maxStale})
	other := authority(t, srv, clock, 0)
	raw := rawClient(t, srv)
	ctx := t.Context()
	for _, id := range []string{"kept", "deleted"} {
		if err := a.Create(ctx, rec(id)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	srv.Restart()
	if n, err := raw.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("Redis after restart holds %d keys (%v), want 0", n, err)
	}
	clock.Advance(maxStale)
	// A re-read finds the record missing and writes it back. (If a health
	// probe caught the restart, the cache serves from memory until it has
	// recovered; the next re-read writes back.)
	for _, id := range []string{"kept", "deleted"} {
		testkit.Eventually(t, 10*time.Second, func() bool {
			got, err := a.Get(ctx, id)
			if err != nil || got.Version != 1 {
				t.Fatalf("Get(%s) after the restart = %v, %v", id, got, err)
			}
			_, err = other.Get(ctx, id)
			return err == nil
		}, "%s written back", id)
	}

	waitSubscribed(t, raw, 2) // resubscribed after the restart
	testkit.Eventually(t, 10*time.Second, func() bool { return !a.Degraded() && !b.Degraded() }, "both replicas healthy")
	if got, err := b.Delete(ctx, "deleted"); err != nil || got.ClientSID != "deleted" {
		t.Fatalf("Delete through b = %v, %v", got, err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return a.Stats().Entries == 1 }, "a drops its copy")
	clock.Advance(maxStale)
	if got, err := a.Get(ctx, "deleted"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("a Get(deleted) = %v, %v; want ErrNotFound", got, err)
	}
	// The key may hold a tombstone, never the session again.
	if live, err := raw.HExists(ctx, "tether:s:deleted", "v").Result(); err != nil || live {
		t.Errorf("deleted record resurrected in Redis (%v, %v)", live, err)
	}
	if got, err := other.Get(ctx, "deleted"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("authority Get(deleted) = %v, %v; want ErrNotFound", got, err)
	}
	if got, err := other.Get(ctx, "kept"); err != nil || got.Version != 1 || got.Host != rec("").Host || got.Path != rec("").Path {
		t.Errorf("kept = %v, %v; want it written back whole", got, err)
	}
}

// Close stops the cache's goroutines, whatever state Redis is in, and a
// second Close neither panics nor hangs.
func TestCacheClose(t *testing.T) {
	tests := []struct {
		name   string
		outage func(*redistest.Server)
	}{
		{"redis up", func(*redistest.Server) {}},
		{"redis killed", (*redistest.Server).Kill},
		{"redis frozen", (*redistest.Server).Freeze},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t)
			clock := newFakeClock()
			// A short flush at close: this test is about Close returning,
			// not about what it writes (TestCacheCloseFlushesPending).
			c := session.NewCache(session.CacheOptions{Shared: sharedStore(t, srv, clock.Now, nil, 0), Now: clock.Now, CloseTimeout: 200 * time.Millisecond})
			if err := c.Create(t.Context(), rec("s")); err != nil {
				t.Fatal(err)
			}
			clock.Advance(10 * time.Minute)
			c.Touch(t.Context(), "s", clock.Now()) // a refresh in flight
			tt.outage(srv)
			for i := range 2 {
				done := make(chan struct{})
				go func() {
					defer close(done)
					c.Close() // the second returns the closed client's error
				}()
				select {
				case <-done:
				case <-time.After(30 * time.Second): // a hang, not a slow machine
					t.Fatalf("Close #%d did not return", i+1)
				}
			}
			if n := cacheGoroutines(); n != 0 {
				t.Errorf("%d cache goroutines left after Close", n)
			}
		})
	}
}

// cacheGoroutines counts the goroutines running the session package's
// background work.
func cacheGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "tether/session.(*Cache)") || strings.Contains(g, "tether/session.(*Redis).Invalidations") {
			count++
		}
	}
	return count
}
