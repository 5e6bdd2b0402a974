package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/session"
)

// The forward step. One attempt builds the request for its backend, sends
// it, and reads the answer's head: the record step (a new session's record,
// a moved session's id, a DELETE's end) or the reason the attempt may be
// repeated. Only then does anything reach the client: relay copies the
// answer, and answerFailure explains a failure.
//
// tether does this itself rather than with httputil.ReverseProxy, whose
// generality costs on every request: it clones the whole request, keeps an
// attempt's state in the request context for its callbacks, copies every
// header value, and for an SSE answer flushes the headers alone from a timer
// goroutine, then flushes again after each body write, so that the usual
// one-event answer to a POST leaves in three writes (bench/README.md,
// "Profile"). Here a complete answer leaves in one, and a stream is flushed
// at each event boundary as the events arrive.

// outcome is how one forwarding attempt ended.
type outcome struct {
	// retry says why the attempt failed in a way that is safe to repeat
	// (the request was never processed); "" when it is not.
	retry string
	err   error
	// resp is the backend's answer, for the client, when the attempt
	// succeeded (retry and err empty). Its headers are already rewritten
	// for the client.
	resp *h1.Answer
}

// forwardOnce makes one attempt and gives its result to the client, unless
// the attempt may be repeated. It is the only place that counts requests in
// flight, and the deferred End runs however the attempt ends: a response
// whose client hung up mid-stream is aborted with panic(http.ErrAbortHandler),
// which skips everything but defers.
func (p *Proxy) forwardOnce(w http.ResponseWriter, r *http.Request, x *exchange) outcome {
	// A GET stream is an idle channel for server messages, not work in
	// flight: counting it would add a constant per session to the load.
	switch {
	case x.class.Op == opListen:
		// A subscriptions/listen stream: counted as a stream (listen.go).
		x.ep.BeginListen()
		defer func() {
			if !x.parked { // else the stream's end ends it (park.go)
				x.ep.EndListen()
			}
		}()
	case x.class.Kind != kindStream:
		x.ep.Begin()
		defer x.ep.End()
	}
	o := p.attempt(r, x)
	switch {
	case o.retry != "":
	case o.err != nil:
		p.answerFailure(w, r, x, o.err)
	default:
		p.relay(w, r, x, o.resp)
	}
	return o
}

// attempt sends the request to x.ep and classifies the answer. It writes
// nothing to the client; what it changes is the session store (the record
// step) and x.newSID.
func (p *Proxy) attempt(r *http.Request, x *exchange) outcome {
	var out sentRequest
	resp, err := p.send(r, x, &out)
	if err != nil {
		if backend.IsDialError(err) {
			// The connection was never established, so the backend never
			// saw the request.
			return outcome{retry: reasonDial, err: err}
		}
		return outcome{err: err}
	}
	removeHopByHopFields(&resp.Header)
	if o := p.record(r, x, out, resp); o.retry != "" || o.err != nil {
		resp.Body.Close()
		return o
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// tether strips Upgrade from every request (stripUpgrade), so a
		// switch was never asked for: the answer cannot be relayed.
		resp.Body.Close()
		return outcome{err: errUnaskedSwitch}
	}
	return outcome{resp: resp}
}

var errUnaskedSwitch = errors.New("backend switched protocols without being asked to")

// send sends the attempt's request to x.ep, and sends it again as long as
// the retry contract allows (backend.MayResend), at most MaxResends
// times: to the same backend, whose session state is there. A backend that
// is going away refuses the next dial, which the forward loop turns into a
// move elsewhere. A failure that ends it is a *sendError, which says how
// often the request went out.
func (p *Proxy) send(r *http.Request, x *exchange, out *sentRequest) (*h1.Answer, error) {
	for resent := 0; ; resent++ {
		resp, err := p.sendOnce(r, x, out)
		if err == nil || backend.IsDialError(err) {
			return resp, err
		}
		idempotent := x.idempotent || hasIdempotencyKey(out.header())
		if resent == backend.MaxResends || r.Context().Err() != nil || !backend.MayResend(err, idempotent) {
			return nil, &sendError{err: err, resent: resent, idempotent: idempotent}
		}
		p.log.Debug("backend request failed before the backend could act on it, or is idempotent; sending it again",
			"backend", x.ep.String(), "err", err)
		if x.span != nil {
			x.span.AddEvent("tether.resend", trace.WithAttributes(attribute.String("tether.backend", x.ep.String())))
		}
	}
}

