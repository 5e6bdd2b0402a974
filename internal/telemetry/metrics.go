package telemetry

import (
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are tether's Prometheus metrics, on a registry of their own (no
// global state: two tethers in one test process do not collide).
type Metrics struct {
	Registry *prometheus.Registry

	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	reinits         *prometheus.CounterVec
	drainDuration   prometheus.Histogram
	pickDuration    prometheus.Histogram
	storeDuration   *prometheus.HistogramVec
	storeErrors     *prometheus.CounterVec
	storeDegraded   prometheus.Gauge
	limitRejections *prometheus.CounterVec
	tasks           taskMetrics

	// series caches each request series' collectors (Request), copied on
	// write; seriesMu serialises its writers, RetainBackends included.
	series   atomic.Pointer[map[requestKey]*requestSeries]
	seriesMu sync.Mutex
}

// EndpointStat is one endpoint as the metrics see it at scrape time.
type EndpointStat struct {
	ID, URL, State     string // State: ready, fenced, ejected
	Sessions, Inflight int64
	ListenStreams      int64 // open subscriptions/listen streams
	// Draining: tether moves the endpoint's sessions elsewhere (it
	// terminates, or an operator drains it).
	Draining bool
}

// StoreStat is the session store's state at scrape time.
type StoreStat struct {
	CacheHits, CacheMisses int64
	Pending                int   // records kept locally, waiting for Redis
	Unwritten              int64 // records that could not be kept
	// Sessions are the records held in this process (memory store, or the
	// cache's entries); InitBytes their distinct initialize bodies' bytes.
	Sessions  int
	InitBytes int64
	// Evictions to respect --max-sessions and --max-session-init-bytes.
	EvictedMaxSessions, EvictedMaxInitBytes int64
	// SlowReplies: Redis calls that failed while Redis answered the health
	// probe (not outages). Recoveries: times Redis was found to have lost
	// its data; WrittenBack: records written back then. Collisions:
	// records kept locally whose id another session took in Redis.
	// UnflushedAtClose: records kept during an outage that Close could not
	// write.
	SlowReplies, Recoveries, WrittenBack, Collisions, UnflushedAtClose int64
	// TaskRecords are the task records held in this process (memory store;
	// with Redis they live in Redis only); EvictedMaxTasks those evicted at
	// the store's bound.
	TaskRecords     int
	EvictedMaxTasks int64
	// Topology is the Redis deployment (single, sentinel, cluster; "" for
	// the memory store), Primaries the primaries tether talks to, and
	// Failovers the primaries seen replaced.
	Topology  string
	Primaries []string
	Failovers int64
}

// MetricsOptions wires the scrape-time views.
type MetricsOptions struct {
	// Endpoints lists the current endpoints (per-backend gauges).
	Endpoints func() []EndpointStat
	// Store reports the store's counters; nil for the memory store.
	Store func() StoreStat
	// Limits reports the use of the client limits; nil = not exported.
	Limits func() LimitStat
}

// LimitStat is the use of the client limits at scrape time.
type LimitStat struct {
	InflightBodyBytes int64 // request-body bytes held
	OpenStreams       int64 // GET streams open
}

// NewMetrics registers every tether metric plus the Go and process
// collectors.
func NewMetrics(opts MetricsOptions) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_requests_total",
		Help: "Client requests by routing decision (new, sticky, reinit, stateless, or refused), protocol era (legacy, modern), JSON-RPC method (a bounded set, else other), backend and HTTP status.",
	}, []string{"route", "era", "method", "backend", "code"})
	m.requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tether_request_duration_seconds",
		Help:    "Time to the end of the response by routing decision (SSE streams included: their whole life).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"route"})
	m.reinits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_reinitializations_total",
		Help: "Transparent session re-initializations by reason (backend_gone, backend_ejected, dial_failed, session_lost, drain: moved ahead of its backend's exit) and result (ok, failed, adopted, refused: the request's credentials are not the session creator's).",
	}, []string{"reason", "result"})
	m.drainDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tether_drain_duration_seconds",
		Help:    "Time from a backend's drain start until it held no session (one observation per drain that empties its backend).",
		Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600},
	})
	m.pickDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tether_pick_duration_seconds",
		Help:    "Time the balancer took to choose a backend.",
		Buckets: []float64{25e-9, 50e-9, 100e-9, 250e-9, 500e-9, 1e-6, 5e-6, 25e-6},
	})
	m.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tether_store_operation_duration_seconds",
		Help:    "Session store round trips by operation (shared store only; cache hits cost none).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
	}, []string{"op"})
	m.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_store_errors_total",
		Help: "Session store operations that failed (timeouts, refused connections), by operation.",
	}, []string{"op"})
	m.storeDegraded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tether_store_degraded",
		Help: "1 while the shared session store is unreachable and tether serves from its cache.",
	})
	m.limitRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_limit_rejections_total",
		Help: "Requests refused because a limit was reached, by limit (inflight_body, streams, body_timeout, body_size, ...).",
	}, []string{"limit"})
	m.Registry.MustRegister(m.requests, m.requestDuration, m.reinits, m.drainDuration, m.pickDuration,
		m.storeDuration, m.storeErrors, m.storeDegraded, m.limitRejections,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.tasks = newTaskMetrics(m.Registry)
	if opts.Endpoints != nil {
		m.Registry.MustRegister(&endpointCollector{list: opts.Endpoints})
	}
	if opts.Store != nil {
		m.Registry.MustRegister(&storeCollector{stat: opts.Store})
	}
	if opts.Limits != nil {
		m.Registry.MustRegister(&limitCollector{stat: opts.Limits})
	}
	return m
}

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// codes holds the status labels so that counting a request never formats
// an integer.
var codes = func() (c [600]string) {
	for i := range c {
		c[i] = strconv.Itoa(i)
	}
	return c
}()

