package server

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// With Redis and no key configured, every replica gets the same key,
// created once, and is warned that it lives in Redis; with Redis away at
// start, a random key of the process, with a warning.
func TestPrincipalKeyFromRedis(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	srv := redistest.Start(t)
	opt, err := session.ParseRedisURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Redis: opt, RedisPrefix: "tether:", RedisTimeout: 50 * time.Millisecond}

	first := principalKeyFromRedis(cfg, log)
	if len(first) < MinPrincipalKey {
		t.Fatalf("key from Redis: %q", first)
	}
	if second := principalKeyFromRedis(cfg, log); !bytes.Equal(first, second) {
		t.Errorf("second replica's key %q, want the first's %q", second, first)
	}
	if !strings.Contains(logs.String(), "principal key kept in Redis") {
		t.Errorf("no warning about the key kept in Redis:\n%s", logs.String())
	}

	srv.Kill()
	logs.Reset()
	if key := principalKeyFromRedis(cfg, log); key != nil {
		t.Errorf("Redis away: key %q, want nil", key)
	}
	if !strings.Contains(logs.String(), "Redis not reachable at start") {
		t.Errorf("no warning about the fallback:\n%s", logs.String())
	}
}
