// Package proxy is tether's routing layer and the only package that knows
// MCP. Every request takes one path:
//
//	classify → route → forward → record
//
// classify reads the method, the session header and (for POST) the bounded
// body; route turns that into a Decision (new, sticky, reinit, stateless);
// forward sends it (forward.go); record writes the session table from the
// response before the response reaches the client.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// DefaultMaxBody is the default bound on a POST body (--max-body).
const DefaultMaxBody = 4 << 20

// DefaultMaxInitBody is the default bound on an initialize body
// (--max-init-body). A real initialize is under 4 KB; the body is stored
// with the session for its whole life and replayed on re-initialization.
const DefaultMaxInitBody = 64 << 10

// maxAttempts bounds how often one client request is sent: the first try
// plus retries that are provably safe (the request never reached a backend).
const maxAttempts = 3

// Config configures a Proxy. Zero values are useful defaults except for
// Balancer and Store, which are required.
type Config struct {
	Balancer *balancer.Balancer
	Store    session.Store
	// Transport sends requests to backends; nil uses
	// backend.NewTransport(false).
	Transport http.RoundTripper
	// MaxBody bounds POST bodies; larger ones get 413. 0 = DefaultMaxBody.
	MaxBody int64
	// MaxInitBody bounds initialize bodies, which are stored with the
	// session; larger ones get 413. 0 = DefaultMaxInitBody.
	MaxInitBody int64
	// PrincipalKey keys the digest of a session's credentials (see
	// PrincipalHeaders); replicas sharing a store must share it. nil = a
	// random key for this process.
	PrincipalKey []byte
	// PrincipalHeaders are the credential headers whose keyed digest binds
	// a session to its creator: only a request with the same digest may
	// re-initialize the session. nil = DefaultPrincipalHeaders.
	PrincipalHeaders []string
	// MaxInflightBodyBytes bounds the request-body bytes held at once by all
	// requests (reserved as bodies arrive, released when their requests
	// end); a request that would pass it gets 503. 0 =
	// DefaultMaxInflightBodyBytes; negative = unbounded.
	MaxInflightBodyBytes int64
	// BodyTimeout bounds the time a request body takes to arrive, whole; a
	// slower one gets 408 and its connection closed. 0 = DefaultBodyTimeout.
	BodyTimeout time.Duration
	// MaxStreams bounds the GET streams open at once; one more gets 503.
	// 0 = DefaultMaxStreams; negative = unbounded.
	MaxStreams int
	// ReinitTimeout bounds one re-initialization (initialize round trip plus
	// notifications/initialized). 0 = 10s.
	ReinitTimeout time.Duration
	Logger        *slog.Logger
	Now           func() time.Time
	// Metrics records requests, picks and re-initializations; nil = none.
	Metrics *telemetry.Metrics
	// Tracer traces each request and its routing decision; nil = tracing
	// off, and the request path does no tracing work at all.
	Tracer trace.Tracer
	// Propagator carries W3C trace context from the client to the backend;
	// nil = trace context and baggage.
	Propagator propagation.TextMapPropagator
	// AffinityHeader, when set, names a header (e.g. Mcp-Param-Workspace)
	// whose value keys a session-less MCP 2026-07-28 request to one
	// backend: such a request goes where Balancer.PickByKey puts that value
	// (consistent hashing with bounded loads) instead of a pick by load.
	// Requests of older protocol versions and requests without the header
	// are picked as before. The Balancer must be built with
	// Options.Affinity; New panics otherwise.
	AffinityHeader string
	// AffinityArgument is the tools/call argument the affinity header
	// carries (params.arguments.AffinityArgument). tether routes on the
	// header only for a tools/call, and only after checking it against the
	// argument: a mismatch is refused with 400 and HeaderMismatch (-32020)
	// before any backend sees it. Required with AffinityHeader.
	AffinityArgument string
	// Drain is what happens to the sessions of a terminating (Fenced)
	// endpoint (drain.go); endpoints an operator drains (OperatorDrained)
	// are drained proactively whatever it says.
	Drain DrainMode
	// DrainRate bounds the sessions moved per second off each draining
	// endpoint; 0 = DefaultDrainRate.
	DrainRate float64
	// OperatorDrained reports whether an operator drains the endpoint with
	// this ID (discovery.Drains.Drained); nil = none is.
	OperatorDrained func(id string) bool
}

