package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// fleet is several tether replicas sharing one Redis, in front of the same
// go-sdk backends.
type fleet struct {
	backends []*mcpbackend.Backend
	replicas []*harness
	redis    *redistest.Server
}

func newFleet(t *testing.T, replicas, backends int, o harnessOptions) *fleet {
	t.Helper()
	f := &fleet{redis: redistest.Start(t)}
	f.backends = testkit.StartBackends(t, backends)
	urls := testkit.URLs(f.backends)
	o.redis = f.redis
	for range replicas {
		h := newTether(t, urls, o)
		h.backends = f.backends
		f.replicas = append(f.replicas, h)
	}
	return f
}

func (f *fleet) backend(name string) *mcpbackend.Backend {
	for _, b := range f.backends {
		if b.Name == name {
			return b
		}
	}
	return nil
}

// switchingTransport sends every request to the replica currently chosen,
// so one client session can move between replicas as a proxy's would.
type switchingTransport struct{ target atomic.Pointer[url.URL] }

func (s *switchingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	u := s.target.Load()
	r.URL.Host, r.Host = u.Host, u.Host
	return http.DefaultTransport.RoundTrip(r)
}

func (s *switchingTransport) use(h *harness) {
	u, _ := url.Parse(h.front.URL)
	s.target.Store(u)
}

func connectVia(ctx context.Context, t *testing.T, st *switchingTransport) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "fleet-client", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   "http://tether.invalid/mcp",
		HTTPClient: &http.Client{Transport: st},
	}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return cs
}

// Sessions initialized through one replica route correctly through
// another, and survive the first replica's death.
func TestReplicasShareSessions(t *testing.T) {
	f := newFleet(t, 2, 3, harnessOptions{})
	a, b := f.replicas[0], f.replicas[1]
	ctx := testContext(t)

	type client struct {
		cs   *mcp.ClientSession
		tr   *switchingTransport
		home string
	}
	var clients []*client
	for range 12 {
		c := &client{tr: &switchingTransport{}}
		c.tr.use(a)
		c.cs = connectVia(ctx, t, c.tr)
		defer c.cs.Close()
		home, err := whoami(ctx, c.cs)
		if err != nil {
			t.Fatal(err)
		}
		c.home = home
		clients = append(clients, c)
	}
	// Replica A dies; every session continues through B, on its backend.
	a.front.Close()
	for i, c := range clients {
		c.tr.use(b)
		for range 3 {
			got, err := whoami(ctx, c.cs)
			if err != nil {
				t.Fatalf("session %d through B: %v", i, err)
			}
			if got != c.home {
				t.Errorf("session %d moved from %s to %s through B", i, c.home, got)
			}
		}
	}
	for _, be := range f.backends {
		if n := be.Initialized.Load(); n > int64(len(clients)) {
			t.Errorf("%s saw %d notifications/initialized: a session was re-initialized", be.Name, n)
		}
	}
}

