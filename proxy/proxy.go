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

	"github.com/tether-mcp/tether/balancer"
	"github.com/tether-mcp/tether/session"
	"github.com/tether-mcp/tether/telemetry"
)

// DefaultMaxBody is the default bound on a POST body (--max-body).
const DefaultMaxBody = 4 << 20

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
	reinitTTL time.Duration
	log       *slog.Logger
	now       func() time.Time

	metrics    *telemetry.Metrics
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	decisions  *decisionLog

	rp      *httputil.ReverseProxy
	flights singleflight.Group // one re-initialization per session at a time
}

// New builds a Proxy from cfg.
func New(cfg Config) *Proxy {
	p := &Proxy{
		bal:        cfg.Balancer,
		store:      cfg.Store,
		transport:  cfg.Transport,
		maxBody:    cfg.MaxBody,
		reinitTTL:  cfg.ReinitTimeout,
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
	if p.reinitTTL <= 0 {
		p.reinitTTL = 10 * time.Second
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.transport,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.handleError,
		BufferPool:     bufferPool{},
		// FlushInterval 0: ReverseProxy already flushes text/event-stream
		// and unknown-length bodies after every write (see isStreaming).
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	return p
}

// SessionExpired is the session store's expiry callback: the record's
// backend loses one live session.
func (p *Proxy) SessionExpired(rec *session.Record) {
	if ep, ok := p.bal.Lookup(rec.BackendID); ok {
		ep.AddSessions(-1)
	}
}

// exchange is the state of one client request as it moves along the path.
// It travels in the request context to the ReverseProxy callbacks.
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

	// Set by the ReverseProxy callbacks for the forward loop.
	retry    string // why the attempt failed safely and may be retried ("" = done)
	retryErr error
}

type exchangeKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
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

	class, rerr := classify(r, p.maxBody)
	x.class = class
	if rerr != nil {
		if rerr == errBodyTooLarge {
			w.Header().Set("Connection", "close") // the rest of the body is unread
		}
		writeRequestError(w, class.ID, rerr)
		return
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
			p.endSession(ctx, rec)
			w.WriteHeader(http.StatusNoContent)
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
// reached a backend (a failed dial) or that the backend refused because it
// does not know the session (404), which are then re-initialized.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, x *exchange) {
	ctx := context.WithValue(r.Context(), exchangeKey{}, x)
	out := r.WithContext(ctx)
	for attempt := 1; ; attempt++ {
		if x.ep == nil && !p.pick(w, x, nil) {
			return
		}
		x.retry, x.retryErr = "", nil

		// A GET stream is an idle channel for server messages, not work in
		// flight: counting it would add a constant per session to the load.
		counted := x.class.Kind != KindStream
		if counted {
			x.ep.Begin()
		}
		p.rp.ServeHTTP(w, out)
		if counted {
			x.ep.End()
		}

		if x.retry == "" {
			return
		}
		if attempt == maxAttempts {
			p.log.Warn("giving up on request", "route", x.route.String(), "backend", x.ep.String(), "err", x.retryErr)
			writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, "no backend could take the request")
			return
		}
		if x.span != nil {
			x.span.AddEvent("tether.retry", trace.WithAttributes(
				attribute.String("tether.retry.reason", x.retry),
				attribute.String("tether.backend", x.ep.String())))
		}
		failed := x.ep
		x.ep = nil
		if x.retry == reasonDial {
			// Passive health: a refused dial ejects the backend, and this
			// request does not try it again. A backend that answered 404 for
			// the session is healthy (it restarted) and may take it back.
			p.bal.Eject(failed, x.retryErr)
			x.excluded = failed
		}
		if x.rec == nil {
			continue // new or stateless: pick another backend
		}
		if x.class.Kind == KindDelete {
			// The backend that held the session is gone: the session ends.
			p.endSession(r.Context(), x.rec)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if err := p.reinitialize(r.Context(), r, x, x.retry); err != nil {
			p.failReinit(w, x, err)
			return
		}
	}
}

// endSession removes a session record and its count on the backend.
func (p *Proxy) endSession(ctx context.Context, rec *session.Record) {
	p.decisions.remove(rec.ClientSID)
	removed, err := p.store.Delete(ctx, rec.ClientSID)
	if err != nil {
		if !errors.Is(err, session.ErrNotFound) {
			p.log.Warn("session delete failed", "err", err)
		}
		return
	}
	if ep, ok := p.bal.Lookup(removed.BackendID); ok {
		ep.AddSessions(-1)
	}
}

// rewrite builds the outgoing request (ReverseProxy has already removed
// hop-by-hop and forwarding headers from Out).
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	x := exchangeFrom(pr.In.Context())
	pr.SetURL(x.ep.URL)
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
		pr.Out.Body = io.NopCloser(bytes.NewReader(body))
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
// before anything reaches the client.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := exchangeFrom(resp.Request.Context())
	ctx := resp.Request.Context()

	if x.rec != nil && resp.StatusCode == http.StatusNotFound && x.class.Kind != KindDelete {
		// The backend does not know the session: it restarted, or expired
		// the session. The request was refused, not processed, so it is safe
		// to re-initialize and send it again.
		x.retry = reasonLost
		return errRetry
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
			BackendID:       x.ep.ID,
			BackendURL:      x.ep.String(),
			BackendSID:      sid,
			Init:            x.class.Body,
			ProtocolVersion: x.class.ProtocolVersion,
			Created:         now,
			LastUsed:        now,
		}
		// Written before the response is released, so the client's next
		// request always finds its session.
		if err := p.store.Create(ctx, rec); err != nil {
			resp.Body.Close()
			return &storeWriteError{err}
		}
		x.ep.AddSessions(1)
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
	errRetry         = errors.New("retry")
	errBadBackendSID = errors.New("backend minted an invalid Mcp-Session-Id")
)

type storeWriteError struct{ err error }

func (e *storeWriteError) Error() string { return "session store write failed: " + e.err.Error() }
func (e *storeWriteError) Unwrap() error { return e.err }

// handleError is ReverseProxy's single failure path. Attempts that are safe
// to repeat are handed back to the forward loop; everything else is
// answered here.
func (p *Proxy) handleError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	switch {
	case errors.Is(err, errRetry):
		return // x.retry is set
	case isDialError(err):
		// The connection was never established, so the backend never saw
		// the request.
		x.retry, x.retryErr = reasonDial, err
		return
	case r.Context().Err() != nil:
		return // the client went away; nobody is listening
	}
	var swe *storeWriteError
	if errors.As(err, &swe) {
		p.log.Error("session record not written", "backend", x.ep.String(), "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "session store unavailable")
		return
	}
	// The request may have reached the backend: sending it again could run
	// a tools/call twice, so the client decides.
	p.log.Warn("backend request failed", "route", x.route.String(), "backend", x.ep.String(), "err", err)
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
	case errors.Is(err, session.ErrNotFound):
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
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
