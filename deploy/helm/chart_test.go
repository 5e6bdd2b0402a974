package helm

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir = "tether"
	// The release deploy/webhook corresponds to: its names are the
	// chart's for a release named "tether" in namespace tether-system.
	releaseName      = "tether"
	releaseNamespace = "tether-system"
)

// strict decodes the built-in kinds, refusing unknown fields.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// rendered is the chart's output: its objects, decoded, in template order.
type rendered struct {
	objects []runtime.Object
	notes   string
}

// render renders the chart as `helm install` would for a release named
// releaseName in namespace ns, with vals over values.yaml. With a client
// config, `lookup` reads that API server (an upgrade's view); without, it
// finds nothing (a first install's view, and `helm template`'s).
func render(t *testing.T, ns string, vals map[string]any, cfg *rest.Config) rendered {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{Name: releaseName, Namespace: ns, IsInstall: true, Revision: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var files map[string]string
	if cfg != nil {
		files, err = engine.RenderWithClient(ch, top, cfg)
	} else {
		files, err = engine.Render(ch, top)
	}
	if err != nil {
		t.Fatal(err)
	}
	return decodeRendered(t, files)
}

func decodeRendered(t *testing.T, files map[string]string) rendered {
	t.Helper()
	var r rendered
	// Helm installs in kind order; the test reads in file order, stably.
	var names []string
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		content := files[name]
		if strings.HasSuffix(name, "NOTES.txt") {
			r.notes = content
			continue
		}
		if strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		for _, doc := range strings.Split("\n"+content, "\n---") {
			js, err := sigsyaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			if string(js) == "null" {
				continue
			}
			var u unstructured.Unstructured
			if err := u.UnmarshalJSON(js); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !scheme.Scheme.Recognizes(u.GroupVersionKind()) {
				// cert-manager's kinds: no Go types here.
				r.objects = append(r.objects, &u)
				continue
			}
			obj, _, err := strict.Decode(js, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			r.objects = append(r.objects, obj)
		}
	}
	return r
}

// one returns the only object of type T named name (any name when empty).
func one[T runtime.Object](t *testing.T, r rendered, name string) T {
	t.Helper()
	var found []T
	for _, o := range r.objects {
		if v, ok := o.(T); ok && (name == "" || o.(metav1.Object).GetName() == name) {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d objects of type %T named %q, want 1", len(found), zero, name)
	}
	return found[0]
}

func kinds(r rendered) []string {
	var ks []string
	for _, o := range r.objects {
		m := o.(metav1.Object)
		ks = append(ks, fmt.Sprintf("%s %s/%s", o.GetObjectKind().GroupVersionKind().Kind, m.GetNamespace(), m.GetName()))
	}
	sort.Strings(ks)
	return ks
}

// The chart lints clean with Helm's own linter: no errors, no warnings
// (an INFO such as "icon is recommended" is allowed), at the defaults and
// at the non-default values of TestRenderCustomValues.
func TestLint(t *testing.T) {
	for name, vals := range map[string]map[string]any{"defaults": nil, "custom": customValues()} {
		t.Run(name, func(t *testing.T) {
			l := lint.RunAll(chartDir, vals, releaseNamespace)
			for _, m := range l.Messages {
				t.Log(m)
				if m.Severity > support.InfoSev {
					t.Errorf("lint: %s", m)
				}
			}
		})
	}
}

// At its default values the chart renders what `kubectl apply -k
// deploy/webhook` applies, in substance: the same objects and names (but no
// Namespace: it installs into the release's), the same container, args,
// ports, probes and security context, the same webhook rules, selector and
// policies. What it adds: Helm's labels, the generated certificate and its
// caBundle, the release namespace's exclusion from the webhook, and the
// sidecar flags at the binary's defaults (checked against the binary in
// kube_test.go).
func TestRenderDefaultsMatchKustomize(t *testing.T) {
	got := render(t, releaseNamespace, nil, nil)
	want := kustomizeWebhook(t)

	if diff := cmp.Diff([]string{
		"Deployment tether-system/tether-webhook",
		"MutatingWebhookConfiguration /tether-sidecar-injector",
		"Secret tether-system/tether-webhook-tls",
		"Service tether-system/tether-webhook",
		"ServiceAccount tether-system/tether-webhook",
	}, kinds(got)); diff != "" {
		t.Errorf("rendered objects (-want +got):\n%s", diff)
	}

	gd, wd := one[*appsv1.Deployment](t, got, ""), one[*appsv1.Deployment](t, want, "")
	if *gd.Spec.Replicas != *wd.Spec.Replicas {
		t.Errorf("replicas %d, deploy/webhook %d", *gd.Spec.Replicas, *wd.Spec.Replicas)
	}
	gp, wp := gd.Spec.Template.Spec, wd.Spec.Template.Spec
	if gp.ServiceAccountName != wp.ServiceAccountName || *gp.AutomountServiceAccountToken != *wp.AutomountServiceAccountToken {
		t.Errorf("serviceAccountName %q automount %v, deploy/webhook %q %v", gp.ServiceAccountName, *gp.AutomountServiceAccountToken, wp.ServiceAccountName, *wp.AutomountServiceAccountToken)
	}
	if diff := cmp.Diff(wp.SecurityContext, gp.SecurityContext); diff != "" {
		t.Errorf("pod securityContext (-kustomize +chart):\n%s", diff)
	}
	if diff := cmp.Diff(wp.Volumes, gp.Volumes); diff != "" {
		t.Errorf("volumes (-kustomize +chart):\n%s", diff)
	}
	gc, wc := gp.Containers[0], wp.Containers[0]
	if len(gp.Containers) != 1 || gc.Name != wc.Name || gc.Image != wc.Image {
		t.Errorf("containers %d, %s %s; deploy/webhook: 1, %s %s", len(gp.Containers), gc.Name, gc.Image, wc.Name, wc.Image)
	}
	for _, a := range wc.Args {
		if !slices.Contains(gc.Args, a) {
			t.Errorf("arg %s of deploy/webhook missing from the chart's %q", a, gc.Args)
		}
	}
	if gc.Args[0] != "webhook" {
		t.Errorf("args %q: want the webhook command first", gc.Args)
	}
	for _, f := range []struct {
		what      string
		got, want any
	}{
		{"ports", gc.Ports, wc.Ports},
		{"readinessProbe", gc.ReadinessProbe, wc.ReadinessProbe},
		{"livenessProbe", gc.LivenessProbe, wc.LivenessProbe},
		{"resources", gc.Resources, wc.Resources},
		{"securityContext", gc.SecurityContext, wc.SecurityContext},
		{"volumeMounts", gc.VolumeMounts, wc.VolumeMounts},
		{"imagePullPolicy", gc.ImagePullPolicy, wc.ImagePullPolicy},
	} {
		if diff := cmp.Diff(f.want, f.got); diff != "" {
			t.Errorf("container %s (-kustomize +chart):\n%s", f.what, diff)
		}
	}
	// The selector is the chart's own (it adds the release), but it must
	// select the Pods and the Service must select the same.
	if !subset(gd.Spec.Selector.MatchLabels, gd.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the pod labels %v", gd.Spec.Selector.MatchLabels, gd.Spec.Template.Labels)
	}
	if !subset(wd.Spec.Selector.MatchLabels, gd.Spec.Template.Labels) {
		t.Errorf("pod labels %v lack deploy/webhook's selector %v", gd.Spec.Template.Labels, wd.Spec.Selector.MatchLabels)
	}

	gs, ws := one[*corev1.Service](t, got, ""), one[*corev1.Service](t, want, "")
	if diff := cmp.Diff(ws.Spec.Ports, gs.Spec.Ports); diff != "" {
		t.Errorf("service ports (-kustomize +chart):\n%s", diff)
	}
	if diff := cmp.Diff(gd.Spec.Selector.MatchLabels, gs.Spec.Selector); diff != "" {
		t.Errorf("service selector differs from the Deployment's (-deployment +service):\n%s", diff)
	}
	gsa, wsa := one[*corev1.ServiceAccount](t, got, ""), one[*corev1.ServiceAccount](t, want, "")
	if *gsa.AutomountServiceAccountToken != *wsa.AutomountServiceAccountToken {
		t.Error("the webhook's ServiceAccount mounts a token; deploy/webhook's does not")
	}

	gm, wm := one[*admissionregistrationv1.MutatingWebhookConfiguration](t, got, ""), one[*admissionregistrationv1.MutatingWebhookConfiguration](t, want, "")
	if len(gm.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(gm.Webhooks))
	}
	gw, ww := gm.Webhooks[0], wm.Webhooks[0]
	if diff := cmp.Diff(ww.ClientConfig.Service, gw.ClientConfig.Service); diff != "" {
		t.Errorf("clientConfig.service (-kustomize +chart):\n%s", diff)
	}
	// Everything but the clientConfig's CA and the namespace selector's
	// added exclusion is deploy/webhook's.
	gw2, ww2 := gw.DeepCopy(), ww.DeepCopy()
	gw2.ClientConfig, ww2.ClientConfig = admissionregistrationv1.WebhookClientConfig{}, admissionregistrationv1.WebhookClientConfig{}
	gw2.NamespaceSelector.MatchExpressions = nil
	if diff := cmp.Diff(ww2, gw2); diff != "" {
		t.Errorf("webhook (-kustomize +chart):\n%s", diff)
	}
	if diff := cmp.Diff([]metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{releaseNamespace}}}, gw.NamespaceSelector.MatchExpressions); diff != "" {
		t.Errorf("namespaceSelector.matchExpressions (-want +got):\n%s", diff)
	}

	// The generated certificate: the caBundle's CA signed the Secret's
	// pair, for the Service's DNS name.
	secret := one[*corev1.Secret](t, got, "tether-webhook-tls")
	if secret.Type != corev1.SecretTypeTLS || secret.Name != gp.Volumes[0].Secret.SecretName {
		t.Errorf("Secret %s of type %s; the Deployment mounts %s", secret.Name, secret.Type, gp.Volumes[0].Secret.SecretName)
	}
	verifyServingCert(t, gw.ClientConfig.CABundle, secret, "tether-webhook.tether-system.svc")
	if string(secret.Data["ca.crt"]) != string(gw.ClientConfig.CABundle) {
		t.Error("the Secret's ca.crt is not the caBundle")
	}
	if !strings.Contains(got.notes, "kubectl label namespace NS tether.dev/injection=enabled") {
		t.Errorf("NOTES.txt does not tell how to opt a namespace in:\n%s", got.notes)
	}
}

