package discovery

import (
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// Tests against a real kube-apiserver and etcd (internal/kubetest): the
// client's requests, decoding and error answers are the API server's own,
// not the fake's idea of them. (Test code may use client-go to set the
// scene; the source under test does not.)

// kubeSlice is an EndpointSlice of the Service everything, as the
// EndpointSlice controller writes them.
func kubeSlice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "everything"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("mcp"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

// kubeEndpoint is a pod's entry; the API server refuses loopback addresses.
func kubeEndpoint(ip, uid string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "mcp", Name: "pod-" + uid, UID: types.UID(uid)},
	}
}

// startKube starts the control plane with the namespace mcp and an
// identity for tether, ServiceAccount mcp/tether, not yet granted anything
// (env.GrantEndpointSliceReader grants it deploy/rbac's rules).
func startKube(t *testing.T) (env *kubetest.Env, admin kubernetes.Interface, user kubetest.User) {
	t.Helper()
	user = kubetest.ServiceAccountUser("mcp", "tether")
	env = kubetest.Start(t, kubetest.Options{Users: []kubetest.User{user}})
	admin = env.AdminClient()
	if _, err := admin.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mcp"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return env, admin, user
}

// The source against the real API server, with only list and watch on
// EndpointSlices: forbidden until its Role is bound, then the initial list,
// changes through the watch, and resumed watches after the API server
// restarts and after it is killed.
func TestKubernetesSourceAgainstAPIServer(t *testing.T) {
	env, admin, user := startKube(t)
	ctx := t.Context()
	api := admin.DiscoveryV1().EndpointSlices("mcp")
	if _, err := api.Create(ctx, kubeSlice("everything-1",
		kubeEndpoint("10.244.0.11", "a", true, true, false),
		kubeEndpoint("10.244.0.12", "b", true, true, false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := kubeSlice("other-1", kubeEndpoint("10.244.0.99", "z", true, true, false))
	other.Labels[discoveryv1.LabelServiceName] = "other"
	if _, err := api.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	client, err := KubeClient(env.Kubeconfig(user.Name), "tether/test")
	if err != nil {
		t.Fatal(err)
	}
	snaps, logs, _ := runSource(t, client, PortSelector{Name: "mcp"})

	// Forbidden: warned, retried, nothing published.
	testkit.Eventually(t, 30*time.Second, func() bool { return len(logs.lines("is forbidden")) >= 2 }, "the forbidden list, retried")
	select {
	case s := <-snaps:
		t.Fatalf("published %v while forbidden", summarize(s))
	default:
	}
	if got := logs.lines("is forbidden")[0]; !strings.Contains(got, "level=WARN") || !strings.Contains(got, "403 Forbidden") {
		t.Errorf("log line %q, want a warning with the API server's message and code", got)
	}

	env.GrantEndpointSliceReader("mcp", "tether")
	until(t, snaps,
		"a/10.244.0.11:8080 http://10.244.0.11:8080 ready",
		"b/10.244.0.12:8080 http://10.244.0.12:8080 ready")

	update := func(s *discoveryv1.EndpointSlice) {
		t.Helper()
		cur, err := api.Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.ResourceVersion = cur.ResourceVersion
		if _, err := api.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update(kubeSlice("everything-1",
		kubeEndpoint("10.244.0.11", "a", false, true, true),
		kubeEndpoint("10.244.0.12", "b", true, true, false)))
	until(t, snaps,
		"a/10.244.0.11:8080 http://10.244.0.11:8080 fenced",
		"b/10.244.0.12:8080 http://10.244.0.12:8080 ready")
	if _, err := api.Create(ctx, kubeSlice("everything-2", kubeEndpoint("10.244.0.13", "c", true, true, false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, snaps,
		"a/10.244.0.11:8080 http://10.244.0.11:8080 fenced",
		"b/10.244.0.12:8080 http://10.244.0.12:8080 ready",
		"c/10.244.0.13:8080 http://10.244.0.13:8080 ready")

	// A restart ends the watch; the source resumes and sees what changed.
	env.RestartAPIServer()
	if err := api.Delete(ctx, "everything-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, snaps, "c/10.244.0.13:8080 http://10.244.0.13:8080 ready")

	// A killed API server resets the connection; the same.
	env.StopAPIServer()
	env.StartAPIServer()
	update(kubeSlice("everything-2", kubeEndpoint("10.244.0.13", "c", false, true, true)))
	until(t, snaps, "c/10.244.0.13:8080 http://10.244.0.13:8080 fenced")
}

// In a pod: the service account's token and CA in their directory, the
// Service's address in the environment. The token is the user's, read from
// its kubeconfig.
func TestInClusterConfigAgainstAPIServer(t *testing.T) {
	env, _, user := startKube(t)
	env.GrantEndpointSliceReader("mcp", "tether")
	kc, err := loadConfig(env.Kubeconfig(user.Name), testEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	ce := envWith(t, "", map[string]string{"KUBERNETES_SERVICE_HOST": u.Hostname(), "KUBERNETES_SERVICE_PORT": u.Port()})
	writeServiceAccount(t, ce, kc.Token, kc.CAData)
	client, err := newKubeClient("", "tether/test", ce)
	if err != nil {
		t.Fatal(err)
	}
	list, err := client.ListEndpointSlices(t.Context(), "mcp", "kubernetes.io/service-name=everything")
	if err != nil {
		t.Fatalf("in-cluster list: %v", err)
	}
	if list.Metadata.ResourceVersion == "" {
		t.Error("no resourceVersion")
	}
	// Another namespace is forbidden, and the error says so.
	_, err = client.ListEndpointSlices(t.Context(), "default", "a=b")
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("list in default: %v, want forbidden", err)
	}
}
