package session_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/session"
)

const ttl = 10 * time.Minute

// newMemory returns a store on clock whose background sweeper never fires
// during a test, so that only the test's own Sweep calls remove records.
func newMemory(t testing.TB, clock *fakeClock, onExpire func(*session.Record)) *session.Memory {
	m := session.NewMemory(session.MemoryOptions{
		TTL:           ttl,
		Now:           clock.Now,
		SweepInterval: 24 * time.Hour,
		OnChange:      onExpired(onExpire),
	})
	t.Cleanup(func() { m.Close() })
	return m
}

func TestMemoryStore(t *testing.T) {
	testStore(t, func(t *testing.T, now func() time.Time) session.Store {
		m := session.NewMemory(session.MemoryOptions{Now: now, SweepInterval: 24 * time.Hour})
		t.Cleanup(func() { m.Close() })
		return m
	})
}

// expiries collects OnExpire calls.
type expiries struct {
	mu  sync.Mutex
	ids []string
}

func (e *expiries) add(r *session.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ids = append(e.ids, r.ClientSID)
}

// take returns the ids seen since the last take, sorted.
func (e *expiries) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := e.ids
	e.ids = nil
	slices.Sort(ids)
	return ids
}

func TestMemoryIdleExpiry(t *testing.T) {
	tests := []struct {
		name  string
		idle  time.Duration
		found bool
	}{
		{"fresh", 0, true},
		{"just before TTL", ttl - time.Nanosecond, true},
		{"at TTL", ttl, false},
		{"long after", 10 * ttl, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			m := newMemory(t, clock, nil)
			ctx := t.Context()
			if err := m.Create(ctx, rec("a")); err != nil {
				t.Fatal(err)
			}
			clock.Advance(tt.idle)
			now := clock.Now()

			_, err := m.Get(ctx, "a")
			if found := err == nil; found != tt.found {
				t.Errorf("Get: err = %v, want found = %v", err, tt.found)
			}
			if !tt.found && !errors.Is(err, session.ErrNotFound) {
				t.Errorf("Get: err = %v, want ErrNotFound", err)
			}
			// Every method agrees with Get before the sweeper runs.
			v1 := stored(rec("a"), epoch)
			if _, err := m.Swap(ctx, v1, v1.Clone()); (err == nil) != tt.found {
				t.Errorf("Swap: err = %v, want found = %v", err, tt.found)
			}
			if err := m.Touch(ctx, "a", now); (err == nil) != tt.found {
				t.Errorf("Touch: err = %v, want found = %v", err, tt.found)
			}
			var ranged int
			m.Range(func(*session.Record) bool { ranged++; return true })
			if (ranged == 1) != tt.found {
				t.Errorf("Range saw %d records, want found = %v", ranged, tt.found)
			}
			if _, err := m.Delete(ctx, "a"); (err == nil) != tt.found {
				t.Errorf("Delete: err = %v, want found = %v", err, tt.found)
			}
		})
	}
}

func TestMemoryTouchExtends(t *testing.T) {
	clock := newFakeClock()
	m := newMemory(t, clock, nil)
	ctx := t.Context()
	if err := m.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		advance      time.Duration
		touch        bool
		wantFound    bool
		wantLastUsed time.Duration // since epoch, when found
	}{
		// Within TTL/10 of the last accepted use a Touch is a no-op.
		{advance: ttl/10 - time.Second, touch: true, wantFound: true, wantLastUsed: 0},
		// Past it, Touch moves LastUsed and the idle clock.
		{advance: time.Second, touch: true, wantFound: true, wantLastUsed: ttl / 10},
		{advance: ttl / 2, touch: true, wantFound: true, wantLastUsed: ttl/10 + ttl/2},
		// 1.3 TTL after Create, but only 0.7 TTL idle.
		{advance: 7 * ttl / 10, wantFound: true, wantLastUsed: ttl/10 + ttl/2},
		// A full TTL idle since the last accepted Touch.
		{advance: 3 * ttl / 10, wantFound: false},
		// A Touch does not revive it.
		{advance: 0, touch: true, wantFound: false},
	}
	for i, st := range steps {
		clock.Advance(st.advance)
		if st.touch {
			err := m.Touch(ctx, "a", clock.Now())
			if (err == nil) != st.wantFound {
				t.Fatalf("step %d: Touch = %v, want found = %v", i, err, st.wantFound)
			}
		}
		got, err := m.Get(ctx, "a")
		if (err == nil) != st.wantFound {
			t.Fatalf("step %d: Get err = %v, want found = %v", i, err, st.wantFound)
		}
		if err == nil && !got.LastUsed.Equal(epoch.Add(st.wantLastUsed)) {
			t.Errorf("step %d: LastUsed = %v, want epoch+%v", i, got.LastUsed.Sub(epoch), st.wantLastUsed)
		}
	}
}

