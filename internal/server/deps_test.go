package server

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The serve path (this package and everything it imports) pulls in none of
// what only the other commands, the webhook or the benchmark need: a
// sidecar's binary, memory and attack surface stay those of a proxy. Like
// tailscale's deptest, it asks the go command for the package graph.
func TestServePathDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/tether-mcp/tether/internal/server").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	// The list is the graph, not an empty answer that passes every check.
	for _, want := range []string{"github.com/tether-mcp/tether/internal/proxy", "github.com/tether-mcp/tether/internal/session"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps lacks %s: %v", want, deps)
		}
	}
	// A package is forbidden when its path is one of these or lies under
	// one.
	forbidden := []struct{ path, why string }{
		{"sigs.k8s.io", "Kubernetes' modules (kustomize for tether inject, structured-merge-diff, ...)"},
		{"k8s.io", "Kubernetes' modules (client-go, the API types and their machinery): discovery has a small client of its own"},
		{"github.com/modelcontextprotocol/go-sdk", "an MCP SDK: the proxy speaks the protocol on the wire itself"},
		{"github.com/tsenart/vegeta", "the benchmark's load generator"},
		{"github.com/tether-mcp/tether/bench", "the benchmark"},
		{"github.com/tether-mcp/tether/internal/inject", "tether inject and the webhook"},
		{"github.com/tether-mcp/tether/cmd", "the commands"},
		{"testing", "tests"},
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f.path || strings.HasPrefix(dep, f.path+"/") {
				t.Errorf("the serve path imports %s (%s)", dep, f.why)
			}
		}
	}
}
