package main

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

// The releaser's decisions, with the runtime's collections but a
// releasable figure of the test's (the runtime's scavenger would otherwise
// move it under the test): a collection arms it, a quiet spell after one
// releases when there is enough to give back, the release's own collection
// arms nothing, a process allocating again is not interrupted, a release
// too small for the live heap it would mark is not made, and nothing is
// released once its context has ended.
func TestMemoryReleaser(t *testing.T) {
	const after = 20 * time.Millisecond
	var give, live, allocs atomic.Uint64
	m := &memoryReleaser{after: after, log: slog.New(slog.DiscardHandler),
		releasable: give.Load,
		live:       live.Load,
		allocated:  allocs.Load,
		free:       runtime.GC, // a collection of its own, as debug.FreeOSMemory's
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.start(ctx)
	releases := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.releases
	}
	waitReleases := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); releases() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d releases, want %d", releases(), n)
			}
		}
	}
	// collect runs a collection and waits until the releaser has seen
	// it: a cleanup that ran late, into the collection's cycle, makes the
	// collection go unseen, and the next one is seen instead.
	collect := func() {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			runtime.GC()
			want := gcCount()
			for wait := time.Now().Add(time.Second); time.Now().Before(wait); time.Sleep(time.Millisecond) {
				m.mu.Lock()
				seen := m.seen
				m.mu.Unlock()
				if seen >= want {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the releaser saw no collection since %d", want)
			}
		}
	}
	// stays asserts that no release comes in several quiet spells.
	stays := func(n int, why string) {
		t.Helper()
		time.Sleep(5 * after)
		if got := releases(); got != n {
			t.Fatalf("%s: %d releases, want %d", why, got, n)
		}
	}

	give.Store(minMemoryRelease - 1)
	collect()
	stays(0, "a collection with less than minMemoryRelease to give back")

	give.Store(64 << 20)
	collect()
	waitReleases(1)
	stays(1, "after a release, with nothing but its own collection")

	collect()
	waitReleases(2)

	// Busy again without a collection yet (allocating more than
	// quietAllocation a spell): no release until it stops.
	collect()
	for range 10 {
		allocs.Add(2 * quietAllocation)
		time.Sleep(after / 2)
	}
	if got := releases(); got != 2 {
		t.Fatalf("%d releases while allocating, want 2", got)
	}
	waitReleases(3)

	// 100,000 sessions in the memory store (issue 29): 16 MB to give back
	// is worth a collection of a 64 MB live heap, 15 MB is not.
	live.Store(64 << 20)
	give.Store(15 << 20)
	collect()
	stays(3, "15 MB to give back on a 64 MB live heap")
	give.Store(16 << 20)
	collect()
	waitReleases(4)

	cancel()
	runtime.GC()
	stays(4, "after the context ended")
}

// A release is made when it gives back minMemoryRelease or more, and a
// quarter or more of the live heap its collection marks.
func TestWorthReleasing(t *testing.T) {
	const MB = 1 << 20
	for _, tc := range []struct {
		live, releasable uint64
		want             bool
	}{
		{2 * MB, minMemoryRelease, true},
		{2 * MB, minMemoryRelease - 1, false},
		{16 * MB, 4 * MB, true},
		{61 * MB, 15 * MB, false},
		{61 * MB, 16 * MB, true},
		{64 * MB, 16*MB - 1, false},
		{400 * MB, 100 * MB, true},
	} {
		if got := worthReleasing(tc.live, tc.releasable); got != tc.want {
			t.Errorf("worthReleasing(live %d, releasable %d) = %v, want %v", tc.live, tc.releasable, got, tc.want)
		}
	}
}

// releasable counts what a burst left past twice the heap's working set,
// not the working set, and what a release leaves is under
// minMemoryRelease: an idle process's collections find nothing worth a
// release (no release every quiet spell), and neither does a steady load's
// heap, which grows to its goal between collections.
func TestReleasable(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	var sink [][]byte
	for range 1024 {
		sink = append(sink, make([]byte, 64<<10)) // 64 MiB, live
	}
	runtime.GC()
	runtime.KeepAlive(sink)
	sink = nil
	runtime.GC() // the 64 MiB are free pages now, the goal is a few MiB
	// The runtime's background scavenger gives some back meanwhile.
	if got := releasable(); got < 48<<20 {
		t.Errorf("releasable %d MiB after a burst of 64 MiB, want 48 or more", got>>20)
	}
	debug.FreeOSMemory()
	if got := releasable(); got >= minMemoryRelease {
		t.Errorf("releasable %d KiB after a release, want under %d", got>>10, minMemoryRelease>>10)
	}

	// A steady load: 32 MiB live, so a goal of 64 MiB, and garbage that
	// the next collection would take, well below the collector's trigger.
	// The working set is gcHeadroom past the live heap (36 MiB), and the
	// heap may hold twice that (a count past the working set itself would
	// give 16 MiB). A burst of 48 MiB on top of it, collected, leaves free
	// pages past it.
	live := make([][]byte, 0, 512)
	for range 512 {
		live = append(live, make([]byte, 64<<10))
	}
	runtime.GC()
	for range 320 {
		sink = append(sink, make([]byte, 64<<10)) // 20 MiB
	}
	sink = nil
	if got := releasable(); got >= minMemoryRelease {
		t.Errorf("releasable %d KiB under a steady load's heap, want under %d", got>>10, minMemoryRelease>>10)
	}
	for range 768 {
		sink = append(sink, make([]byte, 64<<10)) // 48 MiB more
	}
	runtime.KeepAlive(sink)
	sink = nil
	runtime.GC()
	if got := releasable(); got < minMemoryRelease {
		t.Errorf("releasable %d KiB after a burst of 48 MiB on 32 MiB live, want %d or more", got>>10, minMemoryRelease>>10)
	}
	runtime.KeepAlive(live)
}
