package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// The Kubernetes flags (issue 4): --k8s-service NS/NAME, --k8s-port NAME or
// NUMBER, --kubeconfig; the last two only with the first.
func TestKubernetesFlags(t *testing.T) {
	env := func(string) string { return "" }
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"service", []string{"--k8s-service", "mcp/everything"}, ""},
		{"named port and kubeconfig", []string{"--k8s-service", "mcp/everything", "--k8s-port", "http", "--kubeconfig", "/tmp/kc"}, ""},
		{"numbered port", []string{"--k8s-service", "mcp/everything", "--k8s-port", "8080"}, ""},
		{"no namespace", []string{"--k8s-service", "everything"}, "want NAMESPACE/NAME"},
		{"empty name", []string{"--k8s-service", "mcp/"}, "not a DNS label"},
		{"three parts", []string{"--k8s-service", "a/b/c"}, "want NAMESPACE/NAME"},
		{"upper case", []string{"--k8s-service", "MCP/x"}, "not a DNS label"},
		{"port zero", []string{"--k8s-service", "mcp/x", "--k8s-port", "0"}, "--k8s-port"},
		{"port too big", []string{"--k8s-service", "mcp/x", "--k8s-port", "65536"}, "--k8s-port"},
		{"bad port name", []string{"--k8s-service", "mcp/x", "--k8s-port", "Http_1"}, "--k8s-port"},
		{"kubeconfig without service", []string{"--backends", "http://127.0.0.1:9001", "--kubeconfig", "/tmp/kc"}, "need --k8s-service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseServeFlags(tt.args, env, io.Discard)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// newSource builds a Kubernetes source from an explicit kubeconfig without
// contacting the API server.
func TestNewSourceKubernetes(t *testing.T) {
	kc := t.TempDir() + "/kubeconfig"
	writeKubeconfigFile(t, kc, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	cfg, err := parseServeFlags([]string{"--k8s-service", "mcp/everything", "--kubeconfig", kc}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	src, err := newSource(cfg, newLogger(io.Discard, "text", "info"))
	if err != nil {
		t.Fatal(err)
	}
	if src == nil {
		t.Fatal("no source")
	}
	cfg.Kubeconfig = t.TempDir() + "/missing"
	if _, err := newSource(cfg, newLogger(io.Discard, "text", "info")); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("missing kubeconfig: error %v, want one naming --kubeconfig", err)
	}
}

func writeKubeconfigFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
