package proxy

import (
	"context"
	"time"
)

// fleetCounter is a session store that knows the live sessions of every
// replica (the Redis store), so that new sessions are placed by the load of
// the whole fleet and not of one replica's view.
type fleetCounter interface {
	BackendSessions(ctx context.Context, backendIDs []string) (map[string]int64, error)
}

// RunLoadSync keeps each endpoint's session count equal to the fleet-wide
// count, re-read every interval, plus the changes this replica's store told
// since (CountSessions). It is the only correction of the counts: it
// catches what no event tells (other replicas' sessions, Redis's own
// expiry). It returns at once for a store without fleet-wide counts (the
// memory store: the counts kept from its changes are then exact),
// otherwise when ctx ends.
//
// Only the session count is re-based. What placement adds to it and takes
// off it (balancer.Place: the placements in flight, and the sessions a
// backend provably lost whose moves are in flight) is this replica's own
// knowledge, kept apart from the count, and the fleet count cannot hold
// it: the store records a move only once it is done. So a re-base in the
// middle of a burst of moves neither forgets the picks in flight nor puts
// a restarted backend's lost sessions back on its load.
func (p *Proxy) RunLoadSync(ctx context.Context, interval time.Duration) {
	fc, ok := p.store.(fleetCounter)
	if !ok {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		p.syncLoad(ctx, fc)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Proxy) syncLoad(ctx context.Context, fc fleetCounter) {
	eps := p.bal.Endpoints()
	if len(eps) == 0 {
		return
	}
	ids := make([]string, len(eps))
	before := make([]int64, len(eps))
	for i, ep := range eps {
		ids[i] = ep.ID
		before[i] = ep.Sessions()
	}
	counts, err := fc.BackendSessions(ctx, ids)
	if err != nil {
		return // degraded: keep counting locally until the store is back
	}
	for i, ep := range eps {
		// Re-base on the fleet count; changes made here while the count was
		// being read are kept on top of it.
		ep.AddSessions(counts[ep.ID] - before[i])
	}
}
