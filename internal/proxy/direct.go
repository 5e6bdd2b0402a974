package proxy

import (
	"context"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"golang.org/x/net/http/httpguts"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/h1"
)

// The backend's request header is built once per attempt as a list of
// fields (outgoingFields), from the client's list: tether's own client
// writes the list as it is (a direct request, below); any other transport
// gets it as the map of an *http.Request (outgoingRequest).
//
// An exchange keeps one direct request and rewrites it for each attempt.
// No earlier attempt can still read it: tether's client writes a request
// on the caller's goroutine and is done with it when the round trip
// returns (http.Transport, which may write on after a failed round trip,
// gets a new *http.Request for each attempt: outgoingRequest).

// directRequest is the request of one attempt on tether's own client.
type directRequest struct {
	backend.Request

	// room is Fields' array for the usual request, in the exchange: no
	// allocation of its own.
	room [12]h1.Field
}

// directRequest prepares x's direct request for the current attempt, or
// returns nil when the attempt must take outgoingRequest's path: the
// transport is not tether's client, the backend is https, or the request
// is not of the shape h1 writes (a trailer, an opaque URL, a Host net/http
// would convert, a method that is not a token).
func (p *Proxy) directRequest(r *http.Request, x *exchange) *directRequest {
	if p.direct == nil || x.ep.URL.Scheme != "http" || len(r.Trailer) > 0 {
		return nil
	}
	d := &x.direct
	setOutgoingURL(&d.URL, x.ep.URL, r.URL)
	d.Host = r.Host
	if d.Host == "" {
		d.Host = d.URL.Host
	}
	if !backend.Writable(r.Method, &d.URL, d.Host) {
		return nil
	}
	d.Client = r
	d.Body = x.class.Body
	d.Fields = d.room[:0]
	p.outgoingFields(r.Context(), &d.Fields, x)
	// Idempotent by its method, or by an Idempotency-Key as sent (one
	// that the client's Connection field names is not).
	d.Idempotent = x.idempotent || hasIdempotencyKey(d.Fields)
	return d
}

// outgoingFields appends to *dst the header of the current attempt's
// request (a pointer: the propagator's carrier points at it, and a
// variable of the caller's moves to the heap no more than it already
// is): the client's fields (x.header) without the hop-by-hop ones, those
// the client's Connection fields name, those with an underscore in their
// name, and Content-Length (every writer frames the body itself); "Te: trailers" when the client accepts
// trailers; the trace context of the request's span; and the session id
// the backend knows, with the Last-Event-ID for it.
func (p *Proxy) outgoingFields(ctx context.Context, out *h1.Fields, x *exchange) {
	in := x.header
	dst := *out
	var room [2]string
	connection, te := room[:0], false
	for _, f := range in {
		switch f.Name {
		case "Connection":
			connection = append(connection, f.Value)
		case "Te":
			// Backends that support trailers are told tether does, when
			// the client said it does (as net/http/httputil does,
			// golang/go#21096).
			te = te || containsToken(f.Value, "trailers")
		}
	}
	for _, f := range in {
		if isHopHeader(f.Name) || f.Name == "Content-Length" || strings.IndexByte(f.Name, '_') >= 0 {
			// A name with an underscore is dropped, as nginx drops it
			// (underscores_in_headers off): CGI, WSGI and the servers
			// that follow them read "_" as "-", so that
			// "Transfer_Encoding: chunked" would reach such a backend as
			// a second framing next to tether's Content-Length.
			continue
		}
		// A sidecar is transparent: what the proxy in front said about the
		// original client is kept, even where a Connection field names
		// it, and no hop of tether's own is added.
		if len(connection) > 0 && !isForwardingHeader(f.Name) && connectionNames(connection, f.Name) {
			continue
		}
		dst = append(dst, f)
	}
	if te {
		dst = append(dst, h1.Field{Name: "Te", Value: "trailers"})
	}
	*out = dst
	if x.span != nil {
		// The backend's spans become children of this request's span.
		p.propagator.Inject(ctx, fieldsCarrier{out})
	}
	switch x.route {
	case routeNew, routeStateless:
		out.Del(headerSessionID)
	default:
		out.Set(headerSessionID, x.backendSID)
		if id, ok := backendEventID(in.Get(headerLastEventID), x.rec.Reinits); ok {
			out.Set(headerLastEventID, id)
		} else {
			out.Del(headerLastEventID)
		}
	}
}

// isHopHeader reports a hop-by-hop field (RFC 9110 7.6.1, and the older
// ones of RFC 2616 13.5.1 that clients still send: Proxy-Connection, sent by
// libcurl, Keep-Alive): they concern one connection and are never
// forwarded, in either direction. Trailer is the announcement; trailers
// themselves are relayed.
func isHopHeader(name string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

func isForwardingHeader(name string) bool {
	switch name {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return false
}

// containsToken reports whether a comma-separated field value holds
// token, case-insensitively.
func containsToken(v, token string) bool {
	for t := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(textproto.TrimString(t), token) {
			return true
		}
	}
	return false
}

// connectionNames reports whether the values of Connection fields name
// the field key (canonical): whether one of their tokens is key once made
// canonical, as http.Header.Del makes it.
func connectionNames(values []string, key string) bool {
	for _, v := range values {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = textproto.TrimString(tok); tok != "" && canonicalIs(tok, key) {
				return true
			}
		}
	}
	return false
}

// canonicalIs reports whether textproto.CanonicalMIMEHeaderKey(s) is key,
// without making it: s unchanged when it holds a byte that cannot be in a
// field name, else s with each letter upper case at the start and after
// a hyphen, lower case elsewhere.
func canonicalIs(s, key string) bool {
	if len(s) != len(key) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !httpguts.IsTokenRune(rune(s[i])) {
			return s == key
		}
	}
	upper := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != key[i] {
			return false
		}
		upper = c == '-'
	}
	return true
}

// fieldsCarrier is a list of fields as the carrier of a propagator, as
// propagation.HeaderCarrier is a map: names made canonical, Set replaces
// every field of the name.
type fieldsCarrier struct{ f *h1.Fields }

var (
	_ propagation.TextMapCarrier = fieldsCarrier{}
	_ propagation.ValuesGetter   = fieldsCarrier{}
)

// Get returns the value of the first field named key.
func (c fieldsCarrier) Get(key string) string { return c.f.Get(key) }

// Values returns the values of the fields named key (the baggage
// propagator reads every baggage field).
func (c fieldsCarrier) Values(key string) []string { return c.f.Values(key) }

// Set makes value the only value of key.
func (c fieldsCarrier) Set(key, value string) { c.f.Set(key, value) }

// Keys lists the names of the fields, each once.
func (c fieldsCarrier) Keys() []string {
	keys := make([]string, 0, len(*c.f))
	for _, f := range *c.f {
		if !slices.Contains(keys, f.Name) {
			keys = append(keys, f.Name)
		}
	}
	return keys
}