// sendOnce sends the attempt's request once: as a direct request on
// tether's own client, or as an *http.Request of its own on any other
// transport (which may still read the one of an earlier try).
func (p *Proxy) sendOnce(r *http.Request, x *exchange, out *sentRequest) (*h1.Answer, error) {
	if d := p.directRequest(r, x); d != nil {
		out.direct = d
		return p.direct.Send(&d.Request)
	}
	out.req, out.fields = p.outgoingRequest(r, x)
	std, err := p.transport.RoundTrip(out.req)
	if err != nil {
		return nil, err
	}
	// The header as fields, like tether's client's answers: one way to
	// read and relay answers.
	return h1.AnswerOf(std), nil
}

// sendError is a backend request that failed and was not sent again (any
// more): resent is how often it was sent again before, idempotent whether
// the contract let it be sent again once sent. answerFailure tells the
// client which it was.
type sendError struct {
	err        error
	resent     int
	idempotent bool
}

func (e *sendError) Error() string { return e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// failureMessage is what the client is told of a backend request that
// failed: whether it may have run, and whether and how often tether sent
// it again.
func failureMessage(err error) string {
	var se *sendError
	if !errors.As(err, &se) {
		return "backend failed after the request was sent; not retried"
	}
	switch {
	case errors.Is(se.err, h1.ErrMalformedAnswer):
		return "backend sent a malformed answer; not retried"
	case backend.NotSent(se.err):
		return fmt.Sprintf("backend did not take the request (connection broke before it was sent in full); sent %d times", se.resent+1)
	case se.idempotent && se.resent > 0:
		return fmt.Sprintf("backend failed; the request is idempotent and was sent %d times", se.resent+1)
	case se.idempotent:
		return "backend failed; the request is idempotent but could not be sent again"
	}
	return "backend failed after the request was sent; not retried, as the backend may have acted on it"
}

// sentRequest is the request an attempt sent: outgoingRequest's, or a
// direct request.
type sentRequest struct {
	req    *http.Request
	direct *directRequest
	fields h1.Fields // outgoingRequest's header as a list
}

// header is the header the backend got (record's uses: a new session's
// principal, a task's).
func (s sentRequest) header() h1.Fields {
	if s.direct != nil {
		return s.direct.Fields
	}
	return s.fields
}

// outgoingRequest builds the request for the current attempt's backend:
// the client's request with outgoingFields' header, Host and Origin as the
// client sent them, and the body read by classify. It is the request for
// a transport other than tether's own client (h2c, an https backend, a
// Config.Transport), and for what that client does not write itself;
// directRequest is the same request without a map or a request of its own.
// fields is its header as a list.
func (p *Proxy) outgoingRequest(r *http.Request, x *exchange) (out *http.Request, fields h1.Fields) {
	// Not in the exchange: a transport may read a request's body after
	// RoundTrip returns (a write that outlives an early answer or a failed
	// round trip), and an exchange is reused once its request is over.
	o := new(outgoing)
	ep := x.ep

	setOutgoingURL(&o.url, ep.URL, r.URL)

	fields = make(h1.Fields, 0, len(x.header)+2)
	p.outgoingFields(r.Context(), &fields, x)
	h := fields.Header()
	if _, ok := h["User-Agent"]; !ok {
		// Without one the transport would send Go's own.
		h["User-Agent"] = emptyValue
	}
	out = &http.Request{
		Method:     r.Method,
		URL:        &o.url,
		Proto:      r.Proto,
		ProtoMajor: r.ProtoMajor,
		ProtoMinor: r.ProtoMinor,
		Header:     h,
		// Keep Host and Origin as the client sent them: MCP servers check
		// both against DNS rebinding, and go-sdk answers 403 to a foreign
		// Host.
		Host:    r.Host,
		Trailer: r.Trailer,
	}
	if body := x.class.Body; body != nil {
		o.body.Reset(body)
		out.Body = o
		if x.getBody == nil {
			x.getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		}
		// Set, the transport can send the request again on another
		// connection when the first one turns out dead before a byte left
		// (client, retryUnread).
		out.GetBody = x.getBody
		out.ContentLength = int64(len(body))
	}
	return out.WithContext(r.Context()), fields
}

// setOutgoingURL sets u to the request URL in aimed at the backend base:
// its path and query after base's, as net/http/httputil joins them.
func setOutgoingURL(u *url.URL, base, in *url.URL) {
	*u = *in
	u.Scheme, u.Host = base.Scheme, base.Host
	u.Path, u.RawPath = joinURLPath(base, in)
	u.RawQuery = cleanQueryParams(in.RawQuery)
	if q := base.RawQuery; q != "" {
		if u.RawQuery == "" {
			u.RawQuery = q
		} else {
			u.RawQuery = q + "&" + u.RawQuery
		}
	}
}

// outgoing is what an attempt's request points at: its URL, and its body,
// which it reads itself (one allocation less than a reader of its own).
type outgoing struct {
	url  url.URL
	body bytes.Reader
}

// Read and Close make the attempt the outgoing request's body.
func (o *outgoing) Read(b []byte) (int, error) { return o.body.Read(b) }
func (o *outgoing) Close() error               { return nil }

// emptyValue is a header's value list holding "". Shared: header values are
// replaced, never written in place.
var emptyValue = []string{""}

// removeHopByHopFields removes an answer's hop-by-hop fields (isHopHeader)
// and those its Connection fields name, as http.Header.Del would remove
// them (a token made canonical), without making a token canonical: a
// backend's "Connection: keep-alive" costs no allocation.
func removeHopByHopFields(f *h1.Fields) {
	var room [2]string
	connection := room[:0]
	for _, fl := range *f {
		if fl.Name == "Connection" {
			connection = append(connection, fl.Value)
		}
	}
	kept := (*f)[:0]
	for _, fl := range *f {
		if isHopHeader(fl.Name) || len(connection) > 0 && connectionNames(connection, fl.Name) {
			continue
		}
		kept = append(kept, fl)
	}
	clear((*f)[len(kept):]) // no stale strings in the array
	*f = kept
}

// joinURLPath joins a backend's base path and the request's path, as
// net/http/httputil does.
func joinURLPath(a, b *url.URL) (path, rawpath string) {
	if a.RawPath == "" && b.RawPath == "" {
		return joinSlash(a.Path, b.Path), ""
	}
	apath, bpath := a.EscapedPath(), b.EscapedPath()
	aslash, bslash := strings.HasSuffix(apath, "/"), strings.HasPrefix(bpath, "/")
	switch {
	case aslash && bslash:
		return a.Path + b.Path[1:], apath + bpath[1:]
	case !aslash && !bslash:
		return a.Path + "/" + b.Path, apath + "/" + bpath
	}
	return a.Path + b.Path, apath + bpath
}

// joinSlash joins two paths with exactly one slash between them. (Unlike
// singleJoiningSlash, an empty b still gets the slash, as net/http/httputil
// gives it; a base without a path costs no allocation.)
func joinSlash(a, b string) string {
	aslash, bslash := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/")
	switch {
	case aslash && bslash:
		return a + b[1:]
	case !aslash && !bslash:
		return a + "/" + b
	}
	return a + b
}

// maxQueryParams is where a query is re-encoded rather than passed on (Go's
// own bound on what url.ParseQuery parses).
const maxQueryParams = 10000

// cleanQueryParams drops the query parameters a Go backend could not parse
// (';' separators, bad escapes), as net/http/httputil does: a backend and
// tether must not read different parameters from one request.
func cleanQueryParams(s string) string {
	reencode := func(s string) string {
		v, _ := url.ParseQuery(s)
		return v.Encode()
	}
	if strings.Count(s, "&")+1 > maxQueryParams {
		return reencode(s)
	}
	for i := 0; i < len(s); {
		switch s[i] {
		case ';':
			return reencode(s)
		case '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return reencode(s)
			}
			i += 3
		default:
			i++
		}
	}
	return s
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// record is the record step: it runs after the backend answered and before
// anything reaches the client. It returns a retry reason when the attempt
// is safe to repeat, an error when the answer must not reach the client.
func (p *Proxy) record(r *http.Request, x *exchange, out sentRequest, resp *h1.Answer) outcome {
	ctx := r.Context()
	ep := x.ep
	if resp.Header.Count(headerSessionID) > 1 {
		// Which one would the client keep? Clients fail a session whose id
		// changes, and a record keyed by the wrong one strands the session.
		return outcome{err: errDuplicateSID}
	}
	if x.rec != nil && resp.StatusCode == http.StatusNotFound && x.class.Kind != kindDelete {
		lost, err := p.sessionLost(resp)
		if err != nil {
			return outcome{err: err}
		}
		if lost {
			// The backend does not know the session: it restarted, or
			// expired the session. The request was refused, not processed,
			// so it is safe to re-initialize and send it again.
			return outcome{retry: reasonLost}
		}
		// A 404 that answers the request itself (an unknown method under
		// MCP 2026-07-28, a missing resource) goes to the client as it is.
	}

	switch {
	case x.route == routeNew:
		// Copied: a header value shares the memory of the whole head it
		// came in (h1 parses a head into substrings of one string), and
		// the record keeps it for the session's life.
		sid := strings.Clone(resp.Header.Get(headerSessionID))
		if resp.StatusCode/100 != 2 || sid == "" {
			break // a refused initialize, or a stateless server
		}
		if !validSessionID(sid) {
			return outcome{err: errBadBackendSID}
		}
		now := p.now()
		rec := &session.Record{
			ClientSID:       sid,
			BackendID:       ep.ID,
			BackendURL:      ep.String(),
			BackendSID:      sid,
			Init:            x.class.Body,
			ProtocolVersion: strings.Clone(x.class.ProtocolVersion),
			Principal:       p.principal.digest(out.header()),
			Host:            strings.Clone(r.Host),
			Path:            strings.Clone(r.URL.Path),
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
				"session", session.HashID(sid), "backend", ep.String())
			p.deleteLater(ep, sid, p.replayContextOf(r.Host, r.URL.Path, out.header(), x, reasonIDTaken))
			return outcome{retry: reasonIDTaken, err: err}
		}
		if err != nil {
			return outcome{err: &storeWriteError{err}}
		}
		x.newSID = sid
	case x.rec != nil:
		if resp.Header.Get(headerSessionID) != "" && x.backendSID != x.rec.ClientSID {
			// Never let the new backend's id leak: clients fail a session
			// whose id changes under them.
			resp.Header.Set(headerSessionID, x.rec.ClientSID)
		}
		if x.class.Kind == kindDelete && (resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusNotFound) {
			p.endSession(ctx, x.rec)
		}
		if x.rec.Reinits > 0 && isEventStream(resp.Header.Get("Content-Type")) {
			resp.Body = newEventIDTagger(resp.Body, x.rec.Reinits)
			// Tagging lengthens the body: its length is no longer known.
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
		}
	}
	p.watchTaskCreation(r, x, out, resp)
	return outcome{}
}

