package podcost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// Against a real kube-apiserver and etcd (internal/kubetest): the Lease's
// optimistic concurrency, the merge patches and the RBAC answers are the API
// server's own. (Test code uses client-go to set the scene and to look; the
// writers use tether's own client.)

// partitionable is a replica's API client that a test can cut off, as a
// network partition would.
type partitionable struct {
	discovery.Requester
	cut atomic.Bool
}

func (p *partitionable) Do(ctx context.Context, r discovery.Request) ([]byte, error) {
	if p.cut.Load() {
		return nil, errors.New("dial tcp: i/o timeout (partitioned by the test)")
	}
	return p.Requester.Do(ctx, r)
}

// The documented RBAC (deploy/components/pod-deletion-cost), read from its
// files.
func documentedRBAC(t *testing.T, namespace string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	var role rbacv1.Role
	var rb rbacv1.RoleBinding
	for path, obj := range map[string]any{
		"../../deploy/components/pod-deletion-cost/role.yaml":        &role,
		"../../deploy/components/pod-deletion-cost/rolebinding.yaml": &rb,
	} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := sigsyaml.UnmarshalStrict(b, obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	role.Namespace, rb.Namespace = namespace, namespace
	for i := range rb.Subjects {
		rb.Subjects[i].Namespace = namespace // what kustomize's namespace: does
	}
	return &role, &rb
}

// kubeTimings are short, so that a takeover after an expiry takes seconds.
func kubeTimings(o Options) Options {
	o.LeaseDuration = 3 * time.Second
	o.RenewPeriod = 500 * time.Millisecond
	o.Interval = time.Second
	return o
}

func podAnnotations(t *testing.T, admin kubernetes.Interface) map[string]string {
	t.Helper()
	pods, err := admin.CoreV1().Pods("mcp").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		out[p.Name] = p.Annotations[Annotation]
	}
	return out
}