// customValues is a non-default install: cert-manager with an issuer of
// one's own, other images, a Redis Secret with its key, selectors, limits,
// a fail-closed webhook and the sidecars' RBAC in two namespaces. Helm
// merges maps with values.yaml's, so the default namespace label is
// dropped with null, as a user's values file would.
func customValues() map[string]any {
	return map[string]any{
		"fullnameOverride": "tt",
		"webhook": map[string]any{
			"image":                map[string]any{"repository": "registry.example/tether-webhook", "tag": "v9.8.7", "pullPolicy": "Always"},
			"imagePullSecrets":     []any{map[string]any{"name": "regcred"}},
			"replicas":             3,
			"failurePolicy":        "Fail",
			"timeoutSeconds":       10,
			"namespaceSelector":    map[string]any{"matchLabels": map[string]any{"mcp": "yes", "tether.dev/injection": nil}, "matchExpressions": []any{map[string]any{"key": "tier", "operator": "In", "values": []any{"proxies"}}}},
			"objectSelector":       map[string]any{"matchLabels": map[string]any{"tether.dev/sidecar": "wanted"}},
			"podAnnotations":       map[string]any{"prometheus.io/scrape": "false"},
			"nodeSelector":         map[string]any{"kubernetes.io/os": "linux"},
			"priorityClassName":    "system-cluster-critical",
			"maxConcurrentReviews": 8,
		},
		"sidecar": map[string]any{
			"image":          map[string]any{"repository": "registry.example/tether", "tag": "v9.8.7"},
			"service":        "mcp-fetch",
			"port":           "http",
			"redisURLSecret": "shared-redis/redis-url",
			"balancer":       "least-loaded",
			"sessionTTL":     "2h",
			"shutdownGrace":  "40s",
			"logLevel":       "debug",
			"resources":      map[string]any{"cpuRequest": "100m", "memoryRequest": "96Mi", "cpuLimit": "1500m"},
		},
		"sidecarRBAC": map[string]any{"namespaces": []any{"team-a", "team-b"}},
		"certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "corp-ca", "kind": "ClusterIssuer"}},
	}
}

