package session_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// The contract of BackendLister, which a drain relies on: SessionsOn names
// only sessions whose record was live on the backend when the store read
// it (in every mode: in a Redis Cluster, where the backend sets may hold
// stale members, each member is checked against its record as it is read),
// up to the limit. A record may move or expire right after, so a caller
// re-reads each session before moving it.

// listerStore is a session store that lists a backend's sessions.
type listerStore interface {
	session.Store
	session.BackendLister
}

type newListerFunc func(t *testing.T, now func() time.Time) listerStore

const (
	podA = "10.0.1.7:8080/pod-a"
	podB = "10.0.1.9:8080/pod-b"
)

// testSessionsOn: sessions created on two backends, one moved from the
// first to the second, one deleted, one expired: each backend lists exactly
// its live ones, within the limit, and a drain that moves what it lists
// empties the first.
func testSessionsOn(t *testing.T, newStore newListerFunc) {
	clock := newFakeClock()
	s := newStore(t, clock.Now)
	ctx := t.Context()
	create := func(id, backend string) {
		t.Helper()
		r := rec(id)
		r.BackendID = backend
		if err := s.Create(ctx, r); err != nil {
			t.Fatalf("Create(%s): %v", id, err)
		}
	}
	move := func(id, to string) {
		t.Helper()
		cur, err := s.Reload(ctx, id)
		if err != nil {
			t.Fatalf("Reload(%s): %v", id, err)
		}
		next := cur.Clone()
		next.BackendID, next.BackendSID = to, "moved-"+id
		next.Reinits++
		if _, err := s.Swap(ctx, cur, next); err != nil {
			t.Fatalf("Swap(%s): %v", id, err)
		}
	}
	list := func(backend string, limit int) []string {
		t.Helper()
		sids, err := s.SessionsOn(ctx, backend, limit)
		if err != nil {
			t.Fatalf("SessionsOn(%s, %d): %v", backend, limit, err)
		}
		return sids
	}

	// Idle for two hours: expired in every store under test.
	create("a-expired", podA)
	clock.Advance(2 * time.Hour)
	for i := 1; i <= 6; i++ {
		create(fmt.Sprintf("a-%d", i), podA)
	}
	for i := 1; i <= 2; i++ {
		create(fmt.Sprintf("b-%d", i), podB)
	}
	move("a-6", podB)
	if _, err := s.Delete(ctx, "a-5"); err != nil {
		t.Fatal(err)
	}

	want := map[string][]string{
		podA: {"a-1", "a-2", "a-3", "a-4"},
		podB: {"a-6", "b-1", "b-2"},
	}
	for backend, w := range want {
		got := list(backend, 100)
		slices.Sort(got)
		if diff := cmp.Diff(got, w); diff != "" {
			t.Errorf("SessionsOn(%s) (-got +want):\n%s", backend, diff)
		}
		// What a drain does with a listing: re-read, and find it there.
		for _, sid := range got {
			if r, err := s.Reload(ctx, sid); err != nil || r.BackendID != backend {
				t.Errorf("re-reading listed %s: %+v, %v; want a live record on %s", sid, r, err, backend)
			}
		}
	}

	got := list(podA, 2)
	if len(got) != 2 || got[0] == got[1] || !slices.Contains(want[podA], got[0]) || !slices.Contains(want[podA], got[1]) {
		t.Errorf("SessionsOn(%s, 2) = %q; want 2 of %q", podA, got, want[podA])
	}
	for _, limit := range []int{0, -1} {
		if got := list(podA, limit); len(got) != 0 {
			t.Errorf("SessionsOn(%s, %d) = %q; want none", podA, limit, got)
		}
	}
	if got := list("10.0.9.9:8080/pod-none", 10); len(got) != 0 {
		t.Errorf("SessionsOn(a backend without sessions) = %q; want none", got)
	}

	// A drain one session at a time: every listing names a session still
	// there, and the backend empties.
	var moved []string
	for range 2 * len(want[podA]) {
		got := list(podA, 1)
		if len(got) == 0 {
			break
		}
		if len(got) != 1 || slices.Contains(moved, got[0]) {
			t.Fatalf("SessionsOn(%s, 1) = %q after moving %q", podA, got, moved)
		}
		move(got[0], podB)
		moved = append(moved, got[0])
	}
	slices.Sort(moved)
	if diff := cmp.Diff(moved, want[podA]); diff != "" {
		t.Errorf("drained one at a time (-got +want):\n%s", diff)
	}
	if got := list(podB, 100); len(got) != len(want[podA])+len(want[podB]) {
		t.Errorf("SessionsOn(%s) after the drain = %q; want all 7", podB, got)
	}
}

func TestMemorySessionsOn(t *testing.T) {
	testSessionsOn(t, func(t *testing.T, now func() time.Time) listerStore {
		m := session.NewMemory(session.MemoryOptions{Now: now, SweepInterval: 24 * time.Hour})
		t.Cleanup(func() { m.Close() })
		return m
	})
}