func TestMemoryTouchKeepsRecordsImmutable(t *testing.T) {
	clock := newFakeClock()
	m := newMemory(t, clock, nil)
	ctx := t.Context()
	if err := m.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	before, _ := m.Get(ctx, "a")
	snapshot := before.Clone()

	clock.Advance(ttl / 2)
	if err := m.Touch(ctx, "a", clock.Now()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, snapshot); diff != "" {
		t.Errorf("Touch modified a record handed out earlier (-got +want):\n%s", diff)
	}
	after, _ := m.Get(ctx, "a")
	want := snapshot.Clone()
	want.LastUsed = clock.Now()
	if diff := cmp.Diff(after, want); diff != "" {
		t.Errorf("Get after Touch (-got +want):\n%s", diff)
	}
	// A Touch is not a Swap: the version a caller read stays current.
	if _, err := m.Swap(ctx, before, before.Clone()); err != nil {
		t.Errorf("Swap with the version read before Touch: %v", err)
	}
}

func TestMemorySweepAndOnExpire(t *testing.T) {
	clock := newFakeClock()
	var exp expiries
	m := newMemory(t, clock, exp.add)
	ctx := t.Context()

	for _, id := range []string{"old-1", "old-2", "old-3", "deleted", "touched"} {
		if err := m.Create(ctx, rec(id)); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(ttl / 2)
	if err := m.Create(ctx, rec("young")); err != nil {
		t.Fatal(err)
	}
	if err := m.Touch(ctx, "touched", clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Delete(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl / 2) // old-* idle for a full TTL; young and touched for half

	// Lazy expiry: reported absent, not removed, no callback yet.
	if _, err := m.Get(ctx, "old-1"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("Get(expired) = %v, want ErrNotFound", err)
	}
	if _, err := m.Delete(ctx, "old-2"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("Delete(expired) = %v, want ErrNotFound", err)
	}
	if got := exp.take(); len(got) != 0 {
		t.Fatalf("OnExpire before Sweep: %v", got)
	}
	if got, want := m.Len(), 5; got != want {
		t.Errorf("Len before Sweep = %d, want %d (expired records are held until swept)", got, want)
	}

	if got, want := m.Sweep(clock.Now()), 3; got != want {
		t.Errorf("Sweep = %d, want %d", got, want)
	}
	if diff := cmp.Diff(exp.take(), []string{"old-1", "old-2", "old-3"}); diff != "" {
		t.Errorf("OnExpire (-got +want):\n%s", diff)
	}
	if got, want := m.Len(), 2; got != want {
		t.Errorf("Len after Sweep = %d, want %d", got, want)
	}
	// Nothing is reported twice.
	if got := m.Sweep(clock.Now()); got != 0 {
		t.Errorf("second Sweep = %d, want 0", got)
	}
	if got := exp.take(); len(got) != 0 {
		t.Errorf("OnExpire on second Sweep: %v", got)
	}

	clock.Advance(ttl)
	if got, want := m.Sweep(clock.Now()), 2; got != want {
		t.Errorf("final Sweep = %d, want %d", got, want)
	}
	if diff := cmp.Diff(exp.take(), []string{"touched", "young"}); diff != "" {
		t.Errorf("OnExpire (-got +want):\n%s", diff)
	}
	if m.Len() != 0 {
		t.Errorf("Len = %d after everything expired", m.Len())
	}
}

// A Create over a live record changes nothing (ErrExists, no OnExpire); an
// expired record replaced by Create leaves the store without a Delete, so
// the per-backend session count learns of it through OnExpire.
func TestMemoryCreateReplaceReportsOld(t *testing.T) {
	clock := newFakeClock()
	var (
		mu       sync.Mutex
		replaced []*session.Record
	)
	m := newMemory(t, clock, func(r *session.Record) {
		mu.Lock()
		defer mu.Unlock()
		replaced = append(replaced, r)
	})
	ctx := t.Context()

	first := rec("a")
	if err := m.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	second := rec("a")
	second.BackendID = "second"
	if err := m.Create(ctx, second); !errors.Is(err, session.ErrExists) {
		t.Fatalf("Create over a live record = %v, want ErrExists", err)
	}
	clock.Advance(ttl) // first expires, unswept
	third := rec("a")
	third.BackendID = "third"
	if err := m.Create(ctx, third); err != nil {
		t.Fatal(err)
	}
	if got := m.Sweep(clock.Now()); got != 0 {
		t.Errorf("Sweep = %d, want 0 (the expired record was already replaced)", got)
	}
	want := []*session.Record{stored(first, epoch)}
	if diff := cmp.Diff(replaced, want); diff != "" {
		t.Errorf("OnExpire (-got +want):\n%s", diff)
	}
	if got, _ := m.Get(ctx, "a"); got == nil || got.BackendID != "third" {
		t.Errorf("Get = %v, want the third record", got)
	}
}

func TestMemoryRange(t *testing.T) {
	clock := newFakeClock()
	m := newMemory(t, clock, nil)
	ctx := t.Context()
	for i := range 100 {
		if i == 50 {
			clock.Advance(ttl / 2)
		}
		if err := m.Create(ctx, rec(fmt.Sprintf("s%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(ttl / 2) // s000..s049 expire

	var ids []string
	m.Range(func(r *session.Record) bool {
		ids = append(ids, r.ClientSID)
		// Range runs f outside the locks, so f may use the store.
		if _, err := m.Delete(ctx, r.ClientSID); err != nil {
			t.Errorf("Delete inside Range: %v", err)
		}
		return true
	})
	slices.Sort(ids)
	var want []string
	for i := 50; i < 100; i++ {
		want = append(want, fmt.Sprintf("s%03d", i))
	}
	if diff := cmp.Diff(ids, want); diff != "" {
		t.Errorf("Range ids (-got +want):\n%s", diff)
	}

	for i := range 10 {
		if err := m.Create(ctx, rec(fmt.Sprintf("t%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	m.Range(func(*session.Record) bool { n++; return n < 3 })
	if n != 3 {
		t.Errorf("Range after f returned false: %d calls, want 3", n)
	}
}

// The background sweeper removes expired records on its own and reports
// them; Close stops it.
func TestMemorySweeper(t *testing.T) {
	clock := newFakeClock()
	expired := make(chan string, 1)
	m := session.NewMemory(session.MemoryOptions{
		TTL:           ttl,
		Now:           clock.Now,
		SweepInterval: time.Millisecond,
		OnChange:      onExpired(func(r *session.Record) { expired <- r.ClientSID }),
	})
	defer m.Close()
	if err := m.Create(t.Context(), rec("a")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl)
	select {
	case id := <-expired:
		if id != "a" {
			t.Errorf("OnExpire(%q), want a", id)
		}
	case <-time.After(10 * time.Second): // a deadline for a hang, not a timing assumption
		t.Fatal("the sweeper did not remove the expired record")
	}
	if m.Len() != 0 {
		t.Errorf("Len = %d after the sweeper ran", m.Len())
	}
}

func TestMemoryClose(t *testing.T) {
	m := session.NewMemory(session.MemoryOptions{SweepInterval: time.Millisecond})
	closed := make(chan error, 2)
	go func() {
		// Close returns only once the sweeper goroutine has returned.
		closed <- m.Close()
		closed <- m.Close() // idempotent
	}()
	for range 2 {
		select {
		case err := <-closed:
			if err != nil {
				t.Errorf("Close = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return")
		}
	}
	// The records stay usable after Close.
	if err := m.Create(t.Context(), rec("a")); err != nil {
		t.Errorf("Create after Close: %v", err)
	}
	if _, err := m.Get(t.Context(), "a"); err != nil {
		t.Errorf("Get after Close: %v", err)
	}
}

// Concurrent Swaps on one id: every version has exactly one winner, and no
// update is lost (each winner incremented the record it read).
func TestMemoryConcurrentSwapOneWinnerPerVersion(t *testing.T) {
	const (
		workers = 8
		wins    = 200 // per worker
	)
	m := newMemory(t, newFakeClock(), nil)
	ctx := t.Context()
	if err := m.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	var winners [1 + workers*wins + 1]atomic.Int32 // indexed by version
	var conflicts atomic.Int64

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			cur, err := m.Get(ctx, "a")
			if err != nil {
				t.Error(err)
				return
			}
			for won := 0; won < wins; {
				next := cur.Clone()
				next.Reinits++
				got, err := m.Swap(ctx, cur, next)
				switch {
				case err == nil:
					winners[got.Version].Add(1)
					won++
					cur = got
				case errors.Is(err, session.ErrConflict):
					// Adopt the winner's record, as a losing replica does.
					conflicts.Add(1)
					cur = got
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()

	for v := 2; v < len(winners); v++ {
		if n := winners[v].Load(); n != 1 {
			t.Errorf("version %d had %d winners, want 1", v, n)
		}
	}
	final, err := m.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(1 + workers*wins); final.Version != want || final.Reinits != uint32(want-1) {
		t.Errorf("final v%d reinits %d, want v%d reinits %d", final.Version, final.Reinits, want, want-1)
	}
	t.Logf("%d conflicts", conflicts.Load())
}

// Many goroutines run every operation on a few overlapping ids while the
// clock moves and Sweep runs. Each created record must leave the store
// exactly once: through Delete, through OnExpire, or it is still there.
func TestMemoryConcurrentAccounting(t *testing.T) {
	const (
		workers = 8
		ops     = 3000
		ids     = 16
	)
	clock := newFakeClock()
	var expired atomic.Int64
	m := newMemory(t, clock, func(*session.Record) { expired.Add(1) })
	ctx := t.Context()

	var created, deleted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range ops {
				id := fmt.Sprintf("s%d", rng.IntN(ids))
				switch op := rng.IntN(100); {
				case op < 15:
					switch err := m.Create(ctx, rec(id)); {
					case err == nil:
						created.Add(1)
					case !errors.Is(err, session.ErrExists):
						t.Error(err)
						return
					}
				case op < 25:
					if _, err := m.Delete(ctx, id); err == nil {
						deleted.Add(1)
					} else if !errors.Is(err, session.ErrNotFound) {
						t.Error(err)
						return
					}
				case op < 40:
					cur, err := m.Get(ctx, id)
					if err != nil {
						continue
					}
					next := cur.Clone()
					next.Reinits++
					if _, err := m.Swap(ctx, cur, next); err != nil &&
						!errors.Is(err, session.ErrConflict) && !errors.Is(err, session.ErrNotFound) {
						t.Error(err)
						return
					}
				case op < 60:
					if err := m.Touch(ctx, id, clock.Now()); err != nil && !errors.Is(err, session.ErrNotFound) {
						t.Error(err)
						return
					}
				case op < 62:
					clock.Advance(ttl / 7)
				case op < 64:
					m.Sweep(clock.Now())
				case op < 65:
					m.Range(func(*session.Record) bool { return true })
				default:
					if r, err := m.Get(ctx, id); err == nil && r.ClientSID != id {
						t.Errorf("Get(%q) returned %q", id, r.ClientSID)
						return
					}
				}
			}
		})
	}
	wg.Wait()

	left := int64(m.Len())
	if got, want := deleted.Load()+expired.Load()+left, created.Load(); got != want {
		t.Errorf("deleted %d + expired %d + left %d = %d, want created = %d",
			deleted.Load(), expired.Load(), left, got, want)
	}
	t.Logf("created %d, deleted %d, expired %d, left %d", created.Load(), deleted.Load(), expired.Load(), left)
}

func TestMemoryGetTouchDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	clock := newFakeClock()
	m := newMemory(t, clock, nil)
	ctx := t.Context()
	if err := m.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	now := clock.Now()
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := m.Get(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Get: %v allocs/op, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := m.Get(ctx, "absent"); err == nil {
			t.Fatal("found")
		}
	}); n != 0 {
		t.Errorf("Get(absent): %v allocs/op, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if err := m.Touch(ctx, "a", now); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Touch within TTL/10: %v allocs/op, want 0", n)
	}
}

// onExpired is an OnChange subscriber that hands each Expired record to f
// (nil: none).
func onExpired(f func(*session.Record)) func(session.Change) {
	if f == nil {
		return nil
	}
	return func(c session.Change) {
		if c.Kind == session.Expired {
			f(c.Old)
		}
	}
}
