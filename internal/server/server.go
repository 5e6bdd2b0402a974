// Package server is a whole tether: the client listener in front of the
// proxy, the admin listener (/healthz, /readyz, /metrics, /debug), the
// balancer fed by a discovery source, the session store and the telemetry,
// wired once. cmd/tether's serve and demo commands, the benchmark's
// profiled tether and the end-to-end tests run tether through it; the
// proxy's own tests build just the proxy around a store, with the same
// session counting (proxy.CountSessions) and stats (EndpointStats).
//
// New binds both listeners (an address in use fails before anything
// starts); Run serves until its context ends and then shuts down
// gracefully. Configuration is by value: reading flags, files and the
// environment is the caller's business.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/podcost"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// Limits of the listeners (the request-body limits are the proxy's, see
// proxy.Config).
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
	// DefaultHTTP2MaxConcurrentStreams (--http2-max-concurrent-streams) is
	// Go's own default, which h2 clients are tuned for; a GET stream holds
	// one for its whole life, so a front proxy opens another connection
	// past it. The memory behind the streams is bounded by
	// --max-inflight-body-bytes and --max-streams, not by this.
	DefaultHTTP2MaxConcurrentStreams = 250
	// DefaultClientSendTimeout (--client-send-timeout) bounds how long a
	// client may take nothing of an answer being written to it: nginx's
	// send_timeout. A client that stops reading a stream otherwise holds
	// a goroutine, a backend connection and buffers until it leaves.
	DefaultClientSendTimeout = 60 * time.Second
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

	// loadSyncInterval is how often the endpoints' session counts are
	// re-based on the fleet-wide counts (Redis only).
	loadSyncInterval = time.Second
	// adminShutdownTimeout bounds the admin listener's shutdown; its
	// answers are small and quick.
	adminShutdownTimeout = time.Second
	// cutOffTimeout bounds the wait for handlers once their contexts are
	// cancelled at the end of the grace period.
	cutOffTimeout = 2 * time.Second
	// traceFlushTimeout bounds the trace exporter's last flush.
	traceFlushTimeout = 2 * time.Second
)

// Config is a tether's configuration, by value. The zero value of a field
// is the proxy's or the store's default unless said otherwise; Source is
// required.
type Config struct {
	// Listen and AdminListen are the addresses of the client and admin
	// listeners ("127.0.0.1:0" picks a free port; see ClientAddr).
	Listen, AdminListen string
	// Source tells the backends. Required.
	Source discovery.Source
	// Balancer names the new-session placement (balancer.PickerNames);
	// "" is p2c.
	Balancer string
	// Logger receives tether's log; nil discards it.
	Logger *slog.Logger
	// Version is tether's version, in the trace resource.
	Version string

	// Redis, when set, is where the sessions live (shared by the fleet),
	// behind a local cache; nil keeps them in this process's memory.
	Redis        *session.RedisTarget
	RedisPrefix  string
	RedisTimeout time.Duration
	// SessionTTL is a session's idle TTL, SessionMaxAge its absolute cap
	// (Redis only; 0: none).
	SessionTTL, SessionMaxAge time.Duration
	// MaxSessions and MaxSessionInitBytes bound the session records held
	// in this process (the memory store's, or the Redis cache's entries).
	MaxSessions         int
	MaxSessionInitBytes int64

	// See proxy.Config.
	MaxBody, MaxInitBody int64
	// PrincipalKey keys the session principal digests. nil: with Redis, a
	// key kept in Redis and shared by the fleet (see sharedPrincipalKey);
	// without, a random key of this process.
	PrincipalKey         []byte
	PrincipalHeaders     []string
	MaxInflightBodyBytes int64
	BodyTimeout          time.Duration
	MaxStreams           int

	// AffinityHeader, when set, names the header whose value keys a
	// session-less MCP 2026-07-28 request to one backend by consistent
	// hashing with bounded loads (balancer.PickByKey, ε AffinityEpsilon;
	// 0 is balancer.DefaultAffinityEpsilon). See proxy.Config.
	AffinityHeader  string
	AffinityEpsilon float64
	// AffinityArgument is the tools/call argument the affinity header
	// carries, checked against it (required with AffinityHeader).
	AffinityArgument string
	// ListenStreamWeight is what one subscriptions/listen stream adds to
	// its backend's load (balancer.Options.ListenStreamWeight; 0 nothing).
	ListenStreamWeight float64
	// Drain is what happens to a terminating endpoint's sessions, and
	// DrainRate how many move per second off each (proxy.Config).
	Drain     proxy.DrainMode
	DrainRate float64
	// PodDeletionCost, when set, runs the pod deletion cost writer
	// (internal/podcost) while Run serves, from discovery's first snapshot
	// until shutdown begins; its Sessions are the balancer's endpoints (set
	// here). Its Logger defaults to Logger.
	PodDeletionCost *podcost.Options

	// HTTP2MaxConcurrentStreams bounds the concurrent requests of one h2c
	// client connection; 0 is DefaultHTTP2MaxConcurrentStreams.
	HTTP2MaxConcurrentStreams int
	// ClientSendTimeout is h1.Server.SendTimeout for the client listener;
	// 0 is DefaultClientSendTimeout.
	ClientSendTimeout time.Duration
	// BackendH2C speaks HTTP/2 with prior knowledge to the backends.
	BackendH2C bool
	// ShutdownGrace is how long in-flight requests and SSE streams may run
	// on once Run's context ends.
	ShutdownGrace time.Duration

	// TraceStdout, when set, receives the trace spans as JSON; Getenv
	// reads the OTEL_* variables of the trace exporter (nil: none set).
	TraceStdout io.Writer
	Getenv      func(string) string

	// Transport, when set, is the proxy's connection pool to the backends
	// (a test counts its dials); nil is backend.NewTransport(BackendH2C).
	Transport backend.Transport
	// WrapHandler, when set, wraps the client listener's handler (a test
	// observes the requests tether has finished).
	WrapHandler func(http.Handler) http.Handler
}

