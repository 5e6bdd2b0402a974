package server

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/podcost"
	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

// The wiring of --pod-deletion-cost, end to end: two tether replicas on
// one Redis, each with a Kubernetes identity bound to the documented Role
// only, in front of three go-sdk backends whose pods exist in a real API
// server. Sessions are opened through the replica that does not hold the
// Lease, so the holder writes counts it learned from the fleet (Redis), not
// from its own traffic; the annotations follow the sessions as they close;
// and a holder that shuts down hands the Lease to the other at once.
func TestPodDeletionCostThroughTwoReplicas(t *testing.T) {
	user := kubetest.ServiceAccountUser("mcp", "tether")
	env := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{user}})
	admin := env.AdminClient()
	ctx := t.Context()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mcp"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager runs: the ServiceAccount a Pod defaults to is
	// made by hand.
	if _, err := admin.CoreV1().ServiceAccounts("mcp").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applyDocumentedRBAC(t, admin)

	backends := testkit.StartBackends(t, 3)
	var snap discovery.Snapshot
	for i, b := range backends {
		name := "p" + strconv.Itoa(i)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "mcp", Image: "example/mcp:1"}}}}
		if _, err := admin.CoreV1().Pods("mcp").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(b.URL())
		if err != nil {
			t.Fatal(err)
		}
		// As the EndpointSlice source has them: the pod's UID in the ID,
		// its name beside.
		snap.Endpoints = append(snap.Endpoints, discovery.Endpoint{ID: fmt.Sprintf("uid-%d/%s", i, u.Host), URL: u, State: discovery.Ready, Pod: "mcp/" + name})
	}
	src := sourceFunc(func(ctx context.Context, update func(discovery.Snapshot)) error {
		update(snap)
		<-ctx.Done()
		return nil
	})
	redis := redistest.Start(t)
	target, err := session.ParseRedisURL(redis.URL())
	if err != nil {
		t.Fatal(err)
	}
	// Long enough that a takeover by expiry cannot pass for a release.
	const leaseDuration = 6 * time.Second
	replica := func(identity string) (*Server, func()) {
		t.Helper()
		api, err := discovery.KubeRequester(env.Kubeconfig(user.Name), "tether/test")
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{
			Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Source: src, ShutdownGrace: time.Second,
			Redis: target, RedisTimeout: 200 * time.Millisecond, // -race on 2 cores
			PodDeletionCost: &podcost.Options{
				API: api, Service: discovery.ServiceRef{Namespace: "mcp", Name: "everything"}, Identity: identity,
				Interval: time.Second, LeaseDuration: leaseDuration, RenewPeriod: 500 * time.Millisecond,
			},
		}
		return runServer(t, cfg)
	}
	a, stopA := replica("replica-a")
	defer stopA()
	b, stopB := replica("replica-b")
	defer stopB()
	testkit.Eventually(t, 30*time.Second, func() bool { return a.podCost.Holding() != b.podCost.Holding() }, "one holder")
	holder, stopHolder, other := a, stopA, b
	if b.podCost.Holding() {
		holder, stopHolder, other = b, stopB, a
	}

	// Sessions through the replica that does not write.
	var sessions []*mcp.ClientSession
	for range 9 {
		cs, _, err := connectThrough(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		sessions = append(sessions, cs)
	}
	annotationsAreSessions := func() error {
		got := map[string]string{}
		pods, err := admin.CoreV1().Pods("mcp").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			got[p.Name] = p.Annotations[podcost.Annotation]
		}
		want := map[string]string{}
		for i, b := range backends {
			want["p"+strconv.Itoa(i)] = strconv.Itoa(b.LiveSessions())
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("annotations %v, the backends' live sessions %v", got, want)
		}
		return nil
	}
	testkit.EventuallyNoError(t, 30*time.Second, annotationsAreSessions, "annotations equal to the sessions opened through the other replica")

	for _, cs := range sessions[:4] {
		cs.Close() // DELETE: the session ends on its backend and in the store
	}
	testkit.EventuallyNoError(t, 30*time.Second, annotationsAreSessions, "annotations following closed sessions")

	// The holder shuts down: it releases the Lease as its grace period
	// begins, and the other replica writes on.
	began := time.Now()
	stopHolder()
	testkit.Eventually(t, 30*time.Second, other.podCost.Holding, "the other replica takes over")
	handover := time.Since(began)
	t.Logf("handover on shutdown: %s", handover.Round(time.Millisecond))
	if handover > leaseDuration/2 {
		t.Errorf("handover took %s: the Lease expired rather than being released", handover)
	}
	if holder.podCost.Holding() {
		t.Error("the stopped replica still holds the lease")
	}
	for _, cs := range sessions[4:6] {
		cs.Close()
	}
	testkit.EventuallyNoError(t, 30*time.Second, annotationsAreSessions, "annotations written by the new holder")
}

// applyDocumentedRBAC creates the Role and RoleBinding of
// deploy/components/pod-deletion-cost in namespace mcp, from their files.
func applyDocumentedRBAC(t *testing.T, admin kubernetes.Interface) {
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
	for i := range rb.Subjects {
		rb.Subjects[i].Namespace = "mcp"
	}
	if _, err := admin.RbacV1().Roles("mcp").Create(t.Context(), &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings("mcp").Create(t.Context(), &rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// runServer runs a server with cfg until stop (idempotent; also at the
// end of the test) and waits until it is ready.
func runServer(t *testing.T, cfg Config) (*Server, func()) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(stop)
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status("http://"+s.AdminAddr().String()+"/readyz") == 200 }, "ready")
	return s, stop
}
