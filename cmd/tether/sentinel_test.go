package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// With a redis+sentinel:// URL, tether status and /metrics show the
// topology, the primary, and the failover when the primary dies.
func TestSentinelStatusAndMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment")
	}
	d := redistest.StartSentinel(t)
	cfg := defaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Backends = []string{pingBackend(t).URL}
	cfg.RedisURL = d.URL()
	cfg.RedisTimeout = 200 * time.Millisecond // -race on 2 cores
	s, err := newServer(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { stop(); <-done }()
	admin := s.AdminAddr().String()
	testkit.Eventually(t, 10*time.Second, func() bool { return status("http://"+admin+"/readyz") == 200 }, "ready")

	statusSays := func(want string) func() bool {
		return func() bool {
			_, out, _ := runCLI("status", "--admin", admin)
			return strings.Contains(out, want)
		}
	}
	metricsSay := func(want ...string) func() bool {
		return func() bool {
			resp, err := http.Get("http://" + admin + "/metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			for _, w := range want {
				if !strings.Contains(string(body), w) {
					return false
				}
			}
			return true
		}
	}
	testkit.Eventually(t, 10*time.Second, statusSays("store redis sentinel, primary "+d.Primary.Addr()+", 0 failovers seen (healthy)"),
		"status naming the primary")
	testkit.Eventually(t, 10*time.Second, metricsSay(`tether_store_topology_info{topology="sentinel"} 1`,
		`tether_store_primary_info{addr="`+d.Primary.Addr()+`"} 1`, "tether_store_failovers_total 0"), "metrics naming the primary")

	d.Primary.Kill()
	d.WaitFailover(d.Primary)
	testkit.Eventually(t, 30*time.Second, statusSays("primary "+d.Replica.Addr()+", 1 failover seen"), "status naming the new primary")
	testkit.Eventually(t, 10*time.Second, metricsSay(`tether_store_primary_info{addr="`+d.Replica.Addr()+`"} 1`,
		"tether_store_failovers_total 1"), "metrics counting the failover")
}
