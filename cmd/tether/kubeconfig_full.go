//go:build !tether_sidecar

package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-mcp/tether/internal/discovery"

	// kubectl's auth-provider plugins: oidc, and the removed gcp and azure
	// ones, whose errors name the exec plugin that replaced them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

// newKubeAPI is the full build's Kubernetes client: every kubeconfig
// kubectl accepts (exec credential plugins such as aws eks get-token,
// gke-gcloud-auth-plugin or kubelogin, auth-provider oidc, token files,
// client certificates, proxy-url, $KUBECONFIG lists), loaded by client-go's
// clientcmd, with discovery's client over client-go's transport. The
// sidecar build keeps discovery's lean loader (kubeconfig_sidecar.go).
// kubeContext, when set, replaces the kubeconfig's current context.
func newKubeAPI(kubeconfig, kubeContext, userAgent string) (discovery.KubeAPI, error) {
	cfg, err := restConfig(kubeconfig, kubeContext)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = userAgent
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	server, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return discovery.NewKubeAPI(server.String(), hc, userAgent)
}

// kubeContextFlag adds --kube-context, kubectl's --context.
func kubeContextFlag(fs *flag.FlagSet, cfg *config) {
	fs.StringVar(&cfg.KubeContext, "kube-context", "", "kubeconfig context to use instead of the current one (full build only)")
}

// restConfig finds the configuration in discovery.KubeClient's order (the
// sidecar's, so both builds agree): the kubeconfig file when given; else
// the pod's service account, unless a context is asked for; else kubectl's
// loading rules ($KUBECONFIG's files merged, else ~/.kube/config).
// clientcmd alone would prefer a kubeconfig to the service account.
func restConfig(kubeconfig, kubeContext string) (*rest.Config, error) {
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	// empty replaces clientcmd's advice to set $KUBERNETES_MASTER when no
	// file gives a current context.
	load := func(rules *clientcmd.ClientConfigLoadingRules, empty string) (*rest.Config, error) {
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
		if clientcmd.IsEmptyConfig(err) {
			return nil, errors.New(empty)
		}
		return cfg, err
	}
	if kubeconfig != "" {
		cfg, err := load(&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, "no current-context")
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	inClusterErr := rest.ErrNotInCluster
	if kubeContext == "" {
		var cfg *rest.Config
		if cfg, inClusterErr = rest.InClusterConfig(); inClusterErr == nil {
			return cfg, nil
		}
	}
	where := "~/.kube/config"
	if os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "" {
		where = "$KUBECONFIG"
	}
	cfg, err := load(clientcmd.NewDefaultClientConfigLoadingRules(), "no kubeconfig file found, or none sets a current-context")
	if err == nil {
		return cfg, nil
	}
	switch {
	case kubeContext != "":
		return nil, fmt.Errorf("kubeconfig (%s): %w", where, err)
	case errors.Is(inClusterErr, rest.ErrNotInCluster):
		return nil, fmt.Errorf("not running in a cluster, and no usable kubeconfig (%s): %w", where, err)
	}
	return nil, fmt.Errorf("in-cluster kubernetes config: %v; kubeconfig (%s): %w", inClusterErr, where, err)
}
