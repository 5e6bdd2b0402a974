package discovery

import (
	"context"
	"slices"
	"sync"
)

// Drains is a Source that adds an operator's drains (`tether drain`, the
// admin POST /drain) to another source's snapshots: a drained endpoint is
// published Fenced, as a terminating pod is, so it takes no new sessions
// and the proxy moves the ones it has. It works the same over static
// backends and EndpointSlices.
//
// A drain is keyed by endpoint ID and lasts until it is undone or the
// endpoint leaves the set: a new pod on the same address is a new ID and
// starts undrained.
type Drains struct {
	src Source

	mu      sync.Mutex
	drained map[string]bool
	last    Snapshot
	synced  bool             // last holds the source's first snapshot or a later one
	update  func(s Snapshot) // Run's, while it runs
}

// NewDrains wraps src.
func NewDrains(src Source) *Drains {
	return &Drains{src: src, drained: map[string]bool{}}
}

// Run runs the wrapped source and publishes each of its snapshots with the
// drained endpoints fenced; Set publishes again when a drain changes.
func (d *Drains) Run(ctx context.Context, update func(Snapshot)) error {
	d.mu.Lock()
	d.update = update
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.update = nil
		d.mu.Unlock()
	}()
	return d.src.Run(ctx, func(s Snapshot) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.last, d.synced = s, true
		for id := range d.drained {
			if !slices.ContainsFunc(s.Endpoints, func(e Endpoint) bool { return e.ID == id }) {
				delete(d.drained, id) // gone: a drain does not outlive its endpoint
			}
		}
		d.publishLocked()
	})
}

// publishLocked sends the latest snapshot, drained endpoints fenced. The
// source's snapshot is not modified: it may be shared.
func (d *Drains) publishLocked() {
	if !d.synced || d.update == nil {
		return
	}
	out := Snapshot{Endpoints: slices.Clone(d.last.Endpoints)}
	for i := range out.Endpoints {
		if d.drained[out.Endpoints[i].ID] {
			out.Endpoints[i].State = Fenced
		}
	}
	d.update(out)
}

// Set drains (on) or undrains the endpoint whose ID or URL is backend, and
// returns it; ok is false when no endpoint of the latest snapshot matches.
func (d *Drains) Set(backend string, on bool) (e Endpoint, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.last.Endpoints {
		if c.ID == backend || (c.URL != nil && c.URL.String() == backend) {
			e, ok = c, true
			break
		}
	}
	if !ok {
		return e, false
	}
	if d.drained[e.ID] == on {
		return e, true
	}
	if on {
		d.drained[e.ID] = true
	} else {
		delete(d.drained, e.ID)
	}
	d.publishLocked()
	return e, true
}

// Drained reports whether an operator drains the endpoint with this ID.
func (d *Drains) Drained(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.drained[id]
}
