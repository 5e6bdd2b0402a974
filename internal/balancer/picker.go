package balancer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
)

// Picker chooses one of cands. cands has at least one element and every
// element is eligible (ready and not ejected); the Balancer guarantees both.
//
// Pick runs on the request path of every new session and every stateless
// request, concurrently from many goroutines: it must never block, never
// allocate and take no locks. A Picker only reads load; the caller counts the
// request (Endpoint.Begin) once it has decided to use the pick.
type Picker interface {
	Pick(cands []*Endpoint) *Endpoint
}

// PickerNames lists the names NewPicker accepts, default first.
var PickerNames = []string{"p2c", "least-loaded", "round-robin", "random"}

// NewPicker returns the picker called name. rnd(n) must return a uniform
// integer in [0, n) and be safe for concurrent use; nil means math/rand/v2's
// IntN, which draws from a per-thread generator and so stays lock-free.
func NewPicker(name string, rnd func(n int) int) (Picker, error) {
	if rnd == nil {
		rnd = rand.IntN
	}
	switch name {
	case "p2c":
		return &p2c{rnd: rnd}, nil
	case "least-loaded":
		return &leastLoaded{rnd: rnd}, nil
	case "round-robin":
		return &roundRobin{}, nil
	case "random":
		return &random{rnd: rnd}, nil
	}
	return nil, fmt.Errorf("balancer: unknown picker %q (valid: %s)", name, strings.Join(PickerNames, ", "))
}

var (
	_ Picker = (*p2c)(nil)
	_ Picker = (*leastLoaded)(nil)
	_ Picker = (*roundRobin)(nil)
	_ Picker = (*random)(nil)
)

// p2c is "the power of two choices" (M. Mitzenmacher, The Power of Two
// Choices in Randomized Load Balancing, 2001): sample two distinct candidates
// uniformly and take the less loaded one. It costs two loads instead of a scan
// and, unlike least-loaded, does not send a burst of simultaneous picks to the
// same momentarily-idle endpoint (the herd effect of stale load readings),
// while keeping the maximum load within a small constant of the mean.
type p2c struct {
	rnd func(n int) int
}

func (p *p2c) Pick(cands []*Endpoint) *Endpoint {
	if len(cands) == 1 {
		return cands[0]
	}
	first, second := p.sample(cands)
	if lessLoaded(second, second.Load(), first, first.Load()) {
		return second
	}
	return first
}

// lessLoaded is p2c's order: the lower load; on a tie, the endpoint that
// has served fewer requests; on a tie of both, neither (the first sample
// wins, and it is itself uniform). The served count matters where loads
// tie most: short requests, each its own pick (stateless, MCP 2026-07-28),
// finish before the next pick, so both samples read 0 in flight and a
// uniform choice would spread 1,000 calls over 3 backends as a multinomial
// draw does (max/mean about 1.04, above 1.1 in a few percent of runs). The
// served counts keep the totals within a few requests of each other; they
// are per replica and never decay, so they only break ties and never
// outweigh a difference in load.
func lessLoaded(a *Endpoint, aLoad int64, b *Endpoint, bLoad int64) bool {
	if aLoad != bLoad {
		return aLoad < bLoad
	}
	return a.Served() < b.Served()
}

// sample draws two distinct candidates (len(cands) >= 2).
func (p *p2c) sample(cands []*Endpoint) (first, second *Endpoint) {
	i, j := p.sampleIndexes(len(cands))
	return cands[i], cands[j]
}

// sampleIndexes draws two distinct indexes in [0, n), n >= 2.
func (p *p2c) sampleIndexes(n int) (i, j int) {
	// One draw over the n*(n-1) ordered pairs of distinct indices: k names
	// the first sample i and, among the n-1 other slots, the second; skipping
	// over i makes the samples distinct without a retry loop. A single draw
	// instead of two saves about a fifth of the pick.
	k := p.rnd(n * (n - 1))
	i, j = k/(n-1), k%(n-1)
	if j >= i {
		j++
	}
	return i, j
}

