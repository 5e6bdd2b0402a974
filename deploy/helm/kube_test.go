package helm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/testkit/testca"
)

// Every object the chart renders, at its defaults and at customValues,
// passes the real API server's validation (create with dryRun=All), except
// cert-manager's Issuer and Certificate: the test API server has no
// cert-manager CRDs, so those kinds are skipped, and said so. Then an
// upgrade: with the Secret installed, the chart renders it unchanged, and
// the caBundle with it (`lookup`).
func TestRenderedObjectsPassTheAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	admin := env.AdminClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, ns := range []string{releaseNamespace, "mcp-infra", "team-a", "team-b"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dyn, err := dynamic.NewForConfig(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(discovery.NewDiscoveryClientForConfigOrDie(env.Admin))
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)

	for _, tc := range []struct {
		name string
		ns   string
		vals map[string]any
	}{{"defaults", releaseNamespace, nil}, {"custom", "mcp-infra", customValues()}} {
		t.Run(tc.name, func(t *testing.T) {
			validated := 0
			for _, obj := range render(t, tc.ns, tc.vals, nil).objects {
				u := toUnstructured(t, obj)
				gvk := u.GroupVersionKind()
				if gvk.Group == "cert-manager.io" {
					t.Logf("skipped %s %s: no cert-manager CRDs in the test API server", gvk.Kind, u.GetName())
					continue
				}
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Fatalf("%s: %v", gvk, err)
				}
				var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
				if m.Scope.Name() == "namespace" {
					ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
				}
				if _, err := ri.Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
					t.Errorf("%s %s/%s: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
				}
				validated++
			}
			t.Logf("%d objects pass the API server's validation", validated)
			if validated < 5 {
				t.Errorf("only %d objects validated", validated)
			}
		})
	}

	t.Run("upgrade keeps the certificate", func(t *testing.T) {
		first := render(t, releaseNamespace, nil, nil)
		installed := one[*corev1.Secret](t, first, "")
		if _, err := admin.CoreV1().Secrets(releaseNamespace).Create(ctx, installed, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		again := render(t, releaseNamespace, nil, env.Admin)
		s := one[*corev1.Secret](t, again, "")
		for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
			if !bytes.Equal(s.Data[k], installed.Data[k]) {
				t.Errorf("the upgrade rendered a new %s", k)
			}
		}
		bundle := one[*admissionregistrationv1.MutatingWebhookConfiguration](t, again, "").Webhooks[0].ClientConfig.CABundle
		if !bytes.Equal(bundle, installed.Data["ca.crt"]) {
			t.Error("the upgrade's caBundle is not the installed CA")
		}
	})
}

// The webhook installed from the chart injects a Pod: the chart's
// MutatingWebhookConfiguration (only its clientConfig pointed at loopback
// and a test CA) and the chart's Deployment args, run by the tether binary
// of this checkout, so that the chart and the binary cannot drift. The
// sidecar comes with the chart's values: image, Service, Redis Secret,
// resources.
func TestChartWebhookInjectsAPod(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	bin := buildTether(t)
	admin := env.AdminClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	vals := map[string]any{"sidecar": map[string]any{
		"image":          map[string]any{"repository": "registry.example/tether", "tag": "v9.8.7"},
		"service":        "mcp-fetch",
		"port":           "http",
		"redisURLSecret": "shared-redis/redis-url",
		"resources":      map[string]any{"cpuRequest": "100m", "memoryRequest": "96Mi", "cpuLimit": "1500m"},
	}}
	chart := render(t, releaseNamespace, vals, nil)
	addr, caPEM := runChartWebhook(t, bin, one[*appsv1.Deployment](t, chart, ""))

	mwc := one[*admissionregistrationv1.MutatingWebhookConfiguration](t, chart, "")
	url := "https://" + addr + "/inject"
	mwc.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	if _, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// "proxies" opted in; the release's own namespace carries the label
	// too, and must still be left alone. No controller manager runs, so
	// the default ServiceAccounts are made by hand.
	for _, ns := range []string{"proxies", releaseNamespace} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"tether.dev/injection": "enabled"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"tether.dev/inject": "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "proxy", Image: "example/proxy:1"}}},
		}
	}
	sidecar := func(p *corev1.Pod) *corev1.Container {
		for i, c := range p.Spec.InitContainers {
			if c.Name == "tether" {
				return &p.Spec.InitContainers[i]
			}
		}
		return nil
	}

	// The API server picks the configuration up within a moment.
	var sc *corev1.Container
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; sc == nil; i++ {
		p, err := admin.CoreV1().Pods("proxies").Create(ctx, pod(fmt.Sprintf("proxy-%d", i)), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sc = sidecar(p); sc == nil && time.Now().After(deadline) {
			t.Fatal("no Pod was injected within 30 s")
		}
		if sc == nil {
			time.Sleep(200 * time.Millisecond)
		}
	}

	if sc.Image != "registry.example/tether:v9.8.7" {
		t.Errorf("sidecar image %s, want the chart's sidecar.image", sc.Image)
	}
	for _, a := range []string{"--k8s-service=$(POD_NAMESPACE)/mcp-fetch", "--k8s-port=http", "--shutdown-grace=25s"} {
		if !slices.Contains(sc.Args, a) {
			t.Errorf("sidecar args %q: want %s", sc.Args, a)
		}
	}
	i := slices.IndexFunc(sc.Env, func(e corev1.EnvVar) bool { return e.Name == "TETHER_REDIS_URL" })
	if i < 0 || sc.Env[i].ValueFrom == nil || sc.Env[i].ValueFrom.SecretKeyRef == nil {
		t.Fatalf("sidecar env %v: want TETHER_REDIS_URL from a Secret", sc.Env)
	}
	if ref := sc.Env[i].ValueFrom.SecretKeyRef; ref.Name != "shared-redis" || ref.Key != "redis-url" {
		t.Errorf("Redis URL from Secret %s key %s, want shared-redis redis-url", ref.Name, ref.Key)
	}
	r := sc.Resources
	if !r.Requests.Cpu().Equal(resource.MustParse("100m")) || !r.Requests.Memory().Equal(resource.MustParse("96Mi")) || !r.Limits.Cpu().Equal(resource.MustParse("1500m")) {
		t.Errorf("sidecar resources %v", r)
	}

	// The release's namespace is never injected, whatever its labels.
	p, err := admin.CoreV1().Pods(releaseNamespace).Create(ctx, pod("own"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sidecar(p) != nil {
		t.Error("a Pod in the webhook's own namespace was injected")
	}
}

// At the defaults the chart passes, beyond deploy/webhook's args, only
// flags that it sets to the binary's own defaults: both install the same
// webhook.
func TestChartFlagsBeyondKustomizeAreTheBinaryDefaults(t *testing.T) {
	bin := buildTether(t)
	out, _ := exec.Command(bin, "webhook", "-h").CombinedOutput()
	defaults := flagDefaults(string(out))
	if len(defaults) < 5 {
		t.Fatalf("read %d flag defaults from `tether webhook -h`:\n%s", len(defaults), out)
	}
	chartArgs := one[*appsv1.Deployment](t, render(t, releaseNamespace, nil, nil), "").Spec.Template.Spec.Containers[0].Args
	kustomizeArgs := one[*appsv1.Deployment](t, kustomizeWebhook(t), "").Spec.Template.Spec.Containers[0].Args
	extra := 0
	for _, a := range chartArgs[1:] {
		if slices.Contains(kustomizeArgs, a) {
			continue
		}
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		def, ok := defaults[name]
		if !ok || def != value {
			t.Errorf("chart arg %s: deploy/webhook does not pass it and the binary's default is %q", a, def)
		}
		extra++
	}
	t.Logf("%d chart args beyond deploy/webhook's, each at the binary's default", extra)
}

// flagDefaults reads "(default X)" of each flag from Go's flag usage.
func flagDefaults(usage string) map[string]string {
	defaults := map[string]string{}
	var name string
	sc := bufio.NewScanner(strings.NewReader(usage))
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "  -"); ok {
			name, _, _ = strings.Cut(f, " ")
		}
		if i := strings.LastIndex(line, "(default "); i >= 0 && name != "" && strings.HasSuffix(line, ")") {
			defaults[name] = strings.Trim(line[i+len("(default "):len(line)-1], `"`)
		}
	}
	return defaults
}

var tetherBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// buildTether builds cmd/tether of this checkout with tether's own go.mod,
// once per test binary.
func buildTether(t *testing.T) string {
	t.Helper()
	b := &tetherBuild
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "tether-helm-test-")
		if b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, "tether")
		cmd := exec.Command("go", "build", "-o", b.path, "./cmd/tether")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build ./cmd/tether: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tetherBuild.dir != "" {
		os.RemoveAll(tetherBuild.dir)
	}
	os.Exit(code)
}

// runChartWebhook runs `tether webhook` as the Deployment's container does:
// its args and env verbatim, except the listener (a loopback port instead
// of :8443) and the certificate's directory (the Deployment's mount of the
// TLS Secret, here a directory holding a pair for 127.0.0.1 signed by a
// test CA). It returns the address and the CA's PEM.
func runChartWebhook(t *testing.T, bin string, d *appsv1.Deployment) (addr string, caPEM []byte) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	var mount string
	for _, m := range c.VolumeMounts {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				mount = m.MountPath
			}
		}
	}
	if mount == "" {
		t.Fatalf("the Deployment mounts no Secret: %+v", c.VolumeMounts)
	}
	tlsDir := t.TempDir()
	ca := testca.New(t)
	ca.Issue(t, tlsDir, 2)
	caPEM = ca.PEM

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	args := slices.Clone(c.Args)
	rewritten := 0
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "--listen="):
			args[i] = "--listen=" + addr
		case strings.Contains(a, "="+mount+"/"):
			args[i] = strings.Replace(a, "="+mount+"/", "="+tlsDir+"/", 1)
		default:
			continue
		}
		rewritten++
	}
	if rewritten != 3 {
		t.Fatalf("args %q: want --listen, --tls-cert and --tls-key under %s", c.Args, mount)
	}
	environ := os.Environ()
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("env %s comes from the cluster; the test cannot run it", e.Name)
		}
		environ = append(environ, e.Name+"="+e.Value)
	}

	// The log is a file: the test reads it while the process may write.
	logs, err := os.Create(filepath.Join(t.TempDir(), "webhook.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	logText := func() string { b, _ := os.ReadFile(logs.Name()); return string(b) }
	cmd := exec.Command(bin, args...)
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("tether webhook %q:\n%s", args, logText())
		}
	})

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("tether webhook %q exited: %v\n%s", args, err, logText())
		default:
		}
		resp, err := client.Get("https://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr, caPEM
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("tether webhook not healthy within 60 s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func toUnstructured(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.DeepCopy()
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	if u.GetKind() == "" {
		t.Fatalf("%T decoded without its kind", obj)
	}
	return u
}
