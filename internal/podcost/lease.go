package podcost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/tether-mcp/tether/internal/discovery"
)

// This file is leader election on a coordination.k8s.io/v1 Lease, with
// client-go's leaderelection semantics (LeaseLock, tryAcquireOrRenew) in
// small:
//
//   - every renew period each replica reads the Lease; the holder writes its
//     renewTime back, others write themselves in when it is free (no holder)
//     or expired;
//   - "expired" is judged by the reader's own clock: the Lease must have
//     stood unchanged (same holder, renewTime, transitions) for its
//     leaseDurationSeconds since this replica first saw it so, so clocks
//     that disagree across nodes do not matter;
//   - every write carries the resourceVersion that was read (the API
//     server refuses it with 409 Conflict if the Lease changed meanwhile),
//     so of two replicas that both find it expired, one wins;
//   - the holder believes it holds only until two thirds of the duration
//     after it sent its last successful renewal. Another replica can take
//     over only a whole duration after it first saw that renewal, which it
//     read after it was written: the holder has stopped writing by then,
//     with a third of the duration to spare for clocks that run at
//     different rates. (A patch sent just before the holder's belief ends
//     may still land after a takeover; it writes the same kind of value.)

// renewDeadline is how long after a successful renewal the holder goes on
// believing it holds the Lease: client-go's RenewDeadline (10 s) of its
// LeaseDuration (15 s).
func renewDeadline(duration time.Duration) time.Duration { return duration * 2 / 3 }

// microTime is the API's MicroTime format (metav1.RFC3339Micro).
const microTime = "2006-01-02T15:04:05.000000Z07:00"

func micro(t time.Time) string { return t.UTC().Format(microTime) }

// leaseSpec is the part of a Lease's spec the election reads and writes.
// It is comparable: two reads of an unchanged Lease are equal.
type leaseSpec struct {
	Holder          string `json:"holderIdentity"`
	DurationSeconds int32  `json:"leaseDurationSeconds"`
	AcquireTime     string `json:"acquireTime"`
	RenewTime       string `json:"renewTime"`
	Transitions     int32  `json:"leaseTransitions"`
}

// leaseObject is a Lease as read: the whole object is kept and written back
// with only the spec's election fields changed, so that fields tether does
// not know (labels, annotations, newer spec fields) survive its updates,
// and metadata.resourceVersion makes each update conditional.
type leaseObject struct {
	raw  map[string]json.RawMessage
	spec leaseSpec
}

func parseLease(b []byte) (*leaseObject, error) {
	o := &leaseObject{}
	if err := json.Unmarshal(b, &o.raw); err != nil {
		return nil, fmt.Errorf("%w: Lease: %v", discovery.ErrMalformed, err)
	}
	if s, ok := o.raw["spec"]; ok {
		if err := json.Unmarshal(s, &o.spec); err != nil {
			return nil, fmt.Errorf("%w: Lease spec: %v", discovery.ErrMalformed, err)
		}
	}
	return o, nil
}

// newLeaseObject is a Lease to create.
func newLeaseObject(namespace, name string) *leaseObject {
	meta, _ := json.Marshal(map[string]any{
		"name":      name,
		"namespace": namespace,
		"labels":    map[string]string{"app.kubernetes.io/name": "tether"},
	})
	return &leaseObject{raw: map[string]json.RawMessage{
		"apiVersion": json.RawMessage(`"coordination.k8s.io/v1"`),
		"kind":       json.RawMessage(`"Lease"`),
		"metadata":   meta,
	}}
}

// with returns the object's JSON with spec's election fields.
func (o *leaseObject) with(spec leaseSpec) ([]byte, error) {
	fields := map[string]json.RawMessage{}
	if s, ok := o.raw["spec"]; ok && string(s) != "null" {
		if err := json.Unmarshal(s, &fields); err != nil {
			return nil, err
		}
	}
	set := func(k string, v any) {
		b, _ := json.Marshal(v)
		fields[k] = b
	}
	set("holderIdentity", spec.Holder)
	set("leaseDurationSeconds", spec.DurationSeconds)
	set("leaseTransitions", spec.Transitions)
	for k, v := range map[string]string{"acquireTime": spec.AcquireTime, "renewTime": spec.RenewTime} {
		if v != "" {
			set(k, v)
		}
	}
	out := make(map[string]json.RawMessage, len(o.raw)+1)
	for k, v := range o.raw {
		out[k] = v
	}
	b, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	out["spec"] = b
	return json.Marshal(out)
}

// lease is one replica's side of the election.
type lease struct {
	api                   discovery.Requester
	namespace, name       string
	identity              string
	duration, renewPeriod time.Duration
	log                   *slog.Logger

	// Used by run's goroutine only (and by release once run returned).
	observed   leaseSpec    // the Lease's spec as last read or written
	observedAt time.Time    // when observed was first seen, by this clock
	mine       *leaseObject // the Lease as this replica last wrote it
	failing    bool         // the last attempt failed: warn once per streak
	forbidden  bool         // the RBAC hint was logged

	mu        sync.Mutex
	heldUntil time.Time // guarded by mu: the belief ends then
	term      uint64    // guarded by mu: counts acquisitions
}

// held reports whether this replica holds the Lease at now, and the term of
// that holding (a new term begins with each acquisition: what was written
// in an earlier term may have been overwritten by another holder since).
func (l *lease) held(now time.Time) (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Before(l.heldUntil), l.term
}

