package proxy

import (
	"context"
	"hash/maphash"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/session"
)

// Drain: moving a backend's sessions ahead of its exit
// (docs/design.md#drain).
//
// A terminating pod (EndpointSlice serving+terminating: discovery.Fenced)
// still serves, but it will exit. Left alone, each of its sessions moves
// when a request finds the pod gone, paid by that request, and requests in
// flight at the exit are lost. A drain moves each session earlier, at its
// first quiet moment (no request of it in flight through this replica), by
// the same re-initialization as on failure (moveSession: one flight per
// session here, the store's compare-and-swap across replicas), at a bounded
// rate per backend so that the survivors are not stormed. Requests already
// in flight finish on the old pod; a request that arrives while its session
// is being moved waits for the move and goes to the new backend. The
// session's GET streams through this replica end at an event boundary once
// it has moved, so that their clients reconnect through tether, to the new
// backend. Task records stay with their pod (a task cannot move).
//
// The replayed initialize needs the session's credentials, which tether
// never stores: a session bound to credentials (Record.Principal) moves
// once this replica has seen them, on one of its requests or its open GET
// stream, checked against the session's principal. A session without
// credentials moves from its record alone (Record.Host and Path say where
// its MCP endpoint is).

// DrainMode says what happens to a terminating endpoint's sessions.
type DrainMode uint8

const (
	// DrainProactive moves them ahead of the pod's exit (the default).
	DrainProactive DrainMode = iota
	// DrainOnFailure keeps them on the pod until it is gone; each moves when
	// a request of it finds the pod gone (tether before drains).
	DrainOnFailure
)

// DrainModes are the names ParseDrainMode accepts, default first.
var DrainModes = []string{"proactive", "on-failure"}

// ParseDrainMode parses --drain.
func ParseDrainMode(s string) (DrainMode, bool) {
	switch s {
	case "proactive":
		return DrainProactive, true
	case "on-failure":
		return DrainOnFailure, true
	}
	return 0, false
}

// DefaultDrainRate is how many sessions per second a drain moves off one
// backend. A move is an initialize and a notification on the new backend:
// at 100/s a pod with 1,500 sessions empties within a default
// terminationGracePeriodSeconds (30 s), and the survivors see 100
// initializes a second between them (bench/README.md, "Rolling update").
const DefaultDrainRate = 100

// reasonDrain is the re-initialization reason of a drain's moves.
const reasonDrain = "drain"

// Drain reasons, as status and explain show them.
const (
	drainTerminating = "terminating" // the EndpointSlice says so
	drainOperator    = "operator"    // tether drain, POST /drain
)

const (
	// drainBatch is how many of a backend's sessions one pass lists; the
	// next pass lists the rest.
	drainBatch = 1000
	// drainRelist is how often a drain lists its backend's sessions again
	// when nothing woke it: sessions that were busy or waited for their
	// credentials, and other replicas' moves.
	drainRelist = time.Second
	// drainGateAfter is how long a drain lets a session stay busy before
	// it holds the session's new requests back (activity.gate), and
	// drainGateWait the most one of them may wait there.
	drainGateAfter = 500 * time.Millisecond
	drainGateWait  = time.Second
	// drainPassGap is the least time between two passes: the ends of
	// requests wake the drain many times a second.
	drainPassGap = 50 * time.Millisecond
)

// drainRun is the drain of one backend.
type drainRun struct {
	ep     *balancer.Endpoint
	reason string
	since  time.Time
	moved  atomic.Int64
	// emptied is when a pass first found no session left (Unix ns), 0
	// before.
	emptied atomic.Int64
	wake    chan struct{} // capacity 1: a session of the backend turned quiet
	// waiting is how many sessions the last pass left (the drain's
	// goroutine's own).
	waiting int
	cancel  context.CancelFunc
	done    chan struct{}
}

// DrainState is one drain as `tether status` and /debug/endpoints show it.
type DrainState struct {
	Reason string    `json:"reason"` // terminating or operator
	Since  time.Time `json:"since"`
	// Moved counts the sessions this replica moved off the backend.
	Moved int64 `json:"moved"`
	// EmptiedAfter is how long the backend took to hold no session, once
	// it did; 0 before.
	EmptiedAfter time.Duration `json:"emptied_after,omitempty"`
}

