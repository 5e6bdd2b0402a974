// Package deploy_test checks the manifests of deploy/: every YAML file
// decodes strictly into the real API types (client-go's, kustomize's for
// kustomization files), every kustomization renders with kustomize's own
// library, and what they render agrees with tether (the sidecar of the
// component is the one `tether inject` writes; the webhook's ports, path and
// policy line up).
package deploy_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/tether-mcp/tether/internal/inject"
	"github.com/tether-mcp/tether/internal/session"
)

var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// decodeStrict decodes one YAML document into its client-go type.
func decodeStrict(t *testing.T, where string, doc []byte) runtime.Object {
	t.Helper()
	js, err := sigsyaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	obj, _, err := strict.Decode(js, nil, nil)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return obj
}

// documents splits a YAML stream, dropping empty and comment-only
// documents.
func documents(b []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), b...), []byte("\n---")) {
		empty := true
		for _, l := range strings.Split(string(d), "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
				empty = false
			}
		}
		if !empty {
			out = append(out, d)
		}
	}
	return out
}

func isKustomization(path string) bool {
	return slices.Contains([]string{"kustomization.yaml", "kustomization.yml", "Kustomization"}, filepath.Base(path))
}

// Every YAML file under deploy/ is valid for its API type, with no unknown
// or duplicate field.
func TestManifestsDecodeStrictly(t *testing.T) {
	var n int
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == "helm" {
			return filepath.SkipDir // Helm templates, not manifests: deploy/helm tests its chart
		}
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		if isKustomization(path) {
			var k kustypes.Kustomization
			if err := sigsyaml.UnmarshalStrict(b, &k); err != nil {
				t.Errorf("%s: %v", path, err)
				return nil
			}
			if k.Kind != kustypes.KustomizationKind && k.Kind != kustypes.ComponentKind {
				t.Errorf("%s: kind %q", path, k.Kind)
			}
			for _, r := range append(append(k.Resources, k.Components...), patchPaths(k)...) {
				if _, err := os.Stat(filepath.Join(filepath.Dir(path), r)); err != nil {
					t.Errorf("%s: %v", path, err)
				}
			}
			return nil
		}
		for i, doc := range documents(b) {
			decodeStrict(t, path+" document "+strconv.Itoa(i+1), doc)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 15 {
		t.Fatalf("only %d YAML files under deploy/", n)
	}
}

func patchPaths(k kustypes.Kustomization) []string {
	var out []string
	for _, p := range k.Patches {
		if p.Path != "" {
			out = append(out, p.Path)
		}
	}
	return out
}

// render runs kustomize on dir and decodes every object strictly.
func render(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var objs []runtime.Object
	for _, r := range m.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeStrict(t, dir+": "+r.CurId().String(), b))
	}
	return objs
}

// Every kustomization renders.
func TestKustomizationsRender(t *testing.T) {
	for _, dir := range []string{"rbac", "base", "redis", "redis/sentinel", "webhook", "examples/toolhive"} {
		t.Run(dir, func(t *testing.T) {
			if objs := render(t, dir); len(objs) == 0 {
				t.Fatal("nothing rendered")
			}
		})
	}
}

func find[T runtime.Object](objs []runtime.Object, name string, get func(T) string) T {
	var zero T
	for _, o := range objs {
		if v, ok := o.(T); ok && get(v) == name {
			return v
		}
	}
	return zero
}

