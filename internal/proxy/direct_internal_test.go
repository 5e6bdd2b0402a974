package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/session"
)

// TestDirectRequestAsOutgoing pins the backend's request header
// (outgoingFields) to a reference built on a header map, as tether built it
// before request headers were lists, and the direct request (direct.go) to
// outgoingRequest, for a table of client headers, every route, bodies and
// tracing: outgoingRequest's map is the reference's exactly (an empty
// User-Agent included, which no wire shows); what tether's client writes
// for the direct request reads back as what net/http's Request.Write writes
// for outgoingRequest's request; and the client's idempotency check sees
// the same header.
func TestDirectRequestAsOutgoing(t *testing.T) {
	headers := []struct {
		name string
		h    http.Header
	}{
		{"follow-up", http.Header{
			"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"},
			"Mcp-Session-Id": {"sid-client"}, "Mcp-Protocol-Version": {"2025-06-18"},
			"Content-Length": {"99"}, "User-Agent": {"client/1"},
		}},
		{"nothing", http.Header{}},
		{"hop-by-hop", http.Header{
			"Connection": {"keep-alive"}, "Keep-Alive": {"timeout=5"}, "Proxy-Connection": {"keep-alive"},
			"Proxy-Authorization": {"Basic eA=="}, "Proxy-Authenticate": {"Basic"}, "Upgrade": {"h2c"},
			"Transfer-Encoding": {"chunked"}, "Trailer": {"X-T"}, "Te": {"deflate"}, "Accept": {"*/*"},
		}},
		{"connection names fields", http.Header{
			"Connection":      {"X-Hop, x-forwarded-for, MCP-SESSION-ID", "user-agent ,last-event-id,, te"},
			"X-Hop":           {"must not pass"},
			"X-Forwarded-For": {"203.0.113.7"},
			"Mcp-Session-Id":  {"sid-client"},
			"User-Agent":      {"client/1"},
			"Last-Event-Id":   {"e1"},
			"Te":              {"trailers"},
			"Authorization":   {"Bearer t"},
		}},
		{"connection names the rest", http.Header{
			"Connection":      {"authorization, content-length, traceparent, idempotency-key, forwarded, x-forwarded-proto, baggage"},
			"Authorization":   {"Bearer t"},
			"Content-Length":  {"12"},
			"Traceparent":     {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			"Idempotency-Key": {"k1"},
			"Forwarded":       {"for=192.0.2.60"},
			"Baggage":         {"a=b"},
		}},
		{"odd connection tokens", http.Header{
			"Connection": {" , x a, X_Y ,-lead,trail-, ÄB, x-A--b"},
			"X a":        {"space in a name"}, "X_y": {"1"}, "X_Y": {"2"}, "-Lead": {"3"}, "Trail-": {"4"},
			"X-A--B": {"5"}, "Other": {"6"},
		}},
		{"te", http.Header{"Te": {"deflate, TRAILERS;q=1", "x"}}},
		{"te trailers", http.Header{"Te": {"gzip", " trailers "}}},
		{"forwarding", http.Header{
			"Forwarded": {"for=192.0.2.60;proto=http"}, "X-Forwarded-For": {"203.0.113.7", "10.0.0.1"},
			"X-Forwarded-Host": {"mcp.example"}, "X-Forwarded-Proto": {"https"}, "Connection": {"Forwarded, X-Forwarded-Host"},
		}},
		{"event id", http.Header{"Last-Event-Id": {"e1", "e2"}, "Accept": {"text/event-stream"}}},
		{"tagged event id", http.Header{"Last-Event-Id": {string(tagEventID(1, []byte("e9")))}}},
		{"many values", http.Header{
			"X-Multi": {"a", "b", ""}, "User-Agent": {"first", "second"}, "Authorization": {"Bearer a", "Bearer b"},
			"Cookie": {"a=1", "b=2"}, "Idempotency-Key": {"k"},
		}},
		{"empty user agent", http.Header{"User-Agent": {""}, "X-Idempotency-Key": {"k"}}},
		{"no values", http.Header{"User-Agent": {}, "X-Empty": {}, "Mcp-Session-Id": {}}},
		{"line breaks and space", http.Header{"X-N": {"a\r\nX-Injected: b"}, "X-Sp": {"  padded \t"}}},
		{"names h1 leaves to others", http.Header{"Host": {"other"}, "Bad Name": {"x"}, "X-Ok": {"y"}}},
		{"trace context sent", http.Header{
			"Traceparent": {"00-11111111111111111111111111111111-2222222222222222-01"},
			"Tracestate":  {"v=1"}, "Baggage": {"k=v"},
		}},
	}
	routes := []struct {
		name       string
		route      routeKind
		rec        *session.Record
		backendSID string
	}{
		{"new", routeNew, nil, ""},
		{"stateless", routeStateless, nil, ""},
		{"sticky", routeSticky, &session.Record{ClientSID: "sid-client"}, "sid-client"},
		{"sticky, own backend id", routeSticky, &session.Record{ClientSID: "sid-client"}, "sid-backend"},
		{"reinit", routeReinit, &session.Record{ClientSID: "sid-client", Reinits: 1}, "sid-moved"},
	}
	bodies := []struct {
		method string
		body   []byte
	}{
		{http.MethodPost, []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call"}`)},
		{http.MethodPost, []byte{}},
		{http.MethodPost, nil},
		{http.MethodGet, nil},
		{http.MethodDelete, nil},
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	member, _ := baggage.NewMember("user", "u1")
	bag, _ := baggage.New(member)
	traced := baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), bag)
	tracings := []struct {
		name string
		ctx  context.Context
		prop propagation.TextMapPropagator // nil: tracing off
	}{
		{"untraced", context.Background(), nil},
		{"w3c", traced, propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})},
		{"w3c without a span", context.Background(), propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})},
		{"probe", traced, probePropagator{}},
	}
	ep := &balancer.Endpoint{ID: "b", URL: mustParse(t, "http://10.0.0.1:8080/api")}
	target := mustParse(t, "/mcp?a=1")

	for _, hc := range headers {
		for _, rc := range routes {
			for _, bc := range bodies {
				for _, tc := range tracings {
					name := hc.name + "/" + rc.name + "/" + bc.method + "/" + tc.name
					if bc.body != nil && len(bc.body) == 0 {
						name += " empty"
					}
					p := &Proxy{direct: backend.NewClient(nil), propagator: tc.prop}
					r := (&http.Request{
						Method: bc.method, URL: target, Host: "mcp.example:8080",
						Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
					}).WithContext(tc.ctx)
					x := &exchange{exchangeEnd: exchangeEnd{ep: ep, route: rc.route}, rec: rc.rec, backendSID: rc.backendSID, header: fieldsOf(hc.h)}
					x.class.Body = bc.body
					if tc.prop != nil {
						x.span = trace.SpanFromContext(tc.ctx)
					}
					checkDirectAsOutgoing(t, name, p, r, x)
				}
			}
		}
	}
}

