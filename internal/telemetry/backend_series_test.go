package telemetry_test

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// Endpoints that leave take their metric series with them: 50 endpoints
// come, carry requests and go, as in a sequence of rollouts, and the number
// of per-backend series returns to where it started (issue 11: every
// rollout used to add tether_requests_total series forever).
func TestBackendSeriesLeaveWithTheirEndpoints(t *testing.T) {
	var bal *balancer.Balancer
	m := telemetry.NewMetrics(telemetry.MetricsOptions{Endpoints: func() []telemetry.EndpointStat {
		var out []telemetry.EndpointStat
		for _, e := range bal.Endpoints() {
			out = append(out, telemetry.EndpointStat{ID: e.ID, URL: e.String(), State: e.State().String(), Sessions: e.Sessions(), Inflight: e.Inflight()})
		}
		return out
	}})
	picker, err := balancer.NewPicker("p2c", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The wiring cmd/tether uses: the balancer reports each new set.
	bal = balancer.New(balancer.Options{Picker: picker, OnUpdate: func(eps []*balancer.Endpoint) {
		urls := make([]string, len(eps))
		for i, e := range eps {
			urls[i] = e.String()
		}
		m.RetainBackends(urls)
	}})

	endpoint := func(i int) discovery.Endpoint {
		u := &url.URL{Scheme: "http", Host: fmt.Sprintf("10.0.%d.%d:8080", i/250, i%250+1)}
		return discovery.Endpoint{ID: fmt.Sprintf("pod-%d/%s", i, u.Host), URL: u, State: discovery.Ready}
	}
	// request sends one request through e as the proxy records it.
	request := func(e *balancer.Endpoint, route string, status int) {
		e.Begin()
		defer e.End()
		m.Request(route, "legacy", "tools/call", e.String(), status, time.Millisecond)
	}

	steady := endpoint(0)
	bal.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{steady}})
	steadyEP, _ := bal.Lookup(steady.ID)
	request(steadyEP, "new", 200)
	m.Request("refused", "legacy", "", "", 503, time.Millisecond) // no backend: a series of its own, kept
	start := backendSeries(t, m)

	const rollouts = 50
	var stray *balancer.Endpoint
	for i := 1; i <= rollouts; i++ {
		// Endpoint i arrives and endpoint i-1 leaves in the same update.
		bal.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{steady, endpoint(i)}})
		strays := 0
		if stray != nil {
			// A request that was still in flight on the endpoint that just
			// left ends now, after the update: its series comes back...
			request(stray, "sticky", 200)
			stray, strays = nil, 1
		}
		e, err := bal.Pick(steadyEP) // the only other endpoint: i
		if err != nil || e.ID != endpoint(i).ID {
			t.Fatalf("rollout %d: picked %v, %v; want %s", i, e, err, endpoint(i).ID)
		}
		request(e, "new", 200)
		request(e, "sticky", 200)
		request(e, "sticky", 502)
		if i == rollouts/2 {
			stray = e
		}
		// Requests through endpoint i added series (three request series
		// plus its four gauges: sessions, in flight, listen streams,
		// draining); the ones of endpoint i-1 are gone.
		if got, want := backendSeries(t, m), start+7+strays; got != want {
			t.Fatalf("rollout %d: %d per-backend series, want %d", i, got, want)
		}
	}
	// ...and goes with the next update, as does the last endpoint.
	bal.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{steady}})
	if got := backendSeries(t, m); got != start {
		t.Fatalf("after %d endpoints came and went: %d per-backend series, want %d as at the start", rollouts, got, start)
	}
}

// backendSeries counts the series of the registry that carry a backend
// label, the ones whose number grows with the endpoints.
func backendSeries(t *testing.T, m *telemetry.Metrics) int {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "backend" {
					n++
				}
			}
		}
	}
	return n
}

// A backend that leaves and comes back under the same URL (a pod IP reused)
// counts in its registered series again: the per-series cache behind
// Request forgets what RetainBackends deletes, so no count goes to a series
// the registry no longer holds. Statuses outside 0..599 share one series.
func TestRequestsCountAfterBackendReturns(t *testing.T) {
	m := telemetry.NewMetrics(telemetry.MetricsOptions{})
	const a, b = "http://10.0.0.1:8080", "http://10.0.0.2:8080"
	count := func(backend, code string) float64 {
		t.Helper()
		for _, f := range gather(t, m) {
			if f.GetName() != "tether_requests_total" {
				continue
			}
			for _, s := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["backend"] == backend && labels["code"] == code {
					return s.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	for range 3 {
		m.Request("sticky", "legacy", "tools/call", a, 200, time.Millisecond)
	}
	m.Request("sticky", "legacy", "tools/call", b, 200, time.Millisecond)
	if got := count(a, "200"); got != 3 {
		t.Fatalf("a before it left: %v requests, want 3", got)
	}
	m.RetainBackends([]string{b}) // a leaves
	if got := count(a, "200"); got != 0 {
		t.Fatalf("a after it left: %v requests, want its series gone", got)
	}
	m.RetainBackends([]string{a, b}) // and comes back
	m.Request("sticky", "legacy", "tools/call", a, 200, time.Millisecond)
	m.Request("sticky", "legacy", "tools/call", b, 200, time.Millisecond)
	if got := count(a, "200"); got != 1 {
		t.Fatalf("a after it came back: %v requests, want 1", got)
	}
	if got := count(b, "200"); got != 2 {
		t.Fatalf("b, which stayed: %v requests, want 2", got)
	}
	for _, status := range []int{600, 999, -5} {
		m.Request("sticky", "legacy", "tools/call", b, status, time.Millisecond)
	}
	if got := count(b, "other"); got != 3 {
		t.Fatalf("statuses outside 0..599: %v requests under code other, want 3", got)
	}
}
