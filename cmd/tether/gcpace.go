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

// gcHeadroom is the least the collector lets the heap grow past what the
// last collection found live before it collects again, unless GOGC is set.
//
// Why: with GOGC=100 the collector runs when the heap doubles, and no
// sooner than at 4 MiB. A sidecar's live heap is 2 MiB or so, which makes
// that every 2-3 MiB of allocation: twice a second at 2,000 follow-ups a
// second, a cycle costing some 4 ms of CPU however little it frees (it
// marks the whole live heap and every goroutine's stack). That was a
// twentieth of tether's CPU per request (bench, "Where the CPU goes"). A
// headroom makes cycles rarer for that much more heap at the most; past
// it, the live heap's own 100% is the larger (GOGC's default). 4 MiB, not
// 8: the heap a quiet tether keeps grows with it (releasable), and
// 8 MiB of headroom put tether's RSS after the bench's rounds at 30–41 MiB
// against a 40 MiB goal; at 4 MiB it read 24.8, for no CPU measurable
// (tetherbench cpu at 1,800 follow-ups/s, paired by round: 1.000× the
// 8 MiB build). GOMEMLIMIT (setMemoryLimit) still bounds the heap: the
// collector takes the lower goal.
const gcHeadroom = 4 << 20

// heapMinimum is the runtime's least heap goal at GOGC=100 (its
// defaultHeapMinimum), which GOGC scales: with GOGC=g the goal is the
// larger of heapMinimum·g/100 and live·(1+g/100).
const heapMinimum = 4 << 20

// maxGCPercent bounds the GOGC the pacer sets, for a live heap so small
// that the headroom would be many times over.
const maxGCPercent = 1000

// A burst's end, for the collections that follow it (gcPacer.burstEnded):
// collections whose live heap was more than burstLive arm the check, which
// looks every burstPoll whether the goroutines have fallen to half the
// most any of them saw, when that was burstGoroutines or more. It then
// collects up to burstCollections times, each only while worthCollecting.
const (
	burstLive        = 2 * gcHeadroom
	burstGoroutines  = 256
	burstPoll        = 250 * time.Millisecond
	burstCollections = 2
	// burstIdlePolls: a check that has looked this many times since the
	// last collection without the goroutines falling to half rests until
	// the next collection. Goroutines that stay while nothing allocates
	// are not a burst but a steady population (thousands of idle
	// streams): polling them every burstPoll for as long as they live
	// would wake an idle sidecar four times a second (issue 32). A burst
	// allocates, so its collections keep the check going; the one that
	// ends unseen meanwhile is collected after at the latest by the
	// runtime's periodic collection (every 2 minutes), which arms the
	// check again.
	burstIdlePolls = 8
)

// forcedGainShare: a collection the runtime would not run yet (after a
// burst, or a memory release) must free at least 1/forcedGainShare of what
// it marks: a collection costs CPU for every live byte (it marks the whole
// live heap however little it frees), and what it frees lowers the heap's
// goal (the RSS the load then keeps) by twice that at GOGC=100.
//
// Why a quarter: a collection that frees a quarter of the long-lived heap
// lowers the goal a burst left by half the long-lived heap. With 100,000
// sessions in the memory store (60 MB live between bursts) a collection
// after a burst cost 90–420 ms of CPU on a busy 2-core machine. After
// bursts of 32 KiB follow-ups (78–116 MB live at most) one is worth it:
// without any, tether's RSS after the rounds read 262 MiB against
// 102–126; but not two: the second of the old pair found 60–61 MB where
// the first had found 63–67, for a whole mark. After bursts of small
// follow-ups (68–81 MB) they are mostly worth none: tether's CPU per
// follow-up read 0.73× and 0.76× the old pair's, a probe's p99 after a
// burst 3.8 and 2.1 ms against 10.5 and 5.1, and its peak RSS the same
// (hack/gcburst; docs/runtime.md). A sidecar's own 2 MiB live heap marks
// in a millisecond and a burst leaves tens of MB on it: both collections
// stay.
const forcedGainShare = 4

// worthCollecting reports whether a collection after a burst is worth its
// cost: whether what it would free, the live heap the last collection
// found (live) less the long-lived heap (longLived: the live heap of the
// last collection outside a burst, about what this one would mark), is a
// forcedGainShare part of longLived or more. An unknown longLived (0: no
// collection outside a burst yet) is worth it: the collection tells.
func worthCollecting(longLived, live uint64) bool {
	return live-min(live, longLived) >= longLived/forcedGainShare
}

// startGCPacer keeps gcHeadroom above the live heap by setting GOGC after
// each collection until ctx ends, then puts GOGC back to 100. It does
// nothing when GOGC is set in the environment (the runtime has applied
// it; "off" turns collection off).
func startGCPacer(ctx context.Context, log *slog.Logger, getenv func(string) string) *gcPacer {
	if v := getenv("GOGC"); v != "" {
		log.Info("GOGC from the environment", "GOGC", v)
		return nil
	}
	p := &gcPacer{percent: 100, live: liveHeap, set: debug.SetGCPercent,
		goroutines: runtime.NumGoroutine, collect: runtime.GC, log: log}
	p.start(ctx)
	return p
}