// pickExplained is Pick reporting the two samples it compared.
func (p *p2c) pickExplained(cands []*Endpoint, weighed []Candidate) (*Endpoint, []Candidate) {
	if len(cands) == 1 {
		return cands[0], append(weighed, Candidate{cands[0], cands[0].Load()})
	}
	first, second := p.sample(cands)
	fl, sl := first.Load(), second.Load()
	weighed = append(weighed, Candidate{first, fl}, Candidate{second, sl})
	if lessLoaded(second, sl, first, fl) {
		return second, weighed
	}
	return first, weighed
}

// pickExplained is Pick reporting every candidate it scanned.
func (l *leastLoaded) pickExplained(cands []*Endpoint, weighed []Candidate) (*Endpoint, []Candidate) {
	for _, e := range cands {
		weighed = append(weighed, Candidate{e, e.Load()})
	}
	return l.Pick(cands), weighed
}

// Candidate is an endpoint a picker weighed, with the load it saw: its
// Load, or for a placement (Balancer.Place) the sessions it holds or is
// about to hold.
type Candidate struct {
	Endpoint *Endpoint
	Load     int64
}

// explainer is a picker that can say which candidates it weighed, for
// traces. Pickers that weigh nothing (round-robin, random) report only
// their choice.
type explainer interface {
	pickExplained(cands []*Endpoint, weighed []Candidate) (*Endpoint, []Candidate)
}

// leastLoaded scans every candidate and takes the lowest load. Ties are broken
// uniformly at random by reservoir sampling (keep the k-th tied candidate with
// probability 1/k), which needs no scratch slice and so no allocation.
// Without the random tie break, equal loads would always go to the first
// endpoint in ID order.
type leastLoaded struct {
	rnd func(n int) int
}

func (l *leastLoaded) Pick(cands []*Endpoint) *Endpoint {
	best := cands[0]
	bestLoad := best.Load()
	ties := 1
	for _, e := range cands[1:] {
		load := e.Load()
		switch {
		case load < bestLoad:
			best, bestLoad, ties = e, load, 1
		case load == bestLoad:
			ties++
			if l.rnd(ties) == 0 {
				best = e
			}
		}
	}
	return best
}

// roundRobin hands out candidates in turn from a shared atomic counter. It
// ignores load; it is there for backends known to be uniform and for
// comparisons. The counter is shared across candidate sets, so when the set
// changes the rotation continues from wherever the counter is.
type roundRobin struct {
	next atomic.Uint64
}

func (r *roundRobin) Pick(cands []*Endpoint) *Endpoint {
	i := r.next.Add(1) - 1
	return cands[i%uint64(len(cands))]
}

// random picks uniformly, ignoring load.
type random struct {
	rnd func(n int) int
}

func (r *random) Pick(cands []*Endpoint) *Endpoint {
	return cands[r.rnd(len(cands))]
}

// listenPlacer places subscriptions/listen streams (Balancer.PickListen).
var listenPlacer = p2c{rnd: rand.IntN}

// PickListen returns the endpoint for a new subscriptions/listen stream,
// never exclude, or ErrNoEndpoints: two choices, as p2c, between
// endpoints weighed by their load plus one per open listen stream, ties
// to the one that served fewer requests. The stream is held for minutes
// and its cost accumulates where it lands, so its placement counts the
// streams in full, as a new session's placement counts sessions, whatever
// weight (Options.ListenStreamWeight) they have in the load of short
// requests. Without it, streams would be placed by requests in flight
// alone, and a few clients could stack theirs on one endpoint. It does
// not count the stream: call BeginListen on the result.
func (b *Balancer) PickListen(exclude *Endpoint) (*Endpoint, error) {
	cands := b.current.Load().candidates(exclude)
	switch len(cands) {
	case 0:
		return nil, ErrNoEndpoints
	case 1:
		return cands[0], nil
	}
	first, second := listenPlacer.sample(cands)
	if lessLoaded(second, second.Load()+second.ListenStreams(), first, first.Load()+first.ListenStreams()) {
		return second, nil
	}
	return first, nil
}
