package proxy_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/session"
)

const (
	initializeBody  = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"trace-test","version":"1"}}}`
	initializedBody = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	whoamiBody      = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	pingBody        = `{"jsonrpc":"2.0","id":1,"method":"ping"}`
)

// newTracedHarness is a harness whose proxy traces into an in-memory
// recorder.
func newTracedHarness(t *testing.T, o harnessOptions) (*harness, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	o.tracer = tp.Tracer("test")
	return newHarness(t, o), sr
}

// clientSpan is the span of a traced client calling tether.
type clientSpan struct {
	traceID trace.TraceID
	spanID  trace.SpanID
}

func newClientSpan() clientSpan {
	var c clientSpan
	rand.Read(c.traceID[:])
	rand.Read(c.spanID[:])
	return c
}

// traceparent is the W3C header the client sends (sampled).
func (c clientSpan) traceparent() string {
	return fmt.Sprintf("00-%s-%s-01", c.traceID, c.spanID)
}

// tracedPost sends a request as part of a new client trace, drains the
// answer, and returns the status, the session id header and the spans
// tether recorded for it.
func tracedPost(t *testing.T, h *harness, sr *tracetest.SpanRecorder, sid, body string) (int, string, traceSpans) {
	t.Helper()
	c := newClientSpan()
	resp := h.post(sid, body, "traceparent", c.traceparent(), "Mcp-Protocol-Version", "2025-06-18")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	spans := waitServerSpan(t, sr, c.traceID)
	if p := spans.server.Parent(); p.TraceID() != c.traceID || p.SpanID() != c.spanID || !p.IsRemote() {
		t.Errorf("server span's parent is %v/%v (remote %v), want the client's span %v/%v",
			p.TraceID(), p.SpanID(), p.IsRemote(), c.traceID, c.spanID)
	}
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), spans
}

// traceSpans are the spans of one request.
type traceSpans struct {
	all    []sdktrace.ReadOnlySpan
	server sdktrace.ReadOnlySpan
}

func (s traceSpans) named(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	for _, sp := range s.all {
		if sp.Name() == name {
			if found != nil {
				t.Fatalf("two %s spans in one request", name)
			}
			found = sp
		}
	}
	if found == nil {
		t.Fatalf("no %s span; have %v", name, spanNames(s.all))
	}
	return found
}

func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, sp := range spans {
		names = append(names, sp.Name())
	}
	return names
}

// waitServerSpan waits for the server span of trace id to end (it ends
// after the client has its answer) and returns the trace's spans.
func waitServerSpan(t *testing.T, sr *tracetest.SpanRecorder, id trace.TraceID) traceSpans {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ts traceSpans
		for _, sp := range sr.Ended() {
			if sp.SpanContext().TraceID() != id {
				continue
			}
			ts.all = append(ts.all, sp)
			if sp.SpanKind() == trace.SpanKindServer {
				ts.server = sp
			}
		}
		if ts.server != nil {
			return ts
		}
		if time.Now().After(deadline) {
			t.Fatalf("no server span for trace %s; ended spans: %v", id, spanNames(sr.Ended()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func attrs(sp sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range sp.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// checkAttrs compares a span's string and int attributes with want; a want
// of "" means the attribute must be absent, "*" that it must be present.
func checkAttrs(t *testing.T, sp sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	got := attrs(sp)
	for k, w := range want {
		v, ok := got[attribute.Key(k)]
		switch {
		case w == "" && ok:
			t.Errorf("%s span: %s = %s, want no such attribute", sp.Name(), k, v.Emit())
		case w == "":
		case !ok:
			t.Errorf("%s span: no %s attribute, want %q", sp.Name(), k, w)
		case w != "*" && v.Emit() != w:
			t.Errorf("%s span: %s = %q, want %q", sp.Name(), k, v.Emit(), w)
		}
	}
}

// checkCandidates checks a tether.candidates attribute: "URL=load" for each
// candidate, every URL one of the backends', the chosen backend among them.
func checkCandidates(t *testing.T, h *harness, v attribute.Value, chosen string, n int) {
	t.Helper()
	cands := v.AsStringSlice()
	if len(cands) != n {
		t.Errorf("tether.candidates %q: %d candidates, want %d", cands, len(cands), n)
	}
	var urls []string
	for _, c := range cands {
		url, load, ok := strings.Cut(c, "=")
		if !ok || load == "" || strings.Trim(load, "0123456789") != "" || h.backendByURL(url) == "" {
			t.Errorf("tether.candidates entry %q: want URL=load of a backend", c)
		}
		urls = append(urls, url)
	}
	if !slices.Contains(urls, chosen) {
		t.Errorf("tether.candidates %q lack the chosen backend %s", cands, chosen)
	}
}

func (h *harness) backendByURL(url string) string {
	for _, b := range h.backends {
		if b.URL() == url {
			return b.Name
		}
	}
	return ""
}

// The spans of each routing decision carry the attributes of
// docs/design.md#contracts, session ids hashed, continuing the client's
// trace.
func TestTraceRouteKinds(t *testing.T) {
	tr := backend.NewTransport(false)
	h, sr := newTracedHarness(t, harnessOptions{backends: 3, transport: tr})
	var sid, home string

	t.Run("new", func(t *testing.T) {
		status, s, spans := tracedPost(t, h, sr, "", initializeBody)
		if status != 200 || s == "" {
			t.Fatalf("initialize: %d, session %q", status, s)
		}
		sid = s
		route := spans.named(t, "tether.route")
		if route.Parent().SpanID() != spans.server.SpanContext().SpanID() {
			t.Errorf("tether.route is not a child of the server span")
		}
		checkAttrs(t, route, map[string]string{
			"mcp.method": "initialize", "tether.route": "new", "tether.backend": "*", "tether.candidates": "*",
			"mcp.session.id": "", "tether.store.result": "",
		})
		home = attrs(route)["tether.backend"].AsString()
		checkCandidates(t, h, attrs(route)["tether.candidates"], home, 2) // p2c weighs two
		checkAttrs(t, spans.server, map[string]string{
			"http.request.method": "POST", "http.response.status_code": "200", "tether.route": "new", "url.path": "/mcp",
		})
		if spans.server.Name() != "POST" {
			t.Errorf("server span named %q, want POST", spans.server.Name())
		}
		resp := h.post(sid, initializedBody, "Mcp-Protocol-Version", "2025-06-18")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	})
	if sid == "" {
		t.FailNow()
	}

	t.Run("sticky", func(t *testing.T) {
		status, _, spans := tracedPost(t, h, sr, sid, whoamiBody)
		if status != 200 {
			t.Fatalf("tools/call: %d", status)
		}
		checkAttrs(t, spans.named(t, "tether.route"), map[string]string{
			"mcp.method": "tools/call", "tether.route": "sticky", "tether.backend": home,
			"tether.store.result": "hit", "mcp.session.id": session.HashID(sid),
			"tether.candidates": "", // nothing was weighed
		})
		checkAttrs(t, spans.server, map[string]string{"tether.route": "sticky", "http.response.status_code": "200"})
	})

	t.Run("stateless", func(t *testing.T) {
		status, _, spans := tracedPost(t, h, sr, "", pingBody)
		if status != 200 {
			t.Fatalf("ping: %d", status)
		}
		route := spans.named(t, "tether.route")
		checkAttrs(t, route, map[string]string{
			"mcp.method": "ping", "tether.route": "stateless", "tether.backend": "*", "tether.candidates": "*",
			"mcp.session.id": "", "tether.store.result": "",
		})
		checkCandidates(t, h, attrs(route)["tether.candidates"], attrs(route)["tether.backend"].AsString(), 2)
	})

	t.Run("unknown session", func(t *testing.T) {
		status, _, spans := tracedPost(t, h, sr, "no-such-session", whoamiBody)
		if status != 404 {
			t.Fatalf("unknown session: %d, want 404", status)
		}
		checkAttrs(t, spans.named(t, "tether.route"), map[string]string{
			"tether.route": "refused", "tether.store.result": "miss",
			"mcp.session.id": session.HashID("no-such-session"), "tether.backend": "",
		})
		checkAttrs(t, spans.server, map[string]string{"tether.route": "refused", "http.response.status_code": "404"})
	})

	t.Run("reinit", func(t *testing.T) {
		// The session's backend dies and passive health has ejected it: the
		// decision is made in routing, so tether.route says reinit.
		victim := h.backend(h.backendByURL(home))
		victim.Kill(200 * time.Millisecond)
		ep, ok := h.bal.Lookup(victim.URL())
		if !ok {
			t.Fatalf("no endpoint %s", victim.URL())
		}
		h.bal.Eject(ep, errors.New("killed by the test"))

		status, _, spans := tracedPost(t, h, sr, sid, whoamiBody)
		if status != 200 {
			t.Fatalf("tools/call after the kill: %d", status)
		}
		route := spans.named(t, "tether.route")
		checkAttrs(t, route, map[string]string{
			"tether.route": "reinit", "tether.reinit.reason": "backend_ejected", "tether.store.result": "hit",
			"mcp.session.id": session.HashID(sid), "tether.backend": "*",
		})
		to := attrs(route)["tether.backend"].AsString()
		if to == home {
			t.Errorf("re-initialized onto the dead backend %s", home)
		}
		checkAttrs(t, spans.server, map[string]string{"tether.route": "reinit", "http.response.status_code": "200"})

		reinit := spans.named(t, "tether.reinit")
		if reinit.Parent().SpanID() != route.SpanContext().SpanID() {
			t.Errorf("tether.reinit is not a child of tether.route")
		}
		checkAttrs(t, reinit, map[string]string{
			"tether.reinit.reason": "backend_ejected", "tether.reinit.result": "ok",
			"tether.reinit.from": home, "mcp.session.id": session.HashID(sid),
		})
		checkSteps(t, h, reinit, to, "pick", "initialized", "swapped")
	})

	t.Run("reinit after a failed dial", func(t *testing.T) {
		// A backend dies unnoticed: the request's dial fails, and the session
		// moves in the forward loop, after routing chose its backend.
		_, s, _ := tracedPost(t, h, sr, "", initializeBody)
		resp := h.post(s, initializedBody, "Mcp-Protocol-Version", "2025-06-18")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		rec, err := h.store.Get(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		h.backend(h.backendByURL(rec.BackendURL)).Kill(200 * time.Millisecond)
		forgetPooledConns(tr)

		status, _, spans := tracedPost(t, h, sr, s, whoamiBody)
		if status != 200 {
			t.Fatalf("tools/call after the kill: %d", status)
		}
		checkAttrs(t, spans.named(t, "tether.route"), map[string]string{"tether.route": "sticky", "tether.backend": rec.BackendURL})
		checkAttrs(t, spans.server, map[string]string{"tether.route": "reinit", "http.response.status_code": "200"})
		var retried bool
		for _, ev := range spans.server.Events() {
			if ev.Name == "tether.retry" {
				retried = true
				for _, kv := range ev.Attributes {
					if kv.Key == "tether.retry.reason" && kv.Value.AsString() != "dial_failed" {
						t.Errorf("retry reason %s, want dial_failed", kv.Value.AsString())
					}
				}
			}
		}
		if !retried {
			t.Errorf("server span has no tether.retry event: %v", spans.server.Events())
		}
		reinit := spans.named(t, "tether.reinit")
		if reinit.Parent().SpanID() != spans.server.SpanContext().SpanID() {
			t.Errorf("tether.reinit is not a child of the server span")
		}
		checkAttrs(t, reinit, map[string]string{"tether.reinit.reason": "dial_failed", "tether.reinit.result": "ok", "tether.reinit.from": rec.BackendURL})
	})

	// A session id is a credential: no span shows it.
	for _, sp := range sr.Ended() {
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.Emit(), sid) {
				t.Errorf("%s span shows the raw session id in %s", sp.Name(), kv.Key)
			}
		}
		for _, ev := range sp.Events() {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.Emit(), sid) {
					t.Errorf("%s span's %s event shows the raw session id in %s", sp.Name(), ev.Name, kv.Key)
				}
			}
		}
	}
}

// checkSteps checks the events of a tether.reinit span: names in order,
// and the pick's chosen backend and candidates.
func checkSteps(t *testing.T, h *harness, reinit sdktrace.ReadOnlySpan, to string, want ...string) {
	t.Helper()
	var names []string
	for _, ev := range reinit.Events() {
		names = append(names, ev.Name)
		if ev.Name != "pick" {
			continue
		}
		evAttrs := map[attribute.Key]attribute.Value{}
		for _, kv := range ev.Attributes {
			evAttrs[kv.Key] = kv.Value
		}
		if got := evAttrs["tether.backend"].AsString(); got != to {
			t.Errorf("pick event: tether.backend %q, want %q", got, to)
		}
		checkCandidates(t, h, evAttrs["tether.candidates"], to, 2) // two live backends are left
	}
	if !slices.Equal(names, want) {
		t.Errorf("tether.reinit events %q, want %q", names, want)
	}
}

// W3C trace context: tether continues the client's trace and the backend
// continues tether's. With tracing off, the client's header passes through
// untouched.
func TestTraceContextPropagation(t *testing.T) {
	rb := newRecordingBackend(t, nil)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	h := newTether(t, []string{rb.URL}, harnessOptions{tracer: tp.Tracer("test")})

	c := newClientSpan()
	resp := h.post("", pingBody, "traceparent", c.traceparent(), "baggage", "tenant=acme")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	spans := waitServerSpan(t, sr, c.traceID)
	if p := spans.server.Parent(); p.SpanID() != c.spanID || !p.IsRemote() {
		t.Errorf("server span's parent %v, want the client's span %v", p.SpanID(), c.spanID)
	}
	got, _ := rb.last()
	tid, parent, ok := parseTraceparent(got.Header.Get("traceparent"))
	if !ok {
		t.Fatalf("backend got traceparent %q", got.Header.Get("traceparent"))
	}
	if tid != c.traceID.String() {
		t.Errorf("backend's trace id %s, want the client's %s", tid, c.traceID)
	}
	if parent != spans.server.SpanContext().SpanID().String() {
		t.Errorf("backend's parent span %s, want tether's server span %s", parent, spans.server.SpanContext().SpanID())
	}
	if b := got.Header.Get("baggage"); b != "tenant=acme" {
		t.Errorf("backend got baggage %q, want tenant=acme", b)
	}

	// A client that sends no trace context starts a trace at tether.
	resp = h.post("", pingBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got, _ = rb.last()
	if _, _, ok := parseTraceparent(got.Header.Get("traceparent")); !ok {
		t.Errorf("untraced client: backend got traceparent %q, want tether's", got.Header.Get("traceparent"))
	}

	off := newTether(t, []string{rb.URL}, harnessOptions{})
	resp = off.post("", pingBody, "traceparent", c.traceparent())
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got, _ = rb.last()
	if tp := got.Header.Get("traceparent"); tp != c.traceparent() {
		t.Errorf("tracing off: backend got traceparent %q, want the client's %q unchanged", tp, c.traceparent())
	}
}

func parseTraceparent(h string) (traceID, parent string, ok bool) {
	f := strings.Split(h, "-")
	if len(f) != 4 || f[0] != "00" || len(f[1]) != 32 || len(f[2]) != 16 {
		return "", "", false
	}
	return f[1], f[2], true
}
