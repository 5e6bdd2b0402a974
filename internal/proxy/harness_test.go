package proxy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
	"github.com/tether-mcp/tether/internal/testkit"
)

// harness is tether in front of real go-sdk MCP backends, on loopback.
type harness struct {
	t        testing.TB
	backends []*mcpbackend.Backend
	bal      *balancer.Balancer
	store    session.Store
	mem      *session.Memory // the store, when it is the memory store
	cache    *session.Cache  // the store, when it is Redis behind a cache
	proxy    *proxy.Proxy
	front    *testkit.Front
	metrics  *telemetry.Metrics // set with harnessOptions.metrics
}

type harnessOptions struct {
	backends int
	picker   string
	maxBody  int64
	redis    *redistest.Server // share this Redis instead of the memory store
	// redisTimeout is the call budget for Redis (default 200ms: the race
	// detector on 2 cores is slow).
	redisTimeout time.Duration
	hook         redis.Hook // observes every Redis command, when set
	loadSync     time.Duration
	// tracer traces requests; nil leaves tracing off, as by default.
	tracer trace.Tracer
	// metrics gives the proxy a telemetry.Metrics (h.metrics) wired as
	// cmd/tether wires it: endpoint gauges from the balancer, store round
	// trips, cache counters and the degraded gauge.
	metrics bool
	// transport sends to the backends; nil is backend.NewTransport(false).
	transport http.RoundTripper
	// wrapStore, when set, puts a test store in front of the session store.
	wrapStore func(session.Store) session.Store
	// principalHeaders is proxy.Config.PrincipalHeaders.
	principalHeaders []string
	// maxSessions bounds the session records held (the memory store's, or
	// the cache's); 0 is the default bound.
	maxSessions int
	// stateless starts go-sdk backends in stateless mode: dual-era
	// servers that take MCP 2026-07-28 requests and sessionless legacy
	// ones.
	stateless bool
	// drainRate is proxy.Config.DrainRate (0: the default); drains run in
	// every harness (RunDrains), started by fence.
	drainRate float64
	// logTo receives tether's warnings and errors (when not verbose, where
	// everything goes to stderr): a test prints them when it fails.
	logTo io.Writer
}

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	if o.backends == 0 {
		o.backends = 3
	}
	backends := testkit.StartBackendsWith(t, o.backends, mcpbackend.Options{Stateless: o.stateless})
	h := newTether(t, testkit.URLs(backends), o)
	h.backends = backends
	return h
}

// newStaticHarness is tether in front of arbitrary backends.
func newStaticHarness(t *testing.T, urls ...string) *harness {
	return newTether(t, urls, harnessOptions{})
}