// ListenError is a listener that could not be bound.
type ListenError struct {
	Admin bool // the admin listener, else the client listener
	Err   error
}

func (e *ListenError) Error() string {
	name := "client"
	if e.Admin {
		name = "admin"
	}
	return name + " listener: " + e.Err.Error()
}

func (e *ListenError) Unwrap() error { return e.Err }

// errDiscoveryStopped is Run's error when the discovery source returns
// without an error before Run's context ended: tether no longer learns of
// its backends.
var errDiscoveryStopped = errors.New("discovery: the source stopped")

// Server is a tether: client and admin listeners around one proxy.
type Server struct {
	cfg     Config
	log     *slog.Logger
	bal     *balancer.Balancer
	metrics *telemetry.Metrics
	tracing *telemetry.Tracing
	// transport is the proxy's connection pool to the backends.
	transport backend.Transport
	store     session.Store
	proxy     *proxy.Proxy
	// drains is the discovery source with the operator's drains on top
	// (POST /drain).
	drains *discovery.Drains
	// podCost writes the backend pods' deletion cost; nil when off.
	podCost *podcost.Writer

	client, admin     *http.Server
	front             *h1.Server // serves client with its configuration
	clientLn, adminLn net.Listener

	ready      atomic.Bool   // false until discovery has synced, and again while draining
	synced     chan struct{} // closed when the first snapshot reached the balancer
	syncedOnce sync.Once
	ran        atomic.Bool
	// cancelRequests ends every in-flight request (and SSE stream) when the
	// shutdown grace period runs out.
	cancelRequests context.CancelFunc
	requestCtx     context.Context
}

