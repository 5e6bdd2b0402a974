package telemetry_test

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/tether-mcp/tether/internal/telemetry"
)

// exercisedMetrics is a Metrics with every series family present: vectors
// appear in a scrape only once a label combination has been used.
func exercisedMetrics(t *testing.T) *telemetry.Metrics {
	t.Helper()
	m := telemetry.NewMetrics(telemetry.MetricsOptions{
		Endpoints: func() []telemetry.EndpointStat {
			return []telemetry.EndpointStat{
				{ID: "a", URL: "http://10.0.0.1:8080", State: "ready", Sessions: 3, Inflight: 1},
				{ID: "b", URL: "http://10.0.0.2:8080", State: "ejected", Sessions: 0},
			}
		},
		Store: func() telemetry.StoreStat { return telemetry.StoreStat{CacheHits: 9, CacheMisses: 1, Pending: 2} },
	})
	m.Request("sticky", "legacy", "tools/call", "http://10.0.0.1:8080", 200, time.Millisecond)
	m.Reinit("dial_failed", "ok")
	m.Pick(100 * time.Nanosecond)
	m.StoreOp("get", time.Millisecond, errors.New("timeout"))
	m.StoreDegraded(true)
	// /metrics as served: the handler adds its own error counter.
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	return m
}

func gather(t *testing.T, m *telemetry.Metrics) []*dto.MetricFamily {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// Metric names follow the Prometheus conventions (the promtool check
// without promtool): tether_ prefix, counters in _total, durations in
// _seconds.
func TestMetricNames(t *testing.T) {
	mfs := gather(t, exercisedMetrics(t))
	var ours []*dto.MetricFamily
	for _, mf := range mfs {
		name := mf.GetName()
		switch {
		case strings.HasPrefix(name, "tether_"):
			ours = append(ours, mf)
		case strings.HasPrefix(name, "go_"), strings.HasPrefix(name, "process_"), strings.HasPrefix(name, "promhttp_"):
			continue // the client library's collectors
		default:
			t.Errorf("%s: want the tether_ prefix", name)
			continue
		}
		counter := mf.GetType() == dto.MetricType_COUNTER
		if counter != strings.HasSuffix(name, "_total") {
			t.Errorf("%s (%s): counters and only counters end in _total", name, mf.GetType())
		}
		timed := strings.Contains(name, "duration") || strings.Contains(name, "latency") || strings.Contains(name, "_time")
		if timed && !strings.HasSuffix(name, "_seconds") {
			t.Errorf("%s: a duration is in _seconds", name)
		}
		if h := mf.GetType() == dto.MetricType_HISTOGRAM; h && !strings.HasSuffix(name, "_seconds") && !strings.HasSuffix(name, "_bytes") {
			t.Errorf("%s: a histogram's name ends in its base unit", name)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s: no help", name)
		}
	}
	if len(ours) < 12 {
		t.Errorf("only %d tether_ families gathered", len(ours))
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// BenchmarkRequest is what counting one finished request costs the request
// path: a series already in use.
func BenchmarkRequest(b *testing.B) {
	m := telemetry.NewMetrics(telemetry.MetricsOptions{})
	b.ReportAllocs()
	for b.Loop() {
		m.Request("sticky", "legacy", "tools/call", "http://10.0.0.1:8080", 200, time.Millisecond)
	}
}
