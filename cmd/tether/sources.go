package main

import (
	"fmt"
	"log/slog"

	"github.com/tether-mcp/tether/internal/discovery"
)

// newSource builds the endpoint source the configuration names: a static
// list (--backends) or a Service's EndpointSlices (--k8s-service).
func newSource(cfg config, log *slog.Logger) (discovery.Source, error) {
	if cfg.K8sService == "" {
		return discovery.NewStatic(cfg.Backends)
	}
	svc, err := discovery.ParseServiceRef(cfg.K8sService)
	if err != nil {
		return nil, fmt.Errorf("--k8s-service %w", err)
	}
	port, err := discovery.ParsePortSelector(cfg.K8sPort)
	if err != nil {
		return nil, fmt.Errorf("--k8s-port %w", err)
	}
	client, err := newKubeAPI(cfg.Kubeconfig, cfg.KubeContext, "tether/"+version)
	switch {
	case err != nil && cfg.Kubeconfig != "":
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	case err != nil:
		return nil, fmt.Errorf("%w; --kubeconfig names a kubeconfig file", err)
	}
	return discovery.NewKubernetes(discovery.KubernetesOptions{Client: client, Service: svc, Port: port, Logger: log})
}