// Proxy is an http.Handler that routes MCP traffic to backends.
type Proxy struct {
	bal       *balancer.Balancer
	store     session.Store
	transport http.RoundTripper
	// direct is the transport when it is tether's own client, which
	// writes requests straight from the client's (direct.go).
	direct    *backend.Client
	maxBody   int64
	maxInit   int64
	reinitTTL time.Duration
	principal principalDigester
	cleanups  chan struct{} // bounds the DELETEs of superseded backend sessions in flight
	log       *slog.Logger
	now       func() time.Time

	// Client limits (limits.go).
	bodyTimeout time.Duration
	bodies      byteBudget // request-body bytes held
	streams     slots      // GET streams open

	metrics    *telemetry.Metrics
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	decisions  *decisionLog

	// affinityHeader is Config.AffinityHeader, canonical ("": off), and
	// affinityArgument the tool argument it is checked against.
	affinityHeader, affinityArgument string

	// tasks is the store's task records (taskroute.go); nil when the store
	// keeps none, and then task requests are picked like any other.
	tasks session.TaskStore

	flights singleflight.Group // one re-initialization per session at a time

	// Drains (drain.go).
	active          *activities // sessions with requests or streams in flight here
	drains          drains
	drainMode       DrainMode
	drainRate       float64
	operatorDrained func(id string) bool
}

