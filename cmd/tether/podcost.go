package main

import (
	"fmt"

	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/podcost"
)

// podCostOptions configures the pod deletion cost writer
// (--pod-deletion-cost). Its API client is the discovery source's
// (newKubeAPI: --kubeconfig, else in-cluster, ...); the Lease names this replica
// by $POD_NAME (the downward API), else the host name.
func podCostOptions(cfg config) (*podcost.Options, error) {
	svc, err := discovery.ParseServiceRef(cfg.K8sService)
	if err != nil {
		return nil, fmt.Errorf("--k8s-service %w", err)
	}
	api, err := newKubeAPI(cfg.Kubeconfig, cfg.KubeContext, "tether/"+version)
	switch {
	case err != nil && cfg.Kubeconfig != "":
		return nil, fmt.Errorf("--pod-deletion-cost: --kubeconfig: %w", err)
	case err != nil:
		return nil, fmt.Errorf("--pod-deletion-cost: %w; --kubeconfig names a kubeconfig file", err)
	}
	return &podcost.Options{
		API:      api,
		Service:  svc,
		Identity: podcost.NewIdentity(cfg.getenv),
		Interval: cfg.PodDeletionCostInterval,
	}, nil
}
