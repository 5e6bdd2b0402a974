// Package podcost sets the annotation controller.kubernetes.io/pod-deletion-cost
// on the backend pods to their live session counts, so that a ReplicaSet
// (and so a Deployment) scaling down deletes the pods with the fewest
// sessions first, and fewer sessions have to move.
//
// One tether replica at a time writes: the holder of a coordination.k8s.io
// Lease in the Service's namespace (lease.go). The others stand by and take
// over when the holder releases the Lease or stops renewing it. The writer
// (writer.go) patches a pod only when its value changed, at most once per
// interval and a bounded number of pods per pass: every patch is a write to
// etcd, and a ReplicaSet reads the annotation only when it scales down.
//
// It talks to the API server through discovery's own client (a Requester):
// the sidecar links no Kubernetes module.
package podcost

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/tether-mcp/tether/internal/discovery"
)

// Annotation is what the writer sets on each backend pod: its live sessions
// as a decimal int32. The ReplicaSet controller deletes pods with a lower
// cost first (beta and on by default since Kubernetes 1.22); StatefulSets
// ignore it.
const Annotation = "controller.kubernetes.io/pod-deletion-cost"

// Defaults of Options.
const (
	// DefaultInterval is the least time between two passes of the writer
	// (--pod-deletion-cost-interval). A ReplicaSet reads the annotation only
	// at the moment it scales down, so a value seconds old is as good as a
	// fresh one, and each patch is a write to etcd: ten seconds keeps the
	// writes of a busy fleet (sessions come and go every second) to one
	// per changed pod per ten seconds.
	DefaultInterval = 10 * time.Second
	// DefaultMaxPatchesPerPass bounds the pods patched in one pass: 50 per
	// 10 s is 5 writes a second, client-go's default QPS for a controller.
	// The pods left over (the first pass of a large fleet) are patched in
	// the next passes, largest changes first.
	DefaultMaxPatchesPerPass = 50
	// DefaultLeaseDuration and DefaultRenewPeriod are client-go's leader
	// election's usual values (LeaseDuration 15 s; its holder renews well
	// within it). The holder stops writing when it has not renewed for two
	// thirds of the duration; another replica takes over only once the
	// Lease stood unchanged for the whole duration by its own clock.
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewPeriod   = 5 * time.Second
)

const (
	// fieldManager names tether's writes in the objects' managedFields.
	fieldManager = "tether-pod-deletion-cost"
	// patchTimeout bounds one pod patch; a pass stops at the first that
	// outlives the lease anyway.
	patchTimeout = 5 * time.Second
	// releaseTimeout bounds the release of the Lease at shutdown.
	releaseTimeout = 2 * time.Second
)

// PodSessions is one endpoint's live sessions and its pod.
type PodSessions struct {
	// Pod is "namespace/name" (discovery.Endpoint.Pod).
	Pod string
	// Sessions is the endpoint's live session count
	// (balancer.Endpoint.Sessions: fleet-wide with Redis).
	Sessions int64
}

// Options configures a Writer.
type Options struct {
	// API is the client to the API server (discovery.KubeRequester).
	// Required. It needs, in the Service's namespace: patch on pods, and
	// get, create and update on leases.coordination.k8s.io
	// (deploy/components/pod-deletion-cost).
	API discovery.Requester
	// Service is the backend Service: its namespace holds the Lease (named
	// LeaseName(Service)) and the pods that are annotated. Required.
	Service discovery.ServiceRef
	// Sessions returns the endpoints with their pods and live session
	// counts. Endpoints of one pod are added up; pods of another namespace,
	// which a namespaced Role could not patch, are left alone. Required.
	Sessions func() []PodSessions
	// Identity is this replica's name in the Lease; "" is
	// NewIdentity(os.Getenv).
	Identity string
	// Interval, MaxPatchesPerPass, LeaseDuration and RenewPeriod: 0 means
	// their defaults.
	Interval          time.Duration
	MaxPatchesPerPass int
	LeaseDuration     time.Duration
	RenewPeriod       time.Duration
	// Logger receives lease transitions, failures and the RBAC hint; nil
	// discards.
	Logger *slog.Logger
}