func checkDirectAsOutgoing(t *testing.T, name string, p *Proxy, r *http.Request, x *exchange) {
	t.Helper()
	before := slices.Clone(x.header)
	want := referenceOutgoingHeader(r.Context(), p.propagator, x)
	out, fields := p.outgoingRequest(r, x)
	if !reflect.DeepEqual(out.Header, want) {
		t.Errorf("%s: outgoingRequest's header\n%v\nthe reference's\n%v", name, out.Header, want)
	}
	d := p.directRequest(r, x)
	if d == nil {
		t.Fatalf("%s: no direct request", name)
	}
	if !reflect.DeepEqual(d.Fields, fields) {
		t.Errorf("%s: direct request's fields\n%v\noutgoingRequest's\n%v", name, d.Fields, fields)
	}
	_, key := out.Header["Idempotency-Key"]
	_, xkey := out.Header["X-Idempotency-Key"]
	if got, want := d.Idempotent, x.idempotent || key || xkey; got != want {
		t.Errorf("%s: direct request idempotent: %v, outgoingRequest's %v", name, got, want)
	}

	var direct bytes.Buffer
	bw := bufio.NewWriter(&direct)
	if err := d.Write(bw); err != nil {
		t.Fatalf("%s: direct write: %v", name, err)
	}
	bw.Flush()
	if out.ContentLength == 0 && out.Body != nil {
		out.Body = http.NoBody // as client.RoundTrip sends it
	}
	var std, viaH1 bytes.Buffer
	if err := out.Write(&std); err != nil {
		t.Fatalf("%s: Request.Write: %v", name, err)
	}
	out.Body = nil
	if len(x.class.Body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(x.class.Body))
	}
	bw = bufio.NewWriter(&viaH1)
	if err := h1.WriteRequest(bw, out); err != nil {
		t.Fatalf("%s: h1.WriteRequest: %v", name, err)
	}
	bw.Flush()
	got := readWritten(t, direct.Bytes())
	if want := readWritten(t, std.Bytes()); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: direct request\n%q\nreads as %+v\nRequest.Write of outgoingRequest's\n%q\nreads as %+v",
			name, direct.String(), got, std.String(), want)
	}
	if want := readWritten(t, viaH1.Bytes()); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: direct request\n%q\nreads as %+v\nh1.WriteRequest of outgoingRequest's\n%q\nreads as %+v",
			name, direct.String(), got, viaH1.String(), want)
	}
	if !reflect.DeepEqual(x.header, before) {
		t.Errorf("%s: the client's header changed: %v, was %v", name, x.header, before)
	}
}

