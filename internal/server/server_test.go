package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
	"github.com/tether-mcp/tether/internal/testkit"
)

// testConfig is a server on ephemeral loopback ports in front of the
// static backends; without backends, its source waits for the end of Run
// without a snapshot.
func testConfig(t testing.TB, backends ...string) Config {
	t.Helper()
	var src discovery.Source = sourceFunc(func(ctx context.Context, _ func(discovery.Snapshot)) error {
		<-ctx.Done()
		return nil
	})
	if len(backends) > 0 {
		static, err := discovery.NewStatic(backends)
		if err != nil {
			t.Fatal(err)
		}
		src = static
	}
	return Config{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Source: src, ShutdownGrace: time.Second}
}

// startServer runs a server with cfg until the test ends and waits until
// it is ready.
func startServer(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status("http://"+s.AdminAddr().String()+"/readyz") == 200 }, "ready")
	return s
}

// refused reports whether nothing accepts connections at addr any more.
func refused(addr net.Addr) bool {
	conn, err := net.DialTimeout("tcp", addr.String(), time.Second)
	if err != nil {
		return true
	}
	conn.Close()
	return false
}

// sourceFunc is a discovery source that runs run.
type sourceFunc func(ctx context.Context, update func(discovery.Snapshot)) error

func (f sourceFunc) Run(ctx context.Context, update func(discovery.Snapshot)) error {
	return f(ctx, update)
}

// If discovery fails before its first snapshot, Run returns its error
// having closed both listeners (they used to go on serving), and the
// server never became ready.
func TestDiscoveryFailingBeforeSyncStopsEverything(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"error": {errors.New("no such Service"), "discovery: no such Service"},
		// A source returning nil must not produce "%!w(<nil>)".
		"nil": {nil, errDiscoveryStopped.Error()},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Source = sourceFunc(func(context.Context, func(discovery.Snapshot)) error { return tc.err })
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Run(context.Background()) // returns by itself: discovery ended it
			if err == nil || err.Error() != tc.want {
				t.Errorf("Run: %v, want %q", err, tc.want)
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("Run: %v does not wrap the source's error", err)
			}
			if tc.err == nil && !errors.Is(err, errDiscoveryStopped) {
				t.Errorf("Run: %v, want errDiscoveryStopped", err)
			}
			if s.Ready() {
				t.Error("ready after discovery failed")
			}
			for _, addr := range []net.Addr{s.ClientAddr(), s.AdminAddr()} {
				if !refused(addr) {
					t.Errorf("%s still accepts connections after Run returned", addr)
				}
			}
		})
	}
}

// A source that stops without an error after its first snapshot ends Run
// with errDiscoveryStopped too: tether would no longer learn of changes.
func TestDiscoveryStoppingAfterSync(t *testing.T) {
	cfg := testConfig(t)
	stop := make(chan struct{})
	cfg.Source = sourceFunc(func(ctx context.Context, update func(discovery.Snapshot)) error {
		update(discovery.Snapshot{})
		<-stop
		return nil
	})
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	<-s.Synced()
	testkit.Eventually(t, 10*time.Second, s.Ready, "ready")
	close(stop)
	if err := <-done; !errors.Is(err, errDiscoveryStopped) {
		t.Errorf("Run: %v, want errDiscoveryStopped", err)
	}
	if !refused(s.ClientAddr()) || !refused(s.AdminAddr()) {
		t.Error("a listener still accepts connections after Run returned")
	}
}

// A listener that cannot be bound fails New, naming which, and leaves
// nothing bound.
func TestListenErrorStopsWhatStarted(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()

	cfg := testConfig(t)
	cfg.Listen, cfg.AdminListen = freeAddr, taken.Addr().String()
	_, err = New(cfg)
	var le *ListenError
	if !errors.As(err, &le) || !le.Admin {
		t.Fatalf("New: %v, want the admin listener's ListenError", err)
	}
	// The client listener, bound first, was closed again.
	ln, err := net.Listen("tcp", freeAddr)
	if err != nil {
		t.Fatalf("the client listener's address is still taken: %v", err)
	}
	ln.Close()
}

func TestAdminEndpoints(t *testing.T) {
	s := startServer(t, testConfig(t, testkit.PingBackend(t).URL))
	admin := "http://" + s.AdminAddr().String()
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/nope": 404} {
		if got := testkit.Status(admin + path); got != want {
			t.Errorf("GET %s: %d, want %d", path, got, want)
		}
	}
	if !s.Ready() {
		t.Error("Ready() false while /readyz answers 200")
	}
}