func codeLabel(status int) string {
	if status >= 0 && status < len(codes) {
		return codes[status]
	}
	return "other"
}

// Request counts one finished client request. era and method must come
// from bounded sets (the routing layer's era names and methodLabel).
func (m *Metrics) Request(route, era, method, backend string, status int, d time.Duration) {
	if m == nil {
		return
	}
	if status < 0 || status >= len(codes) {
		status = -1 // one "other" series, whatever a backend sends
	}
	k := requestKey{route, era, method, backend, status}
	var rs *requestSeries
	if cached := m.series.Load(); cached != nil {
		rs = (*cached)[k]
	}
	if rs == nil {
		rs = m.newRequestSeries(k)
	}
	rs.count.Inc()
	rs.duration.Observe(d.Seconds())
}

// requestKey is one request series' label values (the status as a number).
type requestKey struct {
	route, era, method, backend string
	status                      int
}

// requestSeries are the collectors one request counts in, resolved once:
// WithLabelValues validates, hashes and looks up every label value under
// the vector's lock on each call, which is most of what counting a request
// costs. The cache is as bounded as the series are (the labels come from
// bounded sets and the current backends).
type requestSeries struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

// newRequestSeries resolves and caches k's collectors. The cache is copied
// on write (a new series is rare once traffic has flowed), so that reading
// it takes no lock. seriesMu orders writers with RetainBackends: a series
// deleted there is never cached after.
func (m *Metrics) newRequestSeries(k requestKey) *requestSeries {
	m.seriesMu.Lock()
	defer m.seriesMu.Unlock()
	var old map[requestKey]*requestSeries
	if cached := m.series.Load(); cached != nil {
		old = *cached
	}
	if rs := old[k]; rs != nil {
		return rs
	}
	rs := &requestSeries{
		count:    m.requests.WithLabelValues(k.route, k.era, k.method, k.backend, codeLabel(k.status)),
		duration: m.requestDuration.WithLabelValues(k.route),
	}
	next := maps.Clone(old)
	if next == nil {
		next = make(map[requestKey]*requestSeries)
	}
	next[k] = rs
	m.series.Store(&next)
	return rs
}