var (
	errBadBackendSID = errors.New("backend minted an invalid Mcp-Session-Id")
	errDuplicateSID  = errors.New("backend sent more than one Mcp-Session-Id")
)

type storeWriteError struct{ err error }

func (e *storeWriteError) Error() string { return "session store write failed: " + e.err.Error() }
func (e *storeWriteError) Unwrap() error { return e.err }

// answerFailure answers an attempt that failed and may not be repeated.
func (p *Proxy) answerFailure(w http.ResponseWriter, r *http.Request, x *exchange, err error) {
	if r.Context().Err() != nil {
		return // the client went away; nobody is listening
	}
	if errors.Is(err, errDuplicateSID) {
		p.log.Warn("backend answered with more than one Mcp-Session-Id", "route", x.route.String(), "backend", x.ep.String())
		writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, "backend answered with more than one Mcp-Session-Id")
		return
	}
	var swe *storeWriteError
	if errors.As(err, &swe) {
		p.log.Error("session record not written", "backend", x.ep.String(), "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "session store unavailable")
		return
	}
	// The request may have reached the backend: sending it again could run
	// a tools/call twice, so the client decides (backend.MayResend).
	p.log.Warn("backend request failed", "route", x.route.String(), "backend", x.ep.String(), "err", err)
	writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, failureMessage(err))
}

