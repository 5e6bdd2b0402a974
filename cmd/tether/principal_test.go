package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/redistest"
)

func TestPrincipalKey(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := defaultConfig()

	if key, err := principalKey(cfg, log); err != nil || key != nil {
		t.Errorf("standalone: key %q, err %v; want nil (a random key of the process)", key, err)
	}

	file := filepath.Join(t.TempDir(), "key")
	os.WriteFile(file, []byte(strings.Repeat("f", 40)+"\n"), 0o600)
	cfg.PrincipalKeyFile = file
	if key, err := principalKey(cfg, log); err != nil || string(key) != strings.Repeat("f", 40) {
		t.Errorf("key file: key %q, err %v", key, err)
	}
	os.WriteFile(file, []byte("too short\n"), 0o600)
	if _, err := principalKey(cfg, log); err == nil || !strings.Contains(err.Error(), "at least 32 bytes") {
		t.Errorf("short key file: err %v", err)
	}
	cfg.PrincipalKeyFile = ""

	// With Redis and no key configured, every replica gets the same key,
	// created once, and is warned that it lives in Redis.
	srv := redistest.Start(t)
	cfg.RedisURL = srv.URL()
	first, err := principalKey(cfg, log)
	if err != nil || len(first) < minPrincipalKey {
		t.Fatalf("key from Redis: %q, %v", first, err)
	}
	second, err := principalKey(cfg, log)
	if err != nil || !bytes.Equal(first, second) {
		t.Errorf("second replica's key %q, want the first's %q (err %v)", second, first, err)
	}
	if !strings.Contains(logs.String(), "principal key kept in Redis") {
		t.Errorf("no warning about the key kept in Redis:\n%s", logs.String())
	}

	// Redis away at start: a random key of the process, with a warning.
	srv.Kill()
	logs.Reset()
	if key, err := principalKey(cfg, log); err != nil || key != nil {
		t.Errorf("Redis away: key %q, err %v; want nil", key, err)
	}
	if !strings.Contains(logs.String(), "Redis not reachable at start") {
		t.Errorf("no warning about the fallback:\n%s", logs.String())
	}
}
