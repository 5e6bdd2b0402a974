package telemetry

import "github.com/prometheus/client_golang/prometheus"

// Task routing (SEP-2663 tasks, internal/proxy/taskroute.go).

// taskRouteResults are the values of tether_task_routes_total{result}: a
// bounded set, each initialised at zero so that a dashboard sees the series
// before the first event.
var taskRouteResults = []string{"routed", "unknown", "backend_gone", "principal_mismatch", "unavailable"}

// taskRecordResults are the values of tether_task_records_total{result}.
var taskRecordResults = []string{"stored", "conflict", "failed"}

type taskMetrics struct {
	routes  *prometheus.CounterVec
	records *prometheus.CounterVec
}

func newTaskMetrics(reg *prometheus.Registry) taskMetrics {
	t := taskMetrics{
		routes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_task_routes_total",
			Help: "tasks/get, tasks/update and tasks/cancel requests of MCP 2026-07-28 by result: routed (to the task's backend), unknown (no record: never created through tether, expired, or never recorded), backend_gone (the task's backend left or is ejected; the task is lost), principal_mismatch (credentials not the creator's), unavailable (the store did not answer; 503).",
		}, []string{"result"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_task_records_total",
			Help: "Task creations seen in backend answers by result: stored (routable from every replica), conflict (a live record of another backend or principal holds the id), failed (the store did not answer in time; the task cannot be routed).",
		}, []string{"result"}),
	}
	for _, r := range taskRouteResults {
		t.routes.WithLabelValues(r)
	}
	for _, r := range taskRecordResults {
		t.records.WithLabelValues(r)
	}
	reg.MustRegister(t.routes, t.records)
	return t
}

// TaskRoute counts one routing of a task request (result from
// taskRouteResults).
func (m *Metrics) TaskRoute(result string) {
	if m == nil {
		return
	}
	m.tasks.routes.WithLabelValues(result).Inc()
}

// TaskRecord counts one task creation seen (result from taskRecordResults).
func (m *Metrics) TaskRecord(result string) {
	if m == nil {
		return
	}
	m.tasks.records.WithLabelValues(result).Inc()
}