// An ejected endpoint is reported as such by Stats, which /metrics and
// /debug share (the benchmark's copy of it never said "ejected").
func TestStatsReportEjected(t *testing.T) {
	backend := testkit.PingBackend(t)
	s := startServer(t, testConfig(t, backend.URL))
	eps := s.bal.Endpoints()
	if len(eps) != 1 {
		t.Fatalf("%d endpoints, want 1", len(eps))
	}
	if got := s.Stats()[0].State; got != "ready" {
		t.Errorf("state %q, want ready", got)
	}
	s.bal.Eject(eps[0], errors.New("test"))
	if got := s.Stats()[0].State; got != "ejected" {
		t.Errorf("state %q after an ejection, want ejected", got)
	}
}

// MaxSessions and MaxSessionInitBytes bound the memory store, the evicted
// session is told as expired, and the evictions show on /metrics by
// reason.
func TestStoreBoundsAndEvictionMetric(t *testing.T) {
	cfg := Config{MaxSessions: 2, MaxSessionInitBytes: 1 << 20}
	var expired []string
	store, err := newStore(cfg, slog.New(slog.DiscardHandler), nil, func(c session.Change) {
		if c.Kind == session.Expired {
			expired = append(expired, c.Old.ClientSID)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, id := range []string{"a", "b", "c"} {
		if err := store.Create(context.Background(), &session.Record{ClientSID: id, BackendID: "pod-1", Init: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if len(expired) != 1 || expired[0] != "a" {
		t.Errorf("evicted %v, want [a]", expired)
	}
	for _, id := range []string{"t1", "t2"} {
		if err := store.(session.TaskStore).PutTask(context.Background(), session.TaskRecord{TaskID: id, BackendID: "pod-1"}); err != nil {
			t.Fatal(err)
		}
	}
	m := telemetry.NewMetrics(telemetry.MetricsOptions{Store: func() telemetry.StoreStat { return StoreStats(store) }})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`tether_session_evictions_total{reason="max_sessions"} 1`,
		`tether_session_evictions_total{reason="max_init_bytes"} 0`,
		"tether_session_records 2",
		"tether_session_init_bytes 2",
		"tether_task_records 2",
		"tether_task_evictions_total 0",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// When an endpoint stops being ready, the idle connections of the pool are
// dropped, so no request is sent on a connection the terminating backend is
// about to close.
func TestIdleConnectionsDroppedWhenAnEndpointLeaves(t *testing.T) {
	closed := make(chan struct{}, 1)
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	backend.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	backend.Start()
	defer backend.Close()

	s := &Server{transport: &http.Transport{}}
	resp, err := (&http.Client{Transport: s.transport}).Get(backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // the connection is now idle in the pool

	a := discovery.Endpoint{ID: "a", State: discovery.Ready}
	b := discovery.Endpoint{ID: "b", State: discovery.Ready}
	ready := s.dropIdleOnDeparture(nil, discovery.Snapshot{Endpoints: []discovery.Endpoint{a, b}})
	select {
	case <-closed:
		t.Fatal("idle connections dropped although no endpoint left")
	default:
	}
	b.State = discovery.Fenced
	s.dropIdleOnDeparture(ready, discovery.Snapshot{Endpoints: []discovery.Endpoint{a, b}})
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle connection survived an endpoint turning terminating")
	}
}

func TestDebugIsLoopbackOnly(t *testing.T) {
	h := loopbackOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for addr, want := range map[string]int{"127.0.0.1:5000": 200, "[::1]:5000": 200, "10.244.0.7:5000": 403, "garbage": 403} {
		r := httptest.NewRequest("GET", "/debug/endpoints", nil)
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("from %s: %d, want %d", addr, w.Code, want)
		}
	}
}

// TestAffinityConfig: --affinity-header builds the balancer's ring (and
// hands the header to the proxy); a bad ε is refused before anything
// starts.
func TestAffinityConfig(t *testing.T) {
	cfg := testConfig(t, testkit.PingBackend(t).URL)
	cfg.AffinityHeader, cfg.AffinityArgument = "Mcp-Param-Workspace", "workspace"
	s := startServer(t, cfg)
	if !s.bal.KeyAffinity() {
		t.Error("AffinityHeader set, but the balancer has no key ring")
	}
	if _, err := s.bal.PickByKey("ws-1", nil); err != nil {
		t.Errorf("PickByKey: %v", err)
	}

	plain := startServer(t, testConfig(t, testkit.PingBackend(t).URL))
	if plain.bal.KeyAffinity() {
		t.Error("no AffinityHeader, but the balancer builds a key ring")
	}

	cfg = testConfig(t)
	cfg.AffinityHeader, cfg.AffinityArgument, cfg.AffinityEpsilon = "Mcp-Param-Workspace", "workspace", -1
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "epsilon") {
		t.Errorf("New with ε = -1: %v, want an epsilon error", err)
	}
	cfg = testConfig(t)
	cfg.AffinityHeader = "Mcp-Param-Workspace"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "AffinityArgument") {
		t.Errorf("New with an affinity header and no argument: %v, want an error naming AffinityArgument", err)
	}
}
