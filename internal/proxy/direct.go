package proxy

import (
	"bufio"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"golang.org/x/net/http/httpguts"

	"github.com/tether-mcp/tether/internal/h1"
)

// A direct request is an attempt's request as tether's own client writes
// it: straight from the client's request, whose header is filtered and
// amended as the head is written. outgoingRequest builds the same request
// as an *http.Request with a header map of its own, for any other
// transport; that costs a map, the request, and its copy with a context,
// all read once by the writer and dropped. TestDirectRequestAsOutgoing
// pins the two together.
//
// An exchange keeps one direct request and rewrites it for each attempt.
// No earlier attempt can still read it: tether's client writes a request
// on the caller's goroutine and is done with it when the round trip
// returns (http.Transport, which may write on after a failed round trip,
// gets a new *http.Request for each attempt: outgoingRequest).

// directRequest is the request of one attempt on tether's own client.
type directRequest struct {
	r    *http.Request // the client's: method, Host, header, context
	url  url.URL       // where it goes
	addr string        // url's host:port, to dial
	host string        // the Host field
	body []byte        // classify's; nil when there is none

	// What tether changes in the client's header (outgoingRequest):
	// connection holds the client's Connection header, whose tokens name
	// more fields to drop; te is set when the client accepts trailers
	// ("Te: trailers"); trace is the trace context Inject sets; sid and
	// eventID are the session id the backend knows and the Last-Event-ID
	// for it.
	connection []string
	te         bool
	trace      traceFields
	sid        fieldEdit
	eventID    fieldEdit
}

// fieldEdit is what a direct request does with a field tether may set:
// keep the client's, drop it, or send a value of its own.
type fieldEdit struct {
	op    fieldOp
	value [1]string // the value set, as a value list without an allocation
}

type fieldOp uint8

const (
	fieldKeep   fieldOp = iota // as the client sent it
	fieldDelete                // not sent
	fieldSet                   // sent with value
)

func (f *fieldEdit) set(v string) { f.op, f.value[0] = fieldSet, v }

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
	setOutgoingURL(&d.url, x.ep.URL, r.URL)
	d.host = r.Host
	if d.host == "" {
		d.host = d.url.Host
	}
	if d.url.Host == "" || !h1.RequestWritable(r.Method, &d.url, d.host) {
		return nil
	}
	x.attempts++
	d.r = r
	d.addr = dialAddr(d.url.Host)
	d.body = x.class.Body
	d.connection = r.Header["Connection"]
	d.te = headerValuesContainToken(r.Header["Te"], "trailers")
	d.trace.d, d.trace.fields = d, d.trace.fields[:0]
	d.sid, d.eventID = fieldEdit{}, fieldEdit{}
	if x.span != nil {
		// The backend's spans become children of this request's span.
		p.propagator.Inject(r.Context(), &d.trace)
	}
	switch x.route {
	case routeNew, routeStateless:
		d.sid.op = fieldDelete
	default:
		d.sid.set(x.backendSID)
		if id, ok := backendEventID(r.Header.Get(headerLastEventID), x.rec.Reinits); ok {
			d.eventID.set(id)
		} else {
			d.eventID.op = fieldDelete
		}
	}
	return d
}

// dialAddr is the host:port of a URL's host, port 80 by default.
func dialAddr(host string) string {
	if _, _, err := net.SplitHostPort(host); err != nil {
		return net.JoinHostPort(strings.Trim(host, "[]"), "80")
	}
	return host
}

// write writes the request to bw, as h1.WriteRequest writes the request
// outgoingRequest builds.
func (d *directRequest) write(bw *bufio.Writer) error {
	b := h1.AppendRequestHead(bw.AvailableBuffer(), d.r.Method, &d.url, d.host, int64(len(d.body)))
	d.fields(func(name string, vv []string) { b = h1.AppendField(b, name, vv) })
	b = append(b, "\r\n"...)
	if _, err := bw.Write(b); err != nil {
		return err
	}
	_, err := bw.Write(d.body)
	return err
}

// Names fields yields after the client's, when the client did not send them.
const (
	sentTe = 1 << iota
	sentSessionID
	sentEventID
	sentUserAgent
)

