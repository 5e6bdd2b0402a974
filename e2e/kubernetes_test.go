package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/mcpbackend"
)

const (
	namespace = "mcp"
	service   = "everything"
	mcpPort   = 8080
)

// pod is a hand-made "pod": an MCP backend listening on a pod address
// inside the test's network namespace, and the EndpointSlice entry that
// names it.
type pod struct {
	name, ip, uid string
	backend       *mcpbackend.Backend
}

func (p *pod) endpointID() string { return fmt.Sprintf("%s/%s:%d", p.uid, p.ip, mcpPort) }

var podIPs = []string{"10.244.0.11", "10.244.0.12", "10.244.0.13", "10.244.0.14"}

// tetherBinEnv carries the tether binary, built before entering the network
// namespace, to the run inside it.
const tetherBinEnv = "TETHER_E2E_TETHER_BIN"

// TestKubernetesDiscovery runs the tether binary against a real
// kube-apiserver with a Service and hand-made EndpointSlices that point at
// go-sdk MCP backends, inside a network namespace of its own (pod addresses
// 10.244.0.11-14 on its loopback interface; the API server refuses loopback
// addresses in slices). tether's identity has only the Role of deploy/rbac.
func TestKubernetesDiscovery(t *testing.T) {
	if os.Getenv(tetherBinEnv) == "" {
		kubetest.Require(t)
		t.Setenv(tetherBinEnv, buildTether(t))
	}
	if !kubetest.InNetns(t, podIPs...) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tetherUser := kubetest.ServiceAccountUser(namespace, "tether")
	last := time.Now()
	phase := func(name string) {
		t.Logf("[%5.1fs] %s", time.Since(last).Seconds(), name)
		last = time.Now()
	}

	start := time.Now()
	env := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{tetherUser}})
	t.Logf("etcd and kube-apiserver ready in %s", time.Since(start).Round(time.Millisecond))
	admin := env.AdminClient()
	slices := admin.DiscoveryV1().EndpointSlices(namespace)

	// Four pods; d is not in any slice yet.
	var pods []*pod
	for i, ip := range podIPs {
		name := "everything-" + string(rune('a'+i))
		b, err := mcpbackend.Start(name, fmt.Sprintf("%s:%d", ip, mcpPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		pods = append(pods, &pod{name: name, ip: ip, uid: fmt.Sprintf("0000000%c-0000-4000-8000-000000000000", 'a'+i), backend: b})
	}
	a, b, c, d := pods[0], pods[1], pods[2], pods[3]

	must(t, create(ctx, admin.CoreV1().Namespaces(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}))
	must(t, create(ctx, admin.CoreV1().Services(namespace), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": service},
			Ports: []corev1.ServicePort{
				{Name: "mcp", Port: 80, TargetPort: intstr.FromInt32(mcpPort)},
				{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9090)},
			},
		},
	}))
	// Two slices, as the EndpointSlice controller may write them.
	must(t, create(ctx, slices, endpointSlice("everything-1", ready(a), ready(b))))
	must(t, create(ctx, slices, endpointSlice("everything-2", ready(c))))

	phase("control plane and pods")

	// tether starts before its Role is bound: the list is forbidden, and
	// tether is alive but not ready. It keeps a terminating pod's sessions
	// until the pod is gone (--drain on-failure), which this test pins;
	// the proactive drain has its own (drain_test.go).
	tether := startTether(t, os.Getenv(tetherBinEnv),
		"--k8s-service", namespace+"/"+service, "--k8s-port", "mcp",
		"--kubeconfig", env.Kubeconfig(tetherUser.Name), "--drain", "on-failure")
	tether.waitLog("the forbidden list", 30*time.Second, func(m map[string]any) bool {
		return m["msg"] == "EndpointSlice list/watch failed, retrying" && strings.Contains(fmt.Sprint(m["err"]), "forbidden")
	})
	for range 5 {
		if got := tether.status("/readyz"); got != 503 {
			t.Fatalf("/readyz before the first list: %d, want 503", got)
		}
		if got := tether.status("/healthz"); got != 200 {
			t.Fatalf("/healthz: %d, want 200", got)
		}
		time.Sleep(100 * time.Millisecond)
	}

	phase("tether not ready while forbidden")

	// Apply deploy/rbac as it is (only the namespace filled in): that is all
	// tether gets, and it suffices.
	applyRBAC(ctx, t, admin, "../deploy/rbac")
	start = time.Now()
	tether.waitStatus("/readyz", 200, 60*time.Second)
	t.Logf("ready %s after the Role was bound", time.Since(start).Round(time.Millisecond))
	tether.waitLog("the sync", 5*time.Second, msgIs("EndpointSlices synced", "ready", "3", "fenced", "0"))
	assertRoleIsAll(ctx, t, env.Kubeconfig(tetherUser.Name))

	phase("ready after RBAC")

	var sessions []*session
	calls, failures := 0, 0
	// callAll makes one call on every session and returns where each went.
	callAll := func(phase string) map[*session]string {
		t.Helper()
		got := map[*session]string{}
		for i, s := range sessions {
			calls++
			name, err := whoami(ctx, s.cs)
			if err != nil {
				failures++
				t.Errorf("%s: session %d (home %s): %v", phase, i, s.home, err)
				continue
			}
			got[s] = name
		}
		return got
	}
	newSessions := func(n int) map[string]int {
		t.Helper()
		per := map[string]int{}
		for range n {
			s := connect(ctx, t, tether.listen)
			sessions = append(sessions, s)
			per[s.home]++
		}
		return per
	}

	// 1. Sessions spread over the three ready endpoints.
	per := newSessions(12)
	t.Logf("12 sessions: %v", per)
	for _, p := range []*pod{a, b, c} {
		if per[p.name] < 2 {
			t.Errorf("%s got %d of 12 sessions, want at least 2", p.name, per[p.name])
		}
	}
	for s, got := range callAll("sticky") {
		if got != s.home {
			t.Errorf("a session of %s moved to %s", s.home, got)
		}
	}

	phase("1 spread")

	// 2. a is terminating but still serving: fenced. It keeps its sessions
	// and gets no new ones.
	must(t, update(ctx, slices, endpointSlice("everything-1", terminating(a), ready(b))))
	tether.waitLog("a fenced", 30*time.Second, msgIs("endpoint state changed", "id", a.endpointID(), "to", "fenced"))
	initsOnA := a.backend.Initializes.Load()
	per = newSessions(9)
	t.Logf("9 sessions with %s fenced: %v", a.name, per)
	if per[a.name] != 0 {
		t.Errorf("the fenced endpoint got %d new sessions", per[a.name])
	}
	onA := 0
	for s, got := range callAll("fenced") {
		if got != s.home {
			t.Errorf("with %s fenced, a session of %s moved to %s", a.name, s.home, got)
		}
		if s.home == a.name {
			onA++
		}
	}
	if onA == 0 {
		t.Fatal("no session on the fenced endpoint to check")
	}
	if got := a.backend.Initializes.Load(); got != initsOnA {
		t.Errorf("the fenced endpoint saw %d initialize requests, want none", got-initsOnA)
	}

	phase("2 fenced")

	// 3. a leaves the slice (its pod is gone from the Service; the process
	// still runs for now): its sessions re-initialize elsewhere, no call
	// fails, and nothing reaches a any more.
	must(t, update(ctx, slices, endpointSlice("everything-1", ready(b))))
	tether.waitLog("a removed", 30*time.Second, msgIs("endpoint removed", "id", a.endpointID(), "pod", namespace+"/"+a.name))
	callsOnA := a.backend.Calls.Load()
	moved := 0
	for s, got := range callAll("a removed") {
		switch {
		case s.home == a.name && got == a.name:
			t.Errorf("a session still reached the removed endpoint")
		case s.home == a.name:
			moved++
			s.home = got
		case got != s.home:
			t.Errorf("with %s removed, a session of %s moved to %s", a.name, s.home, got)
		}
	}
	if moved != onA {
		t.Errorf("%d of %d sessions of the removed endpoint moved", moved, onA)
	}
	if got := a.backend.Calls.Load(); got != callsOnA {
		t.Errorf("the removed endpoint served %d calls after its removal", got-callsOnA)
	}
	phase("3 removed")

	// Then the pod exits, cutting the streams its sessions had open.
	a.backend.Kill(100 * time.Millisecond)
	callAll("a exited")

	phase("3b pod exited")

	// 4. The API server goes away for a while: tether stays ready on what
	// it knows, and sessions work.
	env.StopAPIServer()
	time.Sleep(time.Second)
	if got := tether.status("/readyz"); got != 200 {
		t.Errorf("/readyz without the API server: %d, want 200 (the last snapshot stays in force)", got)
	}
	callAll("API server down")
	env.StartAPIServer()

	phase("4 API server down and back")

	// 5. A new endpoint appears after the watch broke: tether's watch
	// resumed, and the newcomer takes new sessions.
	must(t, create(ctx, slices, endpointSlice("everything-3", ready(d))))
	tether.waitLog("d added", 60*time.Second, msgIs("endpoint added", "id", d.endpointID(), "state", "ready"))
	per = newSessions(9)
	t.Logf("9 sessions with %s new: %v", d.name, per)
	if per[d.name] == 0 {
		t.Errorf("the new endpoint got none of 9 new sessions")
	}

	phase("5 new endpoint")

	// 6. The same IP, a new pod UID (b's pod replaced by one that reused its
	// address): a new endpoint, and b's sessions re-initialize.
	bReplaced := &pod{name: b.name + "-new", ip: b.ip, uid: "0000000b-0000-4000-8000-00000000000b", backend: b.backend}
	must(t, update(ctx, slices, endpointSlice("everything-1", ready(bReplaced))))
	tether.waitLog("b's old identity removed", 30*time.Second, msgIs("endpoint removed", "id", b.endpointID()))
	tether.waitLog("b's new identity added", 30*time.Second, msgIs("endpoint added", "id", bReplaced.endpointID()))
	totalInits := func() (n int64) {
		for _, p := range pods {
			n += p.backend.Initializes.Load()
		}
		return n
	}
	onB := 0
	for _, s := range sessions {
		if s.home == b.name {
			onB++
		}
	}
	before := totalInits()
	callAll("b replaced")
	if got := totalInits() - before; got != int64(onB) {
		t.Errorf("%d re-initializations after b's pod UID changed, want %d (one per session of the old pod)", got, onB)
	}
	phase("6 IP reuse")

	callAll("final")
	t.Logf("%d calls on %d sessions, %d failed", calls, len(sessions), failures)
	if failures != 0 {
		t.Errorf("%d client calls failed, want 0", failures)
	}
	for _, msg := range []string{"endpoint added", "endpoint removed", "endpoint state changed"} {
		t.Logf("%q log lines: %d", msg, tether.countLog(msgIs(msg)))
	}
}

