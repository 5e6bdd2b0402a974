package session_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// The store on a Sentinel-managed primary and on a Redis Cluster: the
// same contract, counts and invalidations as on one server.

// newTargetStore is a store on the deployment at url (a redis+sentinel://
// or redis+cluster:// URL).
func newTargetStore(t *testing.T, url string, opts session.RedisOptions) *session.Redis {
	t.Helper()
	target, err := session.ParseRedisURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opts.Client = session.NewRedisTargetClient(target, 500*time.Millisecond) // -race on 2 cores, 6 nodes
	opts.Sentinel = target.Topology == session.RedisSentinel
	if opts.Timeout == 0 {
		opts.Timeout = 500 * time.Millisecond
	}
	s := session.NewRedis(opts)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRedisTopologies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment and a cluster")
	}
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) string
	}{
		{"Sentinel", func(t *testing.T) string { return redistest.StartSentinel(t).URL() }},
		{"Cluster", func(t *testing.T) string { return redistest.StartCluster(t).URL() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.start(t)
			t.Run("Contract", func(t *testing.T) {
				n := 0
				testStore(t, func(t *testing.T, now func() time.Time) session.Store {
					n++ // a fresh key space per subtest
					return newTargetStore(t, url, session.RedisOptions{Prefix: "t" + string(rune('a'+n)) + ":", Now: now})
				})
			})
			t.Run("SessionsOn", func(t *testing.T) {
				n := 0
				testSessionsOn(t, func(t *testing.T, now func() time.Time) listerStore {
					n++ // a fresh key space per call
					return newTargetStore(t, url, session.RedisOptions{Prefix: fmt.Sprintf("list%d:", n), Now: now})
				})
			})
			if tc.name == "Cluster" {
				t.Run("SessionsOnStaleMembers", func(t *testing.T) {
					testSessionsOnStaleMembers(t, url, newTargetStore(t, url, session.RedisOptions{Prefix: "stale:"}))
				})
			}
			t.Run("BackendSessions", func(t *testing.T) {
				testBackendSessions(t, newTargetStore(t, url, session.RedisOptions{Prefix: "counts:"}))
			})
			t.Run("CountsDrift", func(t *testing.T) {
				testCountsDrift(t, url, newTargetStore(t, url, session.RedisOptions{Prefix: "drift:"}),
					newTargetStore(t, url, session.RedisOptions{Prefix: "drift:"}))
			})
			t.Run("Invalidations", func(t *testing.T) {
				testInvalidations(t, newTargetStore(t, url, session.RedisOptions{Prefix: "inv:"}))
			})
		})
	}
}

// testBackendSessions: creating, moving and deleting sessions moves the
// fleet-wide counts of their backends exactly, and a repair pass finds
// nothing to repair.
func testBackendSessions(t *testing.T, s *session.Redis) {
	ctx := t.Context()
	a, b := "10.0.0.1:8080/a", "10.0.0.2:8080/b"
	for i := range 10 {
		r := rec("sid-" + string(rune('a'+i)))
		r.BackendID = a
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	cur, err := s.Get(ctx, "sid-a")
	if err != nil {
		t.Fatal(err)
	}
	next := cur.Clone()
	next.BackendID = b
	if _, err := s.Swap(ctx, cur, next); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, "sid-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Touch(ctx, "sid-c", time.Now()); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{a: 8, b: 1}
	got, err := s.BackendSessions(ctx, []string{a, b})
	if err != nil || got[a] != want[a] || got[b] != want[b] {
		t.Fatalf("counts %v, %v; want %v", got, err, want)
	}
	removed, moved, err := s.RepairCounts(ctx, []string{a, b})
	if err != nil || removed != 0 || moved != 0 {
		t.Errorf("repair of exact counts: removed %d, moved %d, %v", removed, moved, err)
	}
}

// testInvalidations: a swap and a delete are heard by a subscriber.
func testInvalidations(t *testing.T, s *session.Redis) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	got := make(chan string, 64)
	go s.Invalidations(ctx, func(sid string) { got <- sid }, func() {}, nil)
	if err := s.Create(ctx, rec("x")); err != nil {
		t.Fatal(err)
	}
	// Subscribing is asynchronous: swap until the subscriber hears it.
	for heard := false; !heard; {
		cur, err := s.Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Swap(ctx, cur, cur.Clone()); err != nil {
			t.Fatal(err)
		}
		select {
		case sid := <-got:
			heard = sid == "x"
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no invalidation for Swap")
		}
	}
	// The delete of another session: its id is heard, after any late
	// swap of x.
	if err := s.Create(ctx, rec("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case sid := <-got:
			if sid == "y" {
				return
			}
		case <-ctx.Done():
			t.Fatal("no invalidation for Delete")
		}
	}
}