// referenceOutgoingHeader is the backend's request header as a map, built
// the way tether built it on the client's header map: the map copied; the
// fields the Connection header names removed (made canonical), then the
// hop-by-hop ones; "Te: trailers" when a Te value holds the token; the
// forwarding fields put back as the client sent them; Content-Length
// removed (the writers frame the body), and names with an underscore; the
// trace context injected; the session id and Last-Event-ID of the route;
// an empty User-Agent when there is none.
func referenceOutgoingHeader(ctx context.Context, prop propagation.TextMapPropagator, x *exchange) http.Header {
	in := x.header.Header()
	h := in.Clone()
	for _, v := range in["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = textproto.TrimString(tok); tok != "" {
				h.Del(tok)
			}
		}
	}
	for _, name := range []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		delete(h, name)
	}
	for _, v := range in["Te"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(tok), "trailers") {
				h.Set("Te", "trailers")
			}
		}
	}
	for _, name := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v, ok := in[name]; ok {
			h[name] = v
		}
	}
	h.Del("Content-Length")
	for name := range h {
		if strings.Contains(name, "_") {
			delete(h, name) // as nginx's underscores_in_headers off
		}
	}
	if x.span != nil {
		prop.Inject(ctx, propagation.HeaderCarrier(h))
	}
	switch x.route {
	case routeNew, routeStateless:
		h.Del(headerSessionID)
	default:
		h.Set(headerSessionID, x.backendSID)
		if id, ok := backendEventID(in.Get(headerLastEventID), x.rec.Reinits); ok {
			h.Set(headerLastEventID, id)
		} else {
			h.Del(headerLastEventID)
		}
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""}
	}
	for k, vv := range h {
		if len(vv) == 0 {
			delete(h, k) // a name without values is no field of a list
		}
	}
	return h
}

type writtenRequest struct {
	Method, URI, Host string
	Header            http.Header
	Length            int64
	Chunked           bool
	Body              string
}

func readWritten(t *testing.T, b []byte) writtenRequest {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
	if err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("%q: body: %v", b, err)
	}
	return writtenRequest{r.Method, r.RequestURI, r.Host, r.Header, r.ContentLength, len(r.TransferEncoding) > 0, string(body)}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// probePropagator reads the header as it stands when a propagator runs,
// and sets fields that tether's later steps replace or keep.
type probePropagator struct{}

func (probePropagator) Inject(_ context.Context, c propagation.TextMapCarrier) {
	keys := c.Keys()
	slices.Sort(keys)
	c.Set("x-probe-keys", strings.Join(keys, ","))
	c.Set("x-probe-get", strings.Join([]string{
		c.Get("x-forwarded-for"), c.Get("te"), c.Get("content-length"), c.Get("user-agent"),
		c.Get("mcp-session-id"), c.Get("X-HOP"), c.Get("keep-alive"),
	}, "|"))
	c.Set("mcp-session-id", "from-probe")
	c.Set("last-event-id", "probe-event")
	c.Set("traceparent", "first")
	c.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if c.Get("user-agent") == "" {
		c.Set("User-Agent", "probe/1")
	}
	c.Set("x-probe-after", c.Get("traceparent"))
}

func (probePropagator) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context {
	return ctx
}

func (probePropagator) Fields() []string { return []string{"traceparent"} }

// A Connection token names a field as Header.Del does: made canonical, or
// left as it is when it cannot be a field name.
func TestCanonicalIs(t *testing.T) {
	for _, s := range []string{
		"x-hop", "X-HOP", "x-Hop", "keep-alive", "te", "TE", "x a", "X_Y", "x_y", "-lead", "trail-", "a--b",
		"ÄB", "äb", "1abc", "mcp-session-id", "", "X-Hop ", "x\tb", "x:y",
	} {
		for _, key := range []string{"X-Hop", "Keep-Alive", "Te", "x a", "X_Y", "X_y", "-Lead", "Trail-", "A--B", "ÄB", "1abc", "Mcp-Session-Id", "", "X-Hop ", "x\tb", "x:y"} {
			if got, want := canonicalIs(s, key), textproto.CanonicalMIMEHeaderKey(s) == key; got != want {
				t.Errorf("canonicalIs(%q, %q) = %v, want %v", s, key, got, want)
			}
		}
	}
}

func FuzzCanonicalIs(f *testing.F) {
	f.Add("x-hop", "X-Hop")
	f.Add("x a", "x a")
	f.Add("ÄB", "ÄB")
	f.Fuzz(func(t *testing.T, s, key string) {
		if got, want := canonicalIs(s, key), textproto.CanonicalMIMEHeaderKey(s) == key; got != want {
			t.Errorf("canonicalIs(%q, %q) = %v, want %v", s, key, got, want)
		}
		if got, want := canonicalIs(s, textproto.CanonicalMIMEHeaderKey(s)), true; got != want {
			t.Errorf("canonicalIs(%q, its canonical form) = %v", s, got)
		}
	})
}