// drains holds the running drains, by endpoint ID.
type drains struct {
	mu   sync.Mutex
	runs map[string]*drainRun
	// changed wakes RunDrains (capacity 1): the endpoint set changed.
	changed chan struct{}
}

// EndpointsChanged tells the drains that the endpoint set changed (the
// balancer's OnUpdate): an endpoint may have turned terminating, or left.
func (p *Proxy) EndpointsChanged() {
	select {
	case p.drains.changed <- struct{}{}:
	default:
	}
}

// Drain reports the drain of the endpoint with this ID, if one runs.
func (p *Proxy) Drain(id string) (DrainState, bool) {
	p.drains.mu.Lock()
	run := p.drains.runs[id]
	p.drains.mu.Unlock()
	if run == nil {
		return DrainState{}, false
	}
	st := DrainState{Reason: run.reason, Since: run.since, Moved: run.moved.Load()}
	if at := run.emptied.Load(); at != 0 {
		st.EmptiedAfter = time.Unix(0, at).Sub(run.since)
	}
	return st, true
}

// RunDrains starts a drain for every endpoint that should be drained and
// stops those whose endpoint left or came back, until ctx ends.
//
// Every change of the endpoint set (a pod terminating, an operator's
// drain) wakes it (EndpointsChanged); the drainRelist tick is a second
// look while some drain runs, and with none it does not tick: an idle
// sidecar has no timer firing for the drains.
func (p *Proxy) RunDrains(ctx context.Context) {
	t := time.NewTimer(drainRelist)
	defer t.Stop()
	for {
		var tick <-chan time.Time
		if p.syncDrains(ctx) {
			t.Reset(drainRelist)
			tick = t.C
		} else {
			t.Stop()
		}
		select {
		case <-ctx.Done():
			p.syncDrains(ctx) // stops them all
			return
		case <-p.drains.changed:
		case <-tick:
		}
	}
}

// draining reports whether ep's sessions are to be moved, and why.
func (p *Proxy) draining(ep *balancer.Endpoint) (reason string, ok bool) {
	if ep.State() != discovery.Fenced {
		return "", false
	}
	if p.operatorDrained != nil && p.operatorDrained(ep.ID) {
		return drainOperator, true
	}
	if p.drainMode == DrainProactive {
		return drainTerminating, true
	}
	return "", false
}

