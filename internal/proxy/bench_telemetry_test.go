package proxy_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// benchTracer traces everything and exports to nowhere: the full cost of
// tracing on the request path, with none of the exporter's I/O.
func benchTracer(b *testing.B) trace.Tracer {
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp.Tracer("bench")
}

// BenchmarkFollowUpTelemetry sends a follow-up tools/call on a live session
// through three tethers in front of one go-sdk backend, interleaved in one
// run: "bare" has no telemetry at all (Metrics and Tracer nil), "off" is
// tether as shipped with tracing off (metrics on), "on" traces every
// request. It reports each latency and the ratios off/bare (the cost of
// telemetry when tracing is off) and on/off (the cost of tracing).
func BenchmarkFollowUpTelemetry(b *testing.B) {
	backend, err := mcpbackend.Start("bench", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer backend.Close()
	urls := []string{backend.URL()}
	variants := []harnessOptions{{}, {metrics: true}, {metrics: true, tracer: benchTracer(b)}}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var front, sid [3]string
	for i, o := range variants {
		front[i] = newTether(b, urls, o).front.URL + "/mcp"
		sid[i] = initSession(b, client, front[i])
	}
	for range 50 { // warm the connection pools
		for i := range variants {
			followUp(b, client, front[i], sid[i])
		}
	}

	var spent [3]time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		for k := range variants {
			i := (n + k) % len(variants) // rotate the order: no variant always goes first
			t0 := time.Now()
			followUp(b, client, front[i], sid[i])
			spent[i] += time.Since(t0)
		}
	}
	perReq := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(perReq(spent[0]), "bare-ns/req")
	b.ReportMetric(perReq(spent[1]), "off-ns/req")
	b.ReportMetric(perReq(spent[2]), "on-ns/req")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "off/bare")
	b.ReportMetric(float64(spent[2])/float64(spent[1]), "on/off")
}

// BenchmarkServeHTTPFollowUpTelemetry is tether's own cost for a sticky
// follow-up (the network replaced by a canned answer, as in
// BenchmarkServeHTTPFollowUp) without telemetry, with tracing off, and with
// tracing on, so that the allocations of each show.
func BenchmarkServeHTTPFollowUpTelemetry(b *testing.B) {
	for _, v := range []struct {
		name    string
		metrics bool
		tracing bool
	}{{"bare", false, false}, {"off", true, false}, {"on", true, true}} {
		b.Run(v.name, func(b *testing.B) {
			cfg := proxy.Config{}
			if v.metrics {
				cfg.Metrics = telemetry.NewMetrics(telemetry.MetricsOptions{})
			}
			if v.tracing {
				cfg.Tracer = benchTracer(b)
			}
			serve := cannedProxy(b, cfg)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				serve()
			}
		})
	}
}

// cannedProxy builds a proxy on cfg in front of a canned backend, opens a
// session through it, and returns a function sending one follow-up.
func cannedProxy(tb testing.TB, cfg proxy.Config) func() {
	cfg.Transport = cannedTransport{sid: "bench-session"}
	return cannedProxyAt(tb, cfg, "http://127.0.0.1:9", false)
}

// cannedProxyAt is cannedProxy with cfg's transport to backend; the
// answers go to a writer that adopts the backend's header, as h1's does,
// when adopt is set.
func cannedProxyAt(tb testing.TB, cfg proxy.Config, backend string, adopt bool) func() {
	picker, _ := balancer.NewPicker("p2c", nil)
	bal := balancer.New(balancer.Options{Picker: picker})
	src, _ := discovery.NewStatic([]string{backend})
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	synced := make(chan struct{})
	go src.Run(ctx, func(s discovery.Snapshot) { bal.Update(s); close(synced) })
	<-synced
	store := session.NewMemory(session.MemoryOptions{})
	tb.Cleanup(func() { store.Close() })
	cfg.Balancer, cfg.Store = bal, store
	cfg.Logger = slog.New(slog.DiscardHandler)
	p := proxy.New(cfg)

	init := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	p.ServeHTTP(&discardWriter{h: http.Header{}}, init)
	if _, err := store.Get(ctx, "bench-session"); err != nil {
		tb.Fatal("session not recorded:", err)
	}
	return func() {
		w, r, f := cannedFollowUp(ctx)
		w.adopt = adopt
		p.ServeFields(w, r, f)
	}
}

var (
	cannedBody      = []byte(followUpBody)
	cannedTarget, _ = url.Parse("http://127.0.0.1:7480/mcp")
)

// cannedFollowUp is a follow-up request on the canned session, its header
// as the list h1 serves it with (r.Header is nil: ServeFields), and a
// writer for its answer.
func cannedFollowUp(ctx context.Context) (*discardWriter, *http.Request, h1.Fields) {
	// Built by hand: httptest.NewRequest parses text and would dominate.
	r := &http.Request{
		Method: http.MethodPost, URL: cannedTarget, Host: cannedTarget.Host, RequestURI: "/mcp",
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, RemoteAddr: "127.0.0.1:5000",
		Body: io.NopCloser(bytes.NewReader(cannedBody)), ContentLength: int64(len(cannedBody)),
	}
	f := h1.Fields{
		{Name: "Mcp-Session-Id", Value: "bench-session"},
		{Name: "Mcp-Protocol-Version", Value: "2025-06-18"},
		{Name: "Content-Type", Value: "application/json"},
		{Name: "Accept", Value: "application/json, text/event-stream"},
	}
	return &discardWriter{h: http.Header{}}, r.WithContext(ctx), f
}