// removeHopByHopFields removes an answer's hop-by-hop fields and those its
// Connection fields name, as http.Header.Del removes a named field.
func TestRemoveHopByHopFields(t *testing.T) {
	hop := []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}
	for _, k := range hop {
		if !isHopHeader(k) {
			t.Errorf("isHopHeader(%q) = false", k)
		}
	}
	for _, k := range []string{"Content-Type", "TE", "te", "Keep-alive", "Connection ", "Forwarded", "Mcp-Session-Id"} {
		if isHopHeader(k) {
			t.Errorf("isHopHeader(%q) = true", k)
		}
	}
	reference := func(h http.Header) {
		for _, f := range h["Connection"] {
			for sf := range strings.SplitSeq(f, ",") {
				if sf = textproto.TrimString(sf); sf != "" {
					h.Del(sf)
				}
			}
		}
		for _, f := range hop {
			delete(h, f)
		}
	}
	for _, h := range []http.Header{
		{},
		{"Content-Type": {"a"}, "Content-Length": {"1"}},
		{"Content-Type": {"a"}, "Transfer-Encoding": {"chunked"}, "Trailer": {"X"}, "Connection": {"close, x-a"}, "X-A": {"1"}},
		{"Keep-Alive": {"1"}, "Te": {"t"}, "Upgrade": {"u"}, "Proxy-Authenticate": {"p"}, "Proxy-Authorization": {"p"}, "Proxy-Connection": {"p"}},
		{
			"A": {"1"}, "B": {"1"}, "C": {"1"}, "D": {"1"}, "E": {"1"}, "F": {"1"}, "G": {"1"}, "H": {"1"}, "I": {"1"},
			"Connection": {"a, b", "c"}, "Keep-Alive": {"1"}, "Upgrade": {"x"},
		},
		{"Connection": {"keep-alive, X_y, x a,mcp-SESSION-id"}, "X_y": {"1"}, "X_Y": {"2"}, "X a": {"3"}, "Mcp-Session-Id": {"s"}, "Other": {"4"}},
	} {
		got, want := fieldsOf(h), h.Clone()
		removeHopByHopFields(&got)
		reference(want)
		if got := got.Header(); !reflect.DeepEqual(got, want) {
			t.Errorf("removeHopByHopFields(%v) = %v, want %v", h, got, want)
		}
	}
	if raceEnabled {
		return // allocation counts are not meaningful under the race detector
	}
	answer := h1.Fields{{Name: "Content-Type", Value: "text/event-stream"}, {Name: "Connection", Value: "keep-alive, x-hop"},
		{Name: "X-Hop", Value: "1"}, {Name: "Keep-Alive", Value: "timeout=5"}, {Name: "Mcp-Session-Id", Value: "s"}}
	f := make(h1.Fields, 0, len(answer))
	if n := testing.AllocsPerRun(100, func() {
		f = append(f[:0], answer...)
		removeHopByHopFields(&f)
	}); n != 0 || len(f) != 2 {
		t.Errorf("removeHopByHopFields of a backend's answer: %v allocations, %d fields left; want 0 and 2", n, len(f))
	}
}

// A direct request is prepared and written without an allocation.
func TestDirectRequestWriteAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	p := &Proxy{direct: backend.NewClient(nil)}
	r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/mcp"}, Host: "tether"}
	r = r.WithContext(context.Background())
	x := &exchange{
		exchangeEnd: exchangeEnd{
			ep:    &balancer.Endpoint{ID: "b", URL: &url.URL{Scheme: "http", Host: "10.0.0.1:8080"}},
			route: routeSticky,
		},
		rec: &session.Record{ClientSID: "s"}, backendSID: "s",
		header: h1.Fields{
			{Name: "Content-Type", Value: "application/json"}, {Name: "Accept", Value: "application/json, text/event-stream"},
			{Name: "Mcp-Session-Id", Value: "s"}, {Name: "Mcp-Protocol-Version", Value: "2025-06-18"},
			{Name: "Content-Length", Value: "9"}, {Name: "User-Agent", Value: "client/1"},
		},
	}
	x.class.Body = []byte(`{"id":22}`)
	bw := bufio.NewWriter(io.Discard)
	n := testing.AllocsPerRun(100, func() {
		d := p.directRequest(r, x)
		if err := d.Write(bw); err != nil {
			t.Fatal(err)
		}
		bw.Flush()
	})
	if n > 0 {
		t.Errorf("direct request: %v allocations, want 0", n)
	}
}
