package main

import (
	"context"
	"fmt"
	"math"
	"time"
)

// ratePlan is how the overhead scenario looks for each target's highest
// sustainable rate.
//
// Every target runs at one fraction of its own closed-loop estimate, then
// the next fraction up, interleaved, each fraction starting one target
// further on (so that no target always runs right after the same one).
// Past the last fraction, the targets still sustaining go on up by
// StepFraction of their estimate, to MaxFraction at most: an estimate that
// came out low must not cap a target's rate. A failed step is run once more
// before the target stops: one GC pause or a neighbour's burst should not
// end the search. When a target stops, the gap between its last sustained
// rate and the one that failed is bisected Refine times, so that the rate
// found is within StepFraction/2^Refine of the estimate below the first
// failure: two targets a few per cent apart are not decided by where their
// grids happened to fall. A target whose first rate already fails steps
// down instead (×0.6, twice), so that a loaded machine still yields a rate
// rather than none, and the gap between the rate it then sustains and the
// failure above it is bisected as well: a first step that a neighbour's
// burst spoilt twice must not leave the target at 0.36 of its estimate
// (a run of 2026-12-02 put tether at 0.31× direct that way, where the
// runs before it that day read 0.85–1.04×). A step that follows a failed
// one, whichever target's, starts after Rest without load: an overloaded
// step leaves queues and grown heaps behind in the proxy and the backends,
// and the next step would be judged on the one before it.
type ratePlan struct {
	Fractions    []float64 // rising
	StepFraction float64
	MaxFraction  float64
	Refine       int
	Rest         time.Duration
}

// fraction is the plan's i-th fraction of the estimate.
func (p ratePlan) fraction(i int) float64 {
	if i < len(p.Fractions) {
		return p.Fractions[i]
	}
	return p.Fractions[len(p.Fractions)-1] + p.StepFraction*float64(i-len(p.Fractions)+1)
}

// searchMaxRates runs the plan. measure runs one target at one offered
// rate and says whether the rate was sustained; searchMaxRates records each
// step in t.Steps, the highest sustained rate in t.MaxRate, and in t.StopWhy
// the failure at the lowest rate above every sustained one ("" when none
// failed).
func searchMaxRates(ctx context.Context, targets []*overheadTarget, plan ratePlan, measure func(t *overheadTarget, rate float64) overheadStep) {
	defer func() {
		for _, t := range targets {
			t.StopWhy = stopReason(t)
		}
	}()
	lastFailed := false
	try := func(t *overheadTarget, rate float64) bool {
		if lastFailed {
			sleep(ctx, plan.Rest)
		}
		st := measure(t, rate)
		lastFailed = !st.OK
		t.Steps = append(t.Steps, st)
		if st.OK {
			t.MaxRate = max(t.MaxRate, rate)
		}
		return st.OK
	}
	twice := func(t *overheadTarget, rate float64) bool { return try(t, rate) || try(t, rate) }

	alive := map[*overheadTarget]bool{}
	for _, t := range targets {
		alive[t] = true
	}
	lastOK := map[*overheadTarget]float64{}
	for i := 0; plan.fraction(i) <= plan.MaxFraction+1e-9; i++ {
		if len(alive) == 0 || ctx.Err() != nil {
			return
		}
		f := plan.fraction(i)
		for j := range targets {
			t := targets[(i+j)%len(targets)]
			if !alive[t] || ctx.Err() != nil {
				continue
			}
			rate := math.Round(f * t.Estimate)
			if twice(t, rate) {
				lastOK[t] = rate
				continue
			}
			delete(alive, t)
			lo, hi := lastOK[t], rate // lo is 0 at the first fraction
			if i == 0 {
				for down := f * 0.6; down > f*0.3 && ctx.Err() == nil; down *= 0.6 {
					r := math.Round(down * t.Estimate)
					if try(t, r) {
						lo = r
						break
					}
					hi = r
				}
				if lo == 0 {
					continue // nothing sustained
				}
			}
			for range plan.Refine {
				mid := math.Round((lo + hi) / 2)
				if mid <= lo || mid >= hi || ctx.Err() != nil {
					break
				}
				if twice(t, mid) {
					lo = mid
				} else {
					hi = mid
				}
			}
		}
	}
}

// stopReason is the failed step of t at the lowest rate above its max
// rate, "" when there is none.
func stopReason(t *overheadTarget) string {
	var stop *overheadStep
	for i, st := range t.Steps {
		if !st.OK && st.Rate > t.MaxRate && (stop == nil || st.Rate < stop.Rate) {
			stop = &t.Steps[i]
		}
	}
	if stop == nil {
		return ""
	}
	return fmt.Sprintf("%.0f/s: %s", stop.Rate, stop.Why)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
