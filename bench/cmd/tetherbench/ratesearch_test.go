package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// capacities is a fake load test: a target sustains every rate up to its
// capacity, except the rates in flaky, which fail as many times as it
// says.
type capacities struct {
	limit map[string]float64
	flaky map[float64]int
	order []string // targets in the order they were measured
}

func (c *capacities) measure(t *overheadTarget, rate float64) overheadStep {
	c.order = append(c.order, t.Name)
	if c.flaky[rate] > 0 {
		c.flaky[rate]--
		return overheadStep{Rate: rate, Why: "p99 60ms > 50ms"}
	}
	if rate > c.limit[t.Name] {
		return overheadStep{Rate: rate, Why: fmt.Sprintf("sent %.0f/s", c.limit[t.Name])}
	}
	return overheadStep{Rate: rate, OK: true}
}

var testPlan = ratePlan{Fractions: []float64{0.6, 0.75, 0.85, 0.95, 1.05, 1.15}, StepFraction: 0.1, MaxFraction: 2, Refine: 2}

func TestSearchMaxRatesRefinesBetweenGridPoints(t *testing.T) {
	// Both have the estimate 1000, so both grids are 600, 750, ..., 1150,
	// 1250; a and b differ by 4%, between two grid points.
	a := &overheadTarget{Name: "a", Estimate: 1000}
	b := &overheadTarget{Name: "b", Estimate: 1000}
	c := &capacities{limit: map[string]float64{"a": 1110, "b": 1070}}
	searchMaxRates(context.Background(), []*overheadTarget{a, b}, testPlan, c.measure)
	// Without the bisection both would be 1050. a: 1150 fails, 1100
	// passes, 1125 fails; b: 1100 fails, 1075 fails.
	if a.MaxRate != 1100 || b.MaxRate != 1050 {
		t.Errorf("max rates a %v, b %v; want 1100 and 1050", a.MaxRate, b.MaxRate)
	}
	if !strings.HasPrefix(a.StopWhy, "1125/s: ") || !strings.HasPrefix(b.StopWhy, "1075/s: ") {
		t.Errorf("stop reasons %q, %q; want the lowest failures above the max, 1125 and 1075", a.StopWhy, b.StopWhy)
	}
}

func TestSearchMaxRatesRotatesOrder(t *testing.T) {
	ts := []*overheadTarget{{Name: "a", Estimate: 1000}, {Name: "b", Estimate: 1000}, {Name: "c", Estimate: 1000}}
	c := &capacities{limit: map[string]float64{"a": 5000, "b": 5000, "c": 5000}}
	searchMaxRates(context.Background(), ts, testPlan, c.measure)
	got := strings.Join(c.order[:9], "")
	if got != "abcbcacab" {
		t.Errorf("order of the first three fractions %q, want abcbcacab", got)
	}
	for _, tg := range ts {
		if tg.MaxRate != 1950 || tg.StopWhy != "" {
			t.Errorf("%s: max %v (%q), want 1950 with no failure: the search goes on, up to twice the estimate", tg.Name, tg.MaxRate, tg.StopWhy)
		}
	}
}

func TestSearchMaxRatesRetriesAFailedStep(t *testing.T) {
	a := &overheadTarget{Name: "a", Estimate: 1000}
	c := &capacities{limit: map[string]float64{"a": 960}, flaky: map[float64]int{850: 1}}
	searchMaxRates(context.Background(), []*overheadTarget{a}, testPlan, c.measure)
	// 850 fails once and passes on its second run; 1050 fails twice, and
	// the bisection tries 1000 and 975, which fail too.
	if a.MaxRate != 950 {
		t.Errorf("max rate %v, want 950", a.MaxRate)
	}
	if !strings.HasPrefix(a.StopWhy, "975/s: ") {
		t.Errorf("stop reason %q, want the failure at 975", a.StopWhy)
	}
}

