package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrincipalKey(t *testing.T) {
	cfg := defaultConfig()
	if key, err := principalKey(cfg); err != nil || key != nil {
		t.Errorf("nothing configured: key %q, err %v; want nil (the server's default)", key, err)
	}

	file := filepath.Join(t.TempDir(), "key")
	os.WriteFile(file, []byte(strings.Repeat("f", 40)+"\n"), 0o600)
	cfg.PrincipalKeyFile = file
	if key, err := principalKey(cfg); err != nil || string(key) != strings.Repeat("f", 40) {
		t.Errorf("key file: key %q, err %v", key, err)
	}
	os.WriteFile(file, []byte("too short\n"), 0o600)
	if _, err := principalKey(cfg); err == nil || !strings.Contains(err.Error(), "at least 32 bytes") {
		t.Errorf("short key file: err %v", err)
	}
	cfg.PrincipalKeyFile = ""

	cfg.PrincipalKey = strings.Repeat("k", 32)
	if key, err := principalKey(cfg); err != nil || string(key) != cfg.PrincipalKey {
		t.Errorf("TETHER_PRINCIPAL_KEY: key %q, err %v", key, err)
	}
}
