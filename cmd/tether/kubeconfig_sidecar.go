//go:build tether_sidecar

package main

import (
	"flag"

	"github.com/tether-mcp/tether/internal/discovery"
)

// newKubeAPI is the sidecar's Kubernetes client: discovery's own loader
// (in-cluster service account, kubeconfig tokens and client certificates),
// which links no Kubernetes module (deps_test.go). The full build's is in
// kubeconfig_full.go. kubeContext is always "": the sidecar has no
// --kube-context.
func newKubeAPI(kubeconfig, _, userAgent string) (discovery.KubeAPI, error) {
	return discovery.KubeClient(kubeconfig, userAgent)
}

// kubeContextFlag adds nothing: the sidecar uses its kubeconfig's current
// context.
func kubeContextFlag(*flag.FlagSet, *config) {}
