package session_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

// The primary dies (SIGKILL) during traffic: live sessions keep working
// from the cache, the store takes new sessions again once the replica is
// promoted, and no record acknowledged before the kill, once replicated, is
// lost. The figures are logged (go test -v -run TestRedisFailover).
//
// Every session id carries the hash tag {f}: in the cluster, all records
// live in the slot of the primary that is killed.
func TestRedisFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment and a cluster and fails them over")
	}
	t.Run("Sentinel", func(t *testing.T) {
		d := redistest.StartSentinel(t)
		testFailover(t, d.URL(), d.WaitReplicated, func() (string, func() (string, error)) {
			old := d.CurrentPrimary()
			old.Kill()
			return old.Addr(), d.PrimaryAddr
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		c := redistest.StartCluster(t)
		const key = "fo:s:{f}"
		testFailover(t, c.URL(), c.WaitReplicated, func() (string, func() (string, error)) {
			old := c.PrimaryFor(key)
			old.Kill()
			return old.Addr(), func() (string, error) { return c.PrimaryAddrFor(key) }
		})
	})
}

// testFailover runs traffic through two replicas (two caches, each with
// its own store and connections) after kill killed the primary (it returns
// the dead primary's address and how to ask for the current one) until
// the store takes new sessions again; then the sessions the replicas kept
// locally meanwhile must reach Redis, and be read by the other replica.
func testFailover(t *testing.T, url string, waitReplicated func(), kill func() (string, func() (string, error))) {
	const live = 30
	opts := session.RedisOptions{Prefix: "fo:", Timeout: 200 * time.Millisecond, WatchTopology: true}
	shared := newTargetStore(t, url, opts)
	replicas := []*session.Cache{
		session.NewCache(session.CacheOptions{Shared: shared, Size: 1000}),
		session.NewCache(session.CacheOptions{Shared: newTargetStore(t, url, opts), Size: 1000}),
	}
	for _, c := range replicas {
		t.Cleanup(func() { c.Close() })
	}
	ctx := t.Context()
	for i := range live {
		sid := fmt.Sprintf("{f}live-%d", i)
		if err := replicas[i%2].Create(ctx, rec(sid)); err != nil {
			t.Fatal(err)
		}
		if _, err := replicas[(i+1)%2].Get(ctx, sid); err != nil { // the other replica learns it
			t.Fatal(err)
		}
	}
	waitReplicated()

	old, primary := kill()
	killed := time.Now()
	var promoted, recovered time.Time
	liveErrors, cacheCreateErrors, rounds := 0, 0, 0
	var keptLocally []string
	deadline := killed.Add(60 * time.Second)
	for recovered.IsZero() || promoted.IsZero() {
		if time.Now().After(deadline) {
			t.Fatalf("within 60 s of the kill: promoted %v, new session stored %v", !promoted.IsZero(), !recovered.IsZero())
		}
		rounds++
		for i := range live {
			for _, c := range replicas {
				if _, err := c.Get(ctx, fmt.Sprintf("{f}live-%d", i)); err != nil {
					liveErrors++
				}
			}
		}
		sid := fmt.Sprintf("{f}cached-%d", rounds)
		if err := replicas[rounds%2].Create(ctx, rec(sid)); err != nil {
			cacheCreateErrors++
		} else {
			keptLocally = append(keptLocally, sid)
		}
		if err := shared.Create(ctx, rec(fmt.Sprintf("{f}new-%d", rounds))); err == nil && recovered.IsZero() {
			recovered = time.Now()
		}
		if addr, err := primary(); err == nil && addr != old && promoted.IsZero() {
			promoted = time.Now()
		}
		time.Sleep(20 * time.Millisecond) // paces the traffic; nothing waits on it
	}
	lost := 0
	for i := range live {
		if _, err := shared.Get(ctx, fmt.Sprintf("{f}live-%d", i)); err != nil {
			lost++
		}
	}
	t.Logf("failover: replica promoted %v after the kill, store took a new session %v after the kill; "+
		"live-session errors %d in %d rounds of %d sessions through 2 replicas, cache creates failed %d, acknowledged records lost %d of %d",
		promoted.Sub(killed).Round(10*time.Millisecond), recovered.Sub(killed).Round(10*time.Millisecond),
		liveErrors, rounds, live, cacheCreateErrors, lost, live)
	if liveErrors != 0 || cacheCreateErrors != 0 || lost != 0 {
		t.Errorf("live-session errors %d, cache create errors %d, records lost %d; want none", liveErrors, cacheCreateErrors, lost)
	}
	// Sessions created during the failover (kept locally while the store
	// failed) are written once it is back: the other replica reads them.
	for i, sid := range keptLocally {
		other := replicas[i%2] // keptLocally[i] was created through replicas[(i+1)%2]
		testkit.EventuallyNoError(t, 30*time.Second, func() error { _, err := other.Get(ctx, sid); return err },
			"%s, created during the failover, read through the other replica", sid)
	}
	// The store saw the primary replaced, and names the new one.
	testkit.Eventually(t, 30*time.Second, func() bool {
		st := replicas[0].Topology()
		return st.Failovers == 1 && !slices.Contains(st.Primaries, old)
	}, "one failover seen, %s no longer a primary", old)
}

// A slot migration (MOVED and ASK redirections) during traffic: no call
// fails, and every session is where it was left.
func TestRedisClusterReshard(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and reshards it")
	}
	c := redistest.StartCluster(t)
	s := newTargetStore(t, c.URL(), session.RedisOptions{Prefix: "rs:"})
	ctx := t.Context()
	const sessions = 300
	for i := range sessions {
		if err := s.Create(ctx, rec(fmt.Sprintf("rs-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	reshard := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		reshard <- c.Reshard(rctx, "rs:s:rs-0", 2000) // a third of a primary's slots
	}()
	errs, rounds, created := 0, 0, 0
	var reshardErr error
	for done := false; !done; {
		select {
		case reshardErr = <-reshard:
			done = true
		default:
		}
		rounds++
		for i := range sessions {
			sid := fmt.Sprintf("rs-%d", i)
			cur, err := s.Get(ctx, sid)
			if err != nil {
				t.Logf("Get %s: %v", sid, err)
				errs++
				continue
			}
			if i%10 == rounds%10 {
				if _, err := s.Swap(ctx, cur, cur.Clone()); err != nil {
					t.Logf("Swap %s: %v", sid, err)
					errs++
				}
			}
		}
		created++
		if err := s.Create(ctx, rec(fmt.Sprintf("rs-new-%d", created))); err != nil {
			t.Logf("Create: %v", err)
			errs++
		}
		if _, err := s.BackendSessions(ctx, []string{rec("x").BackendID}); err != nil {
			t.Logf("BackendSessions: %v", err)
			errs++
		}
	}
	if reshardErr != nil {
		t.Fatal(reshardErr)
	}
	counts, err := s.BackendSessions(ctx, []string{rec("x").BackendID})
	t.Logf("reshard of 2000 slots during %d rounds of %d sessions: %d errors; count %v (%v), want %d", rounds, sessions, errs, counts, err, sessions+created)
	if errs != 0 || err != nil || counts[rec("x").BackendID] != int64(sessions+created) {
		t.Errorf("%d errors, count %v (%v); want 0 errors and %d sessions", errs, counts, err, sessions+created)
	}
}

// The invalidation subscription of a cluster is one connection to the
// master of the channel's slot. When that master dies, go-redis
// resubscribes through the new master (once the slot map is reloaded):
// the cache is told (resubscribed, so it distrusts what it cached), and
// invalidations are heard again.
func TestRedisClusterInvalidationsSurviveFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and fails it over")
	}
	c := redistest.StartCluster(t)
	s := newTargetStore(t, c.URL(), session.RedisOptions{Prefix: "inv:"})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	got := make(chan string, 256)
	var resubscribed atomic.Int64
	go s.Invalidations(ctx, func(sid string) {
		select {
		case got <- sid:
		default:
		}
	}, func() { resubscribed.Add(1) }, nil)
	hear := func(sid string) {
		t.Helper()
		// After the failover, a write may fail until the slot map is new.
		testkit.EventuallyNoError(t, 30*time.Second, func() error {
			if err := s.Create(ctx, rec(sid)); err != nil && !errors.Is(err, session.ErrExists) {
				return err
			}
			return nil
		}, "creating %s", sid)
		for {
			// Swap until heard: subscribing is asynchronous, and after the
			// failover the swap itself may fail until the slot map is new.
			if cur, err := s.Get(ctx, sid); err == nil {
				s.Swap(ctx, cur, cur.Clone())
			}
			select {
			case heard := <-got:
				if heard == sid {
					return
				}
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("no invalidation heard for %s", sid)
			}
		}
	}
	hear("before")
	channelMaster := c.PrimaryFor("inv:invalidate")
	channelMaster.Kill()
	c.WaitFailover(channelMaster, "inv:invalidate")
	hear("after")
	if resubscribed.Load() == 0 {
		t.Error("the subscription moved without telling the cache (resubscribed)")
	}
}