// Listing while sessions are created and moved: no race, and every listed
// session was created on the listed backend.
func TestMemorySessionsOnConcurrent(t *testing.T) {
	m := session.NewMemory(session.MemoryOptions{SweepInterval: 24 * time.Hour})
	t.Cleanup(func() { m.Close() })
	ctx := t.Context()
	const writers, perWriter = 4, 500
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				r := rec(fmt.Sprintf("w%d-%d", w, i))
				r.BackendID = podA
				if err := m.Create(ctx, r); err != nil {
					t.Errorf("Create: %v", err)
					return
				}
				if i%2 == 0 {
					cur, err := m.Get(ctx, r.ClientSID)
					if err != nil {
						t.Errorf("Get: %v", err)
						return
					}
					next := cur.Clone()
					next.BackendID = podB
					if _, err := m.Swap(ctx, cur, next); err != nil {
						t.Errorf("Swap: %v", err)
						return
					}
				}
			}
		})
	}
	written := make(chan struct{})
	go func() { wg.Wait(); close(written) }()
	listings := 0
	for done := false; !done; listings++ {
		select {
		case <-written:
			done = true
		default:
		}
		sids, err := m.SessionsOn(ctx, podA, session.MaxSessionsOn)
		if err != nil {
			t.Fatal(err)
		}
		for _, sid := range sids {
			if r, err := m.Get(ctx, sid); err != nil || (r.BackendID != podA && r.Version == 1) {
				t.Fatalf("listed %s: %+v, %v", sid, r, err)
			}
		}
	}
	sids, err := m.SessionsOn(ctx, podA, session.MaxSessionsOn)
	if err != nil || len(sids) != writers*perWriter/2 {
		t.Fatalf("SessionsOn(%s) = %d sessions, %v; want %d", podA, len(sids), err, writers*perWriter/2)
	}
	t.Logf("%d listings during the writes", listings)
}

func TestRedisSessionsOn(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	testSessionsOn(t, func(t *testing.T, now func() time.Time) listerStore {
		n++ // a fresh key space per call
		return newRedisStore(t, srv, session.RedisOptions{Prefix: fmt.Sprintf("list%d:", n), Now: now})
	})
}

func TestCacheSessionsOn(t *testing.T) {
	srv := redistest.Start(t)
	testSessionsOn(t, func(t *testing.T, now func() time.Time) listerStore {
		if err := rawClient(t, srv).FlushAll(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		c := session.NewCache(session.CacheOptions{Shared: sharedStore(t, srv, now, nil, 0), Now: now})
		t.Cleanup(func() { c.Close() })
		return c
	})
}

// testSessionsOnStaleMembers (Redis Cluster, where the backend sets are
// updated apart from the records and may drift, see counts.go): members
// left behind by lost count updates (a moved session still in its old
// backend's set, a member without a record, a live one whose score lags
// behind its record) do not mislead a listing: the moved and the missing
// ones are not listed, and removed from the set; the lagging one is listed,
// and its score moved.
func testSessionsOnStaleMembers(t *testing.T, url string, s *session.Redis) {
	ctx := t.Context()
	target, err := session.ParseRedisURL(url)
	if err != nil {
		t.Fatal(err)
	}
	raw := session.NewRedisTargetClient(target, time.Second)
	defer raw.Close()
	const prefix = "stale:"
	setA := prefix + "b:" + podA
	for _, id := range []string{"x-1", "x-2", "x-3"} {
		r := rec(id)
		r.BackendID = podA
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	cur, err := s.Get(ctx, "x-3")
	if err != nil {
		t.Fatal(err)
	}
	next := cur.Clone()
	next.BackendID = podB
	if _, err := s.Swap(ctx, cur, next); err != nil {
		t.Fatal(err)
	}
	late := float64(time.Now().Add(time.Hour).UnixMilli())
	past := float64(time.Now().Add(-time.Hour).UnixMilli())
	for _, z := range []redis.Z{
		{Score: late, Member: "x-3"},         // the ZREM of its move was lost
		{Score: late, Member: "no-record"},   // a deleted session's ZREM was lost
		{Score: past, Member: "x-2"},         // its touches' ZADDs were lost
		{Score: late, Member: "x-expired"},   // written below, already expired
		{Score: late, Member: "x-tombstone"}, // deleted below, its ZREM lost
	} {
		if err := raw.ZAdd(ctx, setA, z).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.HSet(ctx, prefix+"s:x-expired", "v", "1", "b", podA, "c", "1", "l", "1", "e", "2", "r", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.HSet(ctx, prefix+"s:x-tombstone", "d", "1").Err(); err != nil {
		t.Fatal(err)
	}

	got, err := s.SessionsOn(ctx, podA, 100)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if diff := cmp.Diff(got, []string{"x-1", "x-2"}); diff != "" {
		t.Errorf("SessionsOn(%s) with stale members (-got +want):\n%s", podA, diff)
	}
	members, err := raw.ZRangeWithScores(ctx, setA, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, z := range members {
		left = append(left, z.Member.(string))
		if z.Member == "x-2" && z.Score == past {
			t.Errorf("x-2's lagging score was not moved")
		}
	}
	slices.Sort(left)
	if diff := cmp.Diff(left, []string{"x-1", "x-2"}); diff != "" {
		t.Errorf("members of %s after the listing (-got +want):\n%s", setA, diff)
	}
	if got, err := s.SessionsOn(ctx, podB, 100); err != nil || !slices.Equal(got, []string{"x-3"}) {
		t.Errorf("SessionsOn(%s) = %q, %v; want [x-3]", podB, got, err)
	}
}
