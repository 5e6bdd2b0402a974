package main

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
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

// startGCPacer keeps gcHeadroom above the live heap by setting GOGC after
// each collection until ctx ends, then puts GOGC back to 100. It does
// nothing when GOGC is set in the environment (the runtime has applied
// it; "off" turns collection off).
func startGCPacer(ctx context.Context, log *slog.Logger, getenv func(string) string) *gcPacer {
	if v := getenv("GOGC"); v != "" {
		log.Info("GOGC from the environment", "GOGC", v)
		return nil
	}
	p := &gcPacer{percent: 100, live: liveHeap, set: debug.SetGCPercent}
	p.start(ctx)
	return p
}

// gcPacer sets GOGC from the live heap of the last collection.
type gcPacer struct {
	live func() uint64 // liveHeap
	set  func(int) int // debug.SetGCPercent; tests record instead

	mu      sync.Mutex
	percent int // the GOGC set
	stopped bool
}

func (p *gcPacer) start(ctx context.Context) {
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
	p.applyLocked(p.live())
}

func (p *gcPacer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
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
