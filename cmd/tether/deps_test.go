package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestBinaryDependencies pins what the tether binary may link (as
// tailscale's tstest/deptest does): the image built from this package is a
// sidecar in every MCP server's pod, so each module it links is code that
// runs there and a supply-chain dependency of every user. A new module
// fails this test until it is added to allowedModules on purpose; test and
// benchmark code never reaches the binary.
func TestBinaryDependencies(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	// The full binary, and the sidecar's build (-tags tether_sidecar), which
	// links a subset.
	for _, tags := range []string{"", "tether_sidecar"} {
		t.Run("tags="+tags, func(t *testing.T) {
			// The image's platform and build settings (Dockerfile).
			cmd := exec.Command(goCmd, "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", ".")
			cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps: %v", err)
			}
			modules := map[string]bool{}
			for line := range strings.Lines(string(out)) {
				pkg, module, _ := strings.Cut(strings.TrimSpace(line), " ")
				for _, bad := range forbiddenPackages {
					if pkg == bad || strings.HasPrefix(pkg, bad+"/") {
						t.Errorf("the binary links %s, which is for tests or benchmarks only", pkg)
					}
				}
				if tags == "tether_sidecar" {
					for _, bad := range sidecarForbidden {
						if strings.HasPrefix(pkg, bad) {
							t.Errorf("the sidecar links %s: no Kubernetes Go module belongs in it (discovery has a client of its own)", pkg)
						}
					}
				}
				if module != "" {
					modules[module] = true
				}
			}
			allowed := allowedModules
			if tags == "" {
				allowed = slices.Concat(allowedModules, fullBuildModules)
			}
			for module := range modules {
				if !slices.Contains(allowed, module) {
					t.Errorf("the binary links a new module, %s: if it is meant to, add it to allowedModules", module)
				}
			}
			if len(modules) < 10 {
				t.Fatalf("go list found only %d modules: the listing is broken\n%s", len(modules), out)
			}
		})
	}
}

// forbiddenPackages (and the packages under them) belong to tests and the
// benchmarks.
var forbiddenPackages = []string{
	"testing",
	"net/http/httptest",
	"github.com/tether-mcp/tether/bench",
	"github.com/tether-mcp/tether/e2e",
	"github.com/tether-mcp/tether/hack",
	"github.com/tether-mcp/tether/internal/dockerfile",
	"github.com/tether-mcp/tether/internal/kubetest",
	"github.com/tether-mcp/tether/internal/redistest",
	"github.com/tether-mcp/tether/internal/testkit",
	"github.com/tsenart/vegeta",
	"github.com/stretchr/testify",
	"github.com/google/go-cmp",
}

// sidecarForbidden are the import path prefixes the sidecar's build must
// not link: Kubernetes' modules. Their API types and machinery cost the
// sidecar 9 MB of stripped binary and about 5 MiB of idle RSS in every MCP
// server's pod; discovery speaks list and watch with its own small client,
// and only the full binary's inject and webhook use the API types.
var sidecarForbidden = []string{"k8s.io/", "sigs.k8s.io/"}

// fullBuildModules are the modules only the full binary may link:
// client-go's clientcmd and rest transport (kubeconfig_full.go), so that
// --kubeconfig takes every kubeconfig kubectl takes, exec credential
// plugins included.
var fullBuildModules = []string{
	"github.com/davecgh/go-spew",
	"github.com/spf13/pflag",
	"golang.org/x/term",
	"k8s.io/client-go",
	"sigs.k8s.io/yaml",
}

// allowedModules are the modules the binary may link: MCP (go-sdk), Redis,
// Prometheus, OpenTelemetry, YAML, Kubernetes' API types (the full build's
// inject and webhook only) and their dependencies.
var allowedModules = []string{
	"github.com/tether-mcp/tether",

	"github.com/beorn7/perks",
	"github.com/cenkalti/backoff/v5",
	"github.com/cespare/xxhash/v2",
	"github.com/fxamacker/cbor/v2",
	"github.com/go-logr/logr",
	"github.com/go-logr/stdr",
	"github.com/google/jsonschema-go",
	"github.com/google/uuid",
	"github.com/grpc-ecosystem/grpc-gateway/v2",
	"github.com/hashicorp/golang-lru/v2",
	"github.com/json-iterator/go",
	"github.com/modelcontextprotocol/go-sdk",
	"github.com/modern-go/concurrent",
	"github.com/modern-go/reflect2",
	"github.com/munnerz/goautoneg",
	"github.com/prometheus/client_golang",
	"github.com/prometheus/client_model",
	"github.com/prometheus/common",
	"github.com/prometheus/procfs",
	"github.com/redis/go-redis/v9",
	"github.com/segmentio/asm",
	"github.com/segmentio/encoding",
	"github.com/x448/float16",
	"github.com/yosida95/uritemplate/v3",
	"go.opentelemetry.io/auto/sdk",
	"go.opentelemetry.io/otel",
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace",
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc",
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp",
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace",
	"go.opentelemetry.io/otel/log",
	"go.opentelemetry.io/otel/metric",
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/trace",
	"go.opentelemetry.io/proto/otlp",
	"go.uber.org/atomic",
	"go.yaml.in/yaml/v2",
	"go.yaml.in/yaml/v3",
	"golang.org/x/net",
	"golang.org/x/oauth2",
	"golang.org/x/sync",
	"golang.org/x/sys",
	"golang.org/x/text",
	"golang.org/x/time",
	"google.golang.org/genproto/googleapis/api",
	"google.golang.org/genproto/googleapis/rpc",
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
	"gopkg.in/inf.v0",
	"k8s.io/api",
	"k8s.io/apimachinery",
	"k8s.io/klog/v2",
	"k8s.io/kube-openapi",
	"k8s.io/utils",
	"sigs.k8s.io/json",
	"sigs.k8s.io/randfill",
	"sigs.k8s.io/structured-merge-diff/v6",
}
