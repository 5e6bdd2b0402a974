package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/telemetry"
	"github.com/tether-mcp/tether/internal/testkit"
)

// newHarnessMetrics builds the metrics as internal/server does: endpoint gauges
// read from the balancer at scrape time, cache counters from the store.
func newHarnessMetrics(h *harness) *telemetry.Metrics {
	return telemetry.NewMetrics(telemetry.MetricsOptions{
		Endpoints: func() []telemetry.EndpointStat { return server.EndpointStats(h.bal) },
		Store: func() telemetry.StoreStat {
			if h.cache != nil {
				return server.StoreStats(h.cache)
			}
			return server.StoreStats(h.mem)
		},
	})
}

// wantSeries compares every series of metric name with samples (lines of
// the text exposition format), by way of testutil.GatherAndCompare; HELP
// and TYPE are the registry's own.
func wantSeries(reg *prometheus.Registry, name string, samples ...string) error {
	mfs, err := reg.Gather()
	if err != nil {
		return err
	}
	var text strings.Builder
	for _, mf := range mfs {
		if mf.GetName() == name {
			fmt.Fprintf(&text, "# HELP %s %s\n# TYPE %s %s\n", name, mf.GetHelp(), name, strings.ToLower(mf.GetType().String()))
		}
	}
	for _, s := range samples {
		text.WriteString(s + "\n")
	}
	return testutil.GatherAndCompare(reg, strings.NewReader(text.String()), name)
}