// syncDrains starts and stops drains as draining says, and reports
// whether some drain runs.
func (p *Proxy) syncDrains(ctx context.Context) bool {
	want := map[string]*balancer.Endpoint{}
	reasons := map[string]string{}
	if ctx.Err() == nil {
		for _, ep := range p.bal.Endpoints() {
			if reason, ok := p.draining(ep); ok {
				want[ep.ID], reasons[ep.ID] = ep, reason
			}
		}
	}
	d := &p.drains
	d.mu.Lock()
	var stopped []*drainRun
	for id, run := range d.runs {
		if want[id] != run.ep {
			stopped = append(stopped, run)
			delete(d.runs, id)
		}
	}
	for id, ep := range want {
		if d.runs[id] != nil {
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		run := &drainRun{ep: ep, reason: reasons[id], since: p.now(), wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
		d.runs[id] = run
		p.log.Info("draining backend: its sessions move to others", "backend", ep.String(), "reason", run.reason,
			"sessions", ep.Sessions(), "rate", p.drainRate)
		go func() {
			defer close(run.done)
			p.drain(rctx, run)
		}()
	}
	running := len(d.runs) > 0
	d.mu.Unlock()
	for _, run := range stopped {
		run.cancel()
		<-run.done
		p.active.dropReplays(run.ep)
		p.log.Info("drain ended", "backend", run.ep.String(), "moved", run.moved.Load())
	}
	return running
}

// drain moves run.ep's sessions until ctx ends (the endpoint left, or is
// no longer to be drained).
func (p *Proxy) drain(ctx context.Context, run *drainRun) {
	lim := rate.NewLimiter(rate.Limit(p.drainRate), 1)
	// Passes are jittered, so that a client calling once a second in
	// phase with them is not found busy by every one.
	t := time.NewTimer(drainRelist)
	defer t.Stop()
	for {
		left, ok := p.drainPass(ctx, run, lim)
		if ok && left == 0 && run.emptied.Load() == 0 {
			now := p.now()
			run.emptied.Store(now.UnixNano())
			p.metrics.DrainEmptied(now.Sub(run.since))
			p.log.Info("backend drained: no session left on it", "backend", run.ep.String(),
				"moved", run.moved.Load(), "after", now.Sub(run.since).String())
		}
		t.Reset(drainRelist/2 + rand.N(drainRelist))
		select {
		case <-ctx.Done():
			return
		case <-run.wake:
			gap := time.NewTimer(drainPassGap)
			select {
			case <-ctx.Done():
				gap.Stop()
				return
			case <-gap.C:
			}
		case <-t.C:
		}
	}
}

// drainPass lists the backend's sessions and moves those that may move
// now. It returns how many are left on the backend, and false when it
// could not list them.
func (p *Proxy) drainPass(ctx context.Context, run *drainRun, lim *rate.Limiter) (left int, ok bool) {
	// Streams of sessions another replica moved end here too.
	p.active.endStreamsMovedOff(ctx, p.store, run.ep)
	lister, ok := p.store.(session.BackendLister)
	if !ok {
		return 0, false
	}
	// The sessions that could not move in the last pass (busy, or waiting
	// for their credentials) come back first in Redis's order: the batch
	// grows by them, so that they never hide the rest.
	limit := min(session.MaxSessionsOn, drainBatch+run.waiting)
	sids, err := lister.SessionsOn(ctx, run.ep.ID, limit)
	if err != nil {
		p.log.Debug("drain: cannot list the backend's sessions", "backend", run.ep.String(), "err", err)
		return 0, false
	}
	// Replicas go through the list in different orders, so that two of
	// them seldom replay one session's initialize at once (the loser of
	// the swap ends its copy).
	rand.Shuffle(len(sids), func(i, j int) { sids[i], sids[j] = sids[j], sids[i] })
	for _, sid := range sids {
		if ctx.Err() != nil {
			return left, false
		}
		rec, err := p.store.Get(ctx, sid)
		if err != nil || rec.BackendID != run.ep.ID {
			continue // gone, or moved already
		}
		left++
		rc, ok := p.drainReplay(rec, run.ep)
		if !ok {
			continue // waits for a request that shows its credentials
		}
		if p.active.busy(sid, run.ep) {
			continue // its last request wakes the drain: no rate token spent on it
		}
		if err := lim.Wait(ctx); err != nil {
			return left, false
		}
		if p.moveQuiet(ctx, rec, rc, run) {
			left--
		}
	}
	run.waiting = left
	return left, true
}

// drainReplay is what a drain replays a session's initialize with: the
// credentials and endpoint of a request of it seen while its backend
// drains, or, for a session bound to no credentials, its record's.
func (p *Proxy) drainReplay(rec *session.Record, ep *balancer.Endpoint) (replayContext, bool) {
	if rc := p.active.replay(rec.ClientSID); rc != nil {
		return *rc, true
	}
	if rec.Principal != "" || rec.Path == "" {
		return replayContext{}, false
	}
	return replayContext{host: rec.Host, path: rec.Path, header: http.Header{}, exclude: ep, reason: reasonDrain}, true
}

// moveQuiet moves rec's session if no request of it is in flight through
// this replica, and reports whether it moved.
func (p *Proxy) moveQuiet(ctx context.Context, rec *session.Record, rc replayContext, run *drainRun) bool {
	sid := rec.ClientSID
	if !p.active.beginMove(sid, run.ep) {
		return false // busy: moved after its requests, on a later pass
	}
	gone := false
	defer func() { p.active.endMove(sid, gone) }()
	// The move is the session's one flight: a request that needs to
	// re-initialize it meanwhile (another replica's request found it gone)
	// shares it.
	ch := p.flights.DoChan(sid, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.reinitTTL)
		defer cancel()
		return p.moveSession(fctx, rec, rc)
	})
	res := <-ch
	if res.Err != nil {
		p.log.Debug("drain: session not moved", "session", session.HashID(sid), "backend", run.ep.String(), "err", res.Err)
		return false
	}
	mv := res.Val.(moved)
	if mv.rec.BackendID == run.ep.ID {
		return false
	}
	gone = true
	if !mv.adopted { // (else another replica moved it, and counts it)
		run.moved.Add(1)
		p.recordDrainMove(sid, rec, mv, run)
	}
	return true
}

