package proxy

import (
	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/session"
)

// CountSessions returns the subscriber of a session store's changes
// (session.MemoryOptions.OnChange, session.CacheOptions.OnChange) that
// keeps each endpoint's live-session count, which new-session placement
// reads. It is the one writer of those counts besides the fleet-wide sync
// (RunLoadSync), which re-bases them on the shared store's counts: the
// proxy only changes the store, and the counts follow from what the store
// says changed.
//
// A session whose endpoint has left the balancer is counted nowhere: when
// the endpoint comes back it starts from zero, or from the fleet count.
//
// Placement corrects these counts for what the store has not recorded
// yet (placeMove, balancer.Place): a move's place is reserved on its new
// backend from the pick until the move's Swap has returned, by which time
// this subscriber has counted it.
func CountSessions(bal *balancer.Balancer) func(session.Change) {
	add := func(rec *session.Record, n int64) {
		if ep, ok := bal.Lookup(rec.BackendID); ok {
			ep.AddSessions(n)
		}
	}
	return func(c session.Change) {
		switch c.Kind {
		case session.Created:
			add(c.New, 1)
		case session.Moved:
			if c.Old.BackendID != c.New.BackendID {
				add(c.Old, -1)
				add(c.New, 1)
			}
		case session.Deleted, session.Expired:
			add(c.Old, -1)
		}
	}
}

// placeMove chooses the backend a session moves to (moveSession's pick)
// and reserves its place there (balancer.Place): never exclude, counted
// in that backend's load until the Placement is released, which the
// caller does once the move's Swap has returned (the store's change is
// counted by then) or the attempt failed.
//
// The backend that answered 404 for the session (rc.reason is reasonLost)
// has provably lost it: it is Place's lostBy, so that its count stops
// holding the session while the move is placed, and it may take the
// session back (a restarted backend gets its sessions back rather than
// see them spread over the others). Only on the first attempt, and only
// while the record is the one the 404 was for: a second attempt keeps the
// first's mark (the caller holds both placements until the move ends),
// and a record moved since names a backend that proved nothing.
func (p *Proxy) placeMove(stale, cur *session.Record, exclude *balancer.Endpoint, rc *replayContext, weighed []balancer.Candidate) (balancer.Placement, []balancer.Candidate, error) {
	var lostBy *balancer.Endpoint
	if rc.reason == reasonLost && cur.Version == stale.Version && exclude == rc.exclude {
		lostBy, _ = p.bal.Lookup(cur.BackendID)
	}
	return p.bal.Place(exclude, lostBy, weighed)
}
