package balancer

import (
	"context"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/internal/discovery"
)

// Endpoint is the balancer's long-lived view of one discovery endpoint.
//
// A Balancer keeps the same *Endpoint for an ID across Update calls, so the
// load counters survive endpoint-set rebuilds and callers may hold the pointer
// for the length of a request or a session. ID, URL and Pod never change
// after creation; everything else is safe for concurrent use. A zero Endpoint with
// ID and URL set is usable on its own (Ready, no load), which is handy for
// tests of code that takes an *Endpoint.
type Endpoint struct {
	// ID is the discovery identity (pod UID plus address, or the static URL).
	ID string
	// URL is the base URL requests are forwarded to. Callers must not modify it.
	URL *url.URL
	// Pod is "namespace/name" of the endpoint's pod (discovery.Endpoint.Pod),
	// "" when unknown. The ID holds the pod's UID, so it never changes.
	Pod string

	urlString string // URL.String(), computed once: String is used in logs and labels

	state    atomic.Uint32 // a discovery.State; rewritten by Update when the ID stays
	inflight atomic.Int64
	sessions atomic.Int64
	served   atomic.Uint64 // requests begun on the endpoint, ever: p2c's tie break
	listens  atomic.Int64  // open subscriptions/listen streams (BeginListen minus EndListen)
	// placing counts the placements in flight on the endpoint: sessions
	// Place chose it for whose arrival the session count does not show
	// yet (Placement.Release ends one).
	placing atomic.Int64
	// lost counts the sessions that the session count still holds on the
	// endpoint although the endpoint has provably lost them, while their
	// moves are in flight (Place's lostBy; Placement.Release ends one).
	lost atomic.Int64
	// listenWeight is what one listen stream adds to Load, in thousandths
	// (Options.ListenStreamWeight); fixed when the Endpoint is made.
	listenWeight int64
	// departed is cancelled when the endpoint stops taking new work (it
	// left the set, stopped being Ready, or was ejected), and then replaced
	// by a fresh one for the streams of a later readmission. A context,
	// not a channel: a parked stream waits on it with context.AfterFunc,
	// which takes no goroutine. Written with Balancer.mu held; nil for an
	// Endpoint built by hand (never departs).
	departed atomic.Pointer[departure]
	ejected  atomic.Bool // written with Balancer.mu held, read anywhere

	// Passive health bookkeeping, guarded by Balancer.mu.
	ejections    int       // consecutive ejections since the last readmission
	ejectedUntil time.Time // when the backoff ends and the endpoint may be probed
	probing      bool      // a probe is running; keeps overlapping probe rounds apart
}

func newEndpoint(de discovery.Endpoint, listenWeight int64) *Endpoint {
	e := &Endpoint{ID: de.ID, URL: de.URL, Pod: de.Pod, listenWeight: listenWeight}
	e.departed.Store(newDeparture())
	if de.URL != nil {
		e.urlString = de.URL.String()
	} else {
		e.urlString = de.ID
	}
	e.state.Store(uint32(de.State))
	return e
}

// State is the endpoint's state in the latest snapshot that contained it.
func (e *Endpoint) State() discovery.State { return discovery.State(e.state.Load()) }

// Inflight is the number of requests currently being forwarded to the
// endpoint (Begin minus End).
func (e *Endpoint) Inflight() int64 { return e.inflight.Load() }

// Sessions is the number of live MCP sessions on the endpoint, as the
// routing layer keeps it: with a store that counts sessions fleet-wide
// (Redis) it is re-set to the fleet's count every second plus what this
// replica did since; otherwise it is this replica's own count. It lags
// other replicas' changes, so treat it as a load signal, not an inventory.
func (e *Endpoint) Sessions() int64 { return e.sessions.Load() }

// Load is the score the load-aware pickers minimise: sessions + inflight,
// weighted 1:1, where the sessions are those the endpoint holds or is
// about to hold: the live-session count, plus the placements in flight
// on it, minus the sessions it has provably lost whose moves are in flight
// (Place).
//
// The two terms measure different horizons in the same unit. A session is
// committed future work (its later requests and usually a long-lived GET
// stream must come back to this endpoint), so it is what placement of a new
// session should balance; in-flight requests are the work happening now, the
// only signal for stateless traffic and the one that reacts first when an
// endpoint slows down (its requests pile up). With 1:1 the session count
// dominates at steady state, where sessions outnumber concurrent requests,
// and in-flight requests break ties and steer away from a stalled endpoint.
// Any other ratio would be a tuning constant without a measurement behind it,
// and integer addition keeps the comparison exact and cheap.
//
// The two corrections are Place's (place.go): a session placed and not
// yet recorded by the session store counts on its endpoint from the pick
// on, and a session its endpoint provably lost stops counting there while
// its move is placed. Without them, the placements of a burst (every
// session of a killed or restarted pod, moved at once) read the same
// counts and herd. Place itself balances these sessions alone, with
// in-flight requests only as a tie break: see there why.
//
// Open subscriptions/listen streams add their count times the listen
// weight (Options.ListenStreamWeight, default 0), rounded down: a stream
// is an idle channel, not work in flight, and with any weight above zero
// an endpoint holding more streams loses every tie of the short requests
// that p2c settles by served count, which skews their spread (docs/routing.md,
// "Listen streams").
func (e *Endpoint) Load() int64 {
	load := e.placeLoad() + e.inflight.Load()
	if e.listenWeight != 0 {
		load += e.listens.Load() * e.listenWeight / 1000
	}
	return load
}