// fields calls yield for each field of the request's header, with its
// values: the header outgoingRequest builds, one name at a time.
func (d *directRequest) fields(yield func(name string, vv []string)) {
	var sent uint8
	for k, vv := range d.r.Header {
		switch k {
		case "Te":
			sent |= sentTe
		case headerSessionID:
			sent |= sentSessionID
		case headerLastEventID:
			sent |= sentEventID
		case "User-Agent":
			sent |= sentUserAgent
		}
		if vv, ok := d.value(k, vv, true); ok {
			yield(k, vv)
		}
	}
	for _, f := range d.trace.fields {
		if _, ok := d.r.Header[f.name]; !ok {
			if vv, ok := d.value(f.name, nil, false); ok {
				yield(f.name, vv)
			}
		}
	}
	for _, n := range [...]struct {
		bit  uint8
		name string
	}{{sentTe, "Te"}, {sentSessionID, headerSessionID}, {sentEventID, headerLastEventID}, {sentUserAgent, "User-Agent"}} {
		if sent&n.bit != 0 || d.trace.find(n.name) != nil {
			continue
		}
		if vv, ok := d.value(n.name, nil, false); ok {
			yield(n.name, vv)
		}
	}
}

// value is the field name of the request's header: in its values and
// sent, the client's field of that name.
func (d *directRequest) value(name string, in []string, sent bool) ([]string, bool) {
	// The order of outgoingRequest's steps, last first.
	switch name {
	case headerSessionID:
		return d.sid.value[:], d.sid.op == fieldSet
	case headerLastEventID:
		if d.eventID.op != fieldKeep {
			return d.eventID.value[:], d.eventID.op == fieldSet
		}
	}
	if f := d.trace.find(name); f != nil {
		return f.values, true
	}
	vv, ok := d.filtered(name, in, sent)
	if !ok && name == "User-Agent" {
		// Without one the writer would send Go's own.
		return emptyValue, true
	}
	return vv, ok
}

// filtered is the field name of outgoingHeader's map, and with the body
// taken out of it: the client's field of that name (in, sent) unless it
// is hop-by-hop, named by the Connection header, or Content-Length; the
// forwarding headers kept; "Te: trailers" when the client accepts them.
func (d *directRequest) filtered(name string, in []string, sent bool) ([]string, bool) {
	if name == "Te" {
		return teTrailers, d.te
	}
	if !sent || isHopHeader(name) || name == "Content-Length" && d.body != nil {
		return nil, false
	}
	if d.connection != nil && connectionNames(d.connection, name) && !isForwardingHeader(name) {
		return nil, false
	}
	return in, true
}

// teTrailers is "Te: trailers" as a value list (shared, never written).
var teTrailers = []string{"trailers"}

// header is the request's header as a map: outgoingRequest's.
func (d *directRequest) header() http.Header {
	h := make(http.Header, len(d.r.Header)+1)
	d.fields(func(name string, vv []string) { h[name] = vv })
	return h
}

// has reports whether the request carries a field name.
func (d *directRequest) has(name string) bool {
	_, ok := d.value(name, d.r.Header[name], hasKey(d.r.Header, name))
	return ok
}

func hasKey(h http.Header, name string) bool {
	_, ok := h[name]
	return ok
}

// isHopHeader reports one of hopHeaders.
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

// connectionNames reports whether the Connection header values vv name the
// field key: whether one of their tokens is key once made canonical, as
// removeHopByHopHeaders's Header.Del makes it.
func connectionNames(vv []string, key string) bool {
	for _, v := range vv {
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

// traceFields is the carrier the propagator injects a direct request's
// trace context into: as propagation.HeaderCarrier over outgoingHeader's
// map at that step, whose fields it reads and in which it sets its own.
type traceFields struct {
	d      *directRequest
	fields []traceField
}

type traceField struct {
	name   string
	values []string
}

var _ propagation.TextMapCarrier = (*traceFields)(nil)

func (t *traceFields) find(name string) *traceField {
	for i := range t.fields {
		if t.fields[i].name == name {
			return &t.fields[i]
		}
	}
	return nil
}

// Get returns the first value of the field key, as http.Header.Get.
func (t *traceFields) Get(key string) string {
	key = http.CanonicalHeaderKey(key)
	if f := t.find(key); f != nil {
		return f.values[0]
	}
	vv, ok := t.d.filtered(key, t.d.r.Header[key], hasKey(t.d.r.Header, key))
	if !ok || len(vv) == 0 {
		return ""
	}
	return vv[0]
}

// Set sets the field key to value, as http.Header.Set.
func (t *traceFields) Set(key, value string) {
	key = http.CanonicalHeaderKey(key)
	if f := t.find(key); f != nil {
		f.values = []string{value}
		return
	}
	t.fields = append(t.fields, traceField{name: key, values: []string{value}})
}

// Keys lists the fields, as propagation.HeaderCarrier does.
func (t *traceFields) Keys() []string {
	var keys []string
	d := t.d
	for k, vv := range d.r.Header {
		if _, ok := d.filtered(k, vv, true); ok && t.find(k) == nil {
			keys = append(keys, k)
		}
	}
	if _, ok := d.r.Header["Te"]; !ok && d.te && t.find("Te") == nil {
		keys = append(keys, "Te")
	}
	for _, f := range t.fields {
		keys = append(keys, f.name)
	}
	return keys
}
