package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// This file is the informer half of the Kubernetes source: it keeps the
// Service's EndpointSlices by name, fed by a client-go informer, and
// publishes mergeSlices of them. The merge itself lives in endpointslice.go.

// EndpointSliceClient lists and watches the EndpointSlices of a namespace:
// the only API calls the Kubernetes source makes. KubeClient returns the
// real one; tests adapt a fake clientset.
type EndpointSliceClient interface {
	ListEndpointSlices(ctx context.Context, namespace string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error)
	WatchEndpointSlices(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

// KubernetesOptions configures a Kubernetes source.
type KubernetesOptions struct {
	// Client talks to the API server. Required. It needs get, list and watch
	// on endpointslices.discovery.k8s.io in the Service's namespace only
	// (deploy/rbac).
	Client EndpointSliceClient
	// Service whose EndpointSlices are the endpoints. Required.
	Service ServiceRef
	// Port chooses the port of each slice; the zero value means the only
	// TCP port.
	Port PortSelector
	// Logger receives one info line per endpoint change, warnings for
	// slices that had to be skipped and for watch failures; nil discards.
	Logger *slog.Logger
}

// Kubernetes discovers the endpoints of a Service from its EndpointSlices.
type Kubernetes struct {
	client  EndpointSliceClient
	service ServiceRef
	port    PortSelector
	log     *slog.Logger
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
		client:  o.Client,
		service: o.Service,
		port:    o.Port,
		log:     log.With("service", o.Service.String()),
	}, nil
}

// labelSelector is the selector of the Service's EndpointSlices: the watch
// is scoped to the namespace and to it, never cluster-wide.
func (k *Kubernetes) labelSelector() string {
	return discoveryv1.LabelServiceName + "=" + k.service.Name
}

// Run watches the Service's EndpointSlices until ctx ends. The first
// snapshot is published only once the informer has synced and this source
// has seen every object of the initial list, so tether stays not-ready until
// then; later snapshots are published when the merged set changes. A
// failing watch is retried by client-go (re-listing when the API server
// says its resource version is gone) and logged; the last published set
// stays in force meanwhile. Run returns nil when ctx ends.
func (k *Kubernetes) Run(ctx context.Context, update func(Snapshot)) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	informer := k.informer()
	if err := informer.SetWatchErrorHandlerWithContext(k.watchError); err != nil {
		return fmt.Errorf("kubernetes source: %w", err)
	}
	tracker := newSliceTracker(k.service, k.log)
	reg, err := informer.AddEventHandler(tracker)
	if err != nil {
		return fmt.Errorf("kubernetes source: %w", err)
	}
	wg.Go(func() { informer.RunWithContext(ctx) })

	k.log.Info("waiting for EndpointSlices to sync", "selector", k.labelSelector(), "port", k.port.String())
	select {
	case <-reg.HasSyncedChecker().Done():
	case <-ctx.Done():
		return nil
	}

	p := publisher{log: k.log, update: update}
	p.publish(mergeSlices(tracker.list(), k.port))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tracker.changed:
			p.publish(mergeSlices(tracker.list(), k.port))
		}
	}
}

// informer is client-go's EndpointSlice informer
// (informers/discovery/v1.NewFilteredEndpointSliceInformer) on k.client
// instead of a full clientset: scoped to the Service's namespace and label,
// no resync. The client says whether it can stream the initial list as
// watch events (a fake clientset cannot), as the generated informer's does.
func (k *Kubernetes) informer() cache.SharedIndexInformer {
	scope := func(o metav1.ListOptions) metav1.ListOptions {
		o.LabelSelector = k.labelSelector()
		return o
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return k.client.ListEndpointSlices(ctx, k.service.Namespace, scope(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return k.client.WatchEndpointSlices(ctx, k.service.Namespace, scope(o))
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, k.client), &discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
}

// watchError logs why a list or watch failed; client-go retries with
// backoff. An expired resource version and a cleanly closed watch are
// routine (client-go re-lists or re-watches) and logged at debug.
func (k *Kubernetes) watchError(_ context.Context, _ *cache.Reflector, err error) {
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, io.EOF) {
		k.log.Debug("EndpointSlice watch closed, resuming", "err", err)
		return
	}
	k.log.Warn("EndpointSlice list/watch failed, retrying", "err", err)
}

// sliceTracker is the informer adapter: it keeps the Service's slices by
// name and signals changed (capacity 1: bursts coalesce, and the reader
// always merges the latest state). Handlers run on the informer's
// goroutine; list runs on Run's.
type sliceTracker struct {
	service ServiceRef
	log     *slog.Logger
	changed chan struct{}

	mu     sync.Mutex
	slices map[string]*discoveryv1.EndpointSlice // by name; guarded by mu
}

var _ cache.ResourceEventHandler = (*sliceTracker)(nil)

func newSliceTracker(service ServiceRef, log *slog.Logger) *sliceTracker {
	return &sliceTracker{
		service: service,
		log:     log,
		changed: make(chan struct{}, 1),
		slices:  map[string]*discoveryv1.EndpointSlice{},
	}
}

func (t *sliceTracker) OnAdd(obj any, _ bool)  { t.set(obj) }
func (t *sliceTracker) OnUpdate(_, newObj any) { t.set(newObj) }
func (t *sliceTracker) OnDelete(obj any)       { t.remove(obj) }

// notify signals changed without blocking: a pending signal already covers
// this change.
func (t *sliceTracker) notify() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

func (t *sliceTracker) belongs(s *discoveryv1.EndpointSlice) bool {
	return s.Namespace == t.service.Namespace && s.Labels[discoveryv1.LabelServiceName] == t.service.Name
}

func (t *sliceTracker) set(obj any) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		t.log.Warn("ignoring unexpected object from the EndpointSlice informer", "type", fmt.Sprintf("%T", obj))
		return
	}
	if !t.belongs(s) {
		// The informer is scoped to the Service; a slice relabelled away
		// arrives as a delete. Be safe anyway.
		t.removeName(s.Name, false)
		return
	}
	t.mu.Lock()
	t.slices[s.Name] = s
	t.mu.Unlock()
	t.log.Debug("EndpointSlice seen", "slice", s.Name, "resourceVersion", s.ResourceVersion, "endpoints", len(s.Endpoints))
	t.notify()
}

// remove handles a delete, including the tombstone the informer hands over
// when it learned of the delete only by re-listing.
func (t *sliceTracker) remove(obj any) {
	tomb, isTomb := obj.(cache.DeletedFinalStateUnknown)
	if isTomb {
		obj = tomb.Obj
	}
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		t.removeName(s.Name, isTomb)
		return
	}
	if !isTomb {
		t.log.Warn("ignoring unexpected deleted object from the EndpointSlice informer", "type", fmt.Sprintf("%T", obj))
		return
	}
	// A tombstone without a usable object: its key still names the slice.
	_, name, err := cache.SplitMetaNamespaceKey(tomb.Key)
	if err != nil {
		t.log.Warn("ignoring EndpointSlice tombstone with a bad key", "key", tomb.Key, "err", err)
		return
	}
	t.removeName(name, true)
}

func (t *sliceTracker) removeName(name string, tombstone bool) {
	t.mu.Lock()
	_, had := t.slices[name]
	delete(t.slices, name)
	t.mu.Unlock()
	if had {
		t.log.Debug("EndpointSlice gone", "slice", name, "tombstone", tombstone)
		t.notify()
	}
}

// list returns the current slices (shared with the informer's cache: read
// only).
func (t *sliceTracker) list() []*discoveryv1.EndpointSlice {
	t.mu.Lock()
	defer t.mu.Unlock()
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
