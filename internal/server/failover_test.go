package server

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

// The primary of the session store dies (SIGKILL) while go-sdk clients
// talk to two tether replicas, each call to the other replica: live
// sessions see no error, new sessions work again once the store failed
// over, and every session acknowledged before the kill (and replicated)
// is still in the store: a third replica started afterwards, with an
// empty cache, routes each to its backend. The figures are logged
// (go test -v -run TestFailoverThroughTwoReplicas ./internal/server/).
func TestFailoverThroughTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment and a cluster and fails them over")
	}
	t.Run("Sentinel", func(t *testing.T) {
		d := redistest.StartSentinel(t)
		testReplicaFailover(t, d.URL(), d.WaitReplicated, func(string) (string, func() (string, error)) {
			old := d.CurrentPrimary()
			old.Kill()
			return old.Addr(), d.PrimaryAddr
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		redistest.RequireCLI(t)
		c := redistest.StartCluster(t)
		testReplicaFailover(t, c.URL(), c.WaitReplicated, func(key string) (string, func() (string, error)) {
			old := c.PrimaryFor(key)
			old.Kill()
			return old.Addr(), func() (string, error) { return c.PrimaryAddrFor(key) }
		})
	})
}

// alternating sends each request to the next of its replicas in turn, as
// a load balancer in front of a tether fleet may.
type alternating struct {
	n     atomic.Int64
	hosts atomic.Pointer[[]string]
}

func (a *alternating) use(servers ...*Server) {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = s.ClientAddr().String()
	}
	a.hosts.Store(&hosts)
}

func (a *alternating) RoundTrip(r *http.Request) (*http.Response, error) {
	hosts := *a.hosts.Load()
	host := hosts[a.n.Add(1)%int64(len(hosts))]
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = host, host
	return http.DefaultTransport.RoundTrip(r)
}

// connectThrough opens a go-sdk client session whose requests go to the
// given tether replicas in turn.
func connectThrough(ctx context.Context, servers ...*Server) (*mcp.ClientSession, *alternating, error) {
	tr := &alternating{}
	tr.use(servers...)
	client := mcp.NewClient(&mcp.Implementation{Name: "failover-client", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   "http://tether.invalid/mcp",
		HTTPClient: &http.Client{Transport: tr},
	}, nil)
	return cs, tr, err
}

// testReplicaFailover: live go-sdk sessions through two tether replicas on
// the deployment at storeURL; kill kills the primary holding the record
// key it is given, and returns the dead primary's address and how to ask
// for the current one.
func testReplicaFailover(t *testing.T, storeURL string, waitReplicated func(), kill func(key string) (string, func() (string, error))) {
	const (
		live     = 12
		deadline = 60 * time.Second // bounds the traffic after the kill
		// newSessionBound is the generous bound on when new sessions work
		// again after the kill (failover ~2-3 s, + 1 s; a loaded machine).
		newSessionBound = 20 * time.Second
	)
	target, err := session.ParseRedisURL(storeURL)
	if err != nil {
		t.Fatal(err)
	}
	backends := testkit.StartBackends(t, 3)
	replica := func() *Server {
		cfg := testConfig(t, testkit.URLs(backends)...)
		cfg.Redis, cfg.RedisTimeout = target, 200*time.Millisecond // -race on 2 cores
		return startServer(t, cfg)
	}
	a, b := replica(), replica()
	ctx := t.Context()

	type liveSession struct {
		cs   *mcp.ClientSession
		tr   *alternating
		home string
	}
	sessions := make([]liveSession, live)
	for i := range sessions {
		cs, tr, err := connectThrough(ctx, a, b)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		// Calls through both replicas: each caches the session.
		for range 4 {
			home, err := mcpbackend.Whoami(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			if sessions[i].home != "" && home != sessions[i].home {
				t.Fatalf("session %d moved from %s to %s", i, sessions[i].home, home)
			}
			sessions[i] = liveSession{cs: cs, tr: tr, home: home}
		}
	}
	waitReplicated()

	old, primary := kill("tether:s:" + sessions[0].cs.ID())
	killed := time.Now()
	var promoted, lastNewFailure time.Time
	liveErrors, moved, rounds, newSessions, newFailures, okSince := 0, 0, 0, 0, 0, 0
	for promoted.IsZero() || okSince < 5 {
		if time.Since(killed) > deadline {
			t.Fatalf("within %v of the kill: promoted %v, %d new sessions in a row since the last failure",
				deadline, !promoted.IsZero(), okSince)
		}
		rounds++
		for i, s := range sessions {
			home, err := mcpbackend.Whoami(ctx, s.cs)
			switch {
			case err != nil:
				liveErrors++
				t.Logf("live session %d, %v after the kill: %v", i, time.Since(killed).Round(time.Millisecond), err)
			case home != s.home:
				moved++
			}
		}
		// A new session: its initialize through one replica, its
		// follow-ups through the other, which must find its record.
		newSessions++
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cs, _, err := connectThrough(nctx, a, b)
		if err == nil {
			for range 2 {
				if _, err = mcpbackend.Whoami(nctx, cs); err != nil {
					break
				}
			}
			cs.Close()
		}
		cancel()
		if err != nil {
			newFailures++
			lastNewFailure, okSince = time.Now(), 0
		} else {
			okSince++
		}
		if addr, err := primary(); err == nil && addr != old && promoted.IsZero() {
			promoted = time.Now()
		}
	}
	since := func(at time.Time) time.Duration {
		if at.IsZero() {
			return 0
		}
		return at.Sub(killed).Round(10 * time.Millisecond)
	}

	// Every session acknowledged before the kill is in the store: a new
	// replica, which has cached nothing, routes each to its backend.
	c := replica()
	lost := 0
	for i, s := range sessions {
		s.tr.use(c)
		home, err := mcpbackend.Whoami(ctx, s.cs)
		if err != nil || home != s.home {
			lost++
			t.Logf("session %d (%s) after the failover, through a fresh replica: %q, %v; want %s", i, s.cs.ID(), home, err, s.home)
		}
	}
	t.Logf("%s failover through 2 tether replicas, %d live go-sdk sessions: primary replaced %v after the kill, "+
		"last failed new session %v after it (%d of %d new sessions failed); live-session errors %d in %d rounds, "+
		"sessions moved %d, acknowledged sessions lost %d of %d",
		target.Topology, live, since(promoted), since(lastNewFailure), newFailures, newSessions, liveErrors, rounds, moved, lost, live)
	if liveErrors != 0 || moved != 0 || lost != 0 {
		t.Errorf("live-session errors %d, sessions moved %d, sessions lost %d; want none", liveErrors, moved, lost)
	}
	if !lastNewFailure.IsZero() && lastNewFailure.Sub(killed) > newSessionBound {
		t.Errorf("new sessions failed until %v after the kill, want within %v", since(lastNewFailure), newSessionBound)
	}
}
