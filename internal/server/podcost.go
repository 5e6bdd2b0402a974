package server

import (
	"cmp"
	"context"

	"github.com/tether-mcp/tether/internal/podcost"
)

// newPodCost builds the pod deletion cost writer of Config.PodDeletionCost
// (nil when it is off), fed by the balancer's endpoints.
func (s *Server) newPodCost() (*podcost.Writer, error) {
	if s.cfg.PodDeletionCost == nil {
		return nil, nil
	}
	o := *s.cfg.PodDeletionCost
	o.Sessions = s.podSessions
	o.Logger = cmp.Or(o.Logger, s.log)
	return podcost.New(o)
}

// podSessions is every endpoint that has a pod, with its live sessions:
// fleet-wide with Redis (re-based every loadSyncInterval), this replica's
// own without. A terminating or drained endpoint counts too, so that the
// cost of a pod that is being emptied follows it down.
func (s *Server) podSessions() []podcost.PodSessions {
	var out []podcost.PodSessions
	for _, e := range s.bal.Endpoints() {
		if e.Pod != "" {
			out = append(out, podcost.PodSessions{Pod: e.Pod, Sessions: e.Sessions()})
		}
	}
	return out
}

// runPodCost runs the writer, when there is one, from discovery's first
// snapshot until ctx ends; the channel is closed once it has stopped and
// released its Lease.
func (s *Server) runPodCost(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if s.podCost == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		select {
		case <-s.synced:
		case <-ctx.Done():
			return
		}
		s.podCost.Run(ctx)
	}()
	return done
}