// sampleValue sums the samples of a metric (counter, gauge, or a
// histogram's count) whose labels include match.
func sampleValue(t *testing.T, reg *prometheus.Registry, name string, match map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range match {
				if labels[k] != v {
					continue metrics
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				sum += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				sum += m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// waitRequests waits until n requests have been counted, so that the next
// step sees settled loads.
func waitRequests(t *testing.T, reg *prometheus.Registry, n float64) {
	t.Helper()
	testkit.EventuallyNoError(t, 10*time.Second, func() error {
		if got := sampleValue(t, reg, "tether_requests_total", nil); got != n {
			return fmt.Errorf("tether_requests_total sums to %v, want %v", got, n)
		}
		return nil
	}, "requests counted")
}

func postDrain(t *testing.T, h *harness, sid, body string) int {
	t.Helper()
	resp := h.post(sid, body, "Mcp-Protocol-Version", "2025-06-18")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Scripted traffic through two backends, one killed and one restarted:
// requests by route, backend and code; re-initializations by reason and
// result; live sessions per backend; endpoints by state; picks.
func TestMetricsAfterScriptedTraffic(t *testing.T) {
	tr := backend.NewTransport(false)
	h := newHarness(t, harnessOptions{backends: 2, metrics: true, transport: tr})
	reg := h.metrics.Registry
	client := &http.Client{}
	ctx := context.Background()

	s1 := initSession(t, client, h.endpoint()) // new + notifications/initialized
	waitRequests(t, reg, 2)
	rec, err := h.store.Get(ctx, s1)
	if err != nil {
		t.Fatal(err)
	}
	x := rec.BackendURL
	y := h.backends[0].URL()
	if y == x {
		y = h.backends[1].URL()
	}

	// p2c with two backends weighs both: the less loaded one takes the
	// stateless request and the second session.
	if code := postDrain(t, h, "", pingBody); code != 200 {
		t.Fatalf("ping: %d", code)
	}
	waitRequests(t, reg, 3)
	s2 := initSession(t, client, h.endpoint())
	waitRequests(t, reg, 5)
	for range 2 {
		if code := postDrain(t, h, s1, whoamiBody); code != 200 {
			t.Fatalf("tools/call: %d", code)
		}
	}
	if code := postDrain(t, h, "no-such-session", whoamiBody); code != 404 {
		t.Fatalf("unknown session: %d", code)
	}
	waitRequests(t, reg, 8)

	check := func(name string, samples ...string) {
		t.Helper()
		if err := wantSeries(reg, name, samples...); err != nil {
			t.Errorf("%s:\n%v", name, err)
		}
	}
	check("tether_requests_total",
		`tether_requests_total{backend="",code="404",era="legacy",method="tools/call",route="refused"} 1`,
		fmt.Sprintf(`tether_requests_total{backend=%q,code="200",era="legacy",method="initialize",route="new"} 1`, x),
		fmt.Sprintf(`tether_requests_total{backend=%q,code="200",era="legacy",method="initialize",route="new"} 1`, y),
		fmt.Sprintf(`tether_requests_total{backend=%q,code="202",era="legacy",method="notifications/initialized",route="sticky"} 1`, x),
		fmt.Sprintf(`tether_requests_total{backend=%q,code="202",era="legacy",method="notifications/initialized",route="sticky"} 1`, y),
		fmt.Sprintf(`tether_requests_total{backend=%q,code="200",era="legacy",method="tools/call",route="sticky"} 2`, x),
		fmt.Sprintf(`tether_requests_total{backend=%q,code="200",era="legacy",method="ping",route="stateless"} 1`, y),
	)
	check("tether_backend_sessions",
		fmt.Sprintf(`tether_backend_sessions{backend=%q} 1`, x),
		fmt.Sprintf(`tether_backend_sessions{backend=%q} 1`, y))
	check("tether_backend_inflight_requests",
		fmt.Sprintf(`tether_backend_inflight_requests{backend=%q} 0`, x),
		fmt.Sprintf(`tether_backend_inflight_requests{backend=%q} 0`, y))
	check("tether_endpoints", `tether_endpoints{state="ready"} 2`, `tether_endpoints{state="fenced"} 0`, `tether_endpoints{state="ejected"} 0`)
	check("tether_reinitializations_total") // none yet
	if got := sampleValue(t, reg, "tether_pick_duration_seconds", nil); got != 3 {
		t.Errorf("tether_pick_duration_seconds counts %v picks, want 3 (two placements, one stateless)", got)
	}
	for route, n := range map[string]float64{"new": 2, "sticky": 4, "stateless": 1, "refused": 1} {
		if got := sampleValue(t, reg, "tether_request_duration_seconds", map[string]string{"route": route}); got != n {
			t.Errorf("tether_request_duration_seconds{route=%q} counts %v, want %v", route, got, n)
		}
	}

	// x dies: s1's next request fails to dial and moves to y.
	h.backend(h.backendByURL(x)).Kill(200 * time.Millisecond)
	forgetPooledConns(tr)
	if code := postDrain(t, h, s1, whoamiBody); code != 200 {
		t.Fatalf("tools/call after the kill: %d", code)
	}
	// y restarts: it answers 404 for s2, which is re-initialized there.
	if err := h.backend(h.backendByURL(y)).Restart(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	forgetPooledConns(tr)
	if code := postDrain(t, h, s2, whoamiBody); code != 200 {
		t.Fatalf("tools/call after the restart: %d", code)
	}
	waitRequests(t, reg, 10)

	check("tether_reinitializations_total",
		`tether_reinitializations_total{reason="dial_failed",result="ok"} 1`,
		`tether_reinitializations_total{reason="session_lost",result="ok"} 1`)
	if got := sampleValue(t, reg, "tether_requests_total", map[string]string{"route": "reinit", "backend": y, "code": "200"}); got != 2 {
		t.Errorf(`tether_requests_total{route="reinit",backend=%q,code="200"} = %v, want 2`, y, got)
	}
	check("tether_backend_sessions",
		fmt.Sprintf(`tether_backend_sessions{backend=%q} 0`, x),
		fmt.Sprintf(`tether_backend_sessions{backend=%q} 2`, y))
	check("tether_endpoints", `tether_endpoints{state="ready"} 1`, `tether_endpoints{state="fenced"} 0`, `tether_endpoints{state="ejected"} 1`)
}

// forgetPooledConns drops tether's keep-alive connections after a test
// stopped a backend. A POST written on a pooled connection in the instant
// the backend closes it fails with EOF and is not retried (the backend may
// have read it): a race of HTTP/1.1 keep-alive that these tests are not
// about.
func forgetPooledConns(tr backend.Transport) { tr.CloseIdleConnections() }

// The degraded gauge follows Redis: 0, 1 while it is down, 0 again; store
// round trips and their errors are counted by operation.
func TestMetricsStoreDegraded(t *testing.T) {
	rs := redistest.Start(t)
	h := newHarness(t, harnessOptions{backends: 2, metrics: true, redis: rs, redisTimeout: 100 * time.Millisecond})
	reg := h.metrics.Registry
	client := &http.Client{}

	sid := initSession(t, client, h.endpoint())
	for range 3 {
		if code := postDrain(t, h, sid, whoamiBody); code != 200 {
			t.Fatalf("tools/call: %d", code)
		}
	}
	if err := wantSeries(reg, "tether_store_degraded", "tether_store_degraded 0"); err != nil {
		t.Error(err)
	}
	if got := sampleValue(t, reg, "tether_store_operation_duration_seconds", map[string]string{"op": "create"}); got != 1 {
		t.Errorf("create round trips: %v, want 1", got)
	}
	if got := sampleValue(t, reg, "tether_store_errors_total", nil); got != 0 {
		t.Errorf("store errors before the outage: %v", got)
	}
	if got := sampleValue(t, reg, "tether_session_cache_hits_total", nil); got < 3 {
		t.Errorf("cache hits: %v, want >= 3 (the follow-ups)", got)
	}

	rs.Kill()
	testkit.EventuallyNoError(t, 10*time.Second, func() error {
		return wantSeries(reg, "tether_store_degraded", "tether_store_degraded 1")
	}, "degraded while Redis is down")
	if got := sampleValue(t, reg, "tether_store_errors_total", nil); got < 1 {
		t.Errorf("store errors during the outage: %v, want >= 1", got)
	}
	// Cached sessions keep working; a new one is kept until Redis is back.
	if code := postDrain(t, h, sid, whoamiBody); code != 200 {
		t.Errorf("cached session during the outage: %d", code)
	}
	initSession(t, client, h.endpoint())
	if err := wantSeries(reg, "tether_store_pending_records", "tether_store_pending_records 1"); err != nil {
		t.Error(err)
	}

	rs.Restart()
	testkit.EventuallyNoError(t, 10*time.Second, func() error {
		return wantSeries(reg, "tether_store_degraded", "tether_store_degraded 0")
	}, "healthy once Redis is back")
	testkit.EventuallyNoError(t, 10*time.Second, func() error {
		return wantSeries(reg, "tether_store_pending_records", "tether_store_pending_records 0")
	}, "pending record written")
}
