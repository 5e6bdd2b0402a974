package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/telemetry"
)

// procsLog runs logProcs with env as the environment and returns the
// GOMAXPROCS it left and its log, read by a handler at info (a record at
// debug is not there).
func procsLog(env map[string]string) (procs int, log string) {
	var buf bytes.Buffer
	logProcs(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})),
		func(k string) string { return env[k] })
	return runtime.GOMAXPROCS(0), buf.String()
}

// record decodes the one JSON log record in log.
func record(t *testing.T, log string) map[string]any {
	t.Helper()
	var rec map[string]any
	if err := json.Unmarshal([]byte(log), &rec); err != nil {
		t.Fatalf("logProcs logged %q at info, want one record: %v", log, err)
	}
	return rec
}

// Without GOMAXPROCS in the environment serve keeps the runtime's own
// default, which follows the container's CPU limit (issue 29: it was set
// to 1, a pod with a 4-CPU limit got one thread), and says so at info.
func TestSetProcsKeepsRuntimeDefault(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.SetDefaultGOMAXPROCS()
	want := runtime.GOMAXPROCS(0)

	got, log := procsLog(nil)
	if got != want {
		t.Errorf("without GOMAXPROCS: %d Ps, want the runtime's default %d", got, want)
	}
	rec := record(t, log)
	if rec["level"] != "INFO" || rec["GOMAXPROCS"] != float64(want) || !strings.Contains(rec["from"].(string), "runtime's default") {
		t.Errorf("logged %v, want GOMAXPROCS=%d at INFO from the runtime's default", rec, want)
	}
}

// GOMAXPROCS in the environment (which the runtime has applied before
// main) is the operator's: kept, and logged as such.
func TestSetProcsKeepsEnvironment(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(3) // what GOMAXPROCS=3 did at start

	got, log := procsLog(map[string]string{"GOMAXPROCS": "3"})
	if got != 3 {
		t.Errorf("with GOMAXPROCS=3: %d Ps, want 3", got)
	}
	rec := record(t, log)
	if rec["level"] != "INFO" || rec["GOMAXPROCS"] != float64(3) || rec["from"] != "the environment" {
		t.Errorf("logged %v, want GOMAXPROCS=3 at INFO from the environment", rec)
	}
}

// The value in force is exported at each scrape (the runtime may change
// it as the container's limit changes) by the Go collector tether's
// registry carries: go_sched_gomaxprocs_threads.
func TestProcsExported(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	reg := telemetry.NewMetrics(telemetry.MetricsOptions{}).Registry
	scrape := func() float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "go_sched_gomaxprocs_threads" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no go_sched_gomaxprocs_threads in tether's metrics")
		return 0
	}
	for _, n := range []int{3, 1} {
		runtime.GOMAXPROCS(n)
		if got := scrape(); got != float64(n) {
			t.Errorf("GOMAXPROCS %d: go_sched_gomaxprocs_threads %v", n, got)
		}
	}
}