// placeLoad is the part of Load that placements balance (Place): the
// sessions the endpoint holds or is about to hold.
func (e *Endpoint) placeLoad() int64 {
	// The loss marks are of sessions the count holds; a re-base on the
	// fleet count (proxy.RunLoadSync) may have dropped them first, when
	// another replica moved them.
	held := max(e.sessions.Load()-e.lost.Load(), 0)
	return held + e.placing.Load()
}

// BeginListen records that a subscriptions/listen stream was opened on the
// endpoint: a stream, not a request in flight (see Load). It counts as
// served, so placements of streams among equally loaded endpoints follow
// p2c's tie break too. Pair it with exactly one EndListen.
func (e *Endpoint) BeginListen() {
	e.listens.Add(1)
	e.served.Add(1)
}

// EndListen records that a stream begun with BeginListen has ended.
func (e *Endpoint) EndListen() { e.listens.Add(-1) }

// ListenStreams is the number of subscriptions/listen streams open on the
// endpoint through this replica.
func (e *Endpoint) ListenStreams() int64 { return e.listens.Load() }

// departure is what Departure returns, with its cancel.
type departure struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newDeparture() *departure {
	ctx, cancel := context.WithCancel(context.Background())
	return &departure{ctx: ctx, cancel: cancel}
}

// Departure returns a context cancelled when the endpoint stops taking new
// work: it leaves the endpoint set, stops being Ready, or is ejected. A
// long-lived stream on the endpoint takes it when it opens and ends when it
// is cancelled, so that its client re-opens it on a live endpoint. Taking it
// is one atomic load. An Endpoint built by hand returns nil: it never
// departs.
func (e *Endpoint) Departure() context.Context {
	if d := e.departed.Load(); d != nil {
		return d.ctx
	}
	return nil
}

// Departed is Departure's Done channel (nil, which never fires, for an
// Endpoint built by hand).
func (e *Endpoint) Departed() <-chan struct{} {
	if d := e.departed.Load(); d != nil {
		return d.ctx.Done()
	}
	return nil
}

// departLocked cancels the current departure and installs a fresh one.
// Balancer.mu must be held.
func (e *Endpoint) departLocked() {
	d := e.departed.Load()
	if d == nil {
		return
	}
	e.departed.Store(newDeparture())
	d.cancel()
}

// Begin records that a request is being forwarded to the endpoint. Pair every
// Begin with exactly one End, typically `e.Begin(); defer e.End()`.
func (e *Endpoint) Begin() {
	e.inflight.Add(1)
	e.served.Add(1)
}

// Served is the number of requests ever begun on the endpoint (by this
// replica): p2c breaks load ties with it.
func (e *Endpoint) Served() uint64 { return e.served.Load() }

// End records that a request begun with Begin has finished.
func (e *Endpoint) End() { e.inflight.Add(-1) }

// Placing is the number of placements in flight on the endpoint (Place):
// sessions it was chosen for that its session count does not show yet.
func (e *Endpoint) Placing() int64 { return e.placing.Load() }

// LostInFlight is the number of sessions the endpoint has provably lost
// whose moves are in flight (Place's lostBy): its session count still
// holds them, its Load does not.
func (e *Endpoint) LostInFlight() int64 { return e.lost.Load() }

// AddSessions adjusts the live session count: +1 when a session is created on
// the endpoint, -1 when it is deleted, expires or moves elsewhere. In tether
// the session store's changes drive it (proxy.CountSessions), re-based on
// the fleet-wide count with a shared store (proxy.Proxy.RunLoadSync).
func (e *Endpoint) AddSessions(n int64) { e.sessions.Add(n) }

// Ejected reports whether passive health checking currently keeps the
// endpoint out of picks (a dial to it failed and a probe has not yet
// succeeded).
func (e *Endpoint) Ejected() bool { return e.ejected.Load() }

// String returns the endpoint's base URL.
func (e *Endpoint) String() string {
	if e.urlString == "" && e.URL != nil {
		return e.URL.String() // an Endpoint built by hand rather than by Update
	}
	return e.urlString
}
