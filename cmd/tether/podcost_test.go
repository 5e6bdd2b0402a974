package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/podcost"
)

// --pod-deletion-cost (and TETHER_POD_DELETION_COST) needs --k8s-service;
// its interval has a default and a floor.
func TestPodDeletionCostFlags(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	tests := []struct {
		name         string
		args         []string
		env          func(string) string
		wantOn       bool
		wantInterval time.Duration
		wantErr      string
	}{
		{"off by default", []string{"--k8s-service", "mcp/everything"}, env(), false, podcost.DefaultInterval, ""},
		{"flag", []string{"--k8s-service", "mcp/everything", "--pod-deletion-cost"}, env(), true, 10 * time.Second, ""},
		{"env", []string{"--k8s-service", "mcp/everything"}, env("TETHER_POD_DELETION_COST", "true", "TETHER_POD_DELETION_COST_INTERVAL", "30s"), true, 30 * time.Second, ""},
		{"flag beats env", []string{"--k8s-service", "mcp/everything", "--pod-deletion-cost=false"}, env("TETHER_POD_DELETION_COST", "true"), false, podcost.DefaultInterval, ""},
		{"static backends", []string{"--backends", "http://127.0.0.1:9001", "--pod-deletion-cost"}, env(), false, 0, "--pod-deletion-cost needs --k8s-service"},
		{"interval too short", []string{"--k8s-service", "mcp/everything", "--pod-deletion-cost", "--pod-deletion-cost-interval", "100ms"}, env(), false, 0, "--pod-deletion-cost-interval must be at least 1s"},
		{"bad env", []string{"--k8s-service", "mcp/everything"}, env("TETHER_POD_DELETION_COST", "yes please"), false, 0, "TETHER_POD_DELETION_COST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseServeFlags(tt.args, tt.env, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %v, want one line containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.PodDeletionCost != tt.wantOn || cfg.PodDeletionCostInterval != tt.wantInterval {
				t.Errorf("on %v interval %s, want %v %s", cfg.PodDeletionCost, cfg.PodDeletionCostInterval, tt.wantOn, tt.wantInterval)
			}
		})
	}
}

// The server gets the writer's options only when the flag is on: the
// Service, the interval, an identity from $POD_NAME, and a client by the
// kubeconfig's rules.
func TestServerConfigPodDeletionCost(t *testing.T) {
	kc := t.TempDir() + "/kubeconfig"
	writeKubeconfigFile(t, kc, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	getenv := func(k string) string {
		if k == "POD_NAME" {
			return "proxy-7d9f-abcde"
		}
		return ""
	}
	log := newLogger(io.Discard, "text", "info")
	cfg, err := parseServeFlags([]string{"--k8s-service", "mcp/everything", "--kubeconfig", kc, "--pod-deletion-cost", "--pod-deletion-cost-interval", "20s"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := serverConfig(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	o := sc.PodDeletionCost
	if o == nil {
		t.Fatal("no pod deletion cost options")
	}
	if o.API == nil || o.Service.String() != "mcp/everything" || o.Interval != 20*time.Second || !strings.HasPrefix(o.Identity, "proxy-7d9f-abcde_") {
		t.Errorf("options %+v", o)
	}

	cfg.PodDeletionCost = false
	if sc, err := serverConfig(cfg, log); err != nil || sc.PodDeletionCost != nil {
		t.Errorf("flag off: options %+v, %v; want none", sc.PodDeletionCost, err)
	}
}