func containerNamed(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// The toolhive example: the proxy's upstream is tether, tether is a native
// sidecar with its grace arrangement, and the component's container is the
// one `tether inject` writes, settings aside.
func TestToolhiveExample(t *testing.T) {
	objs := render(t, "examples/toolhive")
	dep := find(objs, "fetch-proxy", func(d *appsv1.Deployment) string { return d.Name })
	if dep == nil {
		t.Fatal("no Deployment fetch-proxy")
	}
	spec := dep.Spec.Template.Spec
	if len(spec.InitContainers) == 0 || spec.InitContainers[0].Name != inject.ContainerName {
		t.Fatalf("init containers %+v: want tether first", spec.InitContainers)
	}
	got := spec.InitContainers[0]
	if got.RestartPolicy == nil || *got.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("tether is not a native sidecar")
	}

	// Termination grace > tether's shutdown grace (plus the proxy's drain).
	var grace time.Duration
	for _, a := range got.Args {
		if v, ok := strings.CutPrefix(a, "--shutdown-grace="); ok {
			grace, _ = time.ParseDuration(v)
		}
	}
	if grace <= 0 || spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second < grace+20*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v for --shutdown-grace %s: want at least 20 s more", spec.TerminationGracePeriodSeconds, grace)
	}
	if !slices.Contains(got.Args, "--listen="+inject.ListenAddr) {
		t.Errorf("tether args %q: want --listen=%s", got.Args, inject.ListenAddr)
	}

	// Same container as inject's, except for how it is configured.
	want := inject.DefaultConfig("latest").Container()
	want.Image = got.Image
	got.Args, got.Env, want.Args, want.Env = nil, nil, nil, nil
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("component container differs from inject's (-inject +component):\n%s", d)
	}

	// The proxyrunner's upstream is tether, and tether can read the
	// backend Service's slices: the pod runs as the bound ServiceAccount.
	cm := find(objs, "fetch-runconfig", func(c *corev1.ConfigMap) string { return c.Name })
	if cm == nil {
		t.Fatal("no ConfigMap fetch-runconfig")
	}
	var rc struct {
		RemoteURL string `json:"remote_url"`
		Transport string `json:"transport"`
		Port      int32  `json:"port"`
	}
	if err := json.Unmarshal([]byte(cm.Data["runconfig.json"]), &rc); err != nil {
		t.Fatal(err)
	}
	if rc.RemoteURL != "http://"+inject.ListenAddr+"/mcp" || rc.Transport != "streamable-http" {
		t.Errorf("runconfig %+v: want remote_url http://%s/mcp over streamable-http", rc, inject.ListenAddr)
	}
	proxy := containerNamed(spec.Containers, "toolhive")
	if proxy == nil || len(proxy.Ports) == 0 || proxy.Ports[0].ContainerPort != rc.Port {
		t.Errorf("proxy container %+v: want port %d of the runconfig", proxy, rc.Port)
	}
	if spec.ServiceAccountName != "tether" {
		t.Errorf("serviceAccountName %q, want tether (deploy/base's binding)", spec.ServiceAccountName)
	}
	if dep.Spec.Template.Annotations[inject.AnnotationService] != "mcp-fetch" {
		t.Errorf("pod annotations %v: want %s: mcp-fetch", dep.Spec.Template.Annotations, inject.AnnotationService)
	}
	if find(objs, "mcp-fetch", func(s *corev1.Service) string { return s.Name }) == nil {
		t.Error("no Service mcp-fetch")
	}
}