// recordDrainMove keeps the move in the session's history, for explain.
func (p *Proxy) recordDrainMove(sid string, from *session.Record, mv moved, run *drainRun) {
	now := p.now()
	d := &Decision{Route: routeReinit.String(), Backend: mv.rec.BackendURL, Reason: reasonDrain,
		From: from.BackendURL, While: run.reason, At: now}
	for _, c := range mv.weighed {
		d.Candidates = append(d.Candidates, candidate{Backend: c.Endpoint.String(), Load: c.Load})
	}
	e := p.decisions.entry(sid, true, 0)
	e.lastReinit.Store(d)
}

// wakeDrain wakes the drain of ep, if one runs: a session of it turned
// quiet with its credentials known.
func (p *Proxy) wakeDrain(ep *balancer.Endpoint) {
	p.drains.mu.Lock()
	run := p.drains.runs[ep.ID]
	p.drains.mu.Unlock()
	if run == nil {
		return
	}
	select {
	case run.wake <- struct{}{}:
	default:
	}
}

// The sessions with something in flight through this replica.
//
// Each request of a session enters its activity before its record is read
// and leaves it when it ends: a drain moves a session only while none of
// its requests is in flight, and a request that arrives during a move
// waits for it, then reads the moved record. The table holds a session only
// while it has requests or streams in flight (or, on a draining backend,
// credentials waiting for its move), so its size is bounded by the
// requests and streams in flight (--max-streams, the listener's limits).
type activities struct {
	seed   maphash.Seed
	shards [64]activityShard
}

type activityShard struct {
	mu sync.Mutex
	m  map[string]activity
	_  [40]byte // a shard per cache line: requests of different sessions do not share one
}

type activity struct {
	requests, streams int32
	// moving is non-nil while a drain moves the session: closed when the
	// move is over.
	moving chan struct{}
	// gate is non-nil while a drain holds the session's new requests back
	// (each for drainGateWait at most) so that those in flight can end and
	// leave it a quiet moment: a session that is never quiet otherwise
	// would never move. Closed when the move begins or the drain gives up.
	gate chan struct{}
	// busySince is when a drain first found requests of the session in
	// flight, and gateSince when it set the gate (Unix ns, 0: not);
	// waker is the draining backend to wake when they have ended.
	busySince, gateSince int64
	waker                *balancer.Endpoint
	// moved is cancelled (endStreams) when the session moves off the
	// backend of its streams, which then end; nil while no stream is open.
	// A context, not a channel: a parked stream waits on it with
	// context.AfterFunc, which takes no goroutine (park.go).
	moved      context.Context
	endStreams context.CancelFunc
	// streamEp is the backend the session's streams are on.
	streamEp *balancer.Endpoint
	// replay holds the credentials of a request seen while the session's
	// backend drains, for the move; streamReplay those of its open GET
	// stream, while the stream lasts (a legacy client's session is idle
	// but for it).
	replay, streamReplay *replayContext
}

func (a *activity) idle() bool {
	return a.requests == 0 && a.streams == 0 && a.moving == nil && a.replay == nil && a.waker == nil
}

// noteBusy records that a drain of ep found requests of the session in
// flight (see beginMove).
//
// The gate's cycle runs on time, not on the drain's passes, which the ends
// of requests wake many times a second: busy for drainGateAfter, the
// session gets the gate; gated for drainGateWait and busy still (a call
// longer than that), the gate opens and the cycle starts over.
func (a *activity) noteBusy(ep *balancer.Endpoint) {
	now := time.Now().UnixNano()
	a.waker = ep
	switch {
	case a.busySince == 0:
		a.busySince = now
	case a.gate == nil && now-a.busySince >= int64(drainGateAfter):
		a.gate, a.gateSince = make(chan struct{}), now
	case a.gate != nil && now-a.gateSince >= int64(drainGateWait):
		a.openGate()
		a.busySince = now
	}
}

