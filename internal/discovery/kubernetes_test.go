package discovery

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

var (
	testService = ServiceRef{Namespace: "mcp", Name: "everything"}
	slicesGVR   = discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
)

// logBuffer collects log lines from concurrent goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) lines(substr string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// fakeSlices is the EndpointSliceClient of a fake clientset. The embedded
// clientset also tells the informer it cannot stream the initial list as
// watch events (IsWatchListSemanticsUnSupported), as it does for client-go's
// own informers.
type fakeSlices struct{ *fake.Clientset }

func (f fakeSlices) ListEndpointSlices(ctx context.Context, namespace string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	return f.DiscoveryV1().EndpointSlices(namespace).List(ctx, opts)
}

func (f fakeSlices) WatchEndpointSlices(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	return f.DiscoveryV1().EndpointSlices(namespace).Watch(ctx, opts)
}

// runSource starts a Kubernetes source on client and returns the channel
// its snapshots arrive on, the log, and a stop function that waits for Run
// to return.
func runSource(t *testing.T, client *fake.Clientset, port PortSelector) (<-chan Snapshot, *logBuffer, func()) {
	t.Helper()
	logs := &logBuffer{}
	src, err := NewKubernetes(KubernetesOptions{
		Client:  fakeSlices{client},
		Service: testService,
		Port:    port,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	snaps := make(chan Snapshot, 100)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(s Snapshot) { snaps <- s }) }()
	var once sync.Once
	stop := func() { once.Do(func() { stopRun(t, cancel, done) }) }
	t.Cleanup(stop)
	return snaps, logs, stop
}

func stopRun(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		t.Errorf("Run did not return after its context ended\n%s", buf[:runtime.Stack(buf, true)])
	}
}

// next waits for the next snapshot.
func next(t *testing.T, snaps <-chan Snapshot) Snapshot {
	t.Helper()
	select {
	case s := <-snaps:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot within 10s")
		return Snapshot{}
	}
}

// until waits for a snapshot equal to want, skipping intermediate ones.
func until(t *testing.T, snaps <-chan Snapshot, want ...string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var last []string
	for {
		select {
		case s := <-snaps:
			if last = summarize(s); cmp.Equal(last, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no snapshot %q within 10s; last %q", want, last)
		}
	}
}

// quiet asserts that no snapshot arrives for a while.
func quiet(t *testing.T, snaps <-chan Snapshot, d time.Duration) {
	t.Helper()
	select {
	case s := <-snaps:
		t.Fatalf("unexpected snapshot %v", summarize(s))
	case <-time.After(d):
	}
}

func expect(t *testing.T, got Snapshot, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if diff := cmp.Diff(summarize(got), want); diff != "" {
		t.Errorf("snapshot (-got +want):\n%s", diff)
	}
}

// The informer is scoped to the namespace and the Service's label; the
// first snapshot waits for the initial list; adds, updates and deletes
// follow; each change is one log line.
func TestKubernetesSourceWiring(t *testing.T) {
	other := v4("other-abc", mcpPort, ips("10.0.9.9")...)
	other.Labels[discoveryv1.LabelServiceName] = "other"
	elsewhere := v4("everything-zzz", mcpPort, ips("10.0.8.8")...)
	elsewhere.Namespace = "default"
	client := fake.NewClientset(
		v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condReady}, ep{"10.0.0.2", "u2", condReady}),
		other, elsewhere,
	)

	// Hold the initial list back until released, and record what was asked.
	release := make(chan struct{})
	var lists []k8stesting.ListActionImpl
	var listsMu sync.Mutex
	client.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		<-release
		listsMu.Lock()
		lists = append(lists, a.(k8stesting.ListActionImpl))
		listsMu.Unlock()
		return false, nil, nil // on to the object tracker
	})
	snaps, logs, stop := runSource(t, client, PortSelector{Name: "mcp"})

	quiet(t, snaps, 200*time.Millisecond) // not synced: nothing published
	close(release)
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
		"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready")

	listsMu.Lock()
	if len(lists) == 0 {
		t.Fatal("no list call")
	}
	for _, l := range lists {
		if l.GetNamespace() != "mcp" || l.GetListRestrictions().Labels.String() != "kubernetes.io/service-name=everything" {
			t.Errorf("list in namespace %q with selector %q, want mcp and kubernetes.io/service-name=everything",
				l.GetNamespace(), l.GetListRestrictions().Labels)
		}
	}
	listsMu.Unlock()
	for _, a := range client.Actions() {
		if a.GetNamespace() != "mcp" {
			t.Errorf("%s %s outside the Service's namespace: %q", a.GetVerb(), a.GetResource().Resource, a.GetNamespace())
		}
	}

	ctx := context.Background()
	api := client.DiscoveryV1().EndpointSlices("mcp")

	// Add a second slice.
	if _, err := api.Create(ctx, v4("everything-def", mcpPort, ep{"10.0.0.3", "u3", condReady}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
		"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready",
		"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")

	// Update: u1 terminates (fenced), u2 goes away.
	if _, err := api.Update(ctx, v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condTerminating}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced",
		"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")

	// An update that changes nothing tether cares about publishes nothing.
	same := v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condTerminating})
	same.Annotations = map[string]string{"touched": "yes"}
	if _, err := api.Update(ctx, same, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	quiet(t, snaps, 200*time.Millisecond)

	// Delete a slice.
	if err := api.Delete(ctx, "everything-def", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, snaps), "u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced")

	// A slice of another Service that reaches the handler anyway (the fake
	// watch does not filter by label) changes nothing.
	stray := v4("other-def", mcpPort, ips("10.0.9.8")...)
	stray.Labels[discoveryv1.LabelServiceName] = "other"
	if _, err := api.Create(ctx, stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	quiet(t, snaps, 200*time.Millisecond)

	// The same IP, now a new pod: a new endpoint, the old one removed.
	if _, err := api.Update(ctx, v4("everything-abc", mcpPort, ep{"10.0.0.1", "u9", condReady}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, snaps), "u9/10.0.0.1:8080 http://10.0.0.1:8080 ready")

	// One info line per change. A change is logged after its snapshot is
	// published: stopping the source first waits for the last lines.
	stop()
	for _, want := range []struct {
		msg string
		n   int
	}{
		{`msg="endpoint added"`, 4},            // u1, u2 at sync; u3; u9
		{`msg="endpoint removed"`, 3},          // u2, u3, u1
		{`msg="endpoint state changed"`, 1},    // u1 ready → fenced
		{`msg="EndpointSlices synced"`, 1},     // once
		{`pod=mcp/pod-10.0.0.1`, 4},            // added u1, changed u1, removed u1, added u9
		{`level=INFO msg="endpoint added"`, 4}, // info level
	} {
		if got := logs.lines(want.msg); len(got) != want.n {
			t.Errorf("%d log lines with %s, want %d:\n%s", len(got), want.msg, want.n, strings.Join(got, "\n"))
		}
	}
}