func ready(p *pod) discoveryv1.Endpoint {
	return p.entry(discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)})
}

func terminating(p *pod) discoveryv1.Endpoint {
	return p.entry(discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)})
}

func (p *pod) entry(c discoveryv1.EndpointConditions) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{p.ip},
		Conditions: c,
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: p.name, UID: types.UID(p.uid)},
	}
}

// endpointSlice is a slice of the Service as the EndpointSlice controller
// writes it: two ports, so --k8s-port has to choose.
func endpointSlice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: service,
				discoveryv1.LabelManagedBy:   "e2e.tether-mcp.dev",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("mcp"), Port: ptr(int32(mcpPort)), Protocol: ptr(corev1.ProtocolTCP)},
			{Name: ptr("metrics"), Port: ptr(int32(9090)), Protocol: ptr(corev1.ProtocolTCP)},
		},
		Endpoints: eps,
	}
}

func ptr[T any](v T) *T { return &v }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type creator[T any] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
}

func create[T any](ctx context.Context, c creator[T], obj T) error {
	_, err := c.Create(ctx, obj, metav1.CreateOptions{})
	return err
}

// update replaces a slice (a Get for the resourceVersion, then Update).
func update(ctx context.Context, c interface {
	Get(context.Context, string, metav1.GetOptions) (*discoveryv1.EndpointSlice, error)
	Update(context.Context, *discoveryv1.EndpointSlice, metav1.UpdateOptions) (*discoveryv1.EndpointSlice, error)
}, s *discoveryv1.EndpointSlice) error {
	cur, err := c.Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	s.ResourceVersion = cur.ResourceVersion
	_, err = c.Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// applyRBAC creates every object of the YAML files in dir in the test's
// namespace. ServiceAccount subjects of RoleBindings get that namespace
// too, as kustomize's namespace transformer would do.
func applyRBAC(ctx context.Context, t *testing.T, client kubernetes.Interface, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			o.Namespace = namespace
			must(t, create(ctx, client.CoreV1().ServiceAccounts(namespace), o))
		case *rbacv1.Role:
			o.Namespace = namespace
			must(t, create(ctx, client.RbacV1().Roles(namespace), o))
		case *rbacv1.RoleBinding:
			o.Namespace = namespace
			for i := range o.Subjects {
				if o.Subjects[i].Kind == rbacv1.ServiceAccountKind {
					o.Subjects[i].Namespace = namespace
				}
			}
			must(t, create(ctx, client.RbacV1().RoleBindings(namespace), o))
		default:
			t.Fatalf("%s: unexpected %T in deploy/rbac", f, obj)
		}
		applied++
	}
	if applied != 3 {
		t.Fatalf("applied %d objects from %s, want 3 (ServiceAccount, Role, RoleBinding)", applied, dir)
	}
}

// assertRoleIsAll checks that tether's identity can read EndpointSlices in
// its namespace and nothing else: not other namespaces, not the cluster,
// not Services or Pods, and no writes.
func assertRoleIsAll(ctx context.Context, t *testing.T, kubeconfig string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := kubernetes.NewForConfigOrDie(cfg)
	if _, err := c.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("tether's identity cannot list EndpointSlices in %s: %v", namespace, err)
	}
	forbidden := map[string]error{}
	_, forbidden["list endpointslices cluster-wide"] = c.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	_, forbidden["list endpointslices in default"] = c.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{})
	_, forbidden["get services"] = c.CoreV1().Services(namespace).Get(ctx, service, metav1.GetOptions{})
	_, forbidden["list pods"] = c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	forbidden["delete endpointslices"] = c.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, "everything-2", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("tether's identity may %s (error %v), want forbidden", what, err)
		}
	}
}