// busy reports whether requests of sid are in flight (or it is moving),
// noting it as beginMove does.
func (t *activities) busy(sid string, ep *balancer.Endpoint) bool {
	sh := t.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a, ok := sh.m[sid]
	if !ok || (a.requests == 0 && a.moving == nil) {
		return false
	}
	if a.requests > 0 {
		a.noteBusy(ep)
		sh.m[sid] = a
	}
	return true
}

// openGate lets the requests held at the gate go on.
func (a *activity) openGate() {
	if a.gate != nil {
		close(a.gate)
		a.gate = nil
	}
}

func newActivities() *activities {
	t := &activities{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = map[string]activity{}
	}
	return t
}

func (t *activities) shard(sid string) *activityShard {
	return &t.shards[maphash.String(t.seed, sid)%uint64(len(t.shards))]
}

// enter records a request (or, with stream, a GET stream) of sid, after
// waiting for a move of the session in progress. A stream gets the channel
// closed when its session moves off its backend.
func (t *activities) enter(ctx context.Context, sid string, stream bool) (moved context.Context, err error) {
	sh := t.shard(sid)
	gated := false // held at a drain's gate once already
	for {
		sh.mu.Lock()
		a := sh.m[sid]
		if ch := a.moving; ch != nil {
			sh.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if ch := a.gate; ch != nil && !gated {
			// Held back for the session's move; past drainGateWait the
			// request goes on to the old backend, which still serves.
			sh.mu.Unlock()
			gated = true
			t := time.NewTimer(drainGateWait)
			select {
			case <-ch:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			t.Stop()
			continue
		}
		if stream {
			a.streams++
			if a.moved == nil {
				a.moved, a.endStreams = context.WithCancel(context.Background())
			}
			moved = a.moved
		} else {
			a.requests++
		}
		sh.m[sid] = a
		sh.mu.Unlock()
		return moved, nil
	}
}

// leave ends what enter recorded. It returns the backend whose drain waits
// for the session to turn quiet, nil if none does.
func (t *activities) leave(sid string, stream bool) (wake *balancer.Endpoint) {
	sh := t.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := sh.m[sid]
	if stream {
		a.streams--
		if a.streams == 0 {
			// (A context of Background's holds nothing to release.)
			a.moved, a.endStreams, a.streamEp, a.streamReplay = nil, nil, nil, nil
		}
	} else {
		a.requests--
	}
	if a.idle() {
		delete(sh.m, sid)
		return nil
	}
	sh.m[sid] = a
	if a.requests == 0 && a.waker != nil {
		return a.waker
	}
	if a.requests == 0 && a.replay != nil {
		return a.replay.exclude
	}
	return nil
}

// streamOn records the backend of sid's open streams.
func (t *activities) streamOn(sid string, ep *balancer.Endpoint) {
	sh := t.shard(sid)
	sh.mu.Lock()
	if a, ok := sh.m[sid]; ok && a.streams > 0 {
		a.streamEp = ep
		sh.m[sid] = a
	}
	sh.mu.Unlock()
}

// keepReplay keeps rc for sid's move: while its GET streams last
// (stream), or until the move (its backend drains).
func (t *activities) keepReplay(sid string, rc *replayContext, stream bool) {
	sh := t.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a, ok := sh.m[sid]
	if !ok || (stream && a.streams == 0) {
		return // the request or stream has ended
	}
	if stream {
		a.streamReplay = rc
	} else {
		a.replay = rc
	}
	sh.m[sid] = a
}

func (t *activities) replay(sid string) *replayContext {
	sh := t.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := sh.m[sid]
	if a.replay != nil {
		return a.replay
	}
	return a.streamReplay
}

// beginMove marks sid as moving, for a drain of ep, unless a request of
// it is in flight (or a move already runs), and reports whether it did.
// A session found busy wakes the drain when its requests have ended, and
// may get a gate that holds its new requests back until then (noteBusy).
func (t *activities) beginMove(sid string, ep *balancer.Endpoint) bool {
	sh := t.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := sh.m[sid]
	if a.moving != nil {
		return false
	}
	if a.requests > 0 {
		a.noteBusy(ep)
		sh.m[sid] = a
		return false
	}
	a.openGate()
	a.busySince, a.waker = 0, nil
	a.moving = make(chan struct{})
	sh.m[sid] = a
	return true
}

// endMove ends what beginMove began; when the session moved, its streams
// end and its kept credentials are dropped.
func (t *activities) endMove(sid string, moved bool) {
	sh := t.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := sh.m[sid]
	close(a.moving)
	a.moving = nil
	if moved {
		if a.moved != nil {
			a.endStreams()
			a.moved, a.endStreams = nil, nil
		}
		a.streamEp, a.replay = nil, nil
	}
	if a.idle() {
		delete(sh.m, sid)
	} else {
		sh.m[sid] = a
	}
}

// endStreamsMovedOff ends the streams open on ep through this replica whose
// session another replica has moved elsewhere.
func (t *activities) endStreamsMovedOff(ctx context.Context, store session.Store, ep *balancer.Endpoint) {
	var sids []string
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for sid, a := range sh.m {
			if a.streamEp == ep && a.moved != nil && a.moving == nil {
				sids = append(sids, sid)
			}
		}
		sh.mu.Unlock()
	}
	for _, sid := range sids {
		rec, err := store.Reload(ctx, sid)
		if err == nil && rec.BackendID == ep.ID {
			continue // still there: moved by this replica's drain, later
		}
		if err != nil && ctx.Err() != nil {
			return
		}
		if err != nil && err != session.ErrNotFound {
			continue // the store cannot tell now
		}
		sh := t.shard(sid)
		sh.mu.Lock()
		if a, ok := sh.m[sid]; ok && a.streamEp == ep && a.moved != nil {
			a.endStreams()
			a.moved, a.endStreams, a.streamEp = nil, nil, nil
			sh.m[sid] = a
		}
		sh.mu.Unlock()
	}
}

// dropReplays forgets what was kept for moves off ep, whose drain ended:
// credentials, wake-ups and gates.
func (t *activities) dropReplays(ep *balancer.Endpoint) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for sid, a := range sh.m {
			if (a.replay != nil && a.replay.exclude == ep) || a.waker == ep {
				a.replay, a.waker, a.busySince = nil, nil, 0
				a.openGate()
				if a.idle() {
					delete(sh.m, sid)
				} else {
					sh.m[sid] = a
				}
			}
		}
		sh.mu.Unlock()
	}
}