// New wires the parts and binds both listeners, so that an address in use
// fails (a *ListenError) before anything starts. What it started is
// stopped again when it fails; once it succeeds, Run must be called, and
// stops everything when it returns.
func New(cfg Config) (_ *Server, err error) {
	if cfg.Source == nil {
		return nil, errors.New("server: no discovery source")
	}
	cfg.Balancer = cmp.Or(cfg.Balancer, "p2c")
	cfg.HTTP2MaxConcurrentStreams = cmp.Or(cfg.HTTP2MaxConcurrentStreams, DefaultHTTP2MaxConcurrentStreams)
	cfg.ClientSendTimeout = cmp.Or(cfg.ClientSendTimeout, DefaultClientSendTimeout)
	if cfg.Getenv == nil {
		cfg.Getenv = func(string) string { return "" }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	picker, err := balancer.NewPicker(cfg.Balancer, nil)
	if err != nil {
		return nil, err
	}
	var affinity *balancer.AffinityOptions
	if cfg.AffinityHeader != "" {
		if cfg.AffinityArgument == "" {
			return nil, errors.New("server: an affinity header needs the tool argument it carries (AffinityArgument)")
		}
		affinity = &balancer.AffinityOptions{Epsilon: cmp.Or(cfg.AffinityEpsilon, balancer.DefaultAffinityEpsilon)}
		if err := balancer.CheckAffinityEpsilon(affinity.Epsilon); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	s := &Server{cfg: cfg, log: log, synced: make(chan struct{}), drains: discovery.NewDrains(cfg.Source)}
	// undo stops what New started, in reverse, if New fails.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	s.bal = balancer.New(balancer.Options{Picker: picker, Logger: log, Affinity: affinity, ListenStreamWeight: cfg.ListenStreamWeight, OnUpdate: func(eps []*balancer.Endpoint) {
		s.metrics.RetainBackends(endpointURLs(eps))
		s.proxy.EndpointsChanged() // (updates begin in Run, once the proxy exists)
	}})
	s.metrics = telemetry.NewMetrics(telemetry.MetricsOptions{
		Endpoints: s.Stats,
		Store:     func() telemetry.StoreStat { return StoreStats(s.store) },
		Limits:    func() telemetry.LimitStat { return s.proxy.LimitStats() },
	})
	if s.store, err = newStore(cfg, log, s.metrics, proxy.CountSessions(s.bal)); err != nil {
		return nil, err
	}
	undo = append(undo, func() { s.store.Close() })
	principal := cfg.PrincipalKey
	if principal == nil && cfg.Redis != nil {
		principal = principalKeyFromRedis(cfg, log)
	}
	s.tracing, err = telemetry.NewTracing(context.Background(), telemetry.TracingOptions{Stdout: cfg.TraceStdout, Getenv: cfg.Getenv, Version: cfg.Version})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { s.flushTraces() })
	s.transport = cfg.Transport
	if s.transport == nil {
		s.transport = backend.NewTransport(cfg.BackendH2C)
	}
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
		AffinityHeader:   cfg.AffinityHeader,
		AffinityArgument: cfg.AffinityArgument,

		Drain:           cfg.Drain,
		DrainRate:       cfg.DrainRate,
		OperatorDrained: s.drains.Drained,
	})

	s.requestCtx, s.cancelRequests = context.WithCancel(context.Background())
	undo = append(undo, s.cancelRequests)
	var handler http.Handler = s.proxy
	if cfg.WrapHandler != nil {
		handler = cfg.WrapHandler(handler)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true) // h2c by prior knowledge only, never by Upgrade
	s.client = &http.Server{
		Handler:   handler,
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
	s.front = h1.Wrap(s.client)
	s.front.SendTimeout = cfg.ClientSendTimeout
	s.admin = &http.Server{
		Handler:           s.adminHandler(),
		ReadHeaderTimeout: adminHeaderTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    adminMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}

	if s.podCost, err = s.newPodCost(); err != nil {
		return nil, err
	}
	if s.clientLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, &ListenError{Err: err}
	}
	undo = append(undo, func() { s.clientLn.Close() })
	if s.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return nil, &ListenError{Admin: true, Err: err}
	}
	return s, nil
}

// ClientAddr is the client listener's address.
func (s *Server) ClientAddr() net.Addr { return s.clientLn.Addr() }

// AdminAddr is the admin listener's address.
func (s *Server) AdminAddr() net.Addr { return s.adminLn.Addr() }

// Ready reports what /readyz answers: discovery has synced and the server
// is not draining.
func (s *Server) Ready() bool { return s.ready.Load() }

// Synced is closed once the first discovery snapshot has reached the
// balancer: from then on a new session can be placed.
func (s *Server) Synced() <-chan struct{} { return s.synced }

// Store is the session store (for status output and tests); its records
// must not be modified.
func (s *Server) Store() session.Store { return s.store }

// LimitStats reports the client limits' use (see proxy.Proxy.LimitStats).
func (s *Server) LimitStats() telemetry.LimitStat { return s.proxy.LimitStats() }

// Stats is the balancer's view of the endpoints, as /metrics and /debug
// show it.
func (s *Server) Stats() []telemetry.EndpointStat {
	stats := EndpointStats(s.bal)
	for i := range stats {
		_, stats[i].Draining = s.proxy.Drain(stats[i].ID)
	}
	return stats
}

