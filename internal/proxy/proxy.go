// Package proxy is tether's routing layer and the only package that knows
// MCP. Every request takes one path:
//
//	classify → route → forward → record
//
// classify reads the method, the session header and (for POST) the bounded
// body; route turns that into a Decision (new, sticky, reinit, stateless);
// forward sends it with httputil.ReverseProxy; record writes the session
// table from the response before the response reaches the client.
package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/tether-mcp/tether/internal/balancer"
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
	// Transport sends requests to backends; nil uses NewTransport(false).
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
}

// Proxy is an http.Handler that routes MCP traffic to backends.
type Proxy struct {
	bal       *balancer.Balancer
	store     session.Store
	transport http.RoundTripper
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

	rp       *httputil.ReverseProxy // requests
	streamRP *httputil.ReverseProxy // GET streams: the same, with small copy buffers
	flights  singleflight.Group     // one re-initialization per session at a time
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
	}
	if p.propagator == nil {
		p.propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	if p.transport == nil {
		p.transport = NewTransport(false)
	}
	p.transport = retryUnread{p.transport} // see unreadRequestError
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
	rp := &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.transport,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.handleError,
		BufferPool:     bufferPool{&copyBuffers},
		// FlushInterval 0: ReverseProxy already flushes text/event-stream
		// and unknown-length bodies after every write (see isStreaming).
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	// GET streams are long-lived and mostly idle: they copy through small
	// buffers (streamCopyBufferSize) so that thousands of them stay cheap.
	streams := *rp
	streams.BufferPool = bufferPool{&streamCopyBuffers}
	p.rp, p.streamRP = rp, &streams
	return p
}

// exchange is the state of one client request as it moves along the path.
// The route step and the forward loop write it; the ReverseProxy callbacks
// of an attempt read it and write only the record step's result (newSID).
type exchange struct {
	class      Classification
	route      Route
	rec        *session.Record      // the session record (sticky, reinit, delete)
	ep         *balancer.Endpoint   // the backend of the current attempt
	backendSID string               // the session id the backend knows
	excluded   *balancer.Endpoint   // a backend that failed a dial for this request
	reinit     string               // reason of the re-initialization done for this request, if any
	routed     bool                 // a decision was made (false: refused before routing)
	store      string               // tether.store.result of the session lookup: hit, miss, error
	newSID     string               // the session id a new session got
	weighed    []balancer.Candidate // what the picker weighed (new sessions, re-initializations, traced picks)

	out   statusRecorder // the client's response writer, remembering the status
	start time.Time
	span  trace.Span // the server span; nil when tracing is off
}