// The webhook's configuration reaches the webhook: path, port, policy.
func TestWebhookManifests(t *testing.T) {
	objs := render(t, "webhook")
	mwc := find(objs, "tether-sidecar-injector", func(m *admissionregistrationv1.MutatingWebhookConfiguration) string { return m.Name })
	if mwc == nil || len(mwc.Webhooks) != 1 {
		t.Fatal("no MutatingWebhookConfiguration tether-sidecar-injector with one webhook")
	}
	wh := mwc.Webhooks[0]
	if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Ignore {
		t.Errorf("failurePolicy %v, want Ignore", wh.FailurePolicy)
	}
	if wh.SideEffects == nil || *wh.SideEffects != admissionregistrationv1.SideEffectClassNone || !slices.Equal(wh.AdmissionReviewVersions, []string{"v1"}) {
		t.Errorf("sideEffects %v, admissionReviewVersions %q", wh.SideEffects, wh.AdmissionReviewVersions)
	}
	ref := wh.ClientConfig.Service
	if ref == nil || ref.Path == nil || *ref.Path != "/inject" || ref.Namespace != "tether-system" {
		t.Fatalf("clientConfig.service %+v", ref)
	}
	svc := find(objs, ref.Name, func(s *corev1.Service) string { return s.Name })
	dep := find(objs, "tether-webhook", func(d *appsv1.Deployment) string { return d.Name })
	if svc == nil || dep == nil {
		t.Fatal("no Service or Deployment tether-webhook")
	}
	if ref.Port == nil || svc.Spec.Ports[0].Port != *ref.Port {
		t.Errorf("webhook port %v, Service port %d", ref.Port, svc.Spec.Ports[0].Port)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if svc.Spec.Ports[0].TargetPort.StrVal != c.Ports[0].Name || !slices.Contains(c.Args, "--listen=:8443") || c.Ports[0].ContainerPort != 8443 {
		t.Errorf("Service targets %v, container ports %+v args %q", svc.Spec.Ports[0].TargetPort, c.Ports, c.Args)
	}
	if c.Args[0] != "webhook" {
		t.Errorf("args %q: want the webhook command", c.Args)
	}
	// The volume holding the certificate is where the flags look.
	mount := c.VolumeMounts[0].MountPath
	for _, f := range []string{"--tls-cert=" + mount + "/tls.crt", "--tls-key=" + mount + "/tls.key"} {
		if !slices.Contains(c.Args, f) {
			t.Errorf("args %q: want %s", c.Args, f)
		}
	}
	ns := find(objs, "tether-system", func(n *corev1.Namespace) string { return n.Name })
	if ns == nil || ns.Labels["tether.dev/injection"] == "enabled" || wh.NamespaceSelector.MatchLabels["tether.dev/injection"] != "enabled" {
		t.Error("the webhook's own namespace must not be selected for injection")
	}
}

// The Sentinel example: the Secret's URL is one tether accepts, and names
// the sentinels' pods and port and the master name they monitor; the
// sentinels monitor the Redis servers' headless names with quorum 2.
func TestRedisSentinelExample(t *testing.T) {
	objs := render(t, "redis/sentinel")
	secret := find(objs, "tether-redis", func(s *corev1.Secret) string { return s.Name })
	if secret == nil {
		t.Fatal("no Secret tether-redis")
	}
	target, err := session.ParseRedisURL(secret.StringData["url"])
	if err != nil || target.Topology != session.RedisSentinel {
		t.Fatalf("Secret url %q: %+v, %v; want a Sentinel URL", secret.StringData["url"], target, err)
	}
	sentinels := find(objs, "tether-redis-sentinel", func(s *appsv1.StatefulSet) string { return s.Name })
	redis := find(objs, "tether-redis", func(s *appsv1.StatefulSet) string { return s.Name })
	if sentinels == nil || redis == nil {
		t.Fatal("missing StatefulSet tether-redis or tether-redis-sentinel")
	}
	if n := int(*sentinels.Spec.Replicas); n != len(target.Sentinel.SentinelAddrs) || n != 3 {
		t.Errorf("%d sentinels, %d in the URL; want 3 and 3", n, len(target.Sentinel.SentinelAddrs))
	}
	for i, addr := range target.Sentinel.SentinelAddrs {
		if want := "tether-redis-sentinel-" + strconv.Itoa(i) + "." + sentinels.Spec.ServiceName + ":26379"; addr != want {
			t.Errorf("sentinel %d in the URL: %s, want %s", i, addr, want)
		}
	}
	script := strings.Join(sentinels.Spec.Template.Spec.Containers[0].Command, " ")
	for _, want := range []string{
		"sentinel monitor " + target.Sentinel.MasterName + " $primary 6379 2",
		`primary="tether-redis-0.` + redis.Spec.ServiceName + `"`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("sentinel command lacks %q", want)
		}
	}
	if *redis.Spec.Replicas < 2 {
		t.Errorf("%d Redis servers: a failover needs a replica", *redis.Spec.Replicas)
	}
}
