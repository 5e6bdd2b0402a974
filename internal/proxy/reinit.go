package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/session"
)

// replayHeaders are copied from the request that triggers a
// re-initialization into the replayed initialize: credentials must be the
// client's current ones (a stored token may have expired), and Origin and
// the forwarding headers keep the backend's own checks meaningful.
var replayHeaders = []string{
	"Authorization", "Cookie", "Origin", "User-Agent",
	"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
}

// maxInitializeResponse bounds what tether reads of a replayed initialize.
const maxInitializeResponse = 1 << 20

// replayContext is what a re-initialization takes from the triggering
// request, copied so the flight never touches a request that has ended.
type replayContext struct {
	host            string
	path            string
	protocolVersion string
	header          http.Header
	exclude         *balancer.Endpoint
	reason          string
}

// newReplayContext copies what a request to a backend on r's behalf needs.
func (p *Proxy) newReplayContext(r *http.Request, x *exchange, reason string) replayContext {
	return p.replayContextOf(r.Host, r.URL.Path, x.header, x, reason)
}

// replayContextOf copies the replayed headers and the principal headers
// (the credentials a backend may bind the session to) from h.
func (p *Proxy) replayContextOf(host, path string, h h1.Fields, x *exchange, reason string) replayContext {
	rc := replayContext{
		host:            host,
		path:            path,
		protocolVersion: x.class.ProtocolVersion,
		header:          make(http.Header, len(replayHeaders)+len(p.principal.headers)),
		exclude:         x.excluded,
		reason:          reason,
	}
	for _, list := range [][]string{replayHeaders, p.principal.headers} {
		for _, name := range list {
			if v := h.Values(name); len(v) > 0 {
				for i := range v {
					v[i] = strings.Clone(v[i]) // not the request's head
				}
				rc.header[textproto.CanonicalMIMEHeaderKey(name)] = v
			}
		}
	}
	return rc
}

// errOtherPrincipal refuses to re-initialize a session for a request whose
// credentials are not those the session was created with.
var errOtherPrincipal = errors.New("the request's credentials are not the session creator's")

// reinitialize moves x's session to another backend
// (docs/design.md#transparent-re-initialization) and points x at it.
// Concurrent requests of one session share one re-initialization. Only the
// session's creator may move it: the replayed initialize carries the
// current request's credentials, and a backend binds the new session to
// them, so anyone else would take the session over.
func (p *Proxy) reinitialize(ctx context.Context, r *http.Request, x *exchange, reason string) error {
	stale := x.rec
	if !p.principal.matches(stale.Principal, x.header) {
		p.metrics.Reinit(reason, "refused")
		p.log.Warn("re-initialization refused: the request's credentials differ from the session creator's",
			"session", session.HashID(stale.ClientSID), "reason", reason)
		return errOtherPrincipal
	}
	rc := p.newReplayContext(r, x, reason)
	ch := p.flights.DoChan(stale.ClientSID, func() (any, error) {
		// The flight outlives any one waiter: it must finish even if the
		// request that started it is cancelled, since others wait on it.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.reinitTTL)
		defer cancel()
		return p.moveSession(fctx, stale, rc)
	})
	var res singleflight.Result
	select {
	case res = <-ch:
	case <-ctx.Done():
		return ctx.Err()
	}
	if res.Err != nil {
		return res.Err
	}
	mv := res.Val.(moved)
	rec := mv.rec
	x.weighed = mv.weighed
	ep, ok := p.bal.Lookup(rec.BackendID)
	if !ok {
		return fmt.Errorf("re-initialized session's backend %s left the endpoint set", rec.BackendURL)
	}
	x.rec, x.ep, x.backendSID = rec, ep, rec.BackendSID
	x.route, x.reinit = routeReinit, reason
	return nil
}

// moved is a re-initialization's outcome, shared by every request that
// waited for it.
type moved struct {
	rec     *session.Record
	weighed []balancer.Candidate
	// adopted: another flight or replica had moved the session; rec is
	// its result.
	adopted bool
}