// Nothing is published, and Run returns, when the context ends before the
// informer syncs (an API server that never answers, a missing Role).
func TestKubernetesSourceNeverSynced(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, kruntime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", nil)
	})
	snaps, logs, stop := runSource(t, client, PortSelector{})
	quiet(t, snaps, 1500*time.Millisecond)
	stop()
	if got := logs.lines("list/watch failed"); len(got) == 0 {
		t.Error("the forbidden list was not logged")
	} else if !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], "forbidden") {
		t.Errorf("log line %q, want a warning naming the error", got[0])
	}
}

// An empty Service syncs too: ready with no endpoints.
func TestKubernetesSourceEmptyService(t *testing.T) {
	snaps, _, _ := runSource(t, fake.NewClientset(), PortSelector{})
	expect(t, next(t, snaps))
}

// A broken watch is survived: client-go re-lists, a slice deleted while the
// watch was down arrives as a tombstone (DeletedFinalStateUnknown), one
// created meanwhile as an add, and the new watch carries on.
func TestKubernetesSourceSurvivesWatchFailure(t *testing.T) {
	client := fake.NewClientset(
		v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condReady}),
		v4("everything-def", mcpPort, ep{"10.0.0.2", "u2", condReady}),
	)
	var listCalls atomic.Int32
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, kruntime.Object, error) {
		listCalls.Add(1)
		return false, nil, nil
	})
	watchers := make(chan *watch.FakeWatcher, 10)
	client.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFakeWithChanSize(10, false)
		watchers <- w
		return true, w, nil
	})
	nextWatcher := func() *watch.FakeWatcher {
		t.Helper()
		select {
		case w := <-watchers:
			return w
		case <-time.After(10 * time.Second):
			t.Fatal("no watch within 10s")
			return nil
		}
	}

	snaps, logs, _ := runSource(t, client, PortSelector{})
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
		"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready")
	w1 := nextWatcher()
	listsBefore := listCalls.Load()

	// While the watch is "down" (nothing is sent on it), one slice goes and
	// another comes, behind the informer's back.
	tracker := client.Tracker()
	if err := tracker.Delete(slicesGVR, "mcp", "everything-def"); err != nil {
		t.Fatal(err)
	}
	if err := tracker.Create(slicesGVR, v4("everything-ghi", mcpPort, ep{"10.0.0.3", "u3", condReady}), "mcp"); err != nil {
		t.Fatal(err)
	}
	// Then the API server says the watch's resource version is too old.
	w1.Error(&apierrors.NewResourceExpired("too old resource version").ErrStatus)

	// The two changes may arrive as two snapshots.
	until(t, snaps,
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
		"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")
	if got := listCalls.Load(); got <= listsBefore {
		t.Errorf("%d list calls after the expired watch, want a re-list", got)
	}
	if got := logs.lines(`slice=everything-def tombstone=true`); len(got) != 1 || !strings.Contains(got[0], `msg="EndpointSlice gone"`) {
		t.Errorf("the delete missed by the watch did not arrive as a tombstone; log:\n%s", strings.Join(logs.lines("EndpointSlice"), "\n"))
	}

	// The new watch works. (What the fake watches send is written to the
	// tracker too, so that a re-list sees the same state.)
	w2 := nextWatcher()
	fenced := v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condTerminating})
	if err := tracker.Update(slicesGVR, fenced, "mcp"); err != nil {
		t.Fatal(err)
	}
	w2.Modify(fenced)
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced",
		"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")

	// A watch that just ends (a connection cut, an API server restart) is
	// resumed too.
	w2.Stop()
	w3 := nextWatcher()
	if err := tracker.Delete(slicesGVR, "mcp", "everything-ghi"); err != nil {
		t.Fatal(err)
	}
	w3.Delete(v4("everything-ghi", mcpPort))
	expect(t, next(t, snaps), "u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced")
}

