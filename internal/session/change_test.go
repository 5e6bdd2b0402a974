package session_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// changeLog records what a store tells its OnChange subscriber, as
// "kind id old-backend new-backend".
type changeLog struct {
	mu  sync.Mutex
	got []string
}

func (l *changeLog) add(c session.Change) {
	var id, from, to string
	if c.Old != nil {
		id, from = c.Old.ClientSID, c.Old.BackendID
	}
	if c.New != nil {
		id, to = c.New.ClientSID, c.New.BackendID
	}
	l.mu.Lock()
	l.got = append(l.got, c.Kind.String()+" "+id+" "+from+" "+to)
	l.mu.Unlock()
}

func (l *changeLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	got := l.got
	l.got = nil
	return got
}

// storeChanges has a store create, move and delete sessions on the
// store's clock now, including the calls that change nothing, and checks that each change is told once and
// nothing else is.
func storeChanges(t *testing.T, s session.Store, now func() time.Time, log *changeLog) {
	t.Helper()
	ctx := context.Background()
	expect := func(step string, want ...string) {
		t.Helper()
		if got := log.take(); !slices.Equal(got, want) {
			t.Errorf("%s: told %q, want %q", step, got, want)
		}
	}
	a := rec("a")
	a.BackendID = "pod-1"
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	expect("create", "created a  pod-1")
	if err := s.Create(ctx, a); !errors.Is(err, session.ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	expect("create of a live id")

	cur, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	next := cur.Clone()
	next.BackendID = "pod-2"
	if _, err := s.Swap(ctx, cur, next); err != nil {
		t.Fatal(err)
	}
	expect("swap", "moved a pod-1 pod-2")
	if _, err := s.Swap(ctx, cur, next); !errors.Is(err, session.ErrConflict) {
		t.Fatalf("stale swap: %v", err)
	}
	expect("lost swap")
	if err := s.Touch(ctx, "a", now()); err != nil {
		t.Fatal(err)
	}
	expect("touch")

	if _, err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	expect("delete", "deleted a pod-2 ")
	if _, err := s.Delete(ctx, "a"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	expect("delete of a gone session")
}

func TestMemoryTellsEachChangeOnce(t *testing.T) {
	var log changeLog
	clock := newFakeClock()
	m := session.NewMemory(session.MemoryOptions{TTL: ttl, Now: clock.Now, SweepInterval: 24 * time.Hour, MaxSessions: 2, OnChange: log.add})
	t.Cleanup(func() { m.Close() })
	storeChanges(t, m, clock.Now, &log)

	// Expiry: told by the sweep, once; a Get or Delete of the expired
	// record tells nothing.
	b := rec("b")
	b.BackendID = "pod-1"
	m.Create(context.Background(), b)
	log.take()
	clock.Advance(ttl)
	m.Delete(context.Background(), "b")
	if got := log.take(); len(got) != 0 {
		t.Errorf("delete of an expired record told %q", got)
	}
	m.Sweep(clock.Now())
	m.Sweep(clock.Now())
	if got := log.take(); !slices.Equal(got, []string{"expired b pod-1 "}) {
		t.Errorf("sweep told %q, want b's expiry once", got)
	}

	// Eviction past MaxSessions: the least recently used, told as expired.
	for _, id := range []string{"c", "d", "e"} {
		r := rec(id)
		r.BackendID = "pod-1"
		if err := m.Create(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if got := log.take(); !slices.Equal(got, []string{"created c  pod-1", "created d  pod-1", "created e  pod-1", "expired c pod-1 "}) {
		t.Errorf("evicting creates told %q", got)
	}
}

func TestCacheTellsEachChangeOnce(t *testing.T) {
	srv := redistest.Start(t)
	var log changeLog
	// Size 1: the cache evicts, and an eviction is no change (the session
	// lives on in Redis).
	r := newReplicaOn(t, srv, nil, cacheBudget, session.CacheOptions{TTL: ttl, Size: 1, OnChange: log.add})
	storeChanges(t, r.Cache, time.Now, &log)

	for _, id := range []string{"b", "c"} {
		rc := rec(id)
		rc.BackendID = "pod-1"
		if err := r.Create(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
	}
	if got := log.take(); !slices.Equal(got, []string{"created b  pod-1", "created c  pod-1"}) {
		t.Errorf("creates past the cache's size told %q", got)
	}
	// b was evicted from the cache, not from Redis: deleting it is one
	// change.
	if _, err := r.Delete(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !slices.Equal(got, []string{"deleted b pod-1 "}) {
		t.Errorf("delete of an evicted entry told %q", got)
	}
}
