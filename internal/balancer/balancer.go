// Package balancer keeps the load and health state of the endpoints that
// discovery publishes and picks one for each new session or stateless
// request. It knows nothing of MCP or of session stores: the routing layer
// asks for a pick, counts its requests and sessions on the returned Endpoint,
// and reports dial failures back with Eject.
//
// The pick path is lock-free. Every change of the endpoint set or of an
// endpoint's eligibility builds a new immutable generation and publishes it
// through an atomic pointer; Pick, PickByKey and Lookup only load that
// pointer. Load counters live on the long-lived *Endpoint values, which the
// generations share, so rebuilding a generation never resets them.
//
// Besides the load pickers, PickByKey routes a key (a handle) by consistent
// hashing with bounded loads (keyring.go).
package balancer

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/internal/discovery"
)

// ErrNoEndpoints means no endpoint can take the request: none is ready, all
// ready ones are ejected, or the only one left was excluded. Callers answer
// 503.
var ErrNoEndpoints = errors.New("balancer: no endpoint available")

// Defaults for the zero values of Options (documented there).
const (
	defaultEjectBase     = time.Second
	defaultEjectMax      = 30 * time.Second
	defaultProbeInterval = 250 * time.Millisecond
)

// Options configures a Balancer. Zero values mean the documented defaults.
type Options struct {
	// Picker chooses among eligible endpoints. Required.
	Picker Picker
	// Now is the clock for ejection backoff; nil means time.Now.
	Now func() time.Time
	// EjectBase is the first ejection's backoff (default 1s). Each further
	// consecutive ejection doubles it, up to EjectMax (default 30s).
	EjectBase time.Duration
	EjectMax  time.Duration
	// Probe checks whether an ejected endpoint may be readmitted; a nil error
	// readmits it. Its context ends after probeTimeout (1s) at the latest, so
	// one hung probe cannot stall readmission. nil means a TCP dial of the
	// URL's host and port (80 or 443 by scheme when the URL has none): the
	// same thing whose failure ejected the endpoint.
	Probe func(ctx context.Context, e *Endpoint) error
	// ProbeInterval is how often Run looks for ejected endpoints whose
	// backoff has expired (default 250ms).
	ProbeInterval time.Duration
	// Logger receives one info line per ejection and per readmission; nil
	// discards.
	Logger *slog.Logger
	// OnUpdate, when set, is called by every Update once the new set is
	// published, with that set sorted by ID (the slice is the callee's).
	// It is how per-endpoint state kept elsewhere (metric series) learns
	// that endpoints left. Calls are made under the writers' lock, so they
	// arrive in the order of the updates; it must be quick and must not
	// call Update or Eject.
	OnUpdate func(endpoints []*Endpoint)
	// Affinity, when set, makes every generation also build the ring that
	// PickByKey walks (VirtualNodes points per eligible endpoint); nil
	// builds none, and PickByKey fails with ErrNoAffinity. New panics on an
	// Epsilon that CheckAffinityEpsilon rejects.
	Affinity *AffinityOptions
	// ListenStreamWeight is what one open subscriptions/listen stream adds
	// to an endpoint's load (Endpoint.Load), with three decimals; 0, the
	// default, places streams by load without letting them weigh on it.
	ListenStreamWeight float64
}

// Balancer holds the current endpoint set and picks from it.
//
// Locking: mu serializes the writers (Update, Eject, the probe loop's
// bookkeeping) and guards the Endpoint fields documented as such. Readers
// (Pick, Lookup, Endpoints) never take it; they load current. Functions whose
// name ends in Locked require mu to be held.
type Balancer struct {
	picker        Picker
	now           func() time.Time
	ejectBase     time.Duration
	ejectMax      time.Duration
	probe         func(ctx context.Context, e *Endpoint) error
	probeInterval time.Duration
	logger        *slog.Logger
	onUpdate      func([]*Endpoint)
	// capFactor is 1+ε in units of 1/capScale (see PickByKey); 0 when
	// Options.Affinity is nil, and then no generation has a ring.
	capFactor int64
	capFloor  int64 // the least capacity, ceil(1/ε)
	// listenWeight is Options.ListenStreamWeight in thousandths.
	listenWeight int64

	current atomic.Pointer[generation] // never nil
	ready   atomic.Bool                // set by the first Update
	// ejections wakes Run, resting while no endpoint is ejected (capacity
	// 1: one wake-up stands for any number of ejections).
	ejections chan struct{}
	// placements counts the reservations Place made: a placement that
	// sees it move while it picks picks again (place.go).
	placements atomic.Uint64

	mu sync.Mutex
}