// RetainBackends deletes the tether_requests_total series of every backend
// not in urls, the current endpoint set, so that endpoints that left stop
// costing memory and scrape time (each rollout brings new backend URLs).
// A request still in flight when its endpoint left recreates a series when
// it ends; the next call deletes it. Series without a backend (refused
// requests) stay. The request path is untouched: this runs when the
// endpoint set changes (balancer.Options.OnUpdate).
func (m *Metrics) RetainBackends(urls []string) {
	if m == nil {
		return
	}
	keep := make(map[string]bool, len(urls)+1)
	keep[""] = true
	for _, u := range urls {
		keep[u] = true
	}
	series := make(chan prometheus.Metric)
	go func() {
		m.requests.Collect(series)
		close(series)
	}()
	gone := map[string]bool{}
	for s := range series {
		var d dto.Metric
		if err := s.Write(&d); err != nil {
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "backend" && !keep[l.GetValue()] {
				gone[l.GetValue()] = true
			}
		}
	}
	m.seriesMu.Lock()
	defer m.seriesMu.Unlock()
	for backend := range gone {
		m.requests.DeletePartialMatch(prometheus.Labels{"backend": backend})
	}
	if cached := m.series.Load(); cached != nil {
		next := maps.Clone(*cached)
		maps.DeleteFunc(next, func(k requestKey, _ *requestSeries) bool { return gone[k.backend] })
		m.series.Store(&next)
	}
}

// Reinit counts one re-initialization.
func (m *Metrics) Reinit(reason, result string) {
	if m == nil {
		return
	}
	m.reinits.WithLabelValues(reason, result).Inc()
}

// DrainEmptied records that a drained backend held no session any more, d
// after its drain began.
func (m *Metrics) DrainEmptied(d time.Duration) {
	if m == nil {
		return
	}
	m.drainDuration.Observe(d.Seconds())
}

// Pick records a balancer decision's duration.
func (m *Metrics) Pick(d time.Duration) {
	if m == nil {
		return
	}
	m.pickDuration.Observe(d.Seconds())
}

// StoreOp records one shared-store round trip.
func (m *Metrics) StoreOp(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.storeDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.storeErrors.WithLabelValues(op).Inc()
	}
}

// StoreDegraded sets the degraded gauge.
func (m *Metrics) StoreDegraded(degraded bool) {
	if m == nil {
		return
	}
	if degraded {
		m.storeDegraded.Set(1)
	} else {
		m.storeDegraded.Set(0)
	}
}

// endpointCollector reads the endpoints at scrape time, so the request path
// pays nothing for per-backend gauges.
type endpointCollector struct{ list func() []EndpointStat }

var (
	sessionsDesc = prometheus.NewDesc("tether_backend_sessions",
		"Live sessions per backend (fleet-wide with a shared store).", []string{"backend"}, nil)
	inflightDesc = prometheus.NewDesc("tether_backend_inflight_requests",
		"Requests in flight per backend (GET streams excluded).", []string{"backend"}, nil)
	listenStreamsDesc = prometheus.NewDesc("tether_backend_listen_streams",
		"Open subscriptions/listen streams per backend (MCP 2026-07-28), counted apart from requests in flight.", []string{"backend"}, nil)
	drainingDesc = prometheus.NewDesc("tether_backend_draining",
		"1 while tether moves the backend's sessions to others (it terminates, or an operator drains it), else 0.", []string{"backend"}, nil)
	endpointsDesc = prometheus.NewDesc("tether_endpoints",
		"Endpoints by state: ready (takes new sessions), fenced (terminating: keeps its sessions), ejected (failing dials).", []string{"state"}, nil)
)