// New builds a Proxy from cfg.
func New(cfg Config) *Proxy {
	p := &Proxy{
		bal:        cfg.Balancer,
		store:      cfg.Store,
		transport:  cfg.Transport,
		maxBody:    cfg.MaxBody,
		maxInit:    cfg.MaxInitBody,
		reinitTTL:  cfg.ReinitTimeout,
		principal:  newPrincipalDigester(cfg.PrincipalKey, cfg.PrincipalHeaders),
		cleanups:   make(chan struct{}, maxCleanups),
		log:        cfg.Logger,
		now:        cfg.Now,
		metrics:    cfg.Metrics,
		tracer:     cfg.Tracer,
		propagator: cfg.Propagator,
		decisions:  newDecisionLog(100000),

		affinityHeader:   http.CanonicalHeaderKey(cfg.AffinityHeader),
		affinityArgument: cfg.AffinityArgument,

		active:          newActivities(),
		drains:          drains{runs: map[string]*drainRun{}, changed: make(chan struct{}, 1)},
		drainMode:       cfg.Drain,
		drainRate:       cmp.Or(cfg.DrainRate, DefaultDrainRate),
		operatorDrained: cfg.OperatorDrained,
	}
	p.tasks, _ = cfg.Store.(session.TaskStore)
	if p.affinityHeader != "" && !p.bal.KeyAffinity() {
		panic("proxy: Config.AffinityHeader needs a Balancer built with Options.Affinity")
	}
	if p.affinityHeader != "" && p.affinityArgument == "" {
		panic("proxy: Config.AffinityHeader needs Config.AffinityArgument")
	}
	if p.propagator == nil {
		p.propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	if p.transport == nil {
		p.transport = backend.NewTransport(false)
	}
	p.direct, _ = p.transport.(*backend.Client)
	if p.maxBody <= 0 {
		p.maxBody = DefaultMaxBody
	}
	if p.maxInit <= 0 {
		p.maxInit = DefaultMaxInitBody
	}
	if p.reinitTTL <= 0 {
		p.reinitTTL = 10 * time.Second
	}
	p.bodyTimeout = cmp.Or(cfg.BodyTimeout, DefaultBodyTimeout)
	p.bodies.max = cmp.Or(cfg.MaxInflightBodyBytes, DefaultMaxInflightBodyBytes)
	p.streams.max = int64(cmp.Or(cfg.MaxStreams, DefaultMaxStreams))
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p
}

// exchange is the state of one client request as it moves along the path.
// The route step and the forward loop write it; an attempt reads it and
// writes only the record step's result (newSID) and its own bookkeeping.
type exchange struct {
	// What the request's end reads (endExchange), apart: a stream that
	// goes on without its handler keeps a copy of it, not the exchange.
	exchangeEnd

	// header is the client's request header. r.Header is nil: h1 gives
	// the fields as a list (ServeFields), and a map from net/http is made
	// one (ServeHTTP).
	header     h1.Fields
	rec        *session.Record    // the session record (sticky, reinit, delete)
	backendSID string             // the session id the backend knows
	excluded   *balancer.Endpoint // a backend that failed a dial for this request
	idempotent bool               // the request may be sent again once sent, by its method (retry.go)
	store      string             // tether.store.result of the session lookup: hit, miss, error
	// affinityKey is the value of the affinity header of a session-less
	// modern request: picks for it go by the key ("" for any other).
	affinityKey string
	// taskID is the task a modern tasks/* request names, routed to the
	// task's backend and never elsewhere ("" for any other request).
	taskID string
	// moved, for a GET stream, is cancelled when the session moves off
	// the stream's backend.
	moved context.Context
	// parked: the request's stream went on without its handler (park.go),
	// whose end ends the request.
	parked bool

	out statusRecorder // the client's response writer, remembering the status

	// What attempts share (forward.go): the direct request of every
	// attempt on tether's own client (direct.go), which writes it before
	// its round trip returns. Other transports get requests of their own
	// (outgoingRequest).
	direct  directRequest
	getBody func() (io.ReadCloser, error) // rebuilds the request body for the transport
}

// exchangeEnd is what the end of a request reads (endRequest): to give
// back what the request held, and to record it.
type exchangeEnd struct {
	class  classification
	route  routeKind
	routed bool // a decision was made (false: refused before routing)
	// entered: the request is in its session's activity (drain.go), which
	// it leaves when it ends.
	entered bool
	// What the end gives back: a --max-streams slot, the bytes of the
	// body reserved (bodies).
	streamSlot bool
	bodyHeld   int64
	ep         *balancer.Endpoint   // the backend of the current attempt
	reinit     string               // reason of the re-initialization done for this request, if any
	newSID     string               // the session id a new session got
	weighed    []balancer.Candidate // what the picker weighed (new sessions, re-initializations, traced picks)
	start      time.Time
	span       trace.Span // the server span; nil when tracing is off
}

// exchanges holds the exchanges of finished requests. An exchange is a
// kilobyte and more (the direct request's room for fields, the
// classification): allocated per request, it was a third of tether's
// allocated bytes, and the allocation rate sets how often the collector
// runs, a cycle costing the same for one request a second or thousands.
// Nothing keeps a pointer into an exchange once ServeFields returns: the
// direct request is written before the round trip returns (a request for
// another transport, which may read it later, is not the exchange's), what
// a session record or a replay keeps is copied, and the client's answer is
// h1's, not the exchange's status recorder.
var exchanges = sync.Pool{New: func() any { return new(exchange) }}

// putExchange clears x, so that a pooled exchange holds no request's
// memory, and pools it.
func putExchange(x *exchange) {
	*x = exchange{}
	exchanges.Put(x)
}

// ServeHTTP serves a request with a header map: net/http's (h2c, and the
// HTTP/1.1 requests h1 hands to it). The map is made a list, and the path
// sees a copy of r without it, as ServeFields's.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f := h1.AppendHeader(make(h1.Fields, 0, len(r.Header)), r.Header)
	r2 := *r
	r2.Header = nil
	p.ServeFields(w, &r2, f)
}

// ServeFields is the request path: classify → route → forward → record.
// f is the request's header (r.Header is not read): h1 calls it for the
// requests it serves (h1.FieldsHandler).
func (p *Proxy) ServeFields(w http.ResponseWriter, r *http.Request, f h1.Fields) {
	x := exchanges.Get().(*exchange)
	x.start, x.header = time.Now(), f
	x.out.ResponseWriter = w
	w = &x.out
	if p.tracer != nil {
		r = p.startServerSpan(r, x)
	}
	defer func() {
		// A parked stream went on with a copy of what its end needs
		// (park.go), and ends the request itself.
		if !x.parked {
			p.endRequest(&x.exchangeEnd, x.out.status)
		}
		putExchange(x)
	}()

	if len(r.TransferEncoding) > 0 {
		// Go's server accepts Content-Length together with
		// Transfer-Encoding: chunked and drops the former; whatever follows
		// the last chunk would be read as a second request on this
		// connection. tether re-frames the body with a Content-Length for the
		// backend and closes the client connection after answering, so such
		// bytes are never read as a request.
		w.Header().Set("Connection", "close")
	}
	stripUpgrade(&x.header)

	class, rerr := p.classifyBounded(w, r, x.header)
	x.class = class
	// The body stays reserved until forwarding is over, retries included:
	// the request's end, or a stream's first park (an initialize body kept
	// in a session record is the session store's to bound).
	x.bodyHeld = int64(cap(class.Body))
	if rerr != nil {
		p.refuse(w, &class, rerr)
		return
	}
	x.idempotent = idempotent(r.Method, &x.class)
	if class.Kind == kindStream || class.Op == opListen {
		// A subscriptions/listen stream is the 2026-07-28 GET stream: the
		// same bound.
		if !p.streams.acquire() {
			p.refuse(w, &class, errTooManyStreams)
			return
		}
		x.streamSlot = true
	}
	if !p.route(w, r, x) {
		return
	}
	p.forward(w, r, x)
}

