package discovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// KubeClient builds the EndpointSlice client of the Kubernetes source. The
// configuration comes from, in order:
//
//  1. kubeconfig, when set: that file and nothing else;
//  2. the pod's service account (in-cluster: KUBERNETES_SERVICE_HOST and
//     the mounted token), the sidecar's normal case;
//  3. when that is not available: kubectl's loading rules, the files listed
//     in $KUBECONFIG, else ~/.kube/config, with their current context.
//
// userAgent identifies tether in the API server's logs and audit.
//
// The client knows the discovery/v1 types and nothing else. client-go's
// typed clients (the full clientset, and even the discovery/v1 one alone)
// decode through k8s.io/client-go/kubernetes/scheme, which registers every
// API group at init: linking it cost every tether process 34 MB of binary
// and 14 MiB of idle RSS, static mode included.
func KubeClient(kubeconfig, userAgent string) (EndpointSliceClient, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = userAgent
	scheme := runtime.NewScheme()
	// As kubernetes/scheme does: the unversioned meta types (Status, the
	// list and watch options) under v1, then the group's own types.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	gv := discoveryv1.SchemeGroupVersion
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(scheme, serializer.NewCodecFactory(scheme)).WithoutConversion()
	client, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &sliceClient{rest: client, params: runtime.NewParameterCodec(scheme)}, nil
}

// sliceClient is the EndpointSlice client KubeClient returns. Its requests
// are those of client-go's generated discovery/v1 client (gentype, which is
// not used because it links client-go's fakes): protobuf preferred, the
// list options as query parameters, their timeout as the request's.
type sliceClient struct {
	rest   rest.Interface
	params runtime.ParameterCodec
}

func (c *sliceClient) ListEndpointSlices(ctx context.Context, namespace string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	list := &discoveryv1.EndpointSliceList{}
	err := c.request(namespace, &opts).Do(ctx).Into(list)
	return list, err
}

func (c *sliceClient) WatchEndpointSlices(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.request(namespace, &opts).Watch(ctx)
}

func (c *sliceClient) request(namespace string, opts *metav1.ListOptions) *rest.Request {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return c.rest.Get().
		UseProtobufAsDefaultIfPreferred(true).
		Namespace(namespace).
		Resource("endpointslices").
		VersionedParams(opts, c.params).
		Timeout(timeout)
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