// testCountsDrift: 1,000 sessions created, half of them moved to another
// backend and a quarter deleted, concurrently through two stores (two
// replicas): the counts must match the records exactly, and a repair pass
// must find nothing to repair. The drift is logged.
func testCountsDrift(t *testing.T, url string, a, b *session.Redis) {
	const sessions, workers = 1000, 8
	backends := []string{"10.0.0.1:8080/a", "10.0.0.2:8080/b", "10.0.0.3:8080/c"}
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		s := []*session.Redis{a, b}[w%2]
		wg.Go(func() {
			for i := w; i < sessions; i += workers {
				r := rec(fmt.Sprintf("drift-%d", i))
				r.BackendID = backends[i%3]
				if err := s.Create(ctx, r); err != nil {
					errs <- err
					return
				}
				if i%2 == 0 {
					cur, err := s.Get(ctx, r.ClientSID)
					if err != nil {
						errs <- err
						return
					}
					next := cur.Clone()
					next.BackendID = backends[(i+1)%3]
					if _, err := s.Swap(ctx, cur, next); err != nil {
						errs <- err
						return
					}
				}
				if i%4 == 1 {
					if _, err := s.Delete(ctx, r.ClientSID); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	truth := map[string]int64{}
	for i := range sessions {
		r, err := a.Get(ctx, fmt.Sprintf("drift-%d", i))
		if err == nil {
			truth[r.BackendID]++
		}
	}
	got, err := b.BackendSessions(ctx, backends)
	if err != nil {
		t.Fatal(err)
	}
	drift := int64(0)
	for _, id := range backends {
		drift += max(got[id]-truth[id], truth[id]-got[id])
	}
	removed, moved, err := a.RepairCounts(ctx, backends)
	t.Logf("counts %v, records %v: drift %d of %d; repair removed %d, moved %d (%v)", got, truth, drift, sessions, removed, moved, err)
	if drift != 0 || removed != 0 || moved != 0 || err != nil {
		t.Errorf("drift %d, repair removed %d, moved %d, %v; want exact counts", drift, removed, moved, err)
	}

	// A drift injected by hand (a deleted session left in a set, a live
	// one in the wrong set, a live one's score behind its expiry) is
	// repaired.
	target, err := session.ParseRedisURL(url)
	if err != nil {
		t.Fatal(err)
	}
	raw := session.NewRedisTargetClient(target, time.Second)
	defer raw.Close()
	late := float64(time.Now().Add(time.Minute).UnixMilli())
	for _, z := range []struct {
		backend, sid string
	}{{backends[1], "drift-1"}, {backends[2], "drift-0"}, {backends[1], "drift-0"}} {
		if err := raw.ZAdd(ctx, "drift:b:"+z.backend, redis.Z{Score: late, Member: z.sid}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	removed, moved, err = a.RepairCounts(ctx, backends)
	if removed != 2 || moved != 1 || err != nil {
		t.Errorf("repair of 3 injected errors: removed %d (want 2), moved %d (want 1), %v", removed, moved, err)
	}
	if got, err := b.BackendSessions(ctx, backends); err != nil || got[backends[1]] != truth[backends[1]] || got[backends[2]] != truth[backends[2]] {
		t.Errorf("counts after the repair %v, %v; want %v", got, err, truth)
	}
}