// endRequest ends what ServeFields began: the session's activity, the
// stream's slot, the body's reservation, and records the request (its
// metrics, decision and span), which ended with status. It runs when the
// handler returns, or when a stream that went on without it ends
// (park.go).
func (p *Proxy) endRequest(e *exchangeEnd, status int) {
	p.leaveSession(e)
	if e.streamSlot {
		p.streams.release()
	}
	if e.bodyHeld > 0 {
		p.bodies.release(e.bodyHeld)
	}
	p.finish(e, status)
}

// leaveSession ends the request's part in its session's activity.
func (p *Proxy) leaveSession(x *exchangeEnd) {
	if !x.entered {
		return
	}
	if ep := p.active.leave(x.class.SessionID, x.class.Kind == kindStream); ep != nil {
		p.wakeDrain(ep)
	}
}

// route makes the routing decision (traced as tether.route). It reports
// false when it has already answered the client.
func (p *Proxy) route(w http.ResponseWriter, r *http.Request, x *exchange) bool {
	var span trace.Span
	ctx := r.Context()
	if p.tracer != nil {
		ctx, span = p.tracer.Start(ctx, "tether.route")
		defer func() { p.endRouteSpan(span, x) }()
	}
	switch {
	case x.class.Kind == kindInitialize:
		// A new session, even if the client sent a session id with it (the
		// header is not forwarded: outgoingRequest).
		x.route = routeNew
		if int64(len(x.class.Body)) > p.maxInit {
			// The body is kept for the session's life and replayed: refused
			// before it is stored or forwarded.
			p.metrics.LimitRejected(limitInitBody)
			writeRequestError(w, x.class.ID, errInitTooLarge)
			return false
		}
		if len(r.Host) > session.MaxAddressLen || len(r.URL.Path) > session.MaxAddressLen {
			// Kept with the session, for a drain's replay.
			p.metrics.LimitRejected(limitInitAddress)
			writeRequestError(w, x.class.ID, errInitAddressTooLong)
			return false
		}
	case x.class.Op == opTask && x.class.Era == eraModern && x.class.Kind == kindRequest && p.tasks != nil:
		// A task lives on one backend: see taskroute.go.
		x.route = routeStateless
		if !p.routeTask(ctx, w, r, x, span) {
			return false
		}
	case x.class.SessionID == "":
		x.route = routeStateless
		if p.affinityHeader != "" && x.class.Era == eraModern && x.class.Kind == kindRequest && x.class.Method == "tools/call" {
			key, rerr := affinityValue(x.header, p.affinityHeader, p.affinityArgument, x.class.Params)
			if rerr != nil {
				writeRequestError(w, x.class.ID, rerr)
				return false
			}
			x.affinityKey = key
		}
	default:
		if !p.routeSession(ctx, w, r.WithContext(ctx), x) {
			return false
		}
	}
	if x.ep == nil && !p.pick(w, x, span) {
		return false
	}
	x.routed = true
	return true
}