func TestRenderCustomValues(t *testing.T) {
	got := render(t, "mcp-infra", customValues(), nil)
	if diff := cmp.Diff([]string{
		"Certificate mcp-infra/tt-webhook",
		"Deployment mcp-infra/tt-webhook",
		"MutatingWebhookConfiguration /tt-sidecar-injector",
		"Role team-a/tt-endpointslice-reader",
		"Role team-b/tt-endpointslice-reader",
		"RoleBinding team-a/tt-endpointslice-reader",
		"RoleBinding team-b/tt-endpointslice-reader",
		"Service mcp-infra/tt-webhook",
		"ServiceAccount mcp-infra/tt-webhook",
		"ServiceAccount team-a/tether",
		"ServiceAccount team-b/tether",
	}, kinds(got)); diff != "" {
		t.Errorf("rendered objects (-want +got); cert-manager makes the Secret, and no Issuer is made for an issuerRef:\n%s", diff)
	}

	d := one[*appsv1.Deployment](t, got, "")
	p := d.Spec.Template.Spec
	c := p.Containers[0]
	if *d.Spec.Replicas != 3 || c.Image != "registry.example/tether-webhook:v9.8.7" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("replicas %d image %s pullPolicy %s", *d.Spec.Replicas, c.Image, c.ImagePullPolicy)
	}
	if p.PriorityClassName != "system-cluster-critical" || p.NodeSelector["kubernetes.io/os"] != "linux" || len(p.ImagePullSecrets) != 1 || p.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("priorityClassName %q nodeSelector %v imagePullSecrets %v", p.PriorityClassName, p.NodeSelector, p.ImagePullSecrets)
	}
	if d.Spec.Template.Annotations["prometheus.io/scrape"] != "false" {
		t.Errorf("pod annotations %v", d.Spec.Template.Annotations)
	}
	if p.Volumes[0].Secret.SecretName != "tt-webhook-tls" {
		t.Errorf("mounts Secret %s, want cert-manager's tt-webhook-tls", p.Volumes[0].Secret.SecretName)
	}
	for _, a := range []string{
		"--max-concurrent-reviews=8",
		"--image=registry.example/tether:v9.8.7",
		"--service=mcp-fetch",
		"--port=http",
		"--redis-url-secret=shared-redis/redis-url",
		"--balancer=least-loaded",
		"--session-ttl=2h",
		"--shutdown-grace=40s",
		"--log-level=debug",
		"--cpu-request=100m",
		"--memory-request=96Mi",
		"--cpu-limit=1500m",
	} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("args %q: want %s", c.Args, a)
		}
	}

	m := one[*admissionregistrationv1.MutatingWebhookConfiguration](t, got, "")
	w := m.Webhooks[0]
	if m.Annotations["cert-manager.io/inject-ca-from"] != "mcp-infra/tt-webhook" || len(w.ClientConfig.CABundle) != 0 {
		t.Errorf("annotations %v caBundle %d bytes: want cert-manager's CA injection from the Certificate", m.Annotations, len(w.ClientConfig.CABundle))
	}
	if *w.FailurePolicy != admissionregistrationv1.Fail || *w.TimeoutSeconds != 10 {
		t.Errorf("failurePolicy %s timeoutSeconds %d", *w.FailurePolicy, *w.TimeoutSeconds)
	}
	wantNS := &metav1.LabelSelector{
		MatchLabels: map[string]string{"mcp": "yes"},
		MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"proxies"}},
			{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"mcp-infra"}},
		},
	}
	if diff := cmp.Diff(wantNS, w.NamespaceSelector); diff != "" {
		t.Errorf("namespaceSelector (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&metav1.LabelSelector{MatchLabels: map[string]string{"tether.dev/sidecar": "wanted"}}, w.ObjectSelector); diff != "" {
		t.Errorf("objectSelector (-want +got):\n%s", diff)
	}
	if s := w.ClientConfig.Service; s.Name != "tt-webhook" || s.Namespace != "mcp-infra" {
		t.Errorf("clientConfig.service %s/%s", s.Namespace, s.Name)
	}

	cert := one[*unstructured.Unstructured](t, got, "tt-webhook")
	spec := cert.Object["spec"].(map[string]any)
	if spec["secretName"] != "tt-webhook-tls" || fmt.Sprint(spec["dnsNames"]) != "[tt-webhook.mcp-infra.svc tt-webhook.mcp-infra.svc.cluster.local]" {
		t.Errorf("Certificate spec %v", spec)
	}
	if ref := spec["issuerRef"].(map[string]any); ref["name"] != "corp-ca" || ref["kind"] != "ClusterIssuer" {
		t.Errorf("issuerRef %v", ref)
	}

	rb := one[*rbacv1.RoleBinding](t, rendered{objects: filter(got.objects, "team-b")}, "")
	if s := rb.Subjects; len(s) != 1 || s[0].Name != "tether" || s[0].Namespace != "team-b" || rb.RoleRef.Name != "tt-endpointslice-reader" {
		t.Errorf("RoleBinding subjects %v roleRef %v", s, rb.RoleRef)
	}
	role := one[*rbacv1.Role](t, rendered{objects: filter(got.objects, "team-a")}, "")
	if diff := cmp.Diff([]rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}}, role.Rules); diff != "" {
		t.Errorf("sidecar Role rules (-want +got):\n%s", diff)
	}
	if !strings.Contains(got.notes, "shared-redis/redis-url") || !strings.Contains(got.notes, "create secret generic shared-redis --from-literal=redis-url=") || !strings.Contains(got.notes, "kubectl label namespace NS mcp=yes\n") {
		t.Errorf("NOTES.txt does not name the Redis Secret:\n%s", got.notes)
	}
}