// run tries to acquire or renew the Lease every renew period until ctx
// ends.
func (l *lease) run(ctx context.Context) {
	t := time.NewTicker(l.renewPeriod)
	defer t.Stop()
	for {
		l.tryAcquireOrRenew(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *lease) path() string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(l.namespace) + "/leases"
}

var writeQuery = url.Values{"fieldManager": {fieldManager}}

// tryAcquireOrRenew is one round of the election.
func (l *lease) tryAcquireOrRenew(ctx context.Context) {
	// A round that takes longer than the holder's belief lasts is useless.
	ctx, cancel := context.WithTimeout(ctx, renewDeadline(l.duration))
	defer cancel()
	b, err := l.api.Do(ctx, discovery.Request{Method: http.MethodGet, Path: l.path() + "/" + url.PathEscape(l.name)})
	if apiCode(err) == http.StatusNotFound {
		start := time.Now()
		spec := leaseSpec{Holder: l.identity, DurationSeconds: l.durationSeconds(), AcquireTime: micro(start), RenewTime: micro(start)}
		l.write(ctx, http.MethodPost, l.path(), newLeaseObject(l.namespace, l.name), spec, start)
		return
	}
	var cur *leaseObject
	if err == nil {
		cur, err = parseLease(b)
	}
	if err != nil {
		l.failed(ctx, "read", err)
		return
	}
	now := time.Now()
	if cur.spec != l.observed {
		l.observed, l.observedAt = cur.spec, now
	}
	if h := cur.spec.Holder; h != "" && h != l.identity {
		d := time.Duration(cur.spec.DurationSeconds) * time.Second
		if d <= 0 {
			d = l.duration
		}
		if now.Before(l.observedAt.Add(d)) {
			l.lost(h)
			l.failing = false
			return
		}
	}
	start := time.Now()
	spec := cur.spec
	if spec.Holder != l.identity {
		spec.AcquireTime = micro(start)
		spec.Transitions++
	}
	spec.Holder, spec.DurationSeconds, spec.RenewTime = l.identity, l.durationSeconds(), micro(start)
	l.write(ctx, http.MethodPut, l.path()+"/"+url.PathEscape(l.name), cur, spec, start)
}

func (l *lease) durationSeconds() int32 { return int32(l.duration / time.Second) }

// write creates (POST) or updates (PUT, conditional on the resourceVersion
// read) the Lease with this replica as holder; start is when the attempt
// began, which the belief counts from.
func (l *lease) write(ctx context.Context, method, path string, obj *leaseObject, spec leaseSpec, start time.Time) {
	body, err := obj.with(spec)
	if err != nil {
		l.failed(ctx, "write", err)
		return
	}
	b, err := l.api.Do(ctx, discovery.Request{Method: method, Path: path, Query: writeQuery, ContentType: "application/json", Body: body})
	var written *leaseObject
	if err == nil {
		written, err = parseLease(b)
	}
	switch code := apiCode(err); {
	case code == http.StatusConflict:
		// Another replica wrote first (created it, renewed it, or took it
		// over): it holds the Lease.
		l.lost("")
		l.failing = false
		return
	case err != nil:
		l.failed(ctx, "write", err)
		return
	}
	l.failing, l.forbidden = false, false
	l.mine = written
	l.observed, l.observedAt = written.spec, time.Now()
	l.mu.Lock()
	acquired := !start.Before(l.heldUntil)
	if acquired {
		l.term++
	}
	l.heldUntil = start.Add(renewDeadline(l.duration))
	l.mu.Unlock()
	if acquired {
		l.log.Info("pod deletion cost: holding the lease; this replica writes the annotations", "transitions", written.spec.Transitions)
	}
}

// lost ends the belief at once: another replica holds the Lease (holder,
// when known).
func (l *lease) lost(holder string) {
	l.mu.Lock()
	had := time.Now().Before(l.heldUntil)
	l.heldUntil = time.Time{}
	l.mu.Unlock()
	if had {
		l.log.Warn("pod deletion cost: lost the lease", "holder", holder)
	}
}

// failed logs a failed round: the RBAC hint once for 403, a warning for the
// first failure of a streak. The belief runs out by itself if renewals keep
// failing.
func (l *lease) failed(ctx context.Context, op string, err error) {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return // shutting down
	}
	if apiCode(err) == http.StatusForbidden {
		if !l.forbidden {
			l.forbidden = true
			l.log.Error("pod deletion cost: the API server forbids the Lease: grant get, create and update on leases (coordination.k8s.io) in namespace "+l.namespace+" (deploy/components/pod-deletion-cost)", "op", op, "err", err)
		}
		return
	}
	if !l.failing {
		l.failing = true
		l.log.Warn("pod deletion cost: lease "+op+" failed, retrying", "err", err)
		return
	}
	l.log.Debug("pod deletion cost: lease "+op+" failed again", "err", err)
}

// release gives the Lease up if this replica holds it (its last write is
// still the Lease's version): holder cleared, as client-go's
// ReleaseOnCancel does, so that another replica acquires it at its next
// round. Call it once run has returned.
func (l *lease) release() {
	l.mu.Lock()
	held := time.Now().Before(l.heldUntil)
	l.heldUntil = time.Time{}
	l.mu.Unlock()
	if !held || l.mine == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	now := time.Now()
	spec := l.mine.spec
	spec.Holder, spec.DurationSeconds, spec.RenewTime = "", 1, micro(now)
	body, err := l.mine.with(spec)
	if err == nil {
		_, err = l.api.Do(ctx, discovery.Request{Method: http.MethodPut, Path: l.path() + "/" + url.PathEscape(l.name), Query: writeQuery, ContentType: "application/json", Body: body})
	}
	if err != nil {
		// It expires by itself after its duration.
		l.log.Warn("pod deletion cost: releasing the lease failed; it expires by itself", "err", err)
		return
	}
	l.log.Info("pod deletion cost: released the lease")
}

// apiCode is the HTTP status of an API error, 0 for any other error.
func apiCode(err error) int {
	var ae *discovery.APIError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}
