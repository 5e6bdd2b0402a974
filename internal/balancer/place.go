package balancer

// Placement of sessions during a burst.
//
// A session's place is counted in its endpoint's session count only once
// the session store has recorded it, and that comes after the backend
// answered the session's initialize (for a move, the replayed initialize
// and notifications/initialized: milliseconds). When many sessions are
// placed at once (a proxy in front of tether moves every session of a
// killed pod with the next request it has for each, within a few
// milliseconds), every pick would read the same counts, and the pickers
// would send the whole burst to the endpoint that looked least loaded.
// Place reserves the place from the pick on, and makes concurrent picks
// see each other's reservations.
//
// A restarted backend raises the opposite problem: it answers 404 for the
// sessions it had, and they move, but its count holds each one until its
// move is recorded, so the moves of its own sessions avoid it and it ends
// with a fraction of what it held. Place's lostBy takes such a session off
// its count for the length of the move.
//
// What a placement balances is sessions: the sessions each endpoint holds
// or is about to hold (its session count, plus its placements in flight,
// minus its lost sessions being moved), with requests in flight only as a
// tie break, and not Load's sum of both. A session is placed for its
// whole life, and a burst of moves comes with a burst of requests: the
// proxy sends one request per session, the moved sessions' and everyone
// else's, so at the moment of the placements each endpoint has about as
// many requests in flight as it has sessions, and the restarted one also
// those of its lost sessions that have not had their 404 yet. Counted 1:1
// they decided the placements (seen: a restarted pod kept 7 of its 10
// sessions, the others' requests in flight outweighing its loss marks).
// (tether places new sessions with PickExplained, by Load: a new
// session's initialize is itself a request in flight on the endpoint
// picked for it, which counts it there from right after the pick until
// the session count does. A move's replayed initialize is no counted
// request, hence the reservation.)
//
// What is provable, and so what tether acts on: a backend that answers a
// request of a session with 404 "session not found" (proxy's sessionLost)
// does not hold that session, whatever happened to it. Nothing else
// proves a loss, so nothing else is taken off a count:
//   - A refused connection proves that nothing listened on the address at
//     that moment, not that the sessions are gone: a server may keep its
//     sessions outside the process (a shared store) or re-open its
//     listener, and a count dropped on a guess stays wrong (the memory
//     store's counts are never re-based). The endpoint is ejected, so its
//     count weighs on no pick until it is readmitted; its sessions' next
//     requests then prove, one by one, whether they were lost.
//   - An EndpointSlice going not-ready and ready again is a readiness
//     probe's verdict (an overloaded pod goes not-ready too), not a
//     restart; a restarted container keeps its pod's UID and address, so
//     nothing else tells a restart either.
//   - A restarted backend's sessions that send no request are counted on
//     it until they send one or expire. That keeps a place for each on the
//     backend that lost it: with lostBy among the choices, a lost session
//     that comes back is placed on it again, and the fleet ends as it was.

// maxPlaceTries bounds how often Place picks again because another
// placement was reserved while it picked. Each failed try means another
// placement succeeded (lock-free progress), and a pick takes tens of
// nanoseconds, so even a burst of hundreds of placements rarely retries
// twice; past the bound the placement is reserved where the last pick
// chose, as a pick was before reservations existed.
const maxPlaceTries = 16

// Placement is an endpoint chosen by Place, with the reservation that
// counts the session in the endpoint's Load until the session count does.
// Release it once the session store's change is counted (the store's
// Create or Swap returned: its OnChange subscriber runs within), or once
// the placement failed. The zero Placement holds nothing.
type Placement struct {
	// Endpoint is where the session goes.
	Endpoint *Endpoint

	reserved *Endpoint // holds one of Endpoint's placing, until Release
	lostBy   *Endpoint // holds one of its lost, until Release
}

// Release ends the placement's reservation, and the mark of the session's
// loss on the endpoint that lost it. Releasing a Placement variable again
// does nothing; Endpoint stays set.
func (pl *Placement) Release() {
	if e := pl.reserved; e != nil {
		pl.reserved = nil
		e.placing.Add(-1)
	}
	if e := pl.lostBy; e != nil {
		pl.lostBy = nil
		e.lost.Add(-1)
	}
}

// Place chooses the endpoint for a session that is being created or moved,
// never exclude, and reserves its place there: until the Placement is
// released, the endpoint's Load counts the session. It appends to weighed
// the candidates it compared, as PickExplained does; their Load is what a
// placement balances (the sessions held or about to be, see above) for
// p2c and least-loaded, Endpoint.Load for the others.
//
// lostBy, when not nil, is the endpoint that provably lost the session
// being moved (it answered 404 for it): until the release, its Load no
// longer counts the session. With the p2c picker it is one of the choices
// whenever it is eligible, besides p2c's two samples of the others: it
// had room for the session until it lost it, and a backend that restarted
// takes its sessions back rather than see them spread over the others
// while its count still holds them. The other pickers weigh it like any
// candidate (least-loaded), or not at all (round-robin, random).
//
// Concurrent placements are serialized by one counter of reservations:
// a placement that finds that another one was reserved while it picked
// picks again (at most maxPlaceTries times), so every placement sees the
// reservations of those that succeeded before it. Picks that are not
// placements (Pick, stateless requests) see the reservations in Load and
// take part in nothing else. Place is lock-free and, with weighed of
// enough capacity (3 for p2c, as many as the endpoints for least-loaded),
// does not allocate.
func (b *Balancer) Place(exclude, lostBy *Endpoint, weighed []Candidate) (Placement, []Candidate, error) {
	var pl Placement
	if lostBy != nil {
		// Before the pick, so that this placement sees the loss too.
		lostBy.lost.Add(1)
		pl.lostBy = lostBy
	}
	mark := len(weighed)
	for try := 1; ; try++ {
		seq := b.placements.Load()
		g := b.current.Load()
		cands := g.candidates(exclude)
		if len(cands) == 0 {
			pl.Release()
			return Placement{}, weighed[:mark], ErrNoEndpoints
		}
		var e *Endpoint
		e, weighed = b.choosePlace(g, cands, exclude, lostBy, weighed[:mark])
		// Reserved before the counter moves: a placement that reads the
		// counter after this one's increment sees the reservation.
		e.placing.Add(1)
		if b.placements.CompareAndSwap(seq, seq+1) || try == maxPlaceTries {
			if try == maxPlaceTries {
				b.placements.Add(1)
			}
			pl.Endpoint, pl.reserved = e, e
			return pl, weighed, nil
		}
		// Another placement was reserved since seq was read; its
		// endpoint's load may have been read without it.
		e.placing.Add(-1)
	}
}

