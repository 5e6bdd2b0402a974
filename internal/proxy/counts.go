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
