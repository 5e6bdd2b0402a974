package main

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// defaultMemoryReleaseAfter is --memory-release-after's default: how long
// after its last garbage collection a process that has gone quiet gives
// back to the OS what its heap holds past its goal (releasable).
const defaultMemoryReleaseAfter = 5 * time.Second

// quietAllocation is the most a process may allocate in a quiet spell: a
// tether serving requests allocates that in a fraction of a second (2 KB
// or so a follow-up), an idle one not in minutes.
const quietAllocation = 1 << 20

// minMemoryRelease is the least the heap must hold past its goal for a
// release to be worth a collection (releasable): less is left to the
// runtime's background scavenger. A large live heap needs more
// (worthReleasing).
const minMemoryRelease = 4 << 20

// worthReleasing reports whether a release that gives back releasable
// bytes is worth its collection, which marks a live heap of live bytes:
// minMemoryRelease or more, and a forcedGainShare part of the live heap or
// more (as the collections after a burst, worthCollecting). For a
// sidecar's few MiB of live heap that is minMemoryRelease; with 100,000
// sessions in the memory store (60 MB and more live), 15 MB.
func worthReleasing(live, releasable uint64) bool {
	return releasable >= max(minMemoryRelease, live/forcedGainShare)
}

// memoryReleaser gives memory back to the OS once the process has been
// quiet for a while after a burst.
//
// Why: after a burst of load the heap holds garbage that no collection
// will reclaim until the runtime's forced one, two minutes on, and freed
// pages go back to the OS only at the background scavenger's slow pace, so
// a sidecar that served a thousand connections for a few seconds keeps
// that RSS for minutes (hack/sessionmem -linger). nginx frees a burst's
// buffers as its connections go idle. A collection with a full scavenge
// (debug.FreeOSMemory) costs a few milliseconds of CPU for a sidecar's
// live heap, and more for every MB of it (the memory store's sessions);
// it runs once per quiet spell, and only when what it can give back is
// worth that (worthReleasing).
//
// "Quiet" is read from the collector itself: every collection re-arms a
// timer (a cleanup on a sentinel object that each collection frees), so
// the release comes a quiet spell (after) past the last collection, and
// only if the process allocated less than quietAllocation in that spell;
// a busy process collects far more often than that and is never
// interrupted, and an idle one wakes for nothing.
type memoryReleaser struct {
	after time.Duration
	log   *slog.Logger
	// releasable, live, allocated and free are the runtime's
	// (releasable, liveHeap, allocatedBytes, debug.FreeOSMemory); tests
	// put their own.
	releasable func() uint64
	live       func() uint64
	allocated  func() uint64
	free       func()

	mu        sync.Mutex
	timer     *time.Timer
	stopped   bool
	releasing bool
	ownGC     uint64 // the collection count right after the last release
	armedAt   uint64 // allocated() when the timer was last armed
	releases  int    // for tests
	// seen is the collection count collected last read. A cleanup may run
	// late, into the next collection's cycle: it then reads the count
	// before that collection ends, and the sentinel it makes outlives
	// that collection, which arms nothing (the one after it does). Tests
	// wait on seen instead of taking each collection for seen.
	seen uint64
}

// startMemoryReleaser starts releasing memory after quiet spells of after,
// until ctx ends. after <= 0 starts nothing.
func startMemoryReleaser(ctx context.Context, log *slog.Logger, after time.Duration) *memoryReleaser {
	if after <= 0 {
		return nil
	}
	m := &memoryReleaser{after: after, log: log, releasable: releasable, live: liveHeap, allocated: allocatedBytes, free: debug.FreeOSMemory}
	m.start(ctx)
	return m
}

// start arms the releaser until ctx ends.
func (m *memoryReleaser) start(ctx context.Context) {
	m.timer = time.AfterFunc(time.Hour, m.release)
	m.timer.Stop()
	m.watch()
	context.AfterFunc(ctx, m.stop)
}

// gcSentinel is freed by the first collection after it is made; its
// cleanup tells the releaser, and makes the next one.
type gcSentinel struct {
	_ [16]byte // not a tiny allocation, which could share its block with a live one
}

func (m *memoryReleaser) watch() {
	runtime.AddCleanup(new(gcSentinel), (*memoryReleaser).collected, m)
}

// collected runs after each collection.
func (m *memoryReleaser) collected() {
	n := gcCount()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	m.watch()
	m.seen = n
	if m.releasing || n <= m.ownGC {
		return // the release's own collection
	}
	m.armLocked()
}

// armLocked (re)starts the quiet spell.
func (m *memoryReleaser) armLocked() {
	m.armedAt = m.allocated()
	m.timer.Reset(m.after)
}

// release gives free memory back to the OS, when there is enough of it.
func (m *memoryReleaser) release() {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	if m.allocated()-m.armedAt > quietAllocation {
		// Busy again, before its first collection: a release now would
		// make the load fault its pages back in. Wait for a quiet spell.
		m.armLocked()
		m.mu.Unlock()
		return
	}
	if !worthReleasing(m.live(), m.releasable()) {
		m.mu.Unlock()
		return
	}
	m.releasing = true
	m.mu.Unlock()

	before, gcBefore := retainedBytes(), gcCount()
	start := time.Now()
	m.free()
	after, gcAfter := retainedBytes(), gcCount()

	m.mu.Lock()
	m.releasing = false
	m.ownGC = gcAfter
	m.releases++
	if gcAfter-gcBefore > 1 && !m.stopped {
		// Collections besides the release's own ran meanwhile (their
		// cleanups were taken for its own): the process is not quiet yet.
		m.armLocked()
	}
	m.mu.Unlock()
	m.log.Debug("memory given back to the OS after a quiet spell",
		"retained_before", before, "retained_after", after, "took", time.Since(start))
}

func (m *memoryReleaser) stop() {
	m.mu.Lock()
	m.stopped = true
	m.timer.Stop()
	m.mu.Unlock()
}

// gcCount is the number of completed collections.
func gcCount() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// releasable is what a collection and a full scavenge would give back to
// the OS past what a steady load holds: what the heap holds (its objects,
// dead ones included until the next collection, and its free pages not
// yet given back) past twice its working set. The working set is the
// heap's goal, or gcHeadroom past the live heap when the goal is further
// (a live heap past gcHeadroom, whose goal is twice it).
//
// Why twice: a steady load's heap holds pages past its goal (objects grow
// to the goal, and sweeping hands free pages back for the next cycle):
// 1.0–1.9 times it after the bench's rounds. A release gives back every
// free page: given back, each is faulted in again by the next requests,
// and on a virtual machine a fault costs some microseconds (a release
// itself took 200 ms there). With the release past the working set
// itself, a steady load with quiet spells between its turns (the
// bench's rounds, 3 s of load and 12 s of quiet) had its heap released
// and faulted in again at every other spell once the goal was a few MiB;
// with the whole free heap given back at each spell, tetherbench cpu
// measured 13% more CPU per follow-up. Past twice the working set, it is
// what a burst left behind.
func releasable() uint64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/heap/goal:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	held := s[0].Value.Uint64() + s[1].Value.Uint64()
	keep := 2 * min(s[2].Value.Uint64(), s[3].Value.Uint64()+gcHeadroom)
	return held - min(held, keep)
}

// allocatedBytes is the heap allocated since the process started.
func allocatedBytes() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// retainedBytes is the memory the Go runtime holds from the OS and has
// not given back: about the process's anonymous RSS.
func retainedBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}