// relay copies the backend's answer to the client: headers, body,
// trailers. A complete answer is written without a flush, so the server
// sends it (headers, body and the final chunk) in one write when the
// handler returns; a stream is flushed at each event boundary as it
// arrives. A body that fails midway aborts the response
// (panic(http.ErrAbortHandler)), so the client sees it cut off rather than
// complete.
func (p *Proxy) relay(w http.ResponseWriter, r *http.Request, x *exchange, resp *h1.Answer) {
	stream := x.class.Kind == kindStream || x.class.Op == opListen
	pool := &copyBuffers
	if stream {
		// GET streams are long-lived and mostly idle: they copy through
		// small buffers (streamCopyBufferSize) so that thousands of them
		// stay cheap.
		pool = &streamCopyBuffers
	}
	buf := pool.Get().(*[]byte)
	defer pool.Put(buf)
	// The body's first read comes before the head is given to the
	// client, so that an answer whose body breaks at once (a bad chunk
	// size, a connection cut after the head) is a 502 rather than a cut
	// connection with nothing on it. Not for a GET or listen stream,
	// whose head reaches the client before its first event (which may be
	// long in coming); every other answer's head leaves with its first
	// bytes anyway (h1 holds it until the first flush).
	primed := -1
	var primedErr error
	if !stream {
		primed, primedErr = resp.Body.Read(*buf)
		if primed == 0 && primedErr != nil && primedErr != io.EOF {
			resp.Body.Close()
			if r.Context().Err() == nil {
				p.log.Warn("backend answer broke before its body's first byte", "backend", x.ep.String(), "err", primedErr)
				writeJSONRPCError(w, http.StatusBadGateway, x.class.ID, codeBackendFailed, "backend answer broke before its body began; not retried")
			}
			return
		}
	}
	if !adoptFields(w, resp.Header) {
		resp.Header.AddTo(w.Header())
	}
	// From here on w.Header() is asked for only when there are trailers:
	// h1's writer renders adopted fields without a map, and builds one
	// when asked for the header.
	//
	// The transport takes the Trailer header into resp.Trailer: announce
	// the trailers again.
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		w.Header().Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)

	mode := flushNever
	switch {
	case isEventStream(resp.Header.Get("Content-Type")):
		mode = flushEvents
	case resp.ContentLength == -1:
		mode = flushReads
	}
	if stream && mode != flushNever {
		// Clients see the stream open before its first event, which may
		// be long in coming.
		flush(w)
	}
	var err error
	if stream && mode == flushEvents {
		var parked bool
		parked, err = p.relayEvents(w, r, x, resp, announced, *buf)
		if parked {
			return // the stream goes on without the handler (park.go)
		}
	} else {
		err = copyBody(w, resp.Body, *buf, primed, primedErr, mode)
	}
	if err != nil {
		resp.Body.Close()
		p.noteRelayFailure(r.Context(), x.ep, err)
		if r.Context().Value(http.ServerContextKey) == nil {
			// Not under an http.Server, which would recover the panic
			// (a handler called directly, as in a benchmark): stop here.
			return
		}
		panic(http.ErrAbortHandler)
	}
	resp.Body.Close() // now, to populate resp.Trailer

	if len(resp.Trailer) == 0 {
		return
	}
	// Chunked, even if short: a Content-Length answer has no trailers.
	flush(w)
	addTrailers(w.Header(), resp.Trailer, announced)
}