// ServeHTTP is the request path: classify → route → forward → record.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x := &exchange{start: time.Now()}
	x.out.ResponseWriter = w
	w = &x.out
	if p.tracer != nil {
		r = p.startServerSpan(r, x)
	}
	defer p.finish(r, x)

	if len(r.TransferEncoding) > 0 {
		// Go's server accepts Content-Length together with
		// Transfer-Encoding: chunked and drops the former; whatever follows
		// the last chunk would be read as a second request on this
		// connection. tether re-frames the body with a Content-Length for the
		// backend and closes the client connection after answering, so such
		// bytes are never read as a request.
		w.Header().Set("Connection", "close")
	}
	stripUpgrade(r.Header)

	class, rerr := p.classifyBounded(w, r)
	x.class = class
	if class.Body != nil {
		// The body stays reserved until forwarding is over, retries
		// included (an initialize body kept in a session record is the
		// session store's to bound).
		defer p.bodies.release(int64(cap(class.Body)))
	}
	if rerr != nil {
		p.refuse(w, &class, rerr)
		return
	}
	if class.Kind == KindStream {
		if !p.streams.acquire() {
			p.refuse(w, &class, errTooManyStreams)
			return
		}
		defer p.streams.release()
	}
	if !p.route(w, r, x) {
		return
	}
	p.forward(w, r, x)
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
	case x.class.Kind == KindInitialize:
		// A new session, even if the client sent a session id with it (the
		// header is stripped in rewrite).
		x.route = RouteNew
		if int64(len(x.class.Body)) > p.maxInit {
			// The body is kept for the session's life and replayed: refused
			// before it is stored or forwarded.
			writeRequestError(w, x.class.ID, errInitTooLarge)
			return false
		}
	case x.class.SessionID == "":
		x.route = RouteStateless
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
	if span != nil || x.route == RouteNew {
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
	x.route = RouteSticky
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
	if x.class.Kind == KindDelete {
		if !alive {
			// Nothing is left to end on the backend; the session ends here.
			p.endDeadSession(ctx, w, r, rec)
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
		o := p.attempt(w, r, x)
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
		if x.rec == nil {
			continue // new or stateless: pick another backend
		}
		if x.class.Kind == KindDelete {
			// The backend that held the session is gone: the session ends.
			p.endDeadSession(r.Context(), w, r, x.rec)
			return
		}
		if err := p.reinitialize(r.Context(), r, x, o.retry); err != nil {
			p.failReinit(w, x, err)
			return
		}
	}
}

// outcome is how one forwarding attempt ended.
type outcome struct {
	// retry says why the attempt failed in a way that is safe to repeat
	// (the request was never processed); "" when the client has its answer
	// or has gone away.
	retry string
	err   error
}

// attempt is one forwarding attempt. It is the only place that counts
// requests in flight, and the deferred End runs however the attempt ends:
// ReverseProxy aborts a response whose client hung up mid-stream with
// panic(http.ErrAbortHandler), which skips everything but defers.
func (p *Proxy) attempt(w http.ResponseWriter, r *http.Request, x *exchange) outcome {
	// A GET stream is an idle channel for server messages, not work in
	// flight: counting it would add a constant per session to the load.
	if x.class.Kind != KindStream {
		x.ep.Begin()
		defer x.ep.End()
	}
	rp := p.rp
	if x.class.Kind == KindStream {
		rp = p.streamRP
	}
	a := &attemptState{x: x, ep: x.ep, path: r.URL.Path}
	rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), attemptKey{}, a)))
	return a.result
}

// attemptState is what the ReverseProxy callbacks of one attempt share: the
// exchange and backend they serve (read only), the request body, and the
// attempt's result, which only handleError writes.
type attemptState struct {
	x      *exchange
	ep     *balancer.Endpoint
	path   string       // the client's request path (not the request: keeping it would move it to the heap)
	body   bytes.Reader // the outgoing body: the attempt is its own reader, one allocation less
	result outcome
}

// Read and Close make the attempt the outgoing request's body.
func (a *attemptState) Read(b []byte) (int, error) { return a.body.Read(b) }
func (a *attemptState) Close() error               { return nil }

type attemptKey struct{}

func attemptFrom(ctx context.Context) *attemptState {
	a, _ := ctx.Value(attemptKey{}).(*attemptState)
	return a
}

// retryError is how modifyResponse hands an attempt that is safe to repeat
// to handleError.
type retryError struct {
	reason string
	err    error
}

func (e *retryError) Error() string { return "retry: " + e.reason }

