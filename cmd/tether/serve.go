package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// newLogger builds the process logger from validated settings.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	log, err := telemetry.NewLogger(w, format, level)
	if err != nil { // validated with the config; keep a usable logger anyway
		return slog.New(slog.NewTextHandler(w, nil))
	}
	return log
}

// Limits of the listeners (docs/design.md#limits; the request-body limits are the
// proxy's, see proxy.Config).
const (
	// clientHeaderTimeout: the request line and headers must arrive within
	// it (HAProxy's usual timeout http-request; nginx's
	// client_header_timeout is 60 s).
	clientHeaderTimeout = 10 * time.Second
	// clientIdleTimeout closes a keep-alive connection idle this long. It is
	// longer than the idle timeouts of the clients in front (Go's transport
	// 90 s, nginx's upstream keepalive 60 s), so the client, not tether,
	// closes an idle connection: a request written as the server closes
	// its side is lost.
	clientIdleTimeout    = 120 * time.Second
	clientMaxHeaderBytes = 64 << 10
	// defaultHTTP2MaxConcurrentStreams (--http2-max-concurrent-streams) is
	// Go's own default, which h2 clients are tuned for; a GET stream holds
	// one for its whole life, so a front proxy opens another connection
	// past it. The memory behind the streams is bounded by
	// --max-inflight-body-bytes and --max-streams, not by this.
	defaultHTTP2MaxConcurrentStreams = 250
	// h2MaxReadFrameSize is the largest frame a client may send: HTTP/2's
	// initial value. The frame read buffer of a connection grows to the
	// largest frame received and stays, so Go's 1 MiB default would let
	// every h2c connection pin 1 MiB.
	h2MaxReadFrameSize = 16 << 10
	// h2ReceiveBuffer is the flow-control window of a connection and of a
	// stream: the most request-body data a client may send that the
	// handler has not read yet (Go's default: 1 MiB each). tether reads
	// POST bodies at once; this bounds what a client can park on a
	// connection in bodies tether does not read (GET, DELETE), and still
	// moves a 4 MiB body on loopback in a few window updates.
	h2ReceiveBuffer = 256 << 10

	// The admin listener serves small, quick answers (/metrics, probes,
	// /debug): a whole request must arrive within adminReadTimeout and its
	// answer be written within adminWriteTimeout (Prometheus' default
	// scrape timeout is 10 s).
	adminHeaderTimeout  = 5 * time.Second
	adminReadTimeout    = 10 * time.Second
	adminWriteTimeout   = 30 * time.Second
	adminIdleTimeout    = 60 * time.Second
	adminMaxHeaderBytes = 16 << 10
)

// server is a running tether: client and admin listeners around one proxy.
type server struct {
	cfg     config
	log     *slog.Logger
	bal     *balancer.Balancer
	metrics *telemetry.Metrics
	tracing *telemetry.Tracing
	// transport is the proxy's connection pool to the backends.
	transport *http.Transport
	store     session.Store
	proxy     *proxy.Proxy

	client, admin     *http.Server
	clientLn, adminLn net.Listener
	ready             atomic.Bool // false until discovery has synced, and again while draining
	// cancelRequests ends every in-flight request (and SSE stream) when the
	// shutdown grace period runs out.
	cancelRequests context.CancelFunc
	requestCtx     context.Context
}

