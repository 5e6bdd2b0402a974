package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// With --redis-url, sessions live in Redis; when Redis goes away tether
// stays ready (degraded, serving) and says so once in its log.
func TestRedisStoreWiringAndReadinessWhileDegraded(t *testing.T) {
	srv := redistest.Start(t)
	backend := testkit.PingBackend(t)

	cfg := defaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Backends = []string{backend.URL}
	cfg.RedisURL = srv.URL()
	var logs testkit.LockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s, err := newServer(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { stop(); <-done }()
	ready := "http://" + s.AdminAddr().String() + "/readyz"
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status(ready) == 200 }, "ready")

	srv.Kill()
	testkit.Eventually(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), "session store degraded") }, "the outage logged")
	if got := testkit.Status(ready); got != 200 {
		t.Errorf("/readyz while Redis is down: %d, want 200 (degraded but serving)", got)
	}
	resp, err := http.Post("http://"+s.ClientAddr().String()+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("stateless request while Redis is down: %d", resp.StatusCode)
	}
	if n := strings.Count(logs.String(), "session store degraded"); n != 1 {
		t.Errorf("%d degraded log lines, want one per transition", n)
	}
}

func TestRedisOptions(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cfg := defaultConfig()
	cfg.RedisURL = "redis://127.0.0.1:6390/3"
	cfg.RedisPassword = "from-env"
	target, err := redisOptions(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if opt := target.Single; opt.Password != "from-env" || opt.DB != 3 || opt.TLSConfig != nil {
		t.Errorf("options %+v", opt)
	}

	cfg.RedisURL = "redis://:in-url@127.0.0.1:6390"
	if target, _ := redisOptions(cfg, log); target.Password() != "in-url" {
		t.Errorf("URL password %q, want it to win over the environment", target.Password())
	}

	// The environment's password goes to the primary of a Sentinel
	// deployment and to the nodes of a cluster.
	cfg.RedisURL = "redis+sentinel://127.0.0.1:26390,127.0.0.1:26391/mymaster/2"
	if target, err := redisOptions(cfg, log); err != nil || target.Sentinel.Password != "from-env" || target.Sentinel.DB != 2 {
		t.Errorf("sentinel: %+v, %v", target, err)
	}
	cfg.RedisURL = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
	if target, err := redisOptions(cfg, log); err != nil || target.Cluster.Password != "from-env" {
		t.Errorf("cluster: %+v, %v", target, err)
	}
	cfg.RedisURL = "rediss+cluster://127.0.0.1:7000"
	if target, err := redisOptions(cfg, log); err != nil || target.Cluster.TLSConfig == nil {
		t.Errorf("rediss+cluster: %+v, %v", target, err)
	}

	cfg.RedisURL = "redis://127.0.0.1:6390"
	cfg.RedisCA = "/nonexistent.pem"
	if _, err := redisOptions(cfg, log); err == nil || !strings.Contains(err.Error(), "rediss://") {
		t.Errorf("--redis-ca with redis://: %v", err)
	}

	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, []byte("not a certificate"), 0o600)
	cfg.RedisURL, cfg.RedisCA = "rediss://redis.example:6380", ca
	if _, err := redisOptions(cfg, log); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("bad CA file: %v", err)
	}
}

// A password sent over plain TCP is warned about.
func TestRedisPlaintextPasswordWarning(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := defaultConfig()
	cfg.RedisURL = "redis://:pw@127.0.0.1:6390"
	if _, err := redisOptions(cfg, log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "plain TCP") {
		t.Errorf("no warning for a plaintext password: %q", logs.String())
	}
	if strings.Contains(logs.String(), "pw") {
		t.Errorf("the password is in the log: %q", logs.String())
	}
}