// With cert-manager and no issuerRef the chart makes a self-signed Issuer
// and points the Certificate at it.
func TestRenderCertManagerSelfSigned(t *testing.T) {
	got := render(t, releaseNamespace, map[string]any{"certManager": map[string]any{"enabled": true}}, nil)
	issuer := one[*unstructured.Unstructured](t, got, "tether-webhook-selfsigned")
	if issuer.GetKind() != "Issuer" || issuer.Object["spec"].(map[string]any)["selfSigned"] == nil {
		t.Errorf("Issuer %v", issuer.Object)
	}
	cert := one[*unstructured.Unstructured](t, got, "tether-webhook")
	if ref := cert.Object["spec"].(map[string]any)["issuerRef"].(map[string]any); ref["name"] != "tether-webhook-selfsigned" || ref["kind"] != "Issuer" {
		t.Errorf("issuerRef %v", ref)
	}
	for _, o := range got.objects {
		if _, ok := o.(*corev1.Secret); ok {
			t.Error("a Secret rendered beside cert-manager's Certificate")
		}
	}
}

// Without an API server to read the installed Secret from, every render
// makes a new CA: what `lookup` keeps stable is tested against a real one
// (TestUpgradeKeepsTheCertificate).
func TestRenderGeneratesAFreshCertificateWithoutACluster(t *testing.T) {
	a := one[*corev1.Secret](t, render(t, releaseNamespace, nil, nil), "")
	b := one[*corev1.Secret](t, render(t, releaseNamespace, nil, nil), "")
	if string(a.Data["ca.crt"]) == string(b.Data["ca.crt"]) {
		t.Error("two renders without a cluster share a CA: the generation is not per install")
	}
}