func (c *endpointCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionsDesc
	ch <- inflightDesc
	ch <- listenStreamsDesc
	ch <- drainingDesc
	ch <- endpointsDesc
}

func (c *endpointCollector) Collect(ch chan<- prometheus.Metric) {
	states := map[string]float64{"ready": 0, "fenced": 0, "ejected": 0}
	for _, e := range c.list() {
		ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(e.Sessions), e.URL)
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(e.Inflight), e.URL)
		ch <- prometheus.MustNewConstMetric(listenStreamsDesc, prometheus.GaugeValue, float64(e.ListenStreams), e.URL)
		draining := 0.0
		if e.Draining {
			draining = 1
		}
		ch <- prometheus.MustNewConstMetric(drainingDesc, prometheus.GaugeValue, draining, e.URL)
		states[e.State]++
	}
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, n, state)
	}
}

type storeCollector struct{ stat func() StoreStat }

var (
	cacheHitsDesc   = prometheus.NewDesc("tether_session_cache_hits_total", "Session lookups answered by the local cache.", nil, nil)
	cacheMissesDesc = prometheus.NewDesc("tether_session_cache_misses_total", "Session lookups that read the shared store.", nil, nil)
	pendingDesc     = prometheus.NewDesc("tether_store_pending_records", "Session records kept locally during an outage, waiting to be written.", nil, nil)
	unwrittenDesc   = prometheus.NewDesc("tether_store_unwritten_records_total", "Session records that could not be kept for writing (the pending bound was reached).", nil, nil)
	recordsDesc     = prometheus.NewDesc("tether_session_records", "Session records held in this process (memory store, or the Redis cache's entries).", nil, nil)
	initBytesDesc   = prometheus.NewDesc("tether_session_init_bytes", "Bytes of the distinct initialize bodies held in this process.", nil, nil)
	evictionsDesc   = prometheus.NewDesc("tether_session_evictions_total", "Session records evicted (least recently used) to respect a bound: reason max_sessions or max_init_bytes.", []string{"reason"}, nil)
	slowDesc        = prometheus.NewDesc("tether_store_slow_replies_total", "Redis calls that failed or timed out while Redis answered the health probe (not outages: no degraded mode).", nil, nil)
	recoveriesDesc  = prometheus.NewDesc("tether_store_recoveries_total", "Times Redis was found to have lost its data (epoch marker missing or changed).", nil, nil)
	writtenBackDesc = prometheus.NewDesc("tether_store_written_back_records_total", "Cached session records written back to Redis after it lost its data.", nil, nil)
	collisionsDesc  = prometheus.NewDesc("tether_store_pending_collisions_total", "Session records kept locally during an outage whose id another session took in Redis meanwhile (dropped).", nil, nil)
	unflushedDesc   = prometheus.NewDesc("tether_store_unflushed_at_close_total", "Session records kept during an outage that could not be written at shutdown (lost).", nil, nil)
	taskRecordsDesc = prometheus.NewDesc("tether_task_records", "Task records (task id to backend) held in this process (memory store; with Redis they live in Redis).", nil, nil)
	taskEvictsDesc  = prometheus.NewDesc("tether_task_evictions_total", "Task records evicted (least recently used) at the memory store's bound of 100,000.", nil, nil)
	topologyDesc    = prometheus.NewDesc("tether_store_topology_info", "The Redis deployment the sessions live in (topology single, sentinel or cluster); always 1.", []string{"topology"}, nil)
	primaryDesc     = prometheus.NewDesc("tether_store_primary_info", "A Redis primary tether talks to (the server, the Sentinel-found primary, or each cluster master), as last seen; always 1.", []string{"addr"}, nil)
	failoversDesc   = prometheus.NewDesc("tether_store_failovers_total", "Redis primaries seen replaced by another (Sentinel or Cluster failovers).", nil, nil)
)

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cacheHitsDesc
	ch <- cacheMissesDesc
	ch <- pendingDesc
	ch <- unwrittenDesc
	for _, d := range []*prometheus.Desc{recordsDesc, initBytesDesc, evictionsDesc, slowDesc, recoveriesDesc, writtenBackDesc, collisionsDesc, unflushedDesc,
		taskRecordsDesc, taskEvictsDesc, topologyDesc, primaryDesc, failoversDesc} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stat()
	ch <- prometheus.MustNewConstMetric(cacheHitsDesc, prometheus.CounterValue, float64(s.CacheHits))
	ch <- prometheus.MustNewConstMetric(cacheMissesDesc, prometheus.CounterValue, float64(s.CacheMisses))
	ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(s.Pending))
	ch <- prometheus.MustNewConstMetric(unwrittenDesc, prometheus.CounterValue, float64(s.Unwritten))
	ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(s.Sessions))
	ch <- prometheus.MustNewConstMetric(initBytesDesc, prometheus.GaugeValue, float64(s.InitBytes))
	ch <- prometheus.MustNewConstMetric(evictionsDesc, prometheus.CounterValue, float64(s.EvictedMaxSessions), "max_sessions")
	ch <- prometheus.MustNewConstMetric(evictionsDesc, prometheus.CounterValue, float64(s.EvictedMaxInitBytes), "max_init_bytes")
	ch <- prometheus.MustNewConstMetric(slowDesc, prometheus.CounterValue, float64(s.SlowReplies))
	ch <- prometheus.MustNewConstMetric(recoveriesDesc, prometheus.CounterValue, float64(s.Recoveries))
	ch <- prometheus.MustNewConstMetric(writtenBackDesc, prometheus.CounterValue, float64(s.WrittenBack))
	ch <- prometheus.MustNewConstMetric(collisionsDesc, prometheus.CounterValue, float64(s.Collisions))
	ch <- prometheus.MustNewConstMetric(unflushedDesc, prometheus.CounterValue, float64(s.UnflushedAtClose))
	ch <- prometheus.MustNewConstMetric(taskRecordsDesc, prometheus.GaugeValue, float64(s.TaskRecords))
	ch <- prometheus.MustNewConstMetric(taskEvictsDesc, prometheus.CounterValue, float64(s.EvictedMaxTasks))
	if s.Topology != "" {
		ch <- prometheus.MustNewConstMetric(topologyDesc, prometheus.GaugeValue, 1, s.Topology)
		ch <- prometheus.MustNewConstMetric(failoversDesc, prometheus.CounterValue, float64(s.Failovers))
		for _, p := range s.Primaries {
			ch <- prometheus.MustNewConstMetric(primaryDesc, prometheus.GaugeValue, 1, p)
		}
	}
}

// LimitRejected counts one request refused by the named limit.
func (m *Metrics) LimitRejected(limit string) {
	if m == nil {
		return
	}
	m.limitRejections.WithLabelValues(limit).Inc()
}

// limitCollector reads the client limits' use at scrape time, so the
// request path only moves its own atomic counters.
type limitCollector struct{ stat func() LimitStat }

var (
	inflightBodyDesc = prometheus.NewDesc("tether_inflight_body_bytes",
		"Request-body bytes held by requests in progress (bounded by --max-inflight-body-bytes).", nil, nil)
	openStreamsDesc = prometheus.NewDesc("tether_open_streams",
		"GET (server-to-client SSE) streams open through tether (bounded by --max-streams).", nil, nil)
)

func (c *limitCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inflightBodyDesc
	ch <- openStreamsDesc
}

func (c *limitCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stat()
	ch <- prometheus.MustNewConstMetric(inflightBodyDesc, prometheus.GaugeValue, float64(s.InflightBodyBytes))
	ch <- prometheus.MustNewConstMetric(openStreamsDesc, prometheus.GaugeValue, float64(s.OpenStreams))
}
