package deploy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-mcp/tether/internal/inject"
)

// renderOverlay renders a kustomization of a proxy Deployment annotated for
// the sidecar, in namespace mcp, with deploy/base and the given components
// (directories under deploy/components). The overlay lives in a temporary
// directory beside a copy of deploy/, so that its relative paths resolve.
func renderOverlay(t *testing.T, components ...string) []runtime.Object {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(filepath.Join(root, "deploy"), os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(root, "overlay")
	if err := os.Mkdir(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: mcp\nresources:\n  - ../deploy/base\n  - proxy.yaml\ncomponents:\n"
	for _, c := range components {
		k += "  - ../deploy/components/" + c + "\n"
	}
	proxy := `apiVersion: apps/v1
kind: Deployment
metadata:
  name: proxy
  annotations:
    tether.dev/inject: "true"
spec:
  selector:
    matchLabels: {app: proxy}
  template:
    metadata:
      labels: {app: proxy}
      annotations:
        tether.dev/service: mcp-everything
    spec:
      serviceAccountName: tether
      containers:
        - name: proxy
          image: example/proxy:1
`
	for name, content := range map[string]string{"kustomization.yaml": k, "proxy.yaml": proxy} {
		if err := os.WriteFile(filepath.Join(overlay, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return render(t, overlay)
}

func tetherEnv(t *testing.T, objs []runtime.Object) map[string]corev1.EnvVar {
	t.Helper()
	dep := find(objs, "proxy", func(d *appsv1.Deployment) string { return d.Name })
	if dep == nil {
		t.Fatal("no Deployment proxy")
	}
	var c *corev1.Container
	for i := range dep.Spec.Template.Spec.InitContainers {
		if dep.Spec.Template.Spec.InitContainers[i].Name == inject.ContainerName {
			c = &dep.Spec.Template.Spec.InitContainers[i]
		}
	}
	if c == nil || len(dep.Spec.Template.Spec.InitContainers) != 1 {
		t.Fatalf("init containers %+v: want tether alone", dep.Spec.Template.Spec.InitContainers)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	return env
}

// The pod-deletion-cost component, after the sidecar's: the Role holds
// exactly what the writer uses (internal/podcost's test against the API
// server runs with this file's Role), bound to tether's ServiceAccount in
// the namespace, and tether's container gets the flag and its pod's name,
// keeping the sidecar's own settings.
func TestPodDeletionCostComponent(t *testing.T) {
	objs := renderOverlay(t, "sidecar", "pod-deletion-cost")

	role := find(objs, "tether-pod-deletion-cost", func(r *rbacv1.Role) string { return r.Name })
	if role == nil || role.Namespace != "mcp" {
		t.Fatalf("no Role tether-pod-deletion-cost in namespace mcp: %+v", role)
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}
	if d := cmp.Diff(role.Rules, want); d != "" {
		t.Errorf("Role rules (-got +want):\n%s", d)
	}
	for _, o := range objs {
		if _, ok := o.(*rbacv1.ClusterRole); ok {
			t.Error("a ClusterRole: the writer needs nothing cluster-wide")
		}
	}
	rb := find(objs, "tether-pod-deletion-cost", func(r *rbacv1.RoleBinding) string { return r.Name })
	if rb == nil {
		t.Fatal("no RoleBinding tether-pod-deletion-cost")
	}
	wantSubjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tether", Namespace: "mcp"}}
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || cmp.Diff(rb.Subjects, wantSubjects) != "" {
		t.Errorf("RoleBinding %+v: want Role %s bound to ServiceAccount mcp/tether", rb, role.Name)
	}

	env := tetherEnv(t, objs)
	if e := env["TETHER_POD_DELETION_COST"]; e.Value != "true" {
		t.Errorf("TETHER_POD_DELETION_COST %+v, want true", e)
	}
	if e := env["POD_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("POD_NAME %+v, want the downward API's metadata.name", e)
	}
	if e := env["TETHER_K8S_SERVICE"]; !strings.Contains(e.Value, "$(BACKEND_SERVICE)") {
		t.Errorf("TETHER_K8S_SERVICE %+v: the sidecar's settings must stay", e)
	}

	// Without the component: neither the Role nor the flag (off by
	// default).
	plain := renderOverlay(t, "sidecar")
	if find(plain, "tether-pod-deletion-cost", func(r *rbacv1.Role) string { return r.Name }) != nil {
		t.Error("the sidecar alone brings the Role")
	}
	if _, ok := tetherEnv(t, plain)["TETHER_POD_DELETION_COST"]; ok {
		t.Error("the sidecar alone turns --pod-deletion-cost on")
	}
}
