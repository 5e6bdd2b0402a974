package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
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
	cfg.Backends = []string{testkit.PingBackend(t).URL}
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
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status("http://"+admin+"/readyz") == 200 }, "ready")

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

// With a redis+cluster:// URL, tether starts, serves, and names the
// cluster's three masters.
func TestClusterStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t)
	cfg := defaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Backends = []string{sessionBackend(t).URL}
	cfg.RedisURL = c.URL()
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
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status("http://"+admin+"/readyz") == 200 }, "ready")
	var out string
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, out, _ = runCLI("status", "--admin", admin)
		return strings.Contains(out, "store redis cluster, primaries ") && strings.Contains(out, "0 failovers seen (healthy)")
	}, "status naming the cluster")
	masters := 0
	for _, n := range c.Nodes {
		if strings.Contains(out, n.Addr()) {
			masters++
		}
	}
	if masters != 3 {
		t.Errorf("status names %d of the nodes, want the 3 masters:\n%s", masters, out)
	}
	// A session initialized through tether is recorded in the cluster, and
	// its follow-up routed.
	post := func(body, sid string) *http.Response {
		req, _ := http.NewRequest("POST", "http://"+s.ClientAddr().String()+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, "")
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize through tether on a cluster: %d, session %q", resp.StatusCode, sid)
	}
	if resp := post(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, sid); resp.StatusCode != 200 {
		t.Errorf("follow-up: %d", resp.StatusCode)
	}
	target, err := session.ParseRedisURL(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	store := session.NewRedis(session.RedisOptions{Client: session.NewRedisTargetClient(target, time.Second), Prefix: cfg.RedisPrefix})
	defer store.Close()
	if rec, err := store.Get(t.Context(), sid); err != nil || rec.BackendURL == "" {
		t.Errorf("the session's record in the cluster: %+v, %v", rec, err)
	}
}

// sessionBackend answers every request, and gives an initialize a session
// id, as a stateful MCP server does.
func sessionBackend(t *testing.T) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), `"initialize"`) {
			w.Header().Set("Mcp-Session-Id", "backend-"+strconv.FormatInt(n.Add(1), 10))
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"b","version":"1"}}}`)
			return
		}
		io.WriteString(w, `{"jsonrpc":"2.0","id":2,"result":{}}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}