// generation is one immutable view of the endpoint set. Nothing in it is
// modified after publish; the Endpoint values it points to carry their own
// atomics.
type generation struct {
	all  []*Endpoint          // the whole set, sorted by ID
	byID map[string]*Endpoint // the whole set, for Lookup

	// eligible holds the endpoints that accept new sessions (Ready and not
	// ejected), sorted by ID. It is ring[:n]; ring is eligible written twice
	// so that "every eligible endpoint but the one at index i" is the
	// contiguous window ring[i+1 : i+n], which Pick hands to the picker
	// without building a new slice.
	eligible      []*Endpoint
	ring          []*Endpoint
	eligibleIndex map[*Endpoint]int // position in eligible, for exclusion

	// keys is the consistent-hash ring over eligible for PickByKey, nil
	// without Options.Affinity. Built here, with the rest of the
	// generation, so the ring changes only when the eligible set does.
	keys *keyRing
}

// New returns a Balancer with no endpoints: Pick fails with ErrNoEndpoints and
// Ready is false until the first Update. It panics if opts.Picker is nil,
// which is a wiring mistake rather than a runtime condition.
func New(opts Options) *Balancer {
	if opts.Picker == nil {
		panic("balancer: Options.Picker is required")
	}
	b := &Balancer{
		picker:        opts.Picker,
		now:           opts.Now,
		ejectBase:     opts.EjectBase,
		ejectMax:      opts.EjectMax,
		probe:         opts.Probe,
		probeInterval: opts.ProbeInterval,
		logger:        opts.Logger,
		onUpdate:      opts.OnUpdate,
		listenWeight:  int64(math.Round(max(opts.ListenStreamWeight, 0) * 1000)),
		ejections:     make(chan struct{}, 1),
	}
	if b.now == nil {
		b.now = time.Now
	}
	if b.ejectBase <= 0 {
		b.ejectBase = defaultEjectBase
	}
	if b.ejectMax <= 0 {
		b.ejectMax = defaultEjectMax
	}
	b.ejectMax = max(b.ejectMax, b.ejectBase)
	if b.probe == nil {
		b.probe = dialProbe
	}
	if b.probeInterval <= 0 {
		b.probeInterval = defaultProbeInterval
	}
	if b.logger == nil {
		b.logger = slog.New(slog.DiscardHandler)
	}
	if a := opts.Affinity; a != nil {
		eps := cmp.Or(a.Epsilon, DefaultAffinityEpsilon)
		if err := CheckAffinityEpsilon(eps); err != nil {
			panic("balancer: " + err.Error())
		}
		b.capFactor = capacityFactor(eps)
		b.capFloor = capacityFloor(eps)
	}
	b.current.Store(b.newGeneration(nil))
	return b
}

// Update replaces the endpoint set with s. An endpoint whose ID was already
// present keeps its *Endpoint, and so its counters and ejection state; only
// its State is refreshed. An ID whose URL changed gets a fresh Endpoint, since
// the counters described a different target. Endpoints absent from s are
// dropped: Lookup no longer finds them, and callers still holding one may
// finish their requests on it (End still works).
func (b *Balancer) Update(s discovery.Snapshot) {
	b.mu.Lock()
	defer b.mu.Unlock()

	old := b.current.Load()
	all := make([]*Endpoint, 0, len(s.Endpoints))
	byID := make(map[string]*Endpoint, len(s.Endpoints))
	for _, de := range s.Endpoints {
		if _, dup := byID[de.ID]; dup {
			continue // IDs are unique by contract; keep the first if a source slips
		}
		e, ok := old.byID[de.ID]
		if ok && e.urlString == urlString(de) {
			e.state.Store(uint32(de.State))
		} else {
			e = newEndpoint(de, b.listenWeight)
		}
		if de.State != discovery.Ready {
			e.departLocked() // terminating or fenced: its streams move on
		}
		all = append(all, e)
		byID[e.ID] = e
	}
	slices.SortFunc(all, func(x, y *Endpoint) int { return strings.Compare(x.ID, y.ID) })
	for _, e := range old.all {
		if byID[e.ID] != e {
			e.departLocked() // gone, or replaced by an Endpoint for a new URL
		}
	}
	b.publishLocked(all)
	b.ready.Store(true)
	if b.onUpdate != nil {
		b.onUpdate(slices.Clone(all))
	}
}

