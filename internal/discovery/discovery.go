// Package discovery finds the backends tether may send traffic to and
// publishes them as immutable snapshots. It knows nothing of HTTP routing or
// sessions: a source says which endpoints exist and whether each one takes
// new sessions, and the balancer turns that into picks.
package discovery

import (
	"context"
	"net/url"
)

// State is what an endpoint may be used for.
type State uint8

const (
	// Ready endpoints take new sessions and serve their existing ones.
	Ready State = iota
	// Fenced endpoints are serving but terminating (a rollout, a scale-down):
	// they keep the sessions they have and take no new ones.
	Fenced
)

func (s State) String() string {
	switch s {
	case Ready:
		return "ready"
	case Fenced:
		return "fenced"
	}
	return "unknown"
}

// Endpoint is one backend as a source sees it. Values are immutable once
// published in a Snapshot.
type Endpoint struct {
	// ID is the endpoint's identity: pod UID plus address for Kubernetes,
	// the URL for static backends. A reused address with a new pod UID is a
	// new ID, so a session is never routed to a pod that did not create it.
	ID string
	// URL is the base URL requests are sent to (scheme, host, and an
	// optional path prefix).
	URL *url.URL
	// State says whether the endpoint takes new sessions.
	State State
	// Pod is "namespace/name" of the endpoint's pod (the EndpointSlice's
	// targetRef), or "" when the source does not know it (static backends,
	// an endpoint without a targetRef). The pod deletion cost writer
	// (internal/podcost) annotates the pod it names.
	Pod string
}

// Snapshot is the complete endpoint set at one moment. Endpoints are unique
// by ID and sorted by ID so that two snapshots compare cheaply.
type Snapshot struct {
	Endpoints []Endpoint
}

// A Source discovers endpoints. Run publishes a full snapshot through update
// every time the set changes (the first call marks the source as synced) and
// returns when ctx ends or the source fails for good.
type Source interface {
	Run(ctx context.Context, update func(Snapshot)) error
}
