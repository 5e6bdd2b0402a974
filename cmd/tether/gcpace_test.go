package main

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"
)

// goalOf is the runtime's heap goal for a live heap at GOGC=percent (stacks
// and globals left out): the larger of the scaled minimum and the live heap
// grown by the percentage.
func goalOf(live uint64, percent int) uint64 {
	return max(heapMinimum*uint64(percent)/100, live+live*uint64(percent)/100)
}

// The percentage leaves the headroom above the live heap, is the least that
// does (one point less would not), never goes below GOGC's default, and is
// bounded for a heap near empty.
func TestGCPercentFor(t *testing.T) {
	for _, live := range []uint64{0, 1, 100 << 10, 1 << 20, 2 << 20, 3<<20 + 12345, 4 << 20, 6 << 20, 8 << 20, 9 << 20, 64 << 20, 1 << 30} {
		pct := gcPercentFor(live)
		if pct < 100 || pct > maxGCPercent {
			t.Errorf("live %d: GOGC %d, outside [100, %d]", live, pct, maxGCPercent)
		}
		want := live + gcHeadroom
		// Integer percentages: the goal may fall short by what one
		// percent of the larger term is worth.
		slack := max(heapMinimum, live) / 100
		if goal := goalOf(live, pct); goal+slack < want && pct < maxGCPercent {
			t.Errorf("live %d: GOGC %d gives a goal of %d, less than live+headroom %d", live, pct, goal, want)
		}
		if pct > 100 {
			if goal := goalOf(live, pct-1); goal >= want {
				t.Errorf("live %d: GOGC %d is not the least: %d gives a goal of %d ≥ %d", live, pct, pct-1, goal, want)
			}
		}
	}
	if got := gcPercentFor(64 << 20); got != 100 {
		t.Errorf("a 64 MiB live heap: GOGC %d, want the default 100", got)
	}
}

// Against the runtime's own collections: each one sets the percentage for
// the live heap it found (with a live figure of the test's), small moves
// are not followed, a return to the default is, and once the context ends
// GOGC is 100 again and later collections set nothing.
func TestGCPacer(t *testing.T) {
	var mu sync.Mutex
	var sets []int
	var live uint64
	p := &gcPacer{percent: 100,
		live:       func() uint64 { mu.Lock(); defer mu.Unlock(); return live },
		set:        func(v int) int { mu.Lock(); defer mu.Unlock(); sets = append(sets, v); return 0 },
		goroutines: func() int { return 10 },
		collect:    func() {},
	}
	setLive := func(v uint64) { mu.Lock(); live = v; mu.Unlock() }
	lastSet := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(sets) == 0 {
			return 0, 0
		}
		return sets[len(sets)-1], len(sets)
	}
	// awaitSets collects until the pacer has made n settings.
	awaitSets := func(n int) int {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			if v, got := lastSet(); got >= n {
				return v
			}
			if time.Now().After(deadline) {
				_, got := lastSet()
				t.Fatalf("%d settings after 10 s of collections, want %d", got, n)
			}
			runtime.GC()
			time.Sleep(time.Millisecond) // the cleanup runs on its own goroutine
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	setLive(2 << 20)
	p.start(ctx)
	if v := awaitSets(1); v != gcPercentFor(2<<20) {
		t.Fatalf("live 2 MiB: GOGC set to %d, want %d", v, gcPercentFor(2<<20))
	}

	// A live heap 2% larger: within a tenth of the percentage, not followed.
	setLive(2<<20 + 40<<10)
	for range 5 {
		runtime.GC()
	}
	setLive(64 << 20)
	if v := awaitSets(2); v != 100 {
		t.Fatalf("live 64 MiB: GOGC set to %d, want 100", v)
	}
	if _, n := lastSet(); n != 2 {
		t.Fatalf("%d settings, want 2: a 2%% move of the live heap was followed", n)
	}

	setLive(1 << 20)
	awaitSets(3)
	cancel()
	// The stop runs on a goroutine of its own (context.AfterFunc).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, n := lastSet(); n >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("GOGC not put back 10 s after the context ended")
		}
	}
	if v, n := lastSet(); v != 100 || n != 4 {
		t.Fatalf("after the context ended: last setting %d (%d in all), want 100 (4)", v, n)
	}
	setLive(2 << 20)
	for range 5 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if _, n := lastSet(); n != 4 {
		t.Fatalf("%d settings after the context ended, want 4", n)
	}
}

// Collections that found a burst's live heap are followed by two more
// (the second for what the first finds in the pools' victim caches) once
// the goroutines have fallen to half the most they saw, when that was
// burstGoroutines or more; and by two only. A small live heap, few
// goroutines or a stopped pacer collects nothing. The runtime's part (the
// cleanup after each collection, the timer) is played by the test.
func TestGCPacerBurstEnd(t *testing.T) {
	var live uint64
	var goroutines, collections int
	newPacer := func() *gcPacer {
		p := &gcPacer{percent: 100,
			live:       func() uint64 { return live },
			set:        func(int) int { return 0 },
			goroutines: func() int { return goroutines },
			collect:    func() { collections++ },
			check:      time.NewTimer(time.Hour),
		}
		p.check.Stop()
		return p
	}

	p := newPacer()
	live, goroutines, collections = 64<<20, 3000, 0
	p.collected() // in the burst
	goroutines = 1800
	p.collected() // in its tail: fewer goroutines, its garbage still live
	for _, g := range []int{3000, 2200, 1501} {
		goroutines = g
		p.burstEnded()
	}
	if collections != 0 {
		t.Fatalf("%d collections with %d of the burst's 3000 goroutines left, want none", collections, goroutines)
	}
	goroutines = 1500
	p.burstEnded()
	p.burstEnded()
	if collections != 2 {
		t.Fatalf("%d collections once the goroutines fell from 3000 to 1500, want 2", collections)
	}
	live = 2 << 20
	p.collected() // theirs: a small heap, nothing armed
	goroutines = 10
	p.burstEnded()
	if collections != 2 {
		t.Fatalf("%d collections after a collection found 2 MiB live, want 2", collections)
	}

	// A large live heap without a burst (the memory store's sessions).
	live, goroutines, collections = 64<<20, 200, 0
	p.collected()
	goroutines = 10
	p.burstEnded()
	if collections != 0 {
		t.Fatalf("goroutines from 200 to 10: %d collections, want none", collections)
	}

	// Stopped: nothing.
	p = newPacer()
	live, goroutines, collections = 64<<20, 3000, 0
	p.collected()
	p.stop()
	goroutines = 10
	p.burstEnded()
	if collections != 0 {
		t.Fatalf("a stopped pacer collected %d times", collections)
	}
}

