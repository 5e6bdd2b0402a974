//go:build !tether_sidecar

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/tether-mcp/tether/internal/inject"
	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/testkit/testca"
)

// The webhook end to end: a real kube-apiserver calls `tether webhook` over
// TLS on loopback, configured by deploy/webhook's own
// MutatingWebhookConfiguration (only its clientConfig pointed at the test's
// address and CA), and Pods come back with the sidecar. The API server's
// validation then also judges the sidecar tether writes: every output of
// the inject golden files is created with dryRun=All.
func TestWebhookAgainstAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	admin := env.AdminClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dir := t.TempDir()
	ca := testca.New(t)
	certFile, keyFile := ca.Issue(t, dir, 7)
	certs, err := newCertReloader(certFile, keyFile, time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	addr, stopWebhook := startWebhook(t, certs, inject.DefaultConfig("v1.0.0"))

	mwc := loadWebhookConfiguration(t)
	url := "https://" + addr + "/inject"
	mwc.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca.PEM}
	if _, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Namespaces: one opted in, one not. No controller manager runs, so
	// their default ServiceAccounts are made by hand.
	for ns, labels := range map[string]map[string]string{
		"proxies": {"tether.dev/injection": "enabled"},
		"plain":   nil,
		"mcp":     nil, // internal/inject/testdata/deployment.yaml's
	} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, sa := range []string{"default", "fetch-proxy"} {
			if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}

	pod := func(name string, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "proxy", Image: "example/proxy:1"}}},
		}
	}
	annotated := map[string]string{"tether.dev/inject": "true", "tether.dev/service": "mcp-fetch", "tether.dev/port": "http"}
	hasTether := func(p *corev1.Pod) bool {
		return slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.ContainerName })
	}

	// The API server picks the configuration up within a moment: wait
	// until an annotated Pod comes back injected.
	var got *corev1.Pod
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		p, err := admin.CoreV1().Pods("proxies").Create(ctx, pod(fmt.Sprintf("proxy-%d", i), annotated), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if hasTether(p) {
			got = p
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Pod was injected within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}

	sc := got.Spec.InitContainers[0]
	if sc.Name != inject.ContainerName || sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("init containers %+v: want tether first, restartPolicy Always", got.Spec.InitContainers)
	}
	for _, a := range []string{"--k8s-service=$(POD_NAMESPACE)/mcp-fetch", "--k8s-port=http", "--listen=127.0.0.1:7480"} {
		if !slices.Contains(sc.Args, a) {
			t.Errorf("tether args %q: want %s", sc.Args, a)
		}
	}
	if g := got.Spec.TerminationGracePeriodSeconds; g == nil || *g != 45 {
		t.Errorf("terminationGracePeriodSeconds %v, want 45", g)
	}
	if c := got.Spec.Containers; len(c) != 1 || c[0].Name != "proxy" {
		t.Errorf("containers %+v: want the proxy alone", c)
	}

	// Not annotated, or not in an opted-in namespace: untouched.
	for _, tc := range []struct{ ns, name string }{{"proxies", "bare"}, {"plain", "annotated"}} {
		ann := annotated
		if tc.name == "bare" {
			ann = nil
		}
		p, err := admin.CoreV1().Pods(tc.ns).Create(ctx, pod(tc.name, ann), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if hasTether(p) {
			t.Errorf("%s/%s was injected", tc.ns, tc.name)
		}
	}

	// Asked for tether without saying which Service: refused, with why.
	_, err = admin.CoreV1().Pods("proxies").Create(ctx, pod("no-service", map[string]string{"tether.dev/inject": "true"}), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "tether: no backend Service") {
		t.Errorf("Pod without a Service: error %v, want a refusal naming the missing Service", err)
	}

	// Every output of `tether inject`'s golden files passes the API
	// server's validation.
	dryRunGoldens(ctx, t, admin)

	// failurePolicy: Ignore: with the webhook gone, Pods are still created
	// (without the sidecar).
	stopWebhook()
	p, err := admin.CoreV1().Pods("proxies").Create(ctx, pod("webhook-down", annotated), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("Pod creation with the webhook down: %v (want failurePolicy Ignore)", err)
	}
	if hasTether(p) {
		t.Error("injected with the webhook down?")
	}
}

// loadWebhookConfiguration reads deploy/webhook's configuration as shipped.
func loadWebhookConfiguration(t *testing.T) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	b, err := os.ReadFile("../../deploy/webhook/mutatingwebhookconfiguration.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := sigsyaml.UnmarshalStrict(b, &mwc); err != nil {
		t.Fatal(err)
	}
	return &mwc
}

// dryRunGoldens creates every object of internal/inject/testdata/*.golden.yaml with
// dryRun=All in namespace "proxies" (or its own).
func dryRunGoldens(ctx context.Context, t *testing.T, c kubernetes.Interface) {
	t.Helper()
	files, err := filepath.Glob("../../internal/inject/testdata/*.golden.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files (%v)", err)
	}
	dec := serializer.NewCodecFactory(scheme.Scheme).UniversalDeserializer()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var objs []runtime.Object
		for _, doc := range strings.Split("\n"+string(b), "\n---\n") {
			js, err := sigsyaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if string(js) == "null" {
				continue
			}
			obj, _, err := dec.Decode(js, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if l, ok := obj.(*corev1.List); ok {
				for _, item := range l.Items {
					o, _, err := dec.Decode(item.Raw, nil, nil)
					if err != nil {
						t.Fatalf("%s: %v", f, err)
					}
					objs = append(objs, o)
				}
				continue
			}
			objs = append(objs, obj)
		}
		for _, obj := range objs {
			m, ok := obj.(metav1.Object)
			if !ok {
				continue
			}
			ns := m.GetNamespace()
			if ns == "" {
				ns = "proxies"
			}
			var err error
			switch o := obj.(type) {
			case *appsv1.Deployment:
				_, err = c.AppsV1().Deployments(ns).Create(ctx, o, dry)
			case *appsv1.StatefulSet:
				_, err = c.AppsV1().StatefulSets(ns).Create(ctx, o, dry)
			case *appsv1.DaemonSet:
				_, err = c.AppsV1().DaemonSets(ns).Create(ctx, o, dry)
			case *appsv1.ReplicaSet:
				_, err = c.AppsV1().ReplicaSets(ns).Create(ctx, o, dry)
			case *corev1.ReplicationController:
				_, err = c.CoreV1().ReplicationControllers(ns).Create(ctx, o, dry)
			case *batchv1.Job:
				_, err = c.BatchV1().Jobs(ns).Create(ctx, o, dry)
			case *batchv1.CronJob:
				_, err = c.BatchV1().CronJobs(ns).Create(ctx, o, dry)
			case *corev1.Pod:
				_, err = c.CoreV1().Pods(ns).Create(ctx, o, dry)
			default:
				continue
			}
			n++
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Errorf("%s: %s %s: %v", filepath.Base(f), obj.GetObjectKind().GroupVersionKind().Kind, m.GetName(), err)
			}
		}
	}
	t.Logf("%d workloads of the inject golden files pass the API server's validation", n)
	if n < 10 {
		t.Errorf("only %d workloads validated", n)
	}
}
