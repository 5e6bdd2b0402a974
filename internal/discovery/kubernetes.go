package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"time"
)

// This file is the list-and-watch half of the Kubernetes source: it keeps
// the Service's EndpointSlices by name, fed by a list and then a watch from
// the list's resource version (client-go's reflector, in small), and
// publishes mergeSlices of them. The merge itself lives in endpointslice.go,
// the API client in kubeapi.go.

// KubernetesOptions configures a Kubernetes source.
type KubernetesOptions struct {
	// Client talks to the API server. Required. It needs list and watch
	// on endpointslices.discovery.k8s.io in the Service's namespace only
	// (deploy/rbac).
	Client EndpointSliceClient
	// Service whose EndpointSlices are the endpoints. Required.
	Service ServiceRef
	// Port chooses the port of each slice; the zero value means the only
	// TCP port.
	Port PortSelector
	// Logger receives one info line per endpoint change, warnings for
	// slices that had to be skipped and for list and watch failures; nil
	// discards.
	Logger *slog.Logger
}

// Retry and watch timing. The backoff is client-go's reflector's in
// spirit: it grows while the API server fails, and is forgotten once a
// watch works again.
const (
	// backoffInitial is the first wait after a failure; it doubles per
	// failure in a row up to backoffMax. Each wait is jittered to between
	// half and all of it, so that the sidecars of a Deployment do not retry
	// in step after an API server restart.
	backoffInitial = time.Second
	backoffMax     = 30 * time.Second
	// minWatchTimeout is the shortest watch asked for (timeoutSeconds);
	// each watch asks for between it and twice it, at random, as the
	// reflector does, so that watches of many sidecars do not end together.
	minWatchTimeout = 5 * time.Minute
	// healthyWatch is how long a watch must last, when it delivers no
	// event, to count as working: a watch the API server ends at once is a
	// failure (and backs off), not a reason to reconnect in a loop.
	healthyWatch = time.Second
)

// Kubernetes discovers the endpoints of a Service from its EndpointSlices.
type Kubernetes struct {
	client  EndpointSliceClient
	service ServiceRef
	port    PortSelector
	log     *slog.Logger

	// Timing; tests shorten it.
	backoffInitial, backoffMax time.Duration
	watchTimeout               func() time.Duration
}

var _ Source = (*Kubernetes)(nil)

