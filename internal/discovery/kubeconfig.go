package discovery

import (
	"errors"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// KubeClient builds a clientset for the Kubernetes source. The
// configuration comes from, in order:
//
//  1. kubeconfig, when set: that file and nothing else;
//  2. the pod's service account (in-cluster: KUBERNETES_SERVICE_HOST and
//     the mounted token), the sidecar's normal case;
//  3. when that is not available: kubectl's loading rules, the files listed
//     in $KUBECONFIG, else ~/.kube/config, with their current context.
//
// userAgent identifies tether in the API server's logs and audit.
func KubeClient(kubeconfig, userAgent string) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = userAgent
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, inClusterErr := rest.InClusterConfig()
	if inClusterErr == nil {
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	switch {
	case err == nil:
		return cfg, nil
	case errors.Is(inClusterErr, rest.ErrNotInCluster):
		return nil, fmt.Errorf("not running in a cluster, and no usable kubeconfig ($KUBECONFIG or ~/.kube/config): %w", err)
	}
	return nil, fmt.Errorf("in-cluster kubernetes config: %v; kubeconfig ($KUBECONFIG or ~/.kube/config): %w", inClusterErr, err)
}