// gcPacer sets GOGC from the live heap of the last collection, and
// collects again when a burst that left a large goal has ended.
//
// Why the burst's end: a collection in the middle of a burst (2,000
// requests in flight, each with its connections' buffers) finds 50 MiB or
// so live, and sets a goal of twice that. When the burst ends, the next
// collection comes only once the heap has grown into that goal: at the
// bench's 1,400 follow-ups a second, 20 s on. Until then every allocation
// takes memory not touched since the burst (pages the runtime's
// scavenger is giving back meanwhile, faulted in again) instead of the
// few MiB a steady load cycles through: after an overload, tetherbench
// cpu measured 0.867× the CPU per follow-up of the build without this
// check, by round (docs/runtime.md, "Memory and CPU"). A burst's requests and
// connections are goroutines, so
// their number says when it is over, for the price of a timer while the
// live heap is large. A live heap large without a burst (the memory
// store's sessions, a few goroutines) arms the check and never meets it.
//
// Two collections, not one, for a small heap: what the burst's requests
// put back into sync.Pools (buffers, request state) outlives one
// collection in the pools' victim caches, and the first collection after
// an overload found 28 MiB live with 11 goroutines left. But each
// collection marks the whole live heap: with a large one (100,000
// sessions in the memory store, 60 MB and more) a collection costs far
// more and frees a smaller share, so each is made only while
// worthCollecting says the live heap holds enough of the burst's to pay
// for it: one, or none, after a burst on such a heap (issue 29).
type gcPacer struct {
	live       func() uint64 // liveHeap
	set        func(int) int // debug.SetGCPercent; tests record instead
	goroutines func() int    // runtime.NumGoroutine; tests put their own
	collect    func()        // runtime.GC; tests count instead
	log        *slog.Logger  // nil: none

	mu      sync.Mutex
	percent int // the GOGC set
	stopped bool
	// burst is the most goroutines seen at collections since one saw
	// burstGoroutines or more with a live heap over burstLive, else 0;
	// check polls for the burst's end. peak is the most live heap those
	// collections found; longLived the live heap of the last collection
	// outside a burst (the heap that outlives bursts: the sessions),
	// 0 until one has run.
	burst           int
	peak, longLived uint64
	check           *time.Timer
	// polls counts the checks since the last collection; armed says the
	// check's timer is set.
	polls int
	armed bool
}

func (p *gcPacer) start(ctx context.Context) {
	p.check = time.AfterFunc(time.Hour, p.burstEnded)
	p.check.Stop()
	p.watch()
	context.AfterFunc(ctx, p.stop)
}

func (p *gcPacer) watch() {
	runtime.AddCleanup(new(gcSentinel), (*gcPacer).collected, p)
}

// collected runs after each collection (the sentinel of the one before
// it is freed).
func (p *gcPacer) collected() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.watch()
	live := p.live()
	p.applyLocked(live)
	if live <= burstLive {
		p.burst, p.peak, p.longLived = 0, 0, live
		return
	}
	g := p.goroutines()
	if p.burst == 0 && g < burstGoroutines {
		p.longLived = live
		return
	}
	// The most, not the last: a collection in the burst's tail finds its
	// garbage and pooled buffers live, with fewer goroutines.
	p.burst = max(p.burst, g)
	p.peak = max(p.peak, live)
	p.polls = 0
	p.armLocked()
}

// armLocked sets the check's timer. p.mu is held.
func (p *gcPacer) armLocked() {
	p.armed = true
	p.check.Reset(burstPoll)
}

// burstEnded collects when the goroutines have fallen to half what the
// burst's collections saw (up to burstCollections times, each while
// worthCollecting), else looks again a burstPoll later, up to
// burstIdlePolls times until the next collection. The collections'
// own cleanups (collected) set the goal from what is live after the burst,
// and take it as the long-lived heap.
func (p *gcPacer) burstEnded() {
	p.mu.Lock()
	p.armed = false
	if p.stopped || p.burst < burstGoroutines {
		p.mu.Unlock()
		return
	}
	burst, now := p.burst, p.goroutines()
	if 2*now > burst {
		// Still in the burst, or a steady population: rest after
		// burstIdlePolls looks with no collection between them.
		if p.polls++; p.polls < burstIdlePolls {
			p.armLocked()
		}
		p.mu.Unlock()
		return
	}
	longLived, live := p.longLived, p.peak
	p.burst, p.peak = 0, 0
	p.mu.Unlock()
	start := time.Now()
	n := 0
	for ; n < burstCollections && worthCollecting(longLived, live); n++ {
		p.collect()
		live = p.live()
	}
	if p.log != nil {
		p.log.Debug("collected after a burst", "collections", n, "goroutines_at_burst", burst, "goroutines", now,
			"long_lived_heap", longLived, "live_heap", live, "took", time.Since(start))
	}
}

func (p *gcPacer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	p.armed = false
	if p.check != nil {
		p.check.Stop()
	}
	if p.percent != 100 {
		p.set(100)
		p.percent = 100
	}
}

// applyLocked sets GOGC for a live heap of live bytes when it differs
// from the one set by a tenth or more, or is back to the default (the
// live heap moves a little with every cycle; the goal need not follow it
// exactly). p.mu is held.
func (p *gcPacer) applyLocked(live uint64) {
	want := gcPercentFor(live)
	if want == p.percent {
		return
	}
	if want == 100 || 10*abs(want-p.percent) >= p.percent {
		p.set(want)
		p.percent = want
	}
}

func abs(n int) int { return max(n, -n) }

// gcPercentFor is the least GOGC, and at least 100, whose heap goal leaves
// gcHeadroom above a live heap of live bytes.
func gcPercentFor(live uint64) int {
	// The goal is max(heapMinimum·g, live·(1+g)) for g = GOGC/100: either
	// term alone reaching live+gcHeadroom is enough.
	byMinimum := (live + gcHeadroom) * 100 / heapMinimum
	byLive := uint64(maxGCPercent)
	if live > 0 {
		byLive = gcHeadroom * 100 / live
	}
	return int(max(100, min(byMinimum, byLive, maxGCPercent)))
}

// liveHeap is the heap the last collection found live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