// moveSession re-initializes the session on a new backend: pick, replay
// initialize, send notifications/initialized, swap the record. It is traced
// as tether.reinit (one event per step) and counted by reason and result.
func (p *Proxy) moveSession(ctx context.Context, stale *session.Record, rc replayContext) (m moved, err error) {
	var span trace.Span
	if p.tracer != nil {
		ctx, span = p.tracer.Start(ctx, "tether.reinit", trace.WithAttributes(
			attribute.String("mcp.session.id", session.HashID(stale.ClientSID)),
			attribute.String("tether.reinit.reason", rc.reason),
			attribute.String("tether.reinit.from", stale.BackendURL)))
		defer span.End()
	}
	step := func(name string, kv ...attribute.KeyValue) {
		if span != nil {
			span.AddEvent(name, trace.WithAttributes(kv...))
		}
	}
	result := "failed"
	defer func() {
		p.metrics.Reinit(rc.reason, result)
		if span != nil {
			span.SetAttributes(attribute.String("tether.reinit.result", result))
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
		}
	}()

	cur, err := p.store.Reload(ctx, stale.ClientSID)
	if err != nil {
		return m, err
	}
	if cur.Version != stale.Version {
		// Moved by an earlier flight (or another replica) after the caller
		// read the record: use that move unless it too is already dead.
		if ep, ok := p.bal.Lookup(cur.BackendID); ok && !ep.Ejected() {
			result = "adopted"
			step("adopt", attribute.String("tether.backend", cur.BackendURL))
			return moved{rec: cur, adopted: true}, nil
		}
	}
	exclude := rc.exclude
	var lastErr error
	for range maxAttempts {
		placed, weighed, err := p.placeMove(stale, cur, exclude, &rc, m.weighed[:0])
		defer placed.Release() // in ep's load until the Swap below is counted (or failed)
		ep := placed.Endpoint
		m.weighed = weighed
		if err != nil {
			return m, err
		}
		step("pick", attribute.String("tether.backend", ep.String()), candidatesAttr(weighed))
		sid, err := p.replayInitialize(ctx, ep, cur, rc)
		if err != nil {
			lastErr = err
			step("initialize failed", attribute.String("error", err.Error()))
			if backend.IsDialError(err) {
				p.bal.Eject(ep, err)
				exclude = ep
				continue
			}
			return m, fmt.Errorf("replay initialize on %s: %w", ep, err)
		}
		step("initialized", attribute.String("tether.backend", ep.String()))

		next := cur.Clone()
		next.BackendID, next.BackendURL, next.BackendSID = ep.ID, ep.String(), sid
		next.Reinits++
		next.LastUsed = p.now()
		stored, err := p.store.Swap(ctx, cur, next)
		if errors.Is(err, session.ErrConflict) && stored != nil {
			// Someone else moved the session first: adopt their backend and
			// end the orphan session we just created.
			step("swap lost", attribute.String("tether.backend", stored.BackendURL))
			p.deleteBackendSession(ctx, ep, sid, rc)
			if winner, ok := p.bal.Lookup(stored.BackendID); ok && !winner.Ejected() {
				result = "adopted"
				return moved{rec: stored, adopted: true}, nil
			}
			cur = stored
			continue
		}
		if err != nil {
			p.deleteBackendSession(ctx, ep, sid, rc)
			return m, fmt.Errorf("swap session record: %w", err)
		}
		step("swapped", attribute.Int64("tether.record.version", int64(stored.Version)))
		if old, ok := p.bal.Lookup(cur.BackendID); ok && rc.reason != reasonDrain {
			// (A drain leaves the old copy to die with its pod: another
			// replica may still have a request of the session in flight on
			// it.)
			// The superseded backend session would otherwise live on until
			// the backend's idle timeout (or for ever): end it. Unless it is
			// the new one: a backend that restarted with a counter for ids
			// may have minted the same id again.
			if old != ep || cur.BackendSID != sid {
				p.deleteLater(old, cur.BackendSID, rc)
			}
		}
		level := slog.LevelInfo
		if rc.reason == reasonDrain {
			level = slog.LevelDebug // a drain logs once per backend
		}
		p.log.Log(ctx, level, "session re-initialized",
			"session", session.HashID(stored.ClientSID),
			"reason", rc.reason,
			"from", cur.BackendURL,
			"to", stored.BackendURL,
			"reinits", stored.Reinits)
		result = "ok"
		m.rec = stored
		return m, nil
	}
	return m, fmt.Errorf("no backend accepted the session: %w", lastErr)
}

// replayInitialize sends the session's stored initialize to ep, then
// notifications/initialized (Python-SDK servers refuse every request until
// it arrives), and returns the session id ep minted.
func (p *Proxy) replayInitialize(ctx context.Context, ep *balancer.Endpoint, rec *session.Record, rc replayContext) (string, error) {
	req, err := p.newBackendRequest(ctx, http.MethodPost, ep, rc, rec.Init)
	if err != nil {
		return "", err
	}
	if rec.ProtocolVersion != "" {
		req.Header.Set(headerProtocolVersion, rec.ProtocolVersion)
	}
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("initialize answered %s", resp.Status)
	}
	sid := strings.Clone(resp.Header.Get(headerSessionID)) // kept in the record: see forward's routeNew
	if !validSessionID(sid) {
		return "", errors.New("initialize answer carries no valid Mcp-Session-Id")
	}
	version, err := readInitializeResult(resp)
	if err != nil {
		p.deleteBackendSession(ctx, ep, sid, rc)
		return "", err
	}
	if rc.protocolVersion != "" {
		version = rc.protocolVersion // what the client negotiated and speaks
	}

	note, err := p.newBackendRequest(ctx, http.MethodPost, ep, rc, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	if err != nil {
		return "", err
	}
	note.Header.Set(headerSessionID, sid)
	if version != "" {
		note.Header.Set(headerProtocolVersion, version)
	}
	nresp, err := p.transport.RoundTrip(note)
	if err != nil {
		return "", fmt.Errorf("notifications/initialized: %w", err)
	}
	io.Copy(io.Discard, io.LimitReader(nresp.Body, maxInitializeResponse))
	nresp.Body.Close()
	if nresp.StatusCode/100 != 2 {
		p.deleteBackendSession(ctx, ep, sid, rc)
		return "", fmt.Errorf("notifications/initialized answered %s", nresp.Status)
	}
	return sid, nil
}