// noteRelayFailure records why an answer was cut off: a client that read
// nothing for the send timeout counts as a limit; a backend body that
// broke is logged (a client gone or a request cancelled is not news).
func (p *Proxy) noteRelayFailure(ctx context.Context, ep *balancer.Endpoint, err error) {
	if errors.Is(err, errClientWrite) && errors.Is(err, os.ErrDeadlineExceeded) {
		p.metrics.LimitRejected(limitClientSend)
	}
	if !errors.Is(err, errClientWrite) && !errors.Is(err, errClientGone) && !errors.Is(err, ctx.Err()) {
		p.log.Debug("backend body read failed", "backend", ep.String(), "err", err)
	}
}

// addTrailers puts the backend's trailers into h, the client's answer's
// header after its head was written: as trailers, announced in the head
// (announced of them were) or under http.TrailerPrefix.
func addTrailers(h, trailer http.Header, announced int) {
	if len(trailer) == announced {
		for k, vv := range trailer {
			for _, v := range vv {
				h.Add(k, v)
			}
		}
		return
	}
	// Trailers that were not announced in the headers.
	for k, vv := range trailer {
		for _, v := range vv {
			h.Add(http.TrailerPrefix+k, v)
		}
	}
}

// fieldsAdopter is a ResponseWriter that takes a header's fields over as
// its own (h1's).
type fieldsAdopter interface {
	AdoptFields(h1.Fields) bool
}