func TestSearchMaxRatesStepsDownFromAFailedStart(t *testing.T) {
	a := &overheadTarget{Name: "a", Estimate: 1000}
	c := &capacities{limit: map[string]float64{"a": 400}}
	searchMaxRates(context.Background(), []*overheadTarget{a}, testPlan, c.measure)
	// 600 fails twice; 360 passes; the bisection tries 480 and 420, which
	// fail twice each.
	if a.MaxRate != 360 || !strings.HasPrefix(a.StopWhy, "420/s: ") {
		t.Errorf("max rate %v (%q), want 360, stopped at 420", a.MaxRate, a.StopWhy)
	}
}

// A first step spoilt twice (a neighbour's burst) costs the target the
// rates above it, but not the gap below it: the search bisects between the
// rate it stepped down to and the failed one.
func TestSearchMaxRatesRefinesAfterAFailedStart(t *testing.T) {
	a := &overheadTarget{Name: "a", Estimate: 1000}
	c := &capacities{limit: map[string]float64{"a": 2000}, flaky: map[float64]int{600: 2}}
	searchMaxRates(context.Background(), []*overheadTarget{a}, testPlan, c.measure)
	// 600 fails twice; 360 passes; 480 and 540 pass.
	if a.MaxRate != 540 || !strings.HasPrefix(a.StopWhy, "600/s: ") {
		t.Errorf("max rate %v (%q), want 540, stopped at 600", a.MaxRate, a.StopWhy)
	}
}

// When no rate is sustained, none is reported.
func TestSearchMaxRatesNothingSustained(t *testing.T) {
	a := &overheadTarget{Name: "a", Estimate: 1000}
	c := &capacities{limit: map[string]float64{"a": 100}}
	searchMaxRates(context.Background(), []*overheadTarget{a}, testPlan, c.measure)
	// 600 fails twice, 360 and 216 once each, and nothing is bisected.
	if a.MaxRate != 0 || len(a.Steps) != 4 {
		t.Errorf("max rate %v after %d steps, want 0 after 4", a.MaxRate, len(a.Steps))
	}
}

func TestSearchMaxRatesRestsAfterAFailedStep(t *testing.T) {
	plan := testPlan
	plan.Rest = 20 * time.Millisecond
	a := &overheadTarget{Name: "a", Estimate: 1000}
	b := &overheadTarget{Name: "b", Estimate: 1000}
	c := &capacities{limit: map[string]float64{"a": 900, "b": 1200}}
	var prev time.Time
	prevFailed, rests := false, 0
	searchMaxRates(context.Background(), []*overheadTarget{a, b}, plan, func(tg *overheadTarget, rate float64) overheadStep {
		now := time.Now()
		if prevFailed {
			if gap := now.Sub(prev); gap < plan.Rest {
				t.Errorf("%s at %v: started %v after a failed step, want a rest of %v first", tg.Name, rate, gap, plan.Rest)
			}
			rests++
		}
		st := c.measure(tg, rate)
		prev, prevFailed = time.Now(), !st.OK
		return st
	})
	if rests == 0 {
		t.Fatal("no step followed a failed one: the test tests nothing")
	}
}

// A bisection step that fails once and passes its second run leaves the
// failure above it as the reason the search stopped (a first version of
// the search cleared the reason on that pass).
func TestSearchMaxRatesStopReasonAfterARetriedMidpoint(t *testing.T) {
	a := &overheadTarget{Name: "a", Estimate: 1000}
	c := &capacities{limit: map[string]float64{"a": 1090}, flaky: map[float64]int{1075: 1}}
	searchMaxRates(context.Background(), []*overheadTarget{a}, testPlan, c.measure)
	// 1150 fails twice; 1100 fails twice; 1075 fails, then passes.
	if a.MaxRate != 1075 || !strings.HasPrefix(a.StopWhy, "1100/s: ") {
		t.Errorf("max rate %v (%q), want 1075, stopped at 1100", a.MaxRate, a.StopWhy)
	}
}
