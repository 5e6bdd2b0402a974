package main

import (
	"log/slog"

	"github.com/tether-mcp/tether/discovery"
)

// newSource builds the endpoint source the configuration names: a static
// list (--backends) or a Service's EndpointSlices (--k8s-service).
func newSource(cfg config, log *slog.Logger) (discovery.Source, error) {
	return discovery.NewStatic(cfg.Backends)
}
