package main

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"

	"github.com/tether-mcp/tether/bench/internal/svg"
	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
)

// Placement quality is an in-process, single-threaded, discrete-event
// simulation that drives balancer.Balancer directly (the real pickers and
// counters: Pick, AddSessions, Begin/End) with deterministic seeds. No
// network and no clock: the figures are the same on every machine.

type placementStatic struct {
	Sessions, Backends, Seeds int
	MeanRatio, WorstRatio     map[string]float64 // max/mean live sessions after all are placed
}

type placementDynamic struct {
	Backends, Sessions int
	MeanLive           float64
	// Time-weighted over the periods with at least one session per backend.
	MeanRatio, P99Ratio map[string]float64
	MeanGap, P99Gap     map[string]float64 // max − mean live sessions
	Bound               float64            // ln ln n / ln 2 + 1: the p2c gap bound with O(1) taken as 1
	Trace               map[string][]float64
	TraceT              []float64
}

type placementResult struct {
	Static  placementStatic
	Dynamic []placementDynamic
}

func runPlacement(full bool) *placementResult {
	seeds := 200
	if full {
		seeds = 2000
	}
	r := &placementResult{Static: staticPlacement(100, 3, seeds)}
	for _, n := range []int{3, 10} {
		r.Dynamic = append(r.Dynamic, dynamicPlacement(1000, n, 42))
	}
	return r
}

func newSimBalancer(name string, n int, rng *rand.Rand) (*balancer.Balancer, []*balancer.Endpoint) {
	pk, err := balancer.NewPicker(name, func(k int) int { return rng.IntN(k) })
	if err != nil {
		panic(err)
	}
	b := balancer.New(balancer.Options{Picker: pk})
	var snap discovery.Snapshot
	for i := range n {
		u, _ := url.Parse(fmt.Sprintf("http://backend-%02d:8080", i))
		snap.Endpoints = append(snap.Endpoints, discovery.Endpoint{ID: u.String(), URL: u, State: discovery.Ready})
	}
	b.Update(snap)
	return b, b.Endpoints()
}

// staticPlacement places m sessions one after another over n backends and
// looks at max/mean once all are placed.
func staticPlacement(m, n, seeds int) placementStatic {
	s := placementStatic{Sessions: m, Backends: n, Seeds: seeds, MeanRatio: map[string]float64{}, WorstRatio: map[string]float64{}}
	for _, name := range balancer.PickerNames {
		for seed := range seeds {
			rng := rand.New(rand.NewPCG(uint64(seed), 1))
			b, eps := newSimBalancer(name, n, rng)
			for range m {
				e, _ := b.Pick(nil)
				e.AddSessions(1)
			}
			mx := int64(0)
			for _, e := range eps {
				mx = max(mx, e.Sessions())
			}
			ratio := float64(mx) / (float64(m) / float64(n))
			s.MeanRatio[name] += ratio / float64(seeds)
			s.WorstRatio[name] = math.Max(s.WorstRatio[name], ratio)
		}
	}
	return s
}

// The dynamic workload: Poisson arrivals; lognormal lifetimes (median 20 s,
// σ 1.2: most sessions are short, a few live ten times longer); each
// session calls tools at its own Pareto-distributed rate (α 1.5, from 0.2/s:
// a few chatty sessions make most calls), and each call stays in flight for
// a lognormal time (median 50 ms, σ 1.5: some calls take seconds).
type simEvent struct {
	t    float64
	kind int // 0 arrival, 1 departure, 2 call start, 3 call end
	sess int
}

type eventQueue []simEvent