// Goroutines that stay while nothing is collected (thousands of idle
// streams on a large live heap) are no burst: the check looks
// burstIdlePolls times, then rests until a collection arms it again, and
// still sees the end of a burst that comes after that.
func TestGCPacerBurstCheckRestsOnSteadyGoroutines(t *testing.T) {
	var live uint64 = 64 << 20
	goroutines, collections := 10014, 0
	p := &gcPacer{percent: 100,
		live:       func() uint64 { return live },
		set:        func(int) int { return 0 },
		goroutines: func() int { return goroutines },
		collect:    func() { collections++ },
		check:      time.NewTimer(time.Hour),
	}
	p.check.Stop()
	defer p.check.Stop()

	p.collected()
	polls := 0
	for p.armed {
		if polls++; polls > 100 {
			t.Fatal("the check is still armed after 100 polls of a steady 10,014 goroutines")
		}
		p.burstEnded()
	}
	if polls != burstIdlePolls {
		t.Errorf("the check rested after %d polls, want %d", polls, burstIdlePolls)
	}
	if collections != 0 {
		t.Fatalf("%d collections with the goroutines steady, want none", collections)
	}

	// The runtime's periodic collection arms it again; the streams end.
	p.collected()
	if !p.armed {
		t.Fatal("a collection with 10,014 goroutines on 64 MiB did not arm the check")
	}
	goroutines = 14
	p.burstEnded()
	if collections == 0 {
		t.Error("no collection once the goroutines fell from 10,014 to 14")
	}
}

// A collection after a burst is made while what it would free (the live
// heap less the long-lived one) is a quarter or more of what it marks (the
// long-lived heap).
func TestWorthCollecting(t *testing.T) {
	const MB = 1 << 20
	for _, tc := range []struct {
		name            string
		longLived, live uint64
		want            bool
	}{
		{"a sidecar's heap after an overload", 2 * MB, 50 * MB, true},
		{"its first collection found the pools' victims", 2 * MB, 28 * MB, true},
		{"no collection outside a burst yet", 0, 64 * MB, true},
		{"100,000 sessions, a burst's collection", 61 * MB, 100 * MB, true},
		{"100,000 sessions, the pools' victims after one collection", 61 * MB, 64 * MB, false},
		{"100,000 sessions, a burst that added a little", 61 * MB, 70 * MB, false},
		{"a quarter exactly", 64 * MB, 80 * MB, true},
		{"a byte short of a quarter", 64 * MB, 80*MB - 1, false},
		{"less live than long-lived (sessions expired)", 61 * MB, 40 * MB, false},
	} {
		if got := worthCollecting(tc.longLived, tc.live); got != tc.want {
			t.Errorf("%s: worthCollecting(%d MB, %d MB) = %v, want %v", tc.name, tc.longLived>>20, tc.live>>20, got, tc.want)
		}
	}
}

// A burst on a large long-lived heap (issue 29: 100,000 sessions in the
// memory store) is followed by one collection when the burst left enough
// on it, none when it left little, and never two: the second would free
// the pools' victim caches, a few MB, for a mark of the whole heap. The
// long-lived heap is what collections outside a burst found, the pacer's
// own after a burst included. The runtime's part is played by the test.
func TestGCPacerBurstEndLargeHeap(t *testing.T) {
	const MB = 1 << 20
	var live uint64
	var goroutines, collections int
	p := &gcPacer{percent: 100,
		live:       func() uint64 { return live },
		set:        func(int) int { return 0 },
		goroutines: func() int { return goroutines },
		// What the first collection after such a burst found.
		collect: func() { collections++; live = 64 * MB },
		check:   time.NewTimer(time.Hour),
	}
	p.check.Stop()
	// spike runs a burst whose collections found peak live, and its end.
	spike := func(peak uint64) {
		goroutines, live = 10, 61*MB
		p.collected() // between bursts: the sessions
		goroutines, live = 1200, peak
		p.collected() // in the burst
		goroutines = 10
		p.burstEnded()
	}

	spike(100 * MB)
	if collections != 1 {
		t.Fatalf("a burst that left 100 MB live on 61 MB of sessions: %d collections, want 1", collections)
	}
	p.collected() // that collection's own cleanup: few goroutines, 64 MB
	if p.longLived != 64*MB {
		t.Errorf("long-lived heap %d MB after the collection, want its 64", p.longLived>>20)
	}

	collections = 0
	spike(70 * MB)
	if collections != 0 {
		t.Fatalf("a burst that left 70 MB live on 61 MB of sessions: %d collections, want none", collections)
	}
}

// GOGC in the environment is the operator's: no pacer.
func TestGCPacerLeavesGOGCSet(t *testing.T) {
	if p := startGCPacer(context.Background(), slog.New(slog.DiscardHandler), func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	}); p != nil {
		t.Fatal("a pacer started with GOGC set")
	}
}
