package kubetest_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// The control plane starts, the admin may do anything, a user without a
// binding may do nothing (RBAC is on) until granted, and it survives a
// restart.
func TestEnv(t *testing.T) {
	start := time.Now()
	reader := kubetest.ServiceAccountUser("kt", "reader")
	env := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{{Name: "nobody"}, reader}})
	t.Logf("etcd and kube-apiserver ready in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	admin := env.AdminClient()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kt"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("admin creates a namespace: %v", err)
	}

	client := func(user string) kubernetes.Interface {
		cfg, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig(user))
		if err != nil {
			t.Fatal(err)
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	nobody := client("nobody")
	_, err := nobody.DiscoveryV1().EndpointSlices("kt").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("unbound user lists EndpointSlices: error %v, want forbidden", err)
	}

	// The grant takes effect a moment later: the API server's authorizer
	// reads Roles and RoleBindings through its informers.
	env.GrantEndpointSliceReader("kt", "reader")
	slices := client(reader.Name).DiscoveryV1().EndpointSlices("kt")
	testkit.EventuallyNoError(t, 30*time.Second, func() error {
		_, err := slices.List(ctx, metav1.ListOptions{})
		return err
	}, "the granted ServiceAccount to list EndpointSlices")
	if w, err := slices.Watch(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the granted ServiceAccount watches EndpointSlices: %v", err)
	} else {
		w.Stop()
	}
	if _, err := client(reader.Name).CoreV1().Pods("kt").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the granted ServiceAccount lists Pods: error %v, want forbidden", err)
	}

	start = time.Now()
	env.RestartAPIServer()
	t.Logf("kube-apiserver restarted in %s", time.Since(start).Round(time.Millisecond))
	if _, err := admin.CoreV1().Namespaces().Get(ctx, "kt", metav1.GetOptions{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