func (q eventQueue) Len() int           { return len(q) }
func (q eventQueue) Less(i, j int) bool { return q[i].t < q[j].t }
func (q eventQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)        { *q = append(*q, x.(simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

func dynamicPlacement(m, n int, seed uint64) placementDynamic {
	d := placementDynamic{Backends: n, Sessions: m, MeanRatio: map[string]float64{}, P99Ratio: map[string]float64{},
		MeanGap: map[string]float64{}, P99Gap: map[string]float64{}, Trace: map[string][]float64{},
		Bound: math.Log(math.Log(float64(n)))/math.Ln2 + 1}
	// About 100 live sessions per 3 backends at steady state (Little's law:
	// arrivals/s × mean lifetime, 20·e^(1.2²/2) ≈ 41 s).
	arrivalRate := 2.4 * float64(n) / 3
	for _, name := range balancer.PickerNames {
		wl := rand.New(rand.NewPCG(seed, 2)) // the same workload for every picker
		pr := rand.New(rand.NewPCG(seed, 1))
		b, eps := newSimBalancer(name, n, pr)
		placed := make([]*balancer.Endpoint, m)
		callRate := make([]float64, m)
		alive := make([]bool, m)
		q := &eventQueue{}
		t, warm := 0.0, 0.0
		for i := range m {
			t += wl.ExpFloat64() / arrivalRate
			heap.Push(q, simEvent{t: t, kind: 0, sess: i})
			if i == m/5 {
				warm = t
			}
		}
		// Figures are taken from the 200th arrival to the last one: the
		// steady state, not the ramp-up nor the drain of long-lived sessions.
		lastArrival := t
		type obs struct{ w, ratio, gap float64 }
		var seen []obs
		last, live, liveArea, totalW := 0.0, 0, 0.0, 0.0
		nextTrace := 0.0
		record := func(now float64) {
			from, to := math.Max(last, warm), math.Min(now, lastArrival)
			last = now
			dt := to - from
			if dt <= 0 {
				return
			}
			liveArea += dt * float64(live)
			mx := int64(0)
			for _, e := range eps {
				mx = max(mx, e.Sessions())
			}
			mean := float64(live) / float64(n)
			seen = append(seen, obs{dt, float64(mx) / mean, float64(mx) - mean})
			totalW += dt
		}
		for q.Len() > 0 {
			ev := heap.Pop(q).(simEvent)
			record(ev.t)
			for ev.t >= nextTrace && nextTrace <= lastArrival {
				mx := int64(0)
				for _, e := range eps {
					mx = max(mx, e.Sessions())
				}
				ratio := math.NaN()
				if live >= n {
					ratio = float64(mx) / (float64(live) / float64(n))
				}
				d.Trace[name] = append(d.Trace[name], ratio)
				if name == balancer.PickerNames[0] {
					d.TraceT = append(d.TraceT, nextTrace)
				}
				nextTrace += 2
			}
			s := ev.sess
			switch ev.kind {
			case 0:
				e, _ := b.Pick(nil)
				e.AddSessions(1)
				placed[s], alive[s] = e, true
				live++
				lifetime := 20 * math.Exp(1.2*wl.NormFloat64())
				callRate[s] = 0.2 / math.Pow(1-wl.Float64(), 1/1.5)
				heap.Push(q, simEvent{t: ev.t + lifetime, kind: 1, sess: s})
				heap.Push(q, simEvent{t: ev.t + wl.ExpFloat64()/callRate[s], kind: 2, sess: s})
			case 1:
				placed[s].AddSessions(-1)
				alive[s] = false
				live--
			case 2:
				if !alive[s] {
					continue
				}
				placed[s].Begin()
				heap.Push(q, simEvent{t: ev.t + 0.05*math.Exp(1.5*wl.NormFloat64()), kind: 3, sess: s})
				heap.Push(q, simEvent{t: ev.t + wl.ExpFloat64()/callRate[s], kind: 2, sess: s})
			case 3:
				placed[s].End()
			}
		}
		d.MeanLive = liveArea / (lastArrival - warm)
		for _, o := range seen {
			d.MeanRatio[name] += o.ratio * o.w / totalW
			d.MeanGap[name] += o.gap * o.w / totalW
		}
		d.P99Ratio[name] = weightedQuantile(seen, func(o obs) float64 { return o.ratio }, func(o obs) float64 { return o.w }, 0.99)
		d.P99Gap[name] = weightedQuantile(seen, func(o obs) float64 { return o.gap }, func(o obs) float64 { return o.w }, 0.99)
	}
	return d
}

func weightedQuantile[T any](xs []T, val, weight func(T) float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.SortFunc(s, func(a, b T) int {
		switch {
		case val(a) < val(b):
			return -1
		case val(a) > val(b):
			return 1
		}
		return 0
	})
	total := 0.0
	for _, x := range s {
		total += weight(x)
	}
	acc := 0.0
	for _, x := range s {
		acc += weight(x)
		if acc >= q*total {
			return val(x)
		}
	}
	return math.NaN()
}

func placementMarkdown(p *placementResult) string {
	var b strings.Builder
	s := p.Static
	fmt.Fprintf(&b, "An in-process simulation driving `balancer.Balancer` itself (the real pickers and load counters) with deterministic seeds; no network, so the figures do not depend on the machine.\n\n")
	fmt.Fprintf(&b, "**%d sessions placed over %d backends** (all live, no calls), max/mean live sessions over %d seeds:\n\n", s.Sessions, s.Backends, s.Seeds)
	b.WriteString("| picker | mean max/mean | worst max/mean |\n|---|---:|---:|\n")
	for _, n := range balancer.PickerNames {
		fmt.Fprintf(&b, "| %s | %.3f | %.3f |\n", n, s.MeanRatio[n], s.WorstRatio[n])
	}
	for _, d := range p.Dynamic {
		fmt.Fprintf(&b, "\n**%d sessions with skewed lifetimes and call costs over %d backends** (%.0f live on average; time-weighted from the 200th arrival to the last):\n\n", d.Sessions, d.Backends, d.MeanLive)
		fmt.Fprintf(&b, "| picker | mean max/mean | p99 max/mean | mean gap (max − mean) | p99 gap |\n|---|---:|---:|---:|---:|\n")
		for _, n := range balancer.PickerNames {
			fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.2f | %.2f |\n", n, d.MeanRatio[n], d.P99Ratio[n], d.MeanGap[n], d.P99Gap[n])
		}
		fmt.Fprintf(&b, "\nPower-of-two-choices bound on the gap: ln ln n / ln 2 + O(1) = %.2f + O(1) for n = %d, independent of the number of sessions (Berenbrink, Czumaj, Steger, Vöcking 2006; the chart draws it with O(1) = 1), against Θ(√(m ln n / n)) for one random choice.\n", d.Bound-1, d.Backends)
	}
	b.WriteString("\nWorkload: Poisson arrivals, lognormal lifetimes (median 20 s, σ 1.2), per-session call rates Pareto (α 1.5, from 0.2/s), call durations lognormal (median 50 ms, σ 1.5). Load = live sessions + calls in flight, as tether weighs it; the table counts sessions only.\n")
	return b.String()
}

func placementChart(p *placementResult) *svg.Figure {
	f := &svg.Figure{Title: "Placement quality (simulation driving balancer.Balancer, deterministic seeds)", Cols: 2, PanelW: 560, PanelH: 290}
	st := &svg.GroupedBars{Title: fmt.Sprintf("%d sessions over %d backends: max/mean", p.Static.Sessions, p.Static.Backends), YLabel: "max/mean", YMax: 1.5,
		Groups: balancer.PickerNames, HLines: []svg.Marker{{X: 1.05, Label: "target 1.05"}}}
	mean, worst := svg.Series{Name: "mean over seeds"}, svg.Series{Name: "worst seed"}
	for _, n := range balancer.PickerNames {
		mean.Y = append(mean.Y, p.Static.MeanRatio[n])
		worst.Y = append(worst.Y, p.Static.WorstRatio[n])
	}
	st.Series = []svg.Series{mean, worst}
	f.Add(st)
	gap := &svg.GroupedBars{Title: "1,000 skewed sessions: p99 gap (max − mean)", YLabel: "sessions", Groups: balancer.PickerNames}
	for _, d := range p.Dynamic {
		s := svg.Series{Name: fmt.Sprintf("%d backends", d.Backends)}
		for _, n := range balancer.PickerNames {
			s.Y = append(s.Y, d.P99Gap[n])
		}
		gap.Series = append(gap.Series, s)
		gap.HLines = append(gap.HLines, svg.Marker{X: d.Bound, Label: fmt.Sprintf("p2c bound n=%d (O(1)=1)", d.Backends)})
	}
	f.Add(gap)
	for _, d := range p.Dynamic {
		lc := &svg.LineChart{Title: fmt.Sprintf("max/mean live sessions over time, %d backends", d.Backends), XLabel: "simulated s", YLabel: "max/mean"}
		for _, n := range balancer.PickerNames {
			lc.Series = append(lc.Series, svg.Series{Name: n, X: d.TraceT, Y: d.Trace[n]})
		}
		lc.YMin, lc.YMax = 1, 2
		f.Add(lc)
	}
	return f
}