// The adapter on its own: every shape of event the informer hands over.
func TestSliceTracker(t *testing.T) {
	logs := &logBuffer{}
	tr := newSliceTracker(testService, slog.New(slog.NewTextHandler(logs, nil)))
	names := func() []string {
		var out []string
		for _, s := range tr.list() {
			out = append(out, s.Name)
		}
		slices.Sort(out)
		return out
	}
	signalled := func() bool {
		select {
		case <-tr.changed:
			return true
		default:
			return false
		}
	}
	a := v4("everything-a", mcpPort, ips("10.0.0.1")...)
	b := v4("everything-b", mcpPort, ips("10.0.0.2")...)
	c := v4("everything-c", mcpPort, ips("10.0.0.3")...)

	tr.OnAdd(a, true)
	tr.OnAdd(b, true)
	tr.OnAdd(c, false)
	if !signalled() || signalled() {
		t.Error("three adds should leave exactly one pending signal")
	}
	if diff := cmp.Diff(names(), []string{"everything-a", "everything-b", "everything-c"}); diff != "" {
		t.Errorf("after adds (-got +want):\n%s", diff)
	}

	// Tombstone carrying the object.
	tr.OnDelete(cache.DeletedFinalStateUnknown{Key: "mcp/everything-b", Obj: b})
	// Tombstone whose object is of no use: the key decides.
	tr.OnDelete(cache.DeletedFinalStateUnknown{Key: "mcp/everything-c", Obj: nil})
	if diff := cmp.Diff(names(), []string{"everything-a"}); diff != "" {
		t.Errorf("after tombstones (-got +want):\n%s", diff)
	}
	if !signalled() {
		t.Error("no signal after deletes")
	}

	// A delete of something unknown changes nothing and signals nothing.
	tr.OnDelete(v4("everything-z", mcpPort))
	if signalled() {
		t.Error("signal after deleting an unknown slice")
	}

	// Relabelled away from the Service: gone.
	moved := a.DeepCopy()
	moved.Labels[discoveryv1.LabelServiceName] = "other"
	tr.OnUpdate(a, moved)
	if got := names(); len(got) != 0 {
		t.Errorf("after relabel: %v, want none", got)
	}

	// Wrong types are ignored with a warning.
	tr.OnAdd("not a slice", false)
	tr.OnDelete(42)
	tr.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/b/c"})
	if got := logs.lines("level=WARN"); len(got) != 3 {
		t.Errorf("%d warnings, want 3:\n%s", len(got), strings.Join(got, "\n"))
	}
}

func TestNewKubernetesValidates(t *testing.T) {
	if _, err := NewKubernetes(KubernetesOptions{Service: testService}); err == nil {
		t.Error("no client: no error")
	}
	if _, err := NewKubernetes(KubernetesOptions{Client: fakeSlices{fake.NewClientset()}, Service: ServiceRef{Name: "x"}}); err == nil {
		t.Error("no namespace: no error")
	}
}