// pick chooses a backend for a request that has none yet.
func (p *Proxy) pick(w http.ResponseWriter, x *exchange, span trace.Span) bool {
	start := time.Now()
	var ep *balancer.Endpoint
	var err error
	if x.affinityKey != "" {
		// A retry after a failed dial excludes the key's endpoint and so
		// goes where the key would go without it.
		ep, err = p.bal.PickByKey(x.affinityKey, x.excluded)
		if span != nil {
			span.SetAttributes(attribute.Bool("tether.affinity", true))
		}
	} else if x.class.Op == opListen && x.route == routeStateless {
		// A subscriptions/listen stream: placed counting streams (listen.go).
		ep, err = p.bal.PickListen(x.excluded)
	} else if span != nil || x.route == routeNew {
		// Placements are rare and worth explaining later; other picks are
		// explained only when traced.
		ep, x.weighed, err = p.bal.PickExplained(x.excluded, x.weighed[:0])
		if span != nil {
			span.SetAttributes(candidatesAttr(x.weighed))
		}
	} else {
		ep, err = p.bal.Pick(x.excluded)
	}
	p.metrics.Pick(time.Since(start))
	if err != nil {
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "no backend available")
		return false
	}
	x.ep = ep
	return true
}

// routeSession routes a request that carries a session id: to the record's
// backend while it is an endpoint, else through a re-initialization. It
// reports false when it has already answered the client.
func (p *Proxy) routeSession(ctx context.Context, w http.ResponseWriter, r *http.Request, x *exchange) bool {
	// Entered before the record is read: a drain moving the session now
	// is waited for, and none starts while the request is in flight.
	stream := x.class.Kind == kindStream
	moved, err := p.active.enter(ctx, x.class.SessionID, stream)
	if err != nil {
		return false // the client has gone
	}
	x.entered, x.moved = true, moved
	rec, err := p.store.Get(ctx, x.class.SessionID)
	switch {
	case err == nil:
		x.store = "hit"
	case errors.Is(err, session.ErrNotFound):
		x.store = "miss"
	default:
		x.store = "error"
	}
	if errors.Is(err, session.ErrNotFound) {
		// The client must re-initialize (MCP: 404 for an unknown session).
		// "id": null keeps the go-sdk client treating this as the end of the
		// session (ErrSessionMissing) rather than as one failed call.
		writeJSONRPCError(w, http.StatusNotFound, nil, codeSessionNotFound, "session not found")
		return false
	}
	if err != nil {
		p.log.Warn("session store lookup failed", "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "session store unavailable")
		return false
	}
	x.rec = rec
	x.route = routeSticky
	x.backendSID = rec.BackendSID

	ep, ok := p.bal.Lookup(rec.BackendID)
	alive := ok && !ep.Ejected()
	if !alive {
		// A cached record may be stale: another replica may already have
		// moved the session. Ask the authority before deciding anything.
		if fresh, err := p.store.Reload(ctx, rec.ClientSID); err == nil && fresh.Version != rec.Version {
			rec = fresh
			x.rec, x.backendSID = rec, rec.BackendSID
			ep, ok = p.bal.Lookup(rec.BackendID)
			alive = ok && !ep.Ejected()
		}
	}
	if x.class.Kind == kindDelete {
		if !alive {
			// Nothing is left to end on the backend; the session ends here.
			p.endDeadSession(ctx, w, x.header, rec)
			return false
		}
		x.ep = ep
		return true
	}
	if !alive {
		reason := reasonGone
		if ok {
			reason = reasonEjected
		}
		if err := p.reinitialize(ctx, r, x, reason); err != nil {
			p.failReinit(w, x, err)
			return false
		}
		return true
	}
	x.ep = ep
	if stream {
		p.active.streamOn(rec.ClientSID, ep)
		p.keepStreamReplay(r, x)
	}
	if ep.State() == discovery.Fenced {
		p.keepDrainReplay(r, x)
	}
	if err := p.store.Touch(ctx, rec.ClientSID, p.now()); err != nil && !errors.Is(err, session.ErrNotFound) {
		p.log.Debug("session touch failed", "err", err)
	}
	return true
}

// forward sends the request, retrying only attempts that provably never
// reached a backend (a failed dial), that the backend refused because it
// does not know the session (404), which are then re-initialized, or whose
// new session could not be recorded because its id is taken.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, x *exchange) {
	for n := 1; ; n++ {
		if x.ep == nil && !p.pick(w, x, nil) {
			return
		}
		o := p.forwardOnce(w, r, x)
		if o.retry == "" {
			return
		}
		if n == maxAttempts {
			p.log.Warn("giving up on request", "route", x.route.String(), "backend", x.ep.String(), "reason", o.retry, "err", o.err)
			writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, "no backend could take the request")
			return
		}
		if x.span != nil {
			x.span.AddEvent("tether.retry", trace.WithAttributes(
				attribute.String("tether.retry.reason", o.retry),
				attribute.String("tether.backend", x.ep.String())))
		}
		failed := x.ep
		x.ep = nil
		switch o.retry {
		case reasonDial:
			// Passive health: a refused dial ejects the backend, and this
			// request does not try it again. A backend that answered 404 for
			// the session is healthy (it restarted) and may take it back.
			p.bal.Eject(failed, o.err)
			x.excluded = failed
		case reasonIDTaken:
			// The backend mints ids that collide with live sessions: the
			// next try goes elsewhere.
			x.excluded = failed
		}
		if x.taskID != "" {
			// A task is not replayed elsewhere (taskroute.go).
			p.taskBackendFailed(w, x, failed)
			return
		}
		if x.rec == nil {
			continue // new or stateless: pick another backend
		}
		if x.class.Kind == kindDelete {
			// The backend that held the session is gone: the session ends.
			p.endDeadSession(r.Context(), w, x.header, x.rec)
			return
		}
		if err := p.reinitialize(r.Context(), r, x, o.retry); err != nil {
			p.failReinit(w, x, err)
			return
		}
	}
}