// newServer wires the parts and binds both listeners, so that an address in
// use fails before anything starts.
func newServer(cfg config, log *slog.Logger) (*server, error) {
	picker, err := balancer.NewPicker(cfg.Balancer, nil)
	if err != nil {
		return nil, err
	}
	s := &server{cfg: cfg, log: log}
	s.bal = balancer.New(balancer.Options{Picker: picker, Logger: log, OnUpdate: func(eps []*balancer.Endpoint) {
		s.metrics.RetainBackends(endpointURLs(eps))
	}})
	s.metrics = telemetry.NewMetrics(telemetry.MetricsOptions{
		Endpoints: s.endpointStats,
		Store:     s.storeStats,
		Limits:    func() telemetry.LimitStat { return s.proxy.LimitStats() },
	})
	s.store, err = newStore(cfg, log, s.metrics, func(r *session.Record) { s.proxy.SessionExpired(r) })
	if err != nil {
		return nil, err
	}
	principal, err := principalKey(cfg, log)
	if err != nil {
		s.store.Close()
		return nil, err
	}
	var traceOut io.Writer
	if cfg.TraceStdout {
		traceOut = os.Stdout
	}
	s.tracing, err = telemetry.NewTracing(context.Background(), telemetry.TracingOptions{Stdout: traceOut, Getenv: cfg.getenv, Version: version})
	if err != nil {
		s.store.Close()
		return nil, err
	}
	s.transport = proxy.NewTransport(cfg.BackendH2C)
	s.proxy = proxy.New(proxy.Config{
		Balancer:  s.bal,
		Store:     s.store,
		Transport: s.transport,
		MaxBody:   cfg.MaxBody,
		Logger:    log,

		MaxInflightBodyBytes: cfg.MaxInflightBodyBytes,
		BodyTimeout:          cfg.BodyTimeout,
		MaxStreams:           cfg.MaxStreams,

		Metrics:    s.metrics,
		Tracer:     s.tracing.Tracer(),
		Propagator: s.tracing.Propagator,

		MaxInitBody:      cfg.MaxInitBody,
		PrincipalKey:     principal,
		PrincipalHeaders: cfg.PrincipalHeaders,
	})

	s.requestCtx, s.cancelRequests = context.WithCancel(context.Background())
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true) // h2c by prior knowledge only, never by Upgrade
	s.client = &http.Server{
		Handler:   s.proxy,
		Protocols: &protos,
		// No ReadTimeout or WriteTimeout: SSE responses live for hours. The
		// body has its own deadline (--body-timeout, set by the proxy).
		ReadHeaderTimeout: clientHeaderTimeout,
		IdleTimeout:       clientIdleTimeout,
		MaxHeaderBytes:    clientMaxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          cfg.HTTP2MaxConcurrentStreams,
			MaxReadFrameSize:              h2MaxReadFrameSize,
			MaxReceiveBufferPerConnection: h2ReceiveBuffer,
			MaxReceiveBufferPerStream:     h2ReceiveBuffer,
		},
		BaseContext: func(net.Listener) context.Context { return s.requestCtx },
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	s.admin = &http.Server{
		Handler:           s.adminHandler(),
		ReadHeaderTimeout: adminHeaderTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    adminMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}

	if s.clientLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		s.store.Close()
		return nil, fmt.Errorf("--listen: %w", err)
	}
	if s.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		s.clientLn.Close()
		s.store.Close()
		return nil, fmt.Errorf("--admin-listen: %w", err)
	}
	return s, nil
}

func (s *server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", s.metrics.Handler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	// For `tether explain` and `tether status` (admin.go).
	// The admin listener may be reachable from the pod network (kubelet
	// probes cannot reach loopback); /debug stays local: kubectl exec and
	// port-forward arrive on loopback.
	mux.Handle("GET /debug/sessions/{id}", loopbackOnly(http.HandlerFunc(s.debugSession)))
	mux.Handle("GET /debug/endpoints", loopbackOnly(http.HandlerFunc(s.debugEndpoints)))
	return mux
}

