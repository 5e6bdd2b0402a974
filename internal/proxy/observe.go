package proxy

import (
	"fmt"
	"hash/maphash"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/session"
)

// statusRecorder remembers the status sent to the client. It lives inside
// the exchange (no allocation of its own) and unwraps for
// http.ResponseController, so relay's flushes reach the connection.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Flush keeps http.Flusher working for code that asserts it directly.
func (r *statusRecorder) Flush() { http.NewResponseController(r.ResponseWriter).Flush() }

// FlushError is the flush http.ResponseController prefers: it reports a
// client that is gone, so that relay stops copying for nobody.
func (r *statusRecorder) FlushError() error {
	return http.NewResponseController(r.ResponseWriter).Flush()
}

// startServerSpan opens the request's server span, continuing the client's
// W3C trace context.
func (p *Proxy) startServerSpan(r *http.Request, x *exchange) *http.Request {
	ctx := p.propagator.Extract(r.Context(), fieldsCarrier{&x.header})
	ctx, x.span = p.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			semconv.HTTPRequestMethodKey.String(r.Method),
			semconv.URLPath(r.URL.Path),
			semconv.ServerAddress(r.Host),
			semconv.NetworkProtocolVersion(fmt.Sprintf("%d.%d", r.ProtoMajor, r.ProtoMinor)),
			semconv.UserAgentOriginal(x.header.Get("User-Agent")),
		))
	return r.WithContext(ctx)
}

// finish records the request: metrics, the decision log, the server span.
func (p *Proxy) finish(x *exchangeEnd, status int) {
	route, backend := "refused", ""
	if x.routed {
		route = x.route.String()
	}
	if x.ep != nil {
		backend = x.ep.String()
	}
	now := time.Now()
	p.metrics.Request(route, x.class.Era.String(), methodLabel(x.class.Method), backend, status, now.Sub(x.start))
	if x.routed {
		p.recordDecision(x, status, now)
	}
	if x.span != nil {
		x.span.SetAttributes(semconv.HTTPResponseStatusCode(status), attribute.String("tether.route", route))
		x.span.SetAttributes(mcpAttributes(&x.class)...)
		if status >= 500 || status == 0 {
			x.span.SetStatus(codes.Error, http.StatusText(status))
		}
		x.span.End()
	}
}

// mcpAttributes describe the request as MCP sees it, on the server span
// (refused requests included): mcp.era always; mcp.method, and
// mcp.protocol.version when it is a version date, when there is one;
// mcp.name for the named methods of tools, prompts and resources; a task's
// id hashed as mcp.task.id, like session ids (session.HashID), since
// whoever knows it can act on the task.
func mcpAttributes(c *classification) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, attribute.String("mcp.era", c.Era.String()))
	if c.Method != "" {
		attrs = append(attrs, attribute.String("mcp.method", c.Method))
	}
	if isVersionDate(c.ProtocolVersion) {
		attrs = append(attrs, attribute.String("mcp.protocol.version", c.ProtocolVersion))
	}
	member := nameMember(c.Method)
	if member == "" || c.Batch {
		return attrs
	}
	name := c.Name // validated against Mcp-Name (modern)
	if name == "" {
		// Legacy, or refused before validation: the body is the truth.
		name, _, _ = paramsString(c.Params, member, "")
	}
	if name == "" {
		return attrs
	}
	if c.Op == opTask {
		return append(attrs, attribute.String("mcp.task.id", session.HashID(name)))
	}
	return append(attrs, attribute.String("mcp.name", name))
}

// endRouteSpan puts the decision on the tether.route span.
func (p *Proxy) endRouteSpan(span trace.Span, x *exchange) {
	attrs := []attribute.KeyValue{
		attribute.String("mcp.method", x.class.Method),
		attribute.String("tether.route", x.route.String()),
	}
	if !x.routed {
		attrs[1] = attribute.String("tether.route", "refused")
	}
	if sid := x.class.SessionID; sid != "" {
		attrs = append(attrs, attribute.String("mcp.session.id", session.HashID(sid)))
	}
	if x.ep != nil {
		attrs = append(attrs, attribute.String("tether.backend", x.ep.String()))
	}
	if x.store != "" {
		attrs = append(attrs, attribute.String("tether.store.result", x.store))
	}
	if x.reinit != "" {
		attrs = append(attrs, attribute.String("tether.reinit.reason", x.reinit))
	}
	span.SetAttributes(attrs...)
	span.End()
}

// candidatesAttr renders what a picker weighed: "URL=load" per candidate.
func candidatesAttr(weighed []balancer.Candidate) attribute.KeyValue {
	out := make([]string, len(weighed))
	for i, c := range weighed {
		out[i] = c.Endpoint.String() + "=" + strconv.FormatInt(c.Load, 10)
	}
	return attribute.StringSlice("tether.candidates", out)
}