// Bounds of the DELETEs that end superseded or refused backend sessions off
// the request path: how many may be in flight, and how long each may take.
const (
	maxCleanups    = 64
	cleanupTimeout = 2 * time.Second
)

// deleteLater ends a backend session that no client will use again, off the
// request path. Best effort and bounded: when maxCleanups are in flight (a
// mass failover) the session is left to the backend's idle timeout.
func (p *Proxy) deleteLater(ep *balancer.Endpoint, sid string, rc replayContext) {
	select {
	case p.cleanups <- struct{}{}:
	default:
		p.log.Debug("backend session left to the backend's idle timeout: too many deletions in flight",
			"session", session.HashID(sid), "backend", ep.String())
		return
	}
	go func() {
		defer func() { <-p.cleanups }()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		p.deleteBackendSession(ctx, ep, sid, rc)
	}()
}

// deleteBackendSession ends a backend session tether created but will not
// use. Best effort: the backend's own idle timeout is the backstop.
func (p *Proxy) deleteBackendSession(ctx context.Context, ep *balancer.Endpoint, sid string, rc replayContext) {
	req, err := p.newBackendRequest(ctx, http.MethodDelete, ep, rc, nil)
	if err != nil {
		return
	}
	req.Header.Set(headerSessionID, sid)
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		return
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxInitializeResponse))
	resp.Body.Close()
}

func (p *Proxy) newBackendRequest(ctx context.Context, method string, ep *balancer.Endpoint, rc replayContext, body []byte) (*http.Request, error) {
	target := *ep.URL
	target.Path = singleJoiningSlash(ep.URL.Path, rc.path)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Host = rc.host
	for h, v := range rc.header {
		req.Header[h] = v
	}
	if p.tracer != nil {
		p.propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	return req, nil
}

func singleJoiningSlash(a, b string) string {
	if b == "" {
		return a
	}
	return strings.TrimSuffix(a, "/") + "/" + strings.TrimPrefix(b, "/")
}

// readInitializeResult reads the answer to an initialize, JSON or SSE, and
// returns the negotiated protocol version.
func readInitializeResult(resp *http.Response) (string, error) {
	body := io.LimitReader(resp.Body, maxInitializeResponse)
	if !isEventStream(resp.Header.Get("Content-Type")) {
		data, err := io.ReadAll(body)
		if err != nil {
			return "", fmt.Errorf("read initialize answer: %w", err)
		}
		return initializeVersion(data)
	}
	// SSE: the answer is the first event whose data is a JSON-RPC response.
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxInitializeResponse)
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if len(data) > 0 {
				if v, err := initializeVersion(data); err == nil || !errors.Is(err, errNotAResponse) {
					return v, err
				}
			}
			data = data[:0]
			continue
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(d, []byte(" "))...)
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read initialize stream: %w", err)
	}
	return "", errors.New("initialize stream ended without an answer")
}

var errNotAResponse = errors.New("not a JSON-RPC response")

// initializeVersion finds the initialize result in a JSON-RPC response (or
// a batch of them) and returns its protocolVersion.
func initializeVersion(data []byte) (string, error) {
	type response struct {
		ID     json.RawMessage `json:"id"`
		Result *struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	var msgs []response
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		if err := json.Unmarshal(data, &msgs); err != nil {
			return "", fmt.Errorf("decode initialize answer: %w", err)
		}
	} else {
		var m response
		if err := json.Unmarshal(data, &m); err != nil {
			return "", fmt.Errorf("decode initialize answer: %w", err)
		}
		msgs = append(msgs, m)
	}
	for _, m := range msgs {
		if m.Error != nil {
			return "", fmt.Errorf("initialize refused: %d %s", m.Error.Code, m.Error.Message)
		}
		if m.Result != nil && m.Result.ProtocolVersion != "" {
			return m.Result.ProtocolVersion, nil
		}
	}
	return "", errNotAResponse
}