// endDeadSession answers a DELETE of a session whose backend is gone. The
// backend can no longer check who ends the session, so tether does: only
// its creator may (anyone else learns nothing, as for an unknown session).
func (p *Proxy) endDeadSession(ctx context.Context, w http.ResponseWriter, h h1.Fields, rec *session.Record) {
	if !p.principal.matches(rec.Principal, h) {
		writeJSONRPCError(w, http.StatusNotFound, nil, codeSessionNotFound, "session not found")
		return
	}
	p.endSession(ctx, rec)
	w.WriteHeader(http.StatusNoContent)
}

// endSession removes a session record (its backend's count follows the
// store's Deleted change, see CountSessions).
func (p *Proxy) endSession(ctx context.Context, rec *session.Record) {
	p.decisions.remove(rec.ClientSID)
	if _, err := p.store.Delete(ctx, rec.ClientSID); err != nil && !errors.Is(err, session.ErrNotFound) {
		p.log.Warn("session delete failed", "err", err)
	}
}

// stripUpgrade removes protocol-upgrade requests. MCP never upgrades and
// h2c is served by prior knowledge only, so the inbound request is cleaned
// first: neither the forwarded request nor a replayed initialize may ask a
// backend to switch protocols. Other Connection tokens stay, for
// outgoingHeader to strip the headers they name.
func stripUpgrade(f *h1.Fields) {
	if !slices.ContainsFunc(*f, func(fl h1.Field) bool { return fl.Name == "Upgrade" || fl.Name == "Http2-Settings" }) {
		return
	}
	f.Del("Upgrade")
	f.Del("Http2-Settings")
	var keep []string
	for _, fl := range *f {
		if fl.Name != "Connection" {
			continue
		}
		for _, tok := range strings.Split(fl.Value, ",") {
			tok = textproto.TrimString(tok)
			if tok != "" && !strings.EqualFold(tok, "upgrade") && !strings.EqualFold(tok, "http2-settings") {
				keep = append(keep, tok)
			}
		}
	}
	f.Del("Connection")
	if len(keep) > 0 {
		f.Set("Connection", strings.Join(keep, ", "))
	}
}

// failReinit answers a request whose session could not be re-initialized.
func (p *Proxy) failReinit(w http.ResponseWriter, x *exchange, err error) {
	switch {
	case errors.Is(err, balancer.ErrNoEndpoints):
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "no backend available to re-initialize the session")
	case errors.Is(err, session.ErrNotFound), errors.Is(err, errOtherPrincipal):
		// errOtherPrincipal: the session belongs to someone else. It gets
		// the same answer as a session that does not exist, so the client
		// starts one of its own and learns nothing about this one.
		writeJSONRPCError(w, http.StatusNotFound, nil, codeSessionNotFound, "session not found")
	case errors.Is(err, session.ErrUnavailable):
		// A move must be agreed in the shared store; until it answers, the
		// session waits rather than split across two backends.
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "session store unavailable; cannot re-initialize the session now")
	default:
		writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, "session re-initialization failed")
	}
}
