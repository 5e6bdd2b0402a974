package podcost

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-mcp/tether/internal/discovery"
)

// podWriter patches the pods' annotations while the lease is held.
type podWriter struct {
	api        discovery.Requester
	namespace  string
	sessions   func() []PodSessions
	interval   time.Duration
	maxPatches int
	lease      *lease
	log        *slog.Logger

	// Used by run's goroutine only.
	written   map[string]int32 // pod name → the cost written in term
	term      uint64
	forbidden bool // the RBAC hint was logged
}

// run makes a pass at most once per interval until ctx ends. The first pass
// comes an interval after the start, by when discovery has synced and the
// session counts have been re-based on the fleet's (with Redis, every
// second): the pods are not all written as zero by a replica that has just
// started.
func (w *podWriter) run(ctx context.Context) {
	next := time.Now().Add(w.interval)
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		start := time.Now()
		if held, term := w.lease.held(start); held {
			w.pass(ctx, term)
		} else {
			w.written = nil
		}
		// Passes start at least an interval apart, however long one took.
		next = start.Add(w.interval)
	}
}

// patch is one pod's new cost.
type patch struct {
	Pod  string // name, in the writer's namespace
	Cost int32
}

// pass writes the costs that changed, at most maxPatches of them, while the
// lease stays held in term.
func (w *podWriter) pass(ctx context.Context, term uint64) {
	if w.written == nil || term != w.term {
		// A new holding: another replica may have written since, so every
		// pod is written once again.
		w.written, w.term = map[string]int32{}, term
	}
	want := desiredCosts(w.namespace, w.sessions())
	todo := plan(want, w.written, w.maxPatches)
	var failed int
	var firstErr error
	for _, p := range todo {
		if held, t := w.lease.held(time.Now()); !held || t != term {
			return // lost, or lost and won again: the next pass starts over
		}
		err := w.patch(ctx, p)
		switch code := apiCode(err); {
		case err == nil:
			w.written[p.Pod] = p.Cost
			w.forbidden = false
		case code == http.StatusNotFound:
			// The pod is gone; its endpoint leaves the set shortly.
			w.written[p.Pod] = p.Cost
		case code == http.StatusForbidden:
			if !w.forbidden {
				w.forbidden = true
				w.log.Error("pod deletion cost: the API server forbids patching pods: grant patch on pods in namespace "+w.namespace+" (deploy/components/pod-deletion-cost)", "pod", p.Pod, "err", err)
			}
			return // the same answer for every pod
		case ctx.Err() != nil:
			return
		default:
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	for pod := range w.written {
		if _, ok := want[pod]; !ok {
			delete(w.written, pod) // written again if it comes back
		}
	}
	if failed > 0 {
		w.log.Warn("pod deletion cost: pod patches failed; retried next pass", "failed", failed, "err", firstErr)
	}
	if len(todo) > 0 {
		w.log.Debug("pod deletion cost: pass", "patched", len(todo)-failed, "pods", len(want))
	}
}

// patch sets one pod's annotation: a JSON merge patch of
// metadata.annotations, nothing else.
func (w *podWriter) patch(ctx context.Context, p patch) error {
	ctx, cancel := context.WithTimeout(ctx, patchTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{Annotation: strconv.Itoa(int(p.Cost))}},
	})
	_, err := w.api.Do(ctx, discovery.Request{
		Method:      http.MethodPatch,
		Path:        "/api/v1/namespaces/" + url.PathEscape(w.namespace) + "/pods/" + url.PathEscape(p.Pod),
		Query:       writeQuery,
		ContentType: "application/merge-patch+json",
		Body:        body,
	})
	return err
}

// desiredCosts is each pod's cost: the sessions of its endpoints added up
// (a dual-stack pod has one per address family), clamped to the
// annotation's int32. Pods outside namespace are left out.
func desiredCosts(namespace string, eps []PodSessions) map[string]int32 {
	sum := map[string]int64{}
	for _, e := range eps {
		ns, name, ok := strings.Cut(e.Pod, "/")
		if !ok || ns != namespace || name == "" {
			continue
		}
		sum[name] += max(e.Sessions, 0) // a count that lags may dip below zero
	}
	out := make(map[string]int32, len(sum))
	for name, n := range sum {
		out[name] = int32(min(n, math.MaxInt32))
	}
	return out
}

// plan chooses the patches of a pass: the pods whose cost differs from what
// was written (or that were not written yet), at most limit of them, the
// unwritten first, then the largest changes, then by name.
func plan(want, written map[string]int32, limit int) []patch {
	type change struct {
		patch
		delta int64 // math.MaxInt64 when never written
	}
	var changes []change
	for pod, cost := range want {
		old, ok := written[pod]
		switch {
		case !ok:
			changes = append(changes, change{patch{pod, cost}, math.MaxInt64})
		case old != cost:
			d := int64(cost) - int64(old)
			changes = append(changes, change{patch{pod, cost}, max(d, -d)})
		}
	}
	slices.SortFunc(changes, func(a, b change) int {
		if c := cmp.Compare(b.delta, a.delta); c != 0 {
			return c
		}
		return cmp.Compare(a.Pod, b.Pod)
	})
	out := make([]patch, 0, min(len(changes), limit))
	for _, c := range changes[:min(len(changes), limit)] {
		out = append(out, c.patch)
	}
	return out
}
