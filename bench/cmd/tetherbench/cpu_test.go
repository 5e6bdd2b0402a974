package main

import "testing"

// Paired ratios cancel a drift that the medians keep: b is 10% cheaper
// than a in every round while the machine slows down round after round.
func TestPairedRatios(t *testing.T) {
	a := []float64{0.100, 0.110, 0.121, 0.133, 0.146}
	b := []float64{0.090, 0.099, 0.1089, 0.1197, 0.1314}
	p := pairedRatios(b, a)
	if p.median < 0.899 || p.median > 0.901 || p.lo < 0.899 || p.hi > 0.901 {
		t.Errorf("paired ratios %+v, want 0.9 in every round", p)
	}
	if got := pairedRatios(nil, a); got != (paired{}) {
		t.Errorf("no rounds: %+v", got)
	}
	// A round without the reference's figure is left out.
	p = pairedRatios([]float64{1, 2, 3}, []float64{1, 0})
	if p.median != 1 || p.lo != 1 || p.hi != 1 {
		t.Errorf("with a missing round: %+v, want 1", p)
	}
}