// choosePlace is Place's pick among cands (not empty). p2c and
// least-loaded compare the endpoints' placeLoad (placeLess); the pickers
// that ignore load pick as they always do.
func (b *Balancer) choosePlace(g *generation, cands []*Endpoint, exclude, lostBy *Endpoint, weighed []Candidate) (*Endpoint, []Candidate) {
	switch p := b.picker.(type) {
	case *p2c:
		if lostBy != nil && lostBy != exclude && len(cands) > 1 {
			if i, eligible := g.eligibleIndex[lostBy]; eligible {
				return p.placeBeside(g, i, exclude, weighed)
			}
		}
		return p.place(cands, weighed)
	case *leastLoaded:
		return p.place(cands, weighed)
	}
	e := b.picker.Pick(cands)
	return e, append(weighed, Candidate{e, e.Load()})
}

// placeLess is the order of placements: fewer sessions held or about to be
// (placeLoad); on a tie, p2c's order of Load (fewer requests in flight,
// then fewer served).
func placeLess(a *Endpoint, aLoad int64, b *Endpoint, bLoad int64) bool {
	if aLoad != bLoad {
		return aLoad < bLoad
	}
	return lessLoaded(a, a.Load(), b, b.Load())
}

// placement is the choice among the candidates a placement weighs, one at
// a time: the first weighed wins ties of placeLess.
type placement struct {
	best     *Endpoint
	bestLoad int64
	weighed  []Candidate
}

func (pc *placement) weigh(e *Endpoint) {
	load := e.placeLoad()
	pc.weighed = append(pc.weighed, Candidate{e, load})
	if pc.best == nil || placeLess(e, load, pc.best, pc.bestLoad) {
		pc.best, pc.bestLoad = e, load
	}
}

// place is p2c for a placement: two samples of cands, compared by
// placeLess.
func (p *p2c) place(cands []*Endpoint, weighed []Candidate) (*Endpoint, []Candidate) {
	pc := placement{weighed: weighed}
	if len(cands) == 1 {
		pc.weigh(cands[0])
		return pc.best, pc.weighed
	}
	i, j := p.sampleIndexes(len(cands))
	pc.weigh(cands[i])
	pc.weigh(cands[j])
	return pc.best, pc.weighed
}

// placeBeside is p2c's placement with the eligible endpoint at index i as
// a third choice: it weighs that endpoint first, then two distinct samples
// of the other eligible endpoints but exclude (one when only one is left),
// and returns the first least placed by placeLess.
func (p *p2c) placeBeside(g *generation, i int, exclude *Endpoint, weighed []Candidate) (*Endpoint, []Candidate) {
	n := len(g.eligible)
	// Every eligible endpoint but the one at i, in the ring's window after
	// it; skip is exclude's place in the window, if it is there.
	others := g.ring[i+1 : i+n]
	skip := -1
	if k, ok := g.eligibleIndex[exclude]; ok {
		skip = (k - i - 1 + n) % n
	}
	m := len(others)
	if skip >= 0 {
		m--
	}
	other := func(k int) *Endpoint {
		if skip >= 0 && k >= skip {
			k++
		}
		return others[k]
	}
	pc := placement{weighed: weighed}
	pc.weigh(g.eligible[i])
	if m == 1 {
		pc.weigh(other(0))
		return pc.best, pc.weighed
	}
	j, k := p.sampleIndexes(m)
	pc.weigh(other(j))
	pc.weigh(other(k))
	return pc.best, pc.weighed
}

// place is least-loaded for a placement: the least placed candidate by
// placeLess, ties broken uniformly (reservoir sampling, as Pick).
func (l *leastLoaded) place(cands []*Endpoint, weighed []Candidate) (*Endpoint, []Candidate) {
	best := cands[0]
	bestLoad := best.placeLoad()
	weighed = append(weighed, Candidate{best, bestLoad})
	ties := 1
	for _, e := range cands[1:] {
		load := e.placeLoad()
		weighed = append(weighed, Candidate{e, load})
		switch {
		case placeLess(e, load, best, bestLoad):
			best, bestLoad, ties = e, load, 1
		case !placeLess(best, bestLoad, e, load):
			ties++
			if l.rnd(ties) == 0 {
				best = e
			}
		}
	}
	return best, weighed
}