func newTether(t testing.TB, urls []string, o harnessOptions) *harness {
	t.Helper()
	if o.picker == "" {
		o.picker = "p2c"
	}
	h := &harness{t: t}
	picker, err := balancer.NewPicker(o.picker, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if _, isBench := t.(*testing.B); testing.Verbose() && !isBench {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	} else if o.logTo != nil {
		log = slog.New(slog.NewTextHandler(o.logTo, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	h.bal = balancer.New(balancer.Options{Picker: picker, Logger: log, ProbeInterval: 50 * time.Millisecond, EjectBase: 100 * time.Millisecond})
	src, err := discovery.NewStatic(urls)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	synced := make(chan struct{})
	go src.Run(ctx, func(s discovery.Snapshot) { h.bal.Update(s); close(synced) })
	<-synced
	go h.bal.Run(ctx)

	if o.metrics {
		h.metrics = newHarnessMetrics(h)
	}
	if o.redis == nil {
		h.mem = session.NewMemory(session.MemoryOptions{TTL: time.Hour, MaxSessions: o.maxSessions, OnChange: proxy.CountSessions(h.bal)})
		h.store = h.mem
	} else {
		if o.redisTimeout == 0 {
			o.redisTimeout = 200 * time.Millisecond
		}
		opt, err := redis.ParseURL(o.redis.URL())
		if err != nil {
			t.Fatal(err)
		}
		client := session.NewRedisClient(opt, o.redisTimeout)
		if o.hook != nil {
			client.AddHook(o.hook)
		}
		ropts := session.RedisOptions{Client: client, Timeout: o.redisTimeout}
		copts := session.CacheOptions{Logger: log, Size: o.maxSessions, OnChange: proxy.CountSessions(h.bal)}
		if h.metrics != nil {
			ropts.Observe, copts.OnDegraded = h.metrics.StoreOp, h.metrics.StoreDegraded
		}
		copts.Shared = session.NewRedis(ropts)
		h.cache = session.NewCache(copts)
		h.store = h.cache
	}
	if o.wrapStore != nil {
		h.store = o.wrapStore(h.store)
	}
	t.Cleanup(func() { h.store.Close() })
	h.proxy = proxy.New(proxy.Config{Balancer: h.bal, Store: h.store, Logger: log, MaxBody: o.maxBody,
		Metrics: h.metrics, Tracer: o.tracer, Transport: o.transport, PrincipalHeaders: o.principalHeaders,
		DrainRate: o.drainRate})
	go h.proxy.RunDrains(ctx)
	if o.loadSync > 0 {
		go h.proxy.RunLoadSync(ctx, o.loadSync)
	}
	h.front = testkit.StartFront(t, h.proxy, nil)
	return h
}

// recordingBackend is a plain HTTP backend that records what reached it.
type recordingBackend struct {
	*httptest.Server
	mu       sync.Mutex
	requests []*http.Request // clones, bodies read into bodies
	bodies   []string
}

func newRecordingBackend(t *testing.T, handle func(r *http.Request)) *recordingBackend {
	rb := &recordingBackend{}
	rb.Server = testkit.StartServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rb.mu.Lock()
		rb.requests = append(rb.requests, r.Clone(context.Background()))
		rb.bodies = append(rb.bodies, string(body))
		if handle != nil {
			handle(r)
		}
		rb.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	}))
	return rb
}

func (rb *recordingBackend) last() (*http.Request, string) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if len(rb.requests) == 0 {
		return nil, ""
	}
	return rb.requests[len(rb.requests)-1], rb.bodies[len(rb.bodies)-1]
}

// assertHealthyStatic checks that tether still forwards a stateless request.
func assertHealthyStatic(t *testing.T, h *harness) {
	t.Helper()
	resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("tether unhealthy afterwards: status %d", resp.StatusCode)
	}
}

func (h *harness) endpoint() string { return h.front.URL + "/mcp" }

// connect opens a go-sdk client session through tether, on the test
// goroutine (it fails the test on error).
func (h *harness) connect(ctx context.Context) *mcp.ClientSession {
	h.t.Helper()
	cs, err := h.tryConnect(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	return cs
}

// tryConnect is connect for goroutines the test starts: it returns the
// error for the test goroutine to report.
func (h *harness) tryConnect(ctx context.Context) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.endpoint()}, nil)
	if err != nil {
		return nil, fmt.Errorf("connect through tether: %w", err)
	}
	return cs, nil
}

// whoami calls the whoami tool and returns the backend's name.
func whoami(ctx context.Context, cs *mcp.ClientSession) (string, error) {
	return mcpbackend.Whoami(ctx, cs)
}

func (h *harness) backend(name string) *mcpbackend.Backend {
	for _, b := range h.backends {
		if b.Name == name {
			return b
		}
	}
	h.t.Fatalf("no backend %q", name)
	return nil
}

// post sends a raw JSON-RPC POST through tether, on the test goroutine
// (it fails the test on error).
func (h *harness) post(sid, body string, hdr ...string) *http.Response {
	h.t.Helper()
	resp, err := h.tryPost(sid, body, hdr...)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// tryPost is post for goroutines the test starts: it returns the error for
// the test goroutine to report.
func (h *harness) tryPost(sid, body string, hdr ...string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, h.endpoint(), stringsReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return http.DefaultClient.Do(req)
}

// countedSessions is the balancer's live-session count over all endpoints.
func (h *harness) countedSessions() (n int64) {
	for _, ep := range h.bal.Endpoints() {
		n += ep.Sessions()
	}
	return n
}