func leaseHolder(t *testing.T, admin kubernetes.Interface) string {
	t.Helper()
	l, err := admin.CoordinationV1().Leases("mcp").Get(t.Context(), LeaseName(everything), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// waitAnnotations waits until the pods' annotations are want and returns
// how long that took.
func waitAnnotations(t *testing.T, admin kubernetes.Interface, want map[string]string, timeout time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	testkit.EventuallyNoError(t, timeout, func() error {
		got := podAnnotations(t, admin)
		for pod, v := range want {
			if got[pod] != v {
				return fmt.Errorf("annotations %v, want %v", got, want)
			}
		}
		return nil
	}, "the annotations")
	return time.Since(began)
}

// Two replicas, each with an identity bound to exactly the documented Role:
// one holds the Lease and writes the counts on the pods; they follow when
// the counts change; when the holder stops it releases the Lease and the
// other writes on; when a holder is cut off its Lease expires and the other
// takes over, never while the first still believes it holds. A pod that is
// gone is skipped quietly. An identity without the Role is refused (403),
// says so once, and the Role grants nothing beyond its rules.
func TestWritersAgainstAPIServer(t *testing.T) {
	tether := kubetest.ServiceAccountUser("mcp", "tether")
	stranger := kubetest.ServiceAccountUser("mcp", "stranger")
	env := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{tether, stranger}})
	admin := env.AdminClient()
	ctx := t.Context()
	for _, ns := range []string{"mcp", "other"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No controller manager runs: the ServiceAccount a Pod defaults to is
	// made by hand.
	if _, err := admin.CoreV1().ServiceAccounts("mcp").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods without a kubelet: objects the API server keeps, which is all a
	// ReplicaSet reads the annotation from.
	for _, name := range []string{"p0", "p1", "p2"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"keep": "me"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "mcp", Image: "example/mcp:1"}}},
		}
		if _, err := admin.CoreV1().Pods("mcp").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	role, rb := documentedRBAC(t, "mcp")
	if _, err := admin.RbacV1().Roles("mcp").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings("mcp").Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := func(u kubetest.User) *partitionable {
		t.Helper()
		c, err := discovery.KubeRequester(env.Kubeconfig(u.Name), "tether/test")
		if err != nil {
			t.Fatal(err)
		}
		return &partitionable{Requester: c}
	}

	c := newCounts(map[string]int64{"mcp/p0": 3, "mcp/p1": 0, "mcp/p2": 7})
	var logsA, logsB logBuffer
	ca, cb := client(tether), client(tether)
	a, stopA := start(t, kubeTimings(Options{API: ca, Identity: "replica-a", Sessions: c.get, Logger: logsA.logger()}))
	b, stopB := start(t, kubeTimings(Options{API: cb, Identity: "replica-b", Sessions: c.get, Logger: logsB.logger()}))
	stopA, stopB = sync.OnceFunc(stopA), sync.OnceFunc(stopB)
	defer stopA()
	defer stopB()

	// Never both: sampled every 10 ms for the whole test.
	var both atomic.Int64
	watchDone := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if a.Holding() && b.Holding() {
				both.Add(1)
			}
			select {
			case <-watchDone:
				return
			case <-tick.C:
			}
		}
	})
	defer func() {
		close(watchDone)
		watch.Wait()
		if n := both.Load(); n > 0 {
			t.Errorf("both replicas held the lease at %d samples", n)
		}
	}()

	testkit.Eventually(t, 30*time.Second, func() bool { return a.Holding() != b.Holding() && leaseHolder(t, admin) != "" }, "one holder")
	holder, other, stopHolder, cutOther := a, b, stopA, cb
	if b.Holding() {
		holder, other, stopHolder, cutOther = b, a, stopB, ca
	}
	if h := leaseHolder(t, admin); h != holder.Identity() {
		t.Fatalf("the Lease names %q, %s believes it holds", h, holder.Identity())
	}
	waitAnnotations(t, admin, map[string]string{"p0": "3", "p1": "0", "p2": "7"}, 30*time.Second)
	if p, err := admin.CoreV1().Pods("mcp").Get(ctx, "p0", metav1.GetOptions{}); err != nil || p.Annotations["keep"] != "me" {
		t.Errorf("p0's other annotations: %v, %v; a merge patch keeps them", p.Annotations, err)
	}

	// The counts change: the annotations follow within the interval.
	c.set("mcp/p0", 1)
	c.set("mcp/p2", 12)
	took := waitAnnotations(t, admin, map[string]string{"p0": "1", "p1": "0", "p2": "12"}, 30*time.Second)
	t.Logf("annotations followed a change in %s (interval %s)", took.Round(time.Millisecond), time.Second)
	if took > time.Second+2*time.Second {
		t.Errorf("annotations followed in %s, want within the interval (1 s) and the API's latency", took)
	}

	// The holder stops: it releases the Lease, the other takes over within
	// a renew period or so, and writes.
	stopHolder()
	began := time.Now()
	testkit.Eventually(t, 30*time.Second, other.Holding, "the other replica takes over after the release")
	handover := time.Since(began)
	t.Logf("handover after a release: %s", handover.Round(time.Millisecond))
	if handover > 2*time.Second {
		t.Errorf("handover after %s: the Lease expired (3 s) rather than being released", handover)
	}
	if h := leaseHolder(t, admin); h != other.Identity() {
		t.Errorf("the Lease names %q, want %s", h, other.Identity())
	}
	c.set("mcp/p1", 4)
	waitAnnotations(t, admin, map[string]string{"p0": "1", "p1": "4", "p2": "12"}, 30*time.Second)

	// A third replica joins; the holder is cut off. Its Lease expires and
	// the newcomer takes over; the watch above would catch an overlap of
	// the first two, this one checks the newcomer's.
	var logsC logBuffer
	third, stopThird := start(t, kubeTimings(Options{API: client(tether), Identity: "replica-c", Sessions: c.get, Logger: logsC.logger()}))
	defer stopThird()
	time.Sleep(time.Second) // let it see the Lease renewed a few times
	if third.Holding() {
		t.Fatal("the newcomer holds a Lease that is renewed")
	}
	cutOther.cut.Store(true)
	cut := time.Now()
	var overlap atomic.Int64
	testkit.Eventually(t, 30*time.Second, func() bool {
		if other.Holding() && third.Holding() {
			overlap.Add(1)
		}
		return third.Holding()
	}, "the newcomer takes over the expired Lease")
	tookOver := time.Since(cut)
	t.Logf("takeover after the holder was cut off: %s (lease duration 3 s)", tookOver.Round(time.Millisecond))
	if overlap.Load() > 0 {
		t.Error("the cut-off holder and the newcomer both held the lease")
	}
	if tookOver < 2*time.Second {
		t.Errorf("took over %s after the cut: before the lease could expire", tookOver)
	}
	if other.Holding() {
		t.Error("the cut-off replica still believes it holds")
	}

	// A pod that is gone is skipped quietly; the others are written.
	if err := admin.CoreV1().Pods("mcp").Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.set("mcp/p1", 9)
	c.set("mcp/p0", 2)
	waitAnnotations(t, admin, map[string]string{"p0": "2", "p2": "12"}, 30*time.Second)
	time.Sleep(2 * time.Second) // a few more passes
	if l := logsC.lines("level=WARN"); len(l) > 0 {
		t.Errorf("warnings: %q", l)
	}
	if l := logsC.lines("level=ERROR"); len(l) > 0 {
		t.Errorf("errors: %q", l)
	}

	// Without the Role: refused, and said once.
	var logsS logBuffer
	s, stopS := start(t, kubeTimings(Options{API: client(stranger), Identity: "stranger", Sessions: c.get, Logger: logsS.logger()}))
	time.Sleep(3 * time.Second)
	if s.Holding() {
		t.Error("an identity without the Role holds the lease")
	}
	stopS()
	if l := logsS.lines("forbids the Lease"); len(l) != 1 {
		t.Errorf("the stranger's 403 was logged %d times, want once: %q", len(l), l)
	}
	strangerAPI := client(stranger)
	tetherAPI := client(tether)
	patch := discovery.Request{Method: http.MethodPatch, Path: "/api/v1/namespaces/mcp/pods/p0", ContentType: "application/merge-patch+json",
		Body: []byte(`{"metadata":{"annotations":{"` + Annotation + `":"0"}}}`)}
	if _, err := strangerAPI.Do(ctx, patch); apiCode(err) != http.StatusForbidden {
		t.Errorf("the stranger's patch: %v, want 403", err)
	}
	// The Role grants its rules and nothing more: no reads of pods, no
	// other namespace, no cluster-wide right.
	for _, r := range []discovery.Request{
		{Method: http.MethodGet, Path: "/api/v1/namespaces/mcp/pods/p0"},
		{Method: http.MethodGet, Path: "/api/v1/namespaces/mcp/pods"},
		{Method: http.MethodGet, Path: "/api/v1/pods"},
		{Method: http.MethodGet, Path: "/apis/coordination.k8s.io/v1/leases"},
		{Method: http.MethodPatch, Path: "/api/v1/namespaces/other/pods/x", ContentType: "application/merge-patch+json", Body: []byte(`{}`)},
		{Method: http.MethodDelete, Path: "/apis/coordination.k8s.io/v1/namespaces/mcp/leases/" + LeaseName(everything)},
	} {
		if _, err := tetherAPI.Do(ctx, r); apiCode(err) != http.StatusForbidden {
			t.Errorf("%s %s with the Role: %v, want 403", r.Method, r.Path, err)
		}
	}
	if l := logsA.lines("forbids"); len(l) > 0 {
		t.Errorf("replica-a was refused: %q", l)
	}
	if l := logsB.lines("forbids"); len(l) > 0 {
		t.Errorf("replica-b was refused: %q", l)
	}
}