// adoptFields makes the backend's header fields f the client's answer's,
// without a copy, when w is h1's writer (behind the exchange's status
// recorder; another wrapper may keep a header map of its own). It reports
// false when f is to be copied into w.Header() instead: net/http's writer
// (a request h1 handed off, h2c).
func adoptFields(w http.ResponseWriter, f h1.Fields) bool {
	if sr, ok := w.(*statusRecorder); ok {
		w = sr.ResponseWriter
	}
	a, ok := w.(fieldsAdopter)
	return ok && a.AdoptFields(f)
}

// When a response is flushed to the client while its body is copied.
type flushMode uint8

const (
	// flushNever: a body of known length, not a stream. The server's
	// buffer decides; the rest leaves when the handler returns.
	flushNever flushMode = iota
	// flushEvents: an SSE stream, flushed whenever what was copied ends
	// an event.
	flushEvents
	// flushReads: a body of unknown length that is not SSE, flushed after
	// every read.
	flushReads
)

// errClientWrite marks a failed write to the client.
var errClientWrite = errors.New("write to client failed")

// copyBody copies body to w through buf. Nothing is flushed when a read
// returns the end of the body with its last bytes: the answer is complete,
// and the server sends what is buffered, with the final chunk, at once
// when the handler returns.
//
// primed >= 0 says that buf[:primed] holds the body's first read already,
// which ended with primedErr.
func copyBody(w http.ResponseWriter, body io.Reader, buf []byte, primed int, primedErr error, mode flushMode) error {
	var tail eventTail
	for {
		var n int
		var rerr error
		if primed >= 0 {
			n, rerr, primed = primed, primedErr, -1
		} else {
			n, rerr = body.Read(buf)
		}
		if n > 0 {
			nw, werr := w.Write(buf[:n])
			if werr != nil {
				return errors.Join(errClientWrite, werr)
			}
			if nw != n {
				return errors.Join(errClientWrite, io.ErrShortWrite)
			}
			if rerr == nil && (mode == flushReads || mode == flushEvents && tail.endsEvent(buf[:n])) {
				if err := flush(w); err != nil {
					return errors.Join(errClientWrite, err)
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// flush sends what the server holds of the response to the client. A
// writer that cannot flush (a handler called outside an http.Server) is
// not an error.
func flush(w http.ResponseWriter) error {
	if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// eventTail remembers the last bytes of an SSE stream, so that the end of
// an event is recognised when the blank line that ends it is split across
// reads.
type eventTail struct {
	last [3]byte
	n    uint8
}

// endsEvent appends b to the stream and reports whether the stream now
// ends with an event: a line terminator (CRLF, LF or CR) followed by an
// empty line.
func (t *eventTail) endsEvent(b []byte) bool {
	// Keep the last three bytes of the stream.
	if len(b) >= len(t.last) {
		t.n = uint8(copy(t.last[:], b[len(b)-len(t.last):]))
	} else {
		n := int(t.n)
		keep := min(n, len(t.last)-len(b))
		copy(t.last[:], t.last[n-keep:n])
		t.n = uint8(keep + copy(t.last[keep:], b))
	}
	s := t.last[:t.n]
	if len(s) < 2 || !isEOL(s[len(s)-1]) || !isEOL(s[len(s)-2]) {
		return false
	}
	if s[len(s)-2] == '\r' && s[len(s)-1] == '\n' {
		// One CRLF: an event ends only if a terminator precedes it.
		return len(s) == 3 && isEOL(s[0])
	}
	return true
}

func isEOL(c byte) bool { return c == '\n' || c == '\r' }

// Copy buffers, pooled: without them every response allocates its buffer.
// The pools hold pointers, so that putting a buffer back allocates nothing.
var (
	copyBuffers       = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
	streamCopyBuffers = sync.Pool{New: func() any { b := make([]byte, streamCopyBufferSize); return &b }}
)