func urlString(de discovery.Endpoint) string {
	if de.URL == nil {
		return de.ID
	}
	return de.URL.String()
}

// publishLocked builds a generation from all (sorted by ID), reading each
// endpoint's current state and ejection, and makes it the one picks see.
func (b *Balancer) publishLocked(all []*Endpoint) {
	b.current.Store(b.newGeneration(all))
}

// candidates is the eligible set without exclude: when exclude is
// eligible at position i, the ring's window after it holds every other
// eligible endpoint, contiguously, so no slice is built.
func (g *generation) candidates(exclude *Endpoint) []*Endpoint {
	if exclude != nil {
		if i, ok := g.eligibleIndex[exclude]; ok {
			return g.ring[i+1 : i+len(g.eligible)]
		}
	}
	return g.eligible
}

func (b *Balancer) newGeneration(all []*Endpoint) *generation {
	g := &generation{
		all:  all,
		byID: make(map[string]*Endpoint, len(all)),
	}
	for _, e := range all {
		g.byID[e.ID] = e
		if e.State() == discovery.Ready && !e.Ejected() {
			g.ring = append(g.ring, e)
		}
	}
	n := len(g.ring)
	g.ring = append(g.ring, g.ring...)
	g.eligible = g.ring[:n:n]
	g.eligibleIndex = make(map[*Endpoint]int, n)
	for i, e := range g.eligible {
		g.eligibleIndex[e] = i
	}
	if b.capFactor != 0 {
		g.keys = newKeyRing(g.eligible)
	}
	return g
}

// Pick returns an endpoint that accepts new sessions (State Ready and not
// ejected), never exclude, or ErrNoEndpoints when there is none. It does not
// count the request: call Begin on the result when using it.
//
// Exclusion keeps the configured picker's policy: when exclude is eligible
// the picker chooses among the other eligible endpoints (a window of the
// precomputed ring, so no allocation), rather than picking among all and
// patching the result. An exclude that is not eligible, not in the set, or a
// stale *Endpoint of a replaced generation changes nothing, since the picker
// could not return it anyway.
func (b *Balancer) Pick(exclude *Endpoint) (*Endpoint, error) {
	cands := b.current.Load().candidates(exclude)
	if len(cands) == 0 {
		return nil, ErrNoEndpoints
	}
	return b.picker.Pick(cands), nil
}

// PickExplained is Pick that also appends to weighed the candidates the
// picker compared, with the loads it saw. It is slower than Pick; the
// routing layer uses it where the choice is explained later: placements of
// new sessions, re-initializations, and traced requests.
func (b *Balancer) PickExplained(exclude *Endpoint, weighed []Candidate) (*Endpoint, []Candidate, error) {
	cands := b.current.Load().candidates(exclude)
	if len(cands) == 0 {
		return nil, weighed, ErrNoEndpoints
	}
	if ex, ok := b.picker.(explainer); ok {
		e, weighed := ex.pickExplained(cands, weighed)
		return e, weighed, nil
	}
	e := b.picker.Pick(cands)
	return e, append(weighed, Candidate{e, e.Load()}), nil
}

// Lookup finds the endpoint with the given ID in the current set, whatever
// its state or ejection: a Fenced or ejected endpoint still owns its sessions
// and the routing layer decides what to do with them.
func (b *Balancer) Lookup(id string) (*Endpoint, bool) {
	e, ok := b.current.Load().byID[id]
	return e, ok
}

// Endpoints returns the current set sorted by ID, for status pages and
// metrics. The slice is the caller's.
func (b *Balancer) Endpoints() []*Endpoint {
	return slices.Clone(b.current.Load().all)
}

// Ready reports whether the first Update has happened, that is, whether the
// balancer's view reflects discovery at all. An empty set after an Update is
// ready (and every Pick fails).
func (b *Balancer) Ready() bool { return b.ready.Load() }

// inSetLocked reports whether e is the endpoint the current set holds for its
// ID (not a dropped or replaced one).
func (b *Balancer) inSetLocked(e *Endpoint) bool {
	cur, ok := b.current.Load().byID[e.ID]
	return ok && cur == e
}