// keepStreamReplay keeps, while a GET stream of x's session lasts, what a
// drain that begins meanwhile will replay (creatorReplay).
func (p *Proxy) keepStreamReplay(r *http.Request, x *exchange) {
	if rc, ok := p.creatorReplay(r, x); ok {
		p.active.keepReplay(x.rec.ClientSID, rc, true)
	}
}

// keepDrainReplay keeps what the move of x's session will replay, if its
// backend drains (creatorReplay).
func (p *Proxy) keepDrainReplay(r *http.Request, x *exchange) {
	if _, ok := p.draining(x.ep); !ok {
		return
	}
	if rc, ok := p.creatorReplay(r, x); ok {
		p.active.keepReplay(x.rec.ClientSID, rc, false)
	}
}

// creatorReplay is what a move of x's session replays when its record
// does not suffice: the request's credentials, once they are shown to be
// the session creator's (anyone else's would hand the session over to
// them).
func (p *Proxy) creatorReplay(r *http.Request, x *exchange) (*replayContext, bool) {
	if x.rec.Principal == "" && x.rec.Path != "" {
		return nil, false // the record suffices
	}
	if !p.principal.matches(x.rec.Principal, x.header) {
		return nil, false
	}
	rc := p.replayContextOf(r.Host, r.URL.Path, x.header, x, reasonDrain)
	rc.exclude = x.ep
	return &rc, true
}