// endDeadSession answers a DELETE of a session whose backend is gone. The
// backend can no longer check who ends the session, so tether does: only
// its creator may (anyone else learns nothing, as for an unknown session).
func (p *Proxy) endDeadSession(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *session.Record) {
	if !p.principal.matches(rec.Principal, r.Header) {
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

// rewrite builds the outgoing request (ReverseProxy has already removed
// hop-by-hop and forwarding headers from Out).
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	a := attemptFrom(pr.In.Context())
	x := a.x
	pr.SetURL(a.ep.URL)
	// Keep Host and Origin as the client sent them: MCP servers check both
	// against DNS rebinding, and go-sdk answers 403 to a foreign Host.
	pr.Out.Host = pr.In.Host
	// A sidecar is transparent: keep what the proxy in front said about the
	// original client instead of adding our loopback hop.
	for _, h := range forwardingHeaders {
		if v, ok := pr.In.Header[h]; ok {
			pr.Out.Header[h] = v
		}
	}

	if x.class.Body != nil {
		body := x.class.Body
		a.body.Reset(body)
		pr.Out.Body = a
		pr.Out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		pr.Out.ContentLength = int64(len(body))
		pr.Out.TransferEncoding = nil
		pr.Out.Header.Del("Content-Length") // the transport writes it from ContentLength
	}

	if x.span != nil {
		// The backend's spans become children of this request's span.
		p.propagator.Inject(pr.In.Context(), propagation.HeaderCarrier(pr.Out.Header))
	}

	switch x.route {
	case RouteNew, RouteStateless:
		pr.Out.Header.Del(headerSessionID)
	default:
		pr.Out.Header.Set(headerSessionID, x.backendSID)
		if id, ok := backendEventID(pr.In.Header.Get(headerLastEventID), x.rec.Reinits); ok {
			pr.Out.Header.Set(headerLastEventID, id)
		} else {
			pr.Out.Header.Del(headerLastEventID)
		}
	}
}

var forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// stripUpgrade removes protocol-upgrade requests. MCP never upgrades, h2c is
// served by prior knowledge only, and ReverseProxy re-adds an Upgrade header
// after Rewrite when the inbound request asked for one (golang/go#80416), so
// the inbound request is cleaned first. Other Connection tokens stay, for
// ReverseProxy to strip the headers they name.
func stripUpgrade(h http.Header) {
	_, up := h["Upgrade"]
	_, settings := h["Http2-Settings"]
	if !up && !settings {
		return
	}
	h.Del("Upgrade")
	h.Del("Http2-Settings")
	var keep []string
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			tok = textproto.TrimString(tok)
			if tok != "" && !strings.EqualFold(tok, "upgrade") && !strings.EqualFold(tok, "http2-settings") {
				keep = append(keep, tok)
			}
		}
	}
	if len(keep) == 0 {
		h.Del("Connection")
	} else {
		h["Connection"] = []string{strings.Join(keep, ", ")}
	}
}

// modifyResponse is the record step: it runs after the backend answered and
// before anything reaches the client. An attempt that is safe to repeat is
// returned as a *retryError.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	ctx := resp.Request.Context()
	a := attemptFrom(ctx)
	x := a.x

	if len(resp.Header[headerSessionID]) > 1 {
		// Which one would the client keep? Clients fail a session whose id
		// changes, and a record keyed by the wrong one strands the session.
		resp.Body.Close()
		return errDuplicateSID
	}
	if x.rec != nil && resp.StatusCode == http.StatusNotFound && x.class.Kind != KindDelete {
		lost, err := p.sessionLost(resp)
		if err != nil {
			resp.Body.Close()
			return err
		}
		if lost {
			// The backend does not know the session: it restarted, or
			// expired the session. The request was refused, not processed,
			// so it is safe to re-initialize and send it again.
			resp.Body.Close()
			return &retryError{reason: reasonLost}
		}
		// A 404 that answers the request itself (an unknown method under
		// MCP 2026-07-28, a missing resource) goes to the client as it is.
	}

	switch {
	case x.route == RouteNew:
		sid := resp.Header.Get(headerSessionID)
		if resp.StatusCode/100 != 2 || sid == "" {
			break // a refused initialize, or a stateless server
		}
		if !validSessionID(sid) {
			resp.Body.Close()
			return errBadBackendSID
		}
		now := p.now()
		rec := &session.Record{
			ClientSID:       sid,
			BackendID:       a.ep.ID,
			BackendURL:      a.ep.String(),
			BackendSID:      sid,
			Init:            x.class.Body,
			ProtocolVersion: x.class.ProtocolVersion,
			Principal:       p.principal.digest(resp.Request.Header),
			Created:         now,
			LastUsed:        now,
		}
		// Written before the response is released, so the client's next
		// request always finds its session.
		err := p.store.Create(ctx, rec)
		if errors.Is(err, session.ErrExists) {
			// Another backend minted the same id and a live session holds
			// it: this one must not take it over. Its answer never reached
			// the client, so the backend session is ended and the
			// initialize tried elsewhere.
			resp.Body.Close()
			p.log.Warn("backend minted a session id that a live session holds; initializing elsewhere",
				"session", session.HashID(sid), "backend", a.ep.String())
			out := resp.Request
			p.deleteLater(a.ep, sid, p.replayContextOf(out.Host, a.path, out.Header, x, reasonIDTaken))
			return &retryError{reason: reasonIDTaken, err: err}
		}
		if err != nil {
			resp.Body.Close()
			return &storeWriteError{err}
		}
		x.newSID = sid
	case x.rec != nil:
		if resp.Header.Get(headerSessionID) != "" && x.backendSID != x.rec.ClientSID {
			// Never let the new backend's id leak: clients fail a session
			// whose id changes under them.
			resp.Header.Set(headerSessionID, x.rec.ClientSID)
		}
		if x.class.Kind == KindDelete && (resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusNotFound) {
			p.endSession(ctx, x.rec)
		}
		if x.rec.Reinits > 0 && isEventStream(resp) {
			resp.Body = newEventIDTagger(resp.Body, x.rec.Reinits)
			// Tagging lengthens the body: its length is no longer known.
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
		}
	}
	return nil
}