// Decision is one routing decision as `tether explain` shows it.
type Decision struct {
	Route   string `json:"route"`
	Backend string `json:"backend"`
	Reason  string `json:"reason,omitempty"`
	// From and While, for a drain's move: the backend the session left,
	// and why it drained (terminating, operator).
	From       string      `json:"from,omitempty"`
	While      string      `json:"while,omitempty"`
	Candidates []candidate `json:"candidates,omitempty"`
	Status     int         `json:"status"`
	At         time.Time   `json:"at"`
}

// candidate is a backend a picker weighed, and the load it saw.
type candidate struct {
	Backend string `json:"backend"`
	Load    int64  `json:"load"`
}

// SessionHistory is what this replica saw of a session: how it was placed,
// its last move, and its latest request.
type SessionHistory struct {
	Placed     *Decision `json:"placed,omitempty"`
	LastReinit *Decision `json:"last_reinit,omitempty"`
	Requests   int64     `json:"requests"`
	LastRoute  string    `json:"last_route"`
	LastStatus int       `json:"last_status"`
	LastAt     time.Time `json:"last_at"`
}

type sessionDecisions struct {
	placed, lastReinit atomic.Pointer[Decision]
	requests           atomic.Int64
	lastRoute          atomic.Uint32
	lastStatus         atomic.Int32
	lastAt             atomic.Int64
}

// decisionLog keeps recent sessions' decisions, bounded, in independently
// locked shards. A sticky request updates atomics in place: no allocation.
type decisionLog struct {
	seed   maphash.Seed
	shards [32]*lru.Cache[string, *sessionDecisions]
}

func newDecisionLog(size int) *decisionLog {
	d := &decisionLog{seed: maphash.MakeSeed()}
	for i := range d.shards {
		d.shards[i], _ = lru.New[string, *sessionDecisions](max(size/len(d.shards), 1))
	}
	return d
}

func (d *decisionLog) shard(sid string) *lru.Cache[string, *sessionDecisions] {
	return d.shards[maphash.String(d.seed, sid)%uint64(len(d.shards))]
}

// promoteEvery is how stale an entry's place in its shard's LRU may get: a
// session's requests within it do not move the entry to the front. Moving
// it is a write lock and four pointer writes on cold cache lines per
// request; eviction needs recency to the second, not to the request.
const promoteEvery = time.Second

// entry returns sid's entry, nil when there is none and create is false.
// now (Unix nanoseconds) is the time of a request of the session, which
// keeps its entry recent; 0 for a look that is not a use (History).
func (d *decisionLog) entry(sid string, create bool, now int64) *sessionDecisions {
	sh := d.shard(sid)
	if e, ok := sh.Peek(sid); ok && (now == 0 || now-e.lastAt.Load() < int64(promoteEvery)) {
		return e
	}
	if e, ok := sh.Get(sid); ok || !create {
		return e
	}
	fresh := &sessionDecisions{}
	if prev, found, _ := sh.PeekOrAdd(sid, fresh); found {
		return prev // added by a concurrent request
	}
	return fresh
}

func (d *decisionLog) remove(sid string) { d.shard(sid).Remove(sid) }

// History returns what this replica knows of a session's decisions.
func (p *Proxy) History(sid string) (SessionHistory, bool) {
	e := p.decisions.entry(sid, false, 0)
	if e == nil {
		return SessionHistory{}, false
	}
	return SessionHistory{
		Placed:     e.placed.Load(),
		LastReinit: e.lastReinit.Load(),
		Requests:   e.requests.Load(),
		LastRoute:  routeKind(e.lastRoute.Load()).String(),
		LastStatus: int(e.lastStatus.Load()),
		LastAt:     time.Unix(0, e.lastAt.Load()),
	}, true
}

func (p *Proxy) recordDecision(x *exchangeEnd, status int, now time.Time) {
	sid := x.class.SessionID
	if x.route == routeNew {
		sid = x.newSID
	}
	if sid == "" {
		return // stateless, or an initialize that created no session
	}
	e := p.decisions.entry(sid, true, now.UnixNano())
	if x.route == routeNew || x.route == routeReinit {
		d := &Decision{Route: x.route.String(), Reason: x.reinit, Status: status, At: now}
		if x.ep != nil {
			d.Backend = x.ep.String()
		}
		for _, c := range x.weighed {
			d.Candidates = append(d.Candidates, candidate{Backend: c.Endpoint.String(), Load: c.Load})
		}
		if x.route == routeNew {
			e.placed.Store(d)
		} else {
			e.lastReinit.Store(d)
		}
	}
	e.requests.Add(1)
	e.lastRoute.Store(uint32(x.route))
	e.lastStatus.Store(int32(status))
	e.lastAt.Store(now.UnixNano())
}