// LeaseName is the name of the Lease of the writers for a Service.
func LeaseName(svc discovery.ServiceRef) string { return "tether-deletion-cost-" + svc.Name }

// NewIdentity names this replica in the Lease: $POD_NAME (the downward
// API), else the host name, plus a random suffix, so that a restarted
// container never mistakes its predecessor's Lease for its own.
func NewIdentity(getenv func(string) string) string {
	name := getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	if name == "" {
		name = "tether"
	}
	var b [4]byte
	rand.Read(b[:])
	return name + "_" + hex.EncodeToString(b[:])
}

// Writer keeps the pod deletion cost of the backend pods while this replica
// holds the Lease.
type Writer struct {
	log   *slog.Logger
	lease *lease
	pods  *podWriter
}

// New checks o and returns a Writer; nothing talks to the API server before
// Run.
func New(o Options) (*Writer, error) {
	if o.API == nil || o.Sessions == nil {
		return nil, errors.New("pod deletion cost: no API client or no session counts")
	}
	if _, err := discovery.ParseServiceRef(o.Service.String()); err != nil {
		return nil, fmt.Errorf("pod deletion cost: Service %w", err)
	}
	o.Interval = cmp.Or(o.Interval, DefaultInterval)
	o.MaxPatchesPerPass = cmp.Or(o.MaxPatchesPerPass, DefaultMaxPatchesPerPass)
	o.LeaseDuration = cmp.Or(o.LeaseDuration, DefaultLeaseDuration)
	o.RenewPeriod = cmp.Or(o.RenewPeriod, DefaultRenewPeriod)
	if o.Identity == "" {
		o.Identity = NewIdentity(os.Getenv)
	}
	switch {
	case o.Interval < 0 || o.MaxPatchesPerPass < 0 || o.LeaseDuration < 0 || o.RenewPeriod < 0:
		return nil, errors.New("pod deletion cost: negative interval, bound or lease timing")
	case o.LeaseDuration < 3*time.Second:
		// leaseDurationSeconds is whole seconds.
		return nil, fmt.Errorf("pod deletion cost: lease duration %s: want at least 3s", o.LeaseDuration)
	case o.RenewPeriod >= renewDeadline(o.LeaseDuration):
		return nil, fmt.Errorf("pod deletion cost: renew period %s must be shorter than two thirds of the lease duration %s", o.RenewPeriod, o.LeaseDuration)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("lease", o.Service.Namespace+"/"+LeaseName(o.Service), "identity", o.Identity)
	l := &lease{
		api:         o.API,
		namespace:   o.Service.Namespace,
		name:        LeaseName(o.Service),
		identity:    o.Identity,
		duration:    o.LeaseDuration,
		renewPeriod: o.RenewPeriod,
		log:         log,
	}
	return &Writer{
		log:   log,
		lease: l,
		pods: &podWriter{
			api:        o.API,
			namespace:  o.Service.Namespace,
			sessions:   o.Sessions,
			interval:   o.Interval,
			maxPatches: o.MaxPatchesPerPass,
			lease:      l,
			log:        log,
		},
	}, nil
}

// Run competes for the Lease and, while this replica holds it, keeps the
// pods' annotations. It returns when ctx ends, after releasing the Lease if
// it held it, so that another replica takes over at once rather than after
// the lease duration. API failures are logged and retried, never fatal.
func (w *Writer) Run(ctx context.Context) {
	w.log.Info("pod deletion cost: competing for the lease", "interval", w.pods.interval.String())
	var wg sync.WaitGroup
	wg.Go(func() { w.lease.run(ctx) })
	wg.Go(func() { w.pods.run(ctx) })
	wg.Wait()
	w.lease.release()
}

// Holding reports whether this replica holds the Lease now (and so may
// write).
func (w *Writer) Holding() bool {
	held, _ := w.lease.held(time.Now())
	return held
}

// Identity is this replica's name in the Lease.
func (w *Writer) Identity() string { return w.lease.identity }