// run serves until ctx ends, then shuts down gracefully: readiness off, no
// new connections, in-flight requests and SSE streams get the grace period,
// then whatever is left is cut. It returns nil after a clean shutdown.
func (s *server) run(ctx context.Context, source discovery.Source) error {
	bgCtx, stopBackground := context.WithCancel(context.Background())
	defer stopBackground()

	synced := make(chan struct{})
	var once atomic.Bool
	discoveryErr := make(chan error, 1)
	go func() {
		var ready map[string]bool
		discoveryErr <- source.Run(bgCtx, func(snap discovery.Snapshot) {
			s.bal.Update(snap)
			ready = s.dropIdleOnDeparture(ready, snap)
			if once.CompareAndSwap(false, true) {
				close(synced)
			}
		})
	}()
	go s.bal.Run(bgCtx)
	go s.proxy.RunLoadSync(bgCtx, time.Second)

	serveErr := make(chan error, 2)
	go func() { serveErr <- s.client.Serve(s.clientLn) }()
	go func() { serveErr <- s.admin.Serve(s.adminLn) }()
	s.log.Info("tether serving", "listen", s.clientLn.Addr().String(), "admin", s.adminLn.Addr().String(),
		"balancer", s.cfg.Balancer, "store", storeName(s.cfg), "tracing", cmp.Or(s.tracing.Exporter, "off"))

	select {
	case <-synced:
		s.ready.Store(true)
	case <-ctx.Done():
	case err := <-discoveryErr:
		return fmt.Errorf("discovery: %w", err)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	case err := <-discoveryErr:
		if err != nil {
			runErr = fmt.Errorf("discovery: %w", err)
		}
	}

	s.ready.Store(false)
	s.log.Info("shutting down", "grace", s.cfg.ShutdownGrace.String())
	s.shutdown()
	stopBackground()
	if err := s.store.Close(); err != nil {
		s.log.Warn("session store close", "err", err)
	}
	flushCtx, cancelFlush := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelFlush()
	if err := s.tracing.Shutdown(flushCtx); err != nil {
		s.log.Warn("trace exporter shutdown", "err", err)
	}
	s.log.Info("stopped")
	return runErr
}

// shutdown stops the listeners and waits for in-flight work up to the grace
// period, then cancels what is left (SSE streams end with their context).
func (s *server) shutdown() {
	// Shutdown waits with a fresh context: the signal's is already done.
	graceCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.client.Shutdown(graceCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			s.log.Warn("client listener shutdown", "err", err)
		}
	}()
	select {
	case <-done:
	case <-graceCtx.Done():
		s.log.Info("grace period over: ending remaining requests and streams")
		s.cancelRequests()
		// Handlers return promptly once their contexts are cancelled; the
		// deadline only guards against a stuck one.
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			s.client.Close()
		}
	}
	s.cancelRequests()
	adminCtx, cancelAdmin := context.WithTimeout(context.Background(), time.Second)
	defer cancelAdmin()
	s.admin.Shutdown(adminCtx)
}

// endpointStats is the balancer's view for the metrics scrape.
// endpointURLs are the backend labels of eps' metric series.
func endpointURLs(eps []*balancer.Endpoint) []string {
	urls := make([]string, len(eps))
	for i, e := range eps {
		urls[i] = e.String()
	}
	return urls
}

func (s *server) endpointStats() []telemetry.EndpointStat {
	eps := s.bal.Endpoints()
	out := make([]telemetry.EndpointStat, len(eps))
	for i, e := range eps {
		state := e.State().String()
		if e.Ejected() {
			state = "ejected"
		}
		out[i] = telemetry.EndpointStat{ID: e.ID, URL: e.String(), State: state, Sessions: e.Sessions(), Inflight: e.Inflight()}
	}
	return out
}

// storeStats reports the session store's counters (see storeStat).
func (s *server) storeStats() telemetry.StoreStat { return storeStat(s.store) }

func storeName(cfg config) string {
	if cfg.RedisURL != "" {
		return "redis"
	}
	return "memory"
}

// dropIdleOnDeparture closes the idle backend connections when an endpoint
// stops being ready (terminating, or gone). A terminating server closes its
// idle keep-alive connections as it shuts down; a request that picks one
// from the pool at that instant fails after it was sent, and must then be
// answered 502 rather than silently retried. Dropping them first means the
// next request dials: the refused dial is provably safe to re-route. It
// returns the new ready set.
func (s *server) dropIdleOnDeparture(before map[string]bool, snap discovery.Snapshot) map[string]bool {
	now := make(map[string]bool, len(snap.Endpoints))
	for _, e := range snap.Endpoints {
		if e.State == discovery.Ready {
			now[e.ID] = true
		}
	}
	for id := range before {
		if !now[id] {
			s.transport.CloseIdleConnections()
			break
		}
	}
	return now
}

// loopbackOnly refuses requests that do not come from a loopback address.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "/debug is served to loopback clients only", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