// NewKubernetes returns a source for o.Service. Nothing talks to the API
// server before Run.
func NewKubernetes(o KubernetesOptions) (*Kubernetes, error) {
	if o.Client == nil {
		return nil, errors.New("kubernetes source: no client")
	}
	if _, err := ParseServiceRef(o.Service.String()); err != nil {
		return nil, fmt.Errorf("kubernetes source: Service %w", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Kubernetes{
		client:         o.Client,
		service:        o.Service,
		port:           o.Port,
		log:            log.With("service", o.Service.String()),
		backoffInitial: backoffInitial,
		backoffMax:     backoffMax,
		watchTimeout: func() time.Duration {
			return minWatchTimeout + rand.N(minWatchTimeout)
		},
	}, nil
}

// labelSelector is the selector of the Service's EndpointSlices: the watch
// is scoped to the namespace and to it, never cluster-wide.
func (k *Kubernetes) labelSelector() string {
	return LabelServiceName + "=" + k.service.Name
}

// Run watches the Service's EndpointSlices until ctx ends. The first
// snapshot is published only once the initial list has been read whole, so
// tether stays not-ready until then; later snapshots are published when the
// merged set changes. A watch that ends is resumed from the last resource
// version seen (bookmarks included); when the API server says that version
// is gone (410), the slices are listed again and replace the whole set, so
// slices deleted meanwhile disappear. Failures are logged as warnings and
// retried with a jittered, capped backoff; the last published set stays in
// force meanwhile. Run returns nil when ctx ends.
func (k *Kubernetes) Run(ctx context.Context, update func(Snapshot)) error {
	k.log.Info("waiting for EndpointSlices to sync", "selector", k.labelSelector(), "port", k.port.String())
	r := &reflector{
		k:       k,
		tracker: newSliceTracker(k.service, k.log),
		pub:     publisher{log: k.log, update: update},
		backoff: backoff{initial: k.backoffInitial, max: k.backoffMax},
	}
	for ctx.Err() == nil {
		if err := r.list(ctx); err != nil {
			if ctx.Err() == nil {
				k.log.Warn("EndpointSlice list/watch failed, retrying", "err", err)
				r.sleep(ctx)
			}
			continue
		}
		r.watch(ctx)
	}
	return nil
}

// reflector lists and watches; it runs on Run's goroutine only.
type reflector struct {
	k       *Kubernetes
	tracker *sliceTracker
	pub     publisher
	backoff backoff
	rv      string // the last resource version seen
}

func (r *reflector) publish() { r.pub.publish(mergeSlices(r.tracker.list(), r.k.port)) }

func (r *reflector) sleep(ctx context.Context) {
	t := time.NewTimer(r.backoff.next())
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// list replaces the whole set with the API server's and publishes it.
func (r *reflector) list(ctx context.Context) error {
	list, err := r.k.client.ListEndpointSlices(ctx, r.k.service.Namespace, r.k.labelSelector())
	if err != nil {
		return err
	}
	r.tracker.replace(list.Items)
	r.rv = list.Metadata.ResourceVersion
	r.k.log.Debug("EndpointSlices listed", "slices", len(list.Items), "resourceVersion", r.rv)
	r.publish()
	return nil
}

// watch watches from r.rv and resumes after each watch that ends, until
// ctx ends or a list is needed: the resource version is gone, or the API
// server sent something that was not a watch event (whatever it stood for
// was missed).
func (r *reflector) watch(ctx context.Context) {
	for ctx.Err() == nil {
		start := time.Now()
		w, err := r.k.client.WatchEndpointSlices(ctx, r.k.service.Namespace, WatchOptions{
			LabelSelector:   r.k.labelSelector(),
			ResourceVersion: r.rv,
			Timeout:         r.k.watchTimeout(),
		})
		events := 0
		if err == nil {
			events, err = r.consume(w)
			w.Close()
		}
		healthy := events > 0 || (err == nil && time.Since(start) >= healthyWatch)
		if healthy {
			r.backoff.reset()
		}
		switch {
		case ctx.Err() != nil:
			return
		case isGone(err):
			r.k.log.Debug("EndpointSlice watch expired, listing again", "resourceVersion", r.rv, "err", err)
			if !healthy {
				r.sleep(ctx)
			}
			return
		case err == nil && healthy:
			r.k.log.Debug("EndpointSlice watch ended, resuming", "resourceVersion", r.rv, "events", events)
			continue
		case err == nil:
			err = errors.New("watch EndpointSlices: the API server ended the watch at once")
		}
		r.k.log.Warn("EndpointSlice list/watch failed, retrying", "err", err)
		r.sleep(ctx)
		var ae *APIError
		if errors.Is(err, ErrMalformed) || errors.As(err, &ae) {
			return // an event may have been lost, or the API refuses: list again
		}
	}
}

// consume applies w's events until it ends; a clean end returns nil.
func (r *reflector) consume(w EndpointSliceWatch) (int, error) {
	events := 0
	for {
		ev, err := w.Next()
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		events++
		changed := false
		switch ev.Type {
		case EventAdded, EventModified:
			changed = r.tracker.set(&ev.Object)
		case EventDeleted:
			changed = r.tracker.remove(ev.Object.Name, false)
		case EventBookmark:
		}
		if ev.Object.ResourceVersion != "" {
			r.rv = ev.Object.ResourceVersion
		}
		if changed {
			r.publish()
		}
	}
}

// backoff is a capped exponential backoff with jitter.
type backoff struct {
	initial, max time.Duration
	cur          time.Duration // the next wait before jitter; 0 = initial
}

// next returns the wait before the next attempt: between half and all of
// the current step, which then doubles up to max.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.initial
	}
	d := b.cur/2 + rand.N(b.cur/2+1)
	b.cur = min(2*b.cur, b.max)
	return d
}

func (b *backoff) reset() { b.cur = 0 }

// sliceTracker keeps the Service's slices by name.
type sliceTracker struct {
	service ServiceRef
	log     *slog.Logger
	slices  map[string]*EndpointSlice
}

func newSliceTracker(service ServiceRef, log *slog.Logger) *sliceTracker {
	return &sliceTracker{service: service, log: log, slices: map[string]*EndpointSlice{}}
}

func (t *sliceTracker) belongs(s *EndpointSlice) bool {
	return s.Namespace == t.service.Namespace && s.Labels[LabelServiceName] == t.service.Name
}

// set stores s and says whether the set changed (a slice of another
// Service removes its name instead).
func (t *sliceTracker) set(s *EndpointSlice) bool {
	if !t.belongs(s) {
		// The watch is scoped to the Service; a slice relabelled away
		// arrives as a delete. Be safe anyway.
		return t.remove(s.Name, false)
	}
	t.slices[s.Name] = s
	t.log.Debug("EndpointSlice seen", "slice", s.Name, "resourceVersion", s.ResourceVersion, "endpoints", len(s.Endpoints))
	return true
}

// remove forgets a slice; relisted says its delete was learned from a list
// rather than the watch.
func (t *sliceTracker) remove(name string, relisted bool) bool {
	if _, had := t.slices[name]; !had {
		return false
	}
	delete(t.slices, name)
	t.log.Debug("EndpointSlice gone", "slice", name, "relisted", relisted)
	return true
}

// replace makes items the whole set.
func (t *sliceTracker) replace(items []EndpointSlice) {
	keep := map[string]bool{}
	for i := range items {
		if t.belongs(&items[i]) {
			keep[items[i].Name] = true
		}
	}
	for name := range t.slices {
		if !keep[name] {
			t.remove(name, true)
		}
	}
	for i := range items {
		t.set(&items[i])
	}
}

// list returns the current slices (shared: read only).
func (t *sliceTracker) list() []*EndpointSlice {
	return slices.Collect(maps.Values(t.slices))
}

// publisher sends a snapshot when the merged set differs from the last one
// sent (always the first time) and logs each change on its own line.
type publisher struct {
	log      *slog.Logger
	update   func(Snapshot)
	sent     bool
	last     merged
	problems []string
}

func (p *publisher) publish(m merged) {
	if !slices.Equal(m.Problems, p.problems) {
		for _, problem := range m.Problems {
			if !slices.Contains(p.problems, problem) {
				p.log.Warn("EndpointSlice skipped in part", "problem", problem)
			}
		}
		p.problems = m.Problems
	}
	changes := diffSnapshots(p.last.Snapshot, m.Snapshot)
	if p.sent && len(changes) == 0 {
		return
	}
	// The snapshot is applied before it is logged: a line saying an
	// endpoint is gone means no new request can be sent to it.
	last, first := p.last, !p.sent
	p.sent = true
	p.last = m
	p.update(m.Snapshot)
	for _, c := range changes {
		pod := m.Pods[c.ID]
		if pod == "" {
			pod = last.Pods[c.ID]
		}
		attrs := []any{"id", c.ID, "url", c.URL}
		if pod != "" {
			attrs = append(attrs, "pod", pod)
		}
		switch c.Kind {
		case added:
			p.log.Info("endpoint added", append(attrs, "state", c.To.String())...)
		case removed:
			p.log.Info("endpoint removed", attrs...)
		case stateChanged:
			p.log.Info("endpoint state changed", append(attrs, "from", c.From.String(), "to", c.To.String())...)
		}
	}
	if first {
		ready, fenced := 0, 0
		for _, e := range m.Snapshot.Endpoints {
			if e.State == Ready {
				ready++
			} else {
				fenced++
			}
		}
		p.log.Info("EndpointSlices synced", "ready", ready, "fenced", fenced)
	}
}

// changeKind says how an endpoint differs between two snapshots.
type changeKind uint8

const (
	added changeKind = iota + 1
	removed
	stateChanged
)

// change is one endpoint's difference between two snapshots. An ID whose URL
// changed is reported as removed and added.
type change struct {
	Kind     changeKind
	ID       string
	URL      string
	From, To State
}

// diffSnapshots lists the changes from old to new, in ID order. Both must
// be sorted by ID with unique IDs, as every Snapshot is.
func diffSnapshots(old, new Snapshot) []change {
	var out []change
	i, j := 0, 0
	for i < len(old.Endpoints) || j < len(new.Endpoints) {
		switch {
		case j == len(new.Endpoints) || (i < len(old.Endpoints) && old.Endpoints[i].ID < new.Endpoints[j].ID):
			o := old.Endpoints[i]
			out = append(out, change{Kind: removed, ID: o.ID, URL: o.URL.String(), From: o.State})
			i++
		case i == len(old.Endpoints) || new.Endpoints[j].ID < old.Endpoints[i].ID:
			n := new.Endpoints[j]
			out = append(out, change{Kind: added, ID: n.ID, URL: n.URL.String(), To: n.State})
			j++
		default:
			o, n := old.Endpoints[i], new.Endpoints[j]
			switch {
			case o.URL.String() != n.URL.String():
				out = append(out,
					change{Kind: removed, ID: o.ID, URL: o.URL.String(), From: o.State},
					change{Kind: added, ID: n.ID, URL: n.URL.String(), To: n.State})
			case o.State != n.State:
				out = append(out, change{Kind: stateChanged, ID: n.ID, URL: n.URL.String(), From: o.State, To: n.State})
			}
			i++
			j++
		}
	}
	return out
}