// Run serves until ctx ends, then shuts down gracefully: readiness off, no
// new connections, in-flight requests and SSE streams get the grace period,
// then whatever is left is cut. It returns nil after a clean shutdown.
// Whatever ends it (ctx, a listener failing, discovery failing, even before
// its first snapshot), everything New and Run started is stopped before it
// returns. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("server: Run called twice")
	}
	bgCtx, stopBackground := context.WithCancel(context.Background())
	defer stopBackground()

	discoveryErr := make(chan error, 1)
	go func() {
		var ready map[string]bool
		discoveryErr <- s.drains.Run(bgCtx, func(snap discovery.Snapshot) {
			s.bal.Update(snap)
			ready = s.dropIdleOnDeparture(ready, snap)
			s.syncedOnce.Do(func() { close(s.synced) })
		})
	}()
	go s.bal.Run(bgCtx)
	go s.proxy.RunLoadSync(bgCtx, loadSyncInterval)
	go s.proxy.RunDrains(bgCtx)
	podCostCtx, stopPodCost := context.WithCancel(bgCtx)
	defer stopPodCost()
	podCostDone := s.runPodCost(podCostCtx)

	serveErr := make(chan error, 2)
	var serving sync.WaitGroup
	serving.Go(func() { serveErr <- s.front.Serve(s.clientLn) })
	serving.Go(func() { serveErr <- s.admin.Serve(s.adminLn) })
	s.log.Info("tether serving", "listen", s.clientLn.Addr().String(), "admin", s.adminLn.Addr().String(),
		"balancer", s.cfg.Balancer, "store", s.storeName(), "tracing", cmp.Or(s.tracing.Exporter, "off"))

	var runErr error
	select {
	case <-s.synced:
		s.ready.Store(true)
		select {
		case <-ctx.Done():
		case err := <-serveErr:
			runErr = fmt.Errorf("serve: %w", err)
		case err := <-discoveryErr:
			runErr = discoveryError(err)
		}
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	case err := <-discoveryErr:
		runErr = discoveryError(err)
	}

	s.ready.Store(false)
	// The Lease is handed over as the grace period begins, not after it:
	// another replica goes on writing the pods' deletion cost at once.
	stopPodCost()
	s.log.Info("shutting down", "grace", s.cfg.ShutdownGrace.String())
	s.shutdown()
	// Shutdown closes only the listeners Serve has begun to track: a Run
	// that ends at once (discovery failing at the start) may get here
	// before its Serve goroutines ran. Closing them here, and waiting for
	// Serve to return, means nothing accepts once Run has returned.
	s.clientLn.Close()
	s.adminLn.Close()
	serving.Wait()
	<-podCostDone
	stopBackground()
	if err := s.store.Close(); err != nil {
		s.log.Warn("session store close", "err", err)
	}
	s.flushTraces()
	s.log.Info("stopped")
	return runErr
}

// discoveryError is Run's error for the source's return value, which is
// nil when the source stopped by itself.
func discoveryError(err error) error {
	if err == nil {
		return errDiscoveryStopped
	}
	return fmt.Errorf("discovery: %w", err)
}

// flushTraces flushes and stops the trace exporter.
func (s *Server) flushTraces() {
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := s.tracing.Shutdown(ctx); err != nil {
		s.log.Warn("trace exporter shutdown", "err", err)
	}
}

// shutdown stops the listeners and waits for in-flight work up to the grace
// period, then cancels what is left (SSE streams end with their context).
func (s *Server) shutdown() {
	// Shutdown waits with a fresh context: the signal's is already done.
	graceCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.front.Shutdown(graceCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
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
		case <-time.After(cutOffTimeout):
			s.front.Close()
		}
	}
	s.cancelRequests()
	adminCtx, cancelAdmin := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancelAdmin()
	s.admin.Shutdown(adminCtx)
}

// EndpointStats is the balancer's view of its endpoints, the one reading
// of it: /metrics, /debug and the benchmark report it. An ejected endpoint
// shows as "ejected" whatever discovery says of it.
func EndpointStats(bal *balancer.Balancer) []telemetry.EndpointStat {
	eps := bal.Endpoints()
	out := make([]telemetry.EndpointStat, len(eps))
	for i, e := range eps {
		state := e.State().String()
		if e.Ejected() {
			state = "ejected"
		}
		out[i] = telemetry.EndpointStat{ID: e.ID, URL: e.String(), State: state, Sessions: e.Sessions(), Inflight: e.Inflight(), ListenStreams: e.ListenStreams()}
	}
	return out
}

func (s *Server) storeName() string {
	if s.cfg.Redis != nil {
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
func (s *Server) dropIdleOnDeparture(before map[string]bool, snap discovery.Snapshot) map[string]bool {
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

// endpointURLs are the backend labels of eps' metric series.
func endpointURLs(eps []*balancer.Endpoint) []string {
	urls := make([]string, len(eps))
	for i, e := range eps {
		urls[i] = e.String()
	}
	return urls
}
