package session

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// TopologyStats is what a store knows of the Redis deployment it talks to.
type TopologyStats struct {
	Topology RedisTopology
	// Primaries are the primaries tether talks to (one, or a cluster's
	// masters), as last seen; empty until first seen.
	Primaries []string
	// Failovers counts the primaries seen replaced by another.
	Failovers int64
}

// topologyWatch follows the primaries (see Redis.watchTopology).
type topologyWatch struct {
	mu        sync.Mutex
	primaries []string
	failovers int64
	stop      context.CancelFunc
	done      chan struct{}
}

// topologyPoll is how often the watch asks who the primaries are.
const topologyPoll = time.Second

// topology is the deployment behind the client.
func (r *Redis) topology() RedisTopology {
	switch r.client.(type) {
	case *redis.ClusterClient:
		return RedisCluster
	case *redis.Client:
		if r.sentinel {
			return RedisSentinel
		}
	}
	return RedisSingle
}

// Topology reports the deployment, its primaries and the failovers seen.
// Primaries of one server are its address, and never fail over.
func (r *Redis) Topology() TopologyStats {
	st := TopologyStats{Topology: r.topology()}
	if c, ok := r.client.(*redis.Client); ok && !r.sentinel {
		st.Primaries = []string{c.Options().Addr}
		return st
	}
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	st.Primaries, st.Failovers = slices.Clone(w.primaries), w.failovers
	return st
}

// watchTopology starts following the primaries of a Sentinel or Cluster
// deployment every topologyPoll, until Close: a primary that leaves the
// set counts as a failover.
func (r *Redis) watchTopology() {
	if r.topology() == RedisSingle {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	r.watch.stop, r.watch.done = stop, make(chan struct{})
	go func() {
		defer close(r.watch.done)
		t := time.NewTicker(topologyPoll)
		defer t.Stop()
		for {
			r.observePrimaries(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// observePrimaries asks for the primaries once and counts the ones gone.
func (r *Redis) observePrimaries(ctx context.Context) {
	now, err := r.primaries(ctx)
	if err != nil || len(now) == 0 {
		return // down or failing over: the next answer tells
	}
	slices.Sort(now)
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.primaries {
		if !slices.Contains(now, p) {
			w.failovers++
		}
	}
	w.primaries = now
}

// primaries asks the deployment for its primaries: the address the
// Sentinel-found primary's connection is to (CLIENT INFO's laddr), or
// the masters of the cluster client's slot map.
func (r *Redis) primaries(ctx context.Context) ([]string, error) {
	ctx, cancel := r.call(ctx, 4*r.timeout)
	defer cancel()
	switch c := r.client.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		var out []string
		err := c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			mu.Lock()
			out = append(out, m.Options().Addr)
			mu.Unlock()
			return nil
		})
		return out, err
	default:
		info, err := r.client.Do(ctx, "CLIENT", "INFO").Text()
		if err != nil {
			return nil, err
		}
		for field := range strings.FieldsSeq(info) {
			if addr, ok := strings.CutPrefix(field, "laddr="); ok {
				return []string{addr}, nil
			}
		}
		return nil, badReply("CLIENT INFO without laddr")
	}
}

// stopWatch ends the watch, if any.
func (r *Redis) stopWatch() {
	if r.watch.stop != nil {
		r.watch.stop()
		<-r.watch.done
	}
}

// Topology is the shared store's (see Redis.Topology).
func (c *Cache) Topology() TopologyStats { return c.shared.Topology() }