// Both replicas find the session's backend dead at the same moment: one
// re-initialization wins, the other replica adopts it and ends its orphan.
func TestReplicasReinitializeOnce(t *testing.T) {
	f := newFleet(t, 2, 3, harnessOptions{})
	a, b := f.replicas[0], f.replicas[1]
	ctx := testContext(t)

	tr := &switchingTransport{}
	tr.use(a)
	cs := connectVia(ctx, t, tr)
	defer cs.Close()
	home, err := whoami(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	sid := cs.ID()
	f.backend(home).Kill(50 * time.Millisecond)

	// Requests of the session arrive at both replicas at once.
	const perReplica = 8
	var wg sync.WaitGroup
	errs := make(chan error, 2*perReplica)
	for r, h := range []*harness{a, b} {
		for i := range perReplica {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := h.tryPost(sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"whoami"}}`, 100*(r+1)+i),
					"Mcp-Protocol-Version", "2025-06-18")
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"backend"`) || strings.Contains(string(body), home) {
					errs <- fmt.Errorf("status %d: %s", resp.StatusCode, body)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	rec, err := a.store.Reload(ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Reinits != 1 {
		t.Errorf("record re-initialized %d times, want 1", rec.Reinits)
	}
	// No orphan: the survivors hold exactly one backend session for it.
	live := 0
	for _, be := range f.backends {
		if be.Name != home {
			live += be.LiveSessions()
		}
	}
	if live != 1 {
		t.Errorf("survivors hold %d backend sessions for one client session, want 1 (orphans not ended)", live)
	}
	// And the client's own session carries on through either replica.
	for _, h := range []*harness{a, b} {
		tr.use(h)
		if got, err := whoami(ctx, cs); err != nil || got != f.backendNameOf(t, rec.BackendURL) {
			t.Errorf("through %s: %q, %v; want %s", h.front.URL, got, err, rec.BackendURL)
		}
	}
}

func (f *fleet) backendNameOf(t *testing.T, url string) string {
	for _, b := range f.backends {
		if b.URL() == url {
			return b.Name
		}
	}
	t.Fatalf("no backend at %s", url)
	return ""
}

// New sessions placed concurrently by two replicas spread by the load of
// the whole fleet.
func TestReplicasBalanceTogether(t *testing.T) {
	f := newFleet(t, 2, 3, harnessOptions{loadSync: 50 * time.Millisecond})
	const perReplica = 100
	var wg sync.WaitGroup
	errs := make(chan error, 2*perReplica)
	for _, h := range f.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perReplica {
				resp, err := h.tryPost("", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c%d","version":"1"}}}`, i))
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get("Mcp-Session-Id") == "" {
					errs <- fmt.Errorf("initialize: %d", resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	max, total := int64(0), int64(0)
	counts := map[string]int64{}
	for _, b := range f.backends {
		n := b.Initializes.Load()
		counts[b.Name] = n
		total += n
		if n > max {
			max = n
		}
	}
	ratio := float64(max) / (float64(total) / 3)
	t.Logf("sessions per backend %v, max/mean %.3f", counts, ratio)
	if total != 2*perReplica || ratio > 1.10 {
		t.Errorf("sessions per backend %v: max/mean %.3f, want <= 1.10", counts, ratio)
	}
}

// A record rewritten in Redis to point elsewhere is never followed: tether
// only dials endpoints it discovered itself.
func TestTamperedRecordIsNeverFollowed(t *testing.T) {
	f := newFleet(t, 1, 2, harnessOptions{})
	h := f.replicas[0]
	ctx := testContext(t)
	canary, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer canary.Close()
	var dialled atomic.Int64
	go func() {
		for {
			c, err := canary.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()

	cs := h.connect(ctx)
	defer cs.Close()
	if _, err := whoami(ctx, cs); err != nil {
		t.Fatal(err)
	}
	raw := redis.NewClient(&redis.Options{Addr: f.redis.Addr()})
	defer raw.Close()
	canaryURL := "http://" + canary.Addr().String()
	for _, id := range []string{canaryURL, f.backends[0].URL() + "x"} { // an unknown id, and a near-miss
		if err := raw.HSet(ctx, "tether:s:"+cs.ID(), "b", id, "u", canaryURL).Err(); err != nil {
			t.Fatal(err)
		}
		h.cache.Invalidate(cs.ID()) // as if this replica had not cached it
		if _, err := whoami(ctx, cs); err != nil {
			t.Errorf("client not served after tampering: %v", err)
		}
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("the canary address taken from Redis was dialled %d times", n)
	}
}

// commandCounter is a go-redis hook counting the commands sent.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// At steady state a follow-up request costs Redis almost nothing: reads are
// cached, TTL refreshes are rate-limited and asynchronous.
func TestRedisCommandsPerFollowUp(t *testing.T) {
	counter := &commandCounter{}
	f := newFleet(t, 1, 2, harnessOptions{hook: counter})
	h := f.replicas[0]
	ctx := testContext(t)
	var sessions []*mcp.ClientSession
	for range 5 {
		cs := h.connect(ctx)
		defer cs.Close()
		sessions = append(sessions, cs)
	}
	before := counter.n.Load()
	const calls = 200
	for i := range calls {
		if _, err := whoami(ctx, sessions[i%len(sessions)]); err != nil {
			t.Fatal(err)
		}
	}
	perCall := float64(counter.n.Load()-before) / calls
	t.Logf("%.3f Redis commands per follow-up request", perCall)
	if perCall > 0.1 {
		t.Errorf("%.3f Redis commands per follow-up, want <= 0.1", perCall)
	}
}

var _ = errors.New
