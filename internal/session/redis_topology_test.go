package session_test

import (
	"context"
	"testing"
	"time"

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
			t.Run("BackendSessions", func(t *testing.T) {
				testBackendSessions(t, newTargetStore(t, url, session.RedisOptions{Prefix: "counts:"}))
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