var (
	errBadBackendSID = errors.New("backend minted an invalid Mcp-Session-Id")
	errDuplicateSID  = errors.New("backend sent more than one Mcp-Session-Id")
)

type storeWriteError struct{ err error }

func (e *storeWriteError) Error() string { return "session store write failed: " + e.err.Error() }
func (e *storeWriteError) Unwrap() error { return e.err }

// handleError is ReverseProxy's single failure path. Attempts that are safe
// to repeat become the attempt's result, for the forward loop; everything
// else is answered here.
func (p *Proxy) handleError(w http.ResponseWriter, r *http.Request, err error) {
	a := attemptFrom(r.Context())
	x := a.x
	var retry *retryError
	switch {
	case errors.As(err, &retry):
		a.result = outcome{retry: retry.reason, err: retry.err}
		return
	case isDialError(err):
		// The connection was never established, so the backend never saw
		// the request.
		a.result = outcome{retry: reasonDial, err: err}
		return
	case r.Context().Err() != nil:
		return // the client went away; nobody is listening
	}
	if errors.Is(err, errDuplicateSID) {
		p.log.Warn("backend answered with more than one Mcp-Session-Id", "route", x.route.String(), "backend", a.ep.String())
		writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, "backend answered with more than one Mcp-Session-Id")
		return
	}
	var swe *storeWriteError
	if errors.As(err, &swe) {
		p.log.Error("session record not written", "backend", a.ep.String(), "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "session store unavailable")
		return
	}
	// The request may have reached the backend: sending it again could run
	// a tools/call twice, so the client decides.
	p.log.Warn("backend request failed", "route", x.route.String(), "backend", a.ep.String(), "err", err)
	writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, "backend failed after the request was sent; not retried")
}

// isDialError reports whether err is a failure to establish the connection.
func isDialError(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
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

// bufferPool gives ReverseProxy reusable copy buffers; without one every
// response allocates 32 KiB.
type bufferPool struct{ pool *sync.Pool }

var (
	copyBuffers       = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
	streamCopyBuffers = sync.Pool{New: func() any { b := make([]byte, streamCopyBufferSize); return &b }}
)

func (p bufferPool) Get() []byte  { return *p.pool.Get().(*[]byte) }
func (p bufferPool) Put(b []byte) { p.pool.Put(&b) }