func filter(objs []runtime.Object, ns string) []runtime.Object {
	var out []runtime.Object
	for _, o := range objs {
		if o.(metav1.Object).GetNamespace() == ns {
			out = append(out, o)
		}
	}
	return out
}

func subset(sub, of map[string]string) bool {
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return len(sub) > 0
}

// verifyServingCert checks that caPEM signed the Secret's pair for dnsName
// and that the pair is valid now and for years to come.
func verifyServingCert(t *testing.T, caPEM []byte, s *corev1.Secret, dnsName string) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("caBundle holds no PEM certificate: %q", caPEM)
	}
	block, _ := pem.Decode(s.Data["tls.crt"])
	if block == nil {
		t.Fatalf("tls.crt holds no PEM: %q", s.Data["tls.crt"])
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: dnsName, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("serving certificate: %v", err)
	}
	if cert.NotAfter.Before(time.Now().AddDate(5, 0, 0)) {
		t.Errorf("serving certificate expires %s: want validityDays (10 years)", cert.NotAfter)
	}
	if len(s.Data["tls.key"]) == 0 {
		t.Error("no tls.key")
	}
}

// kustomizeWebhook builds deploy/webhook as `kubectl apply -k` would.
func kustomizeWebhook(t *testing.T) rendered {
	t.Helper()
	abs, err := filepath.Abs("../webhook")
	if err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build deploy/webhook: %v", err)
	}
	var r rendered
	for _, res := range m.Resources() {
		js, err := res.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := strict.Decode(js, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.objects = append(r.objects, obj)
	}
	return r
}
