package discovery

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/testkit"
)

var testService = ServiceRef{Namespace: "mcp", Name: "everything"}

// logBuffer collects log lines from concurrent goroutines.
type logBuffer struct{ testkit.LockedBuffer }

func (b *logBuffer) lines(substr string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// runSource starts a Kubernetes source on client, with a backoff of
// milliseconds, and returns the channel its snapshots arrive on, the log,
// and a stop function that waits for Run to return nil.
func runSource(t *testing.T, client EndpointSliceClient, port PortSelector) (<-chan Snapshot, *logBuffer, func()) {
	t.Helper()
	logs := &logBuffer{}
	src, err := NewKubernetes(KubernetesOptions{
		Client:  client,
		Service: testService,
		Port:    port,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	src.backoffInitial, src.backoffMax = time.Millisecond, 20*time.Millisecond
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
			t.Errorf("Run: %v, want nil when its context ends", err)
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

// waitWatch waits until the source has a watch open on f, so that a change
// made next arrives as a watch event.
func waitWatch(t *testing.T, f *fakeAPI) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool { return f.watching() > 0 }, "a watch is open")
}

// The list and watch are scoped to the namespace and the Service's label;
// the first snapshot waits for the initial list; adds, updates and deletes
// follow; each change is one log line.
func TestKubernetesSourceWiring(t *testing.T) {
	other := v4("other-abc", mcpPort, ips("10.0.9.9")...)
	other.Labels[LabelServiceName] = "other"
	f := newFakeAPI(t,
		v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condReady}, ep{"10.0.0.2", "u2", condReady}),
		other,
	)
	release := f.holdLists()
	snaps, logs, stop := runSource(t, f.client(), PortSelector{Name: "mcp"})

	testkit.Eventually(t, 10*time.Second, func() bool { return len(f.requests("list")) > 0 }, "a list request")
	quiet(t, snaps, 100*time.Millisecond) // not synced: nothing published
	listRV := f.currentRV()
	release()
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
		"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready")

	list := f.requests("list")[0]
	if got, want := list.URL.Path, "/apis/discovery.k8s.io/v1/namespaces/mcp/endpointslices"; got != want {
		t.Errorf("list path %s, want %s", got, want)
	}
	if got := list.URL.RawQuery; got != "labelSelector=kubernetes.io%2Fservice-name%3Deverything" {
		t.Errorf("list query %s", got)
	}
	for h, want := range map[string]string{"Accept": "application/json", "User-Agent": "tether/test", "Authorization": "Bearer secret"} {
		if got := list.Header.Get(h); got != want {
			t.Errorf("list header %s: %q, want %q", h, got, want)
		}
	}
	waitWatch(t, f)
	w := query(f.requests("watch")[0])
	if w.Get("watch") != "1" || w.Get("resourceVersion") != listRV || w.Get("allowWatchBookmarks") != "true" ||
		w.Get("labelSelector") != "kubernetes.io/service-name=everything" {
		t.Errorf("watch query %v, want watch=1 from the list's version %s with bookmarks and the selector", w, listRV)
	}
	if s, err := strconv.Atoi(w.Get("timeoutSeconds")); err != nil || s < 300 || s > 600 {
		t.Errorf("watch timeoutSeconds %q, want 5 to 10 minutes", w.Get("timeoutSeconds"))
	}

	// Add a second slice.
	f.create(v4("everything-def", mcpPort, ep{"10.0.0.3", "u3", condReady}))
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
		"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready",
		"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")

	// Update: u1 terminates (fenced), u2 goes away.
	f.update(v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condTerminating}))
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced",
		"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")

	// An update that changes nothing tether cares about publishes nothing.
	same := v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condTerminating})
	same.Labels["touched"] = "yes"
	f.update(same)
	quiet(t, snaps, 100*time.Millisecond)

	// Delete a slice.
	f.delete("everything-def")
	expect(t, next(t, snaps), "u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced")

	// A slice of another Service is not watched.
	stray := v4("other-def", mcpPort, ips("10.0.9.8")...)
	stray.Labels[LabelServiceName] = "other"
	f.create(stray)
	quiet(t, snaps, 100*time.Millisecond)

	// The same IP, now a new pod: a new endpoint, the old one removed.
	f.update(v4("everything-abc", mcpPort, ep{"10.0.0.1", "u9", condReady}))
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
		{`level=WARN`, 0},                      // nothing went wrong
	} {
		if got := logs.lines(want.msg); len(got) != want.n {
			t.Errorf("%d log lines with %s, want %d:\n%s", len(got), want.msg, want.n, strings.Join(got, "\n"))
		}
	}
	if n := len(f.requests("list")); n != 1 {
		t.Errorf("%d lists, want 1", n)
	}
}

// Nothing is published, and Run returns nil, when the context ends before
// the first list succeeds (a missing Role, an API server that never
// answers).
func TestKubernetesSourceNeverSynced(t *testing.T) {
	t.Run("forbidden", func(t *testing.T) {
		f := newFakeAPI(t)
		f.answerAlways("list", func(w http.ResponseWriter, _ *http.Request) {
			writeStatus(w, http.StatusForbidden, "Forbidden",
				`endpointslices.discovery.k8s.io is forbidden: User "x" cannot list resource "endpointslices"`)
		})
		snaps, logs, stop := runSource(t, f.client(), PortSelector{})
		testkit.Eventually(t, 10*time.Second, func() bool { return len(f.requests("list")) >= 3 }, "lists retried")
		stop()
		select {
		case s := <-snaps:
			t.Fatalf("published %v without a list", summarize(s))
		default:
		}
		got := logs.lines("list/watch failed")
		if len(got) == 0 {
			t.Fatal("the forbidden list was not logged")
		}
		if !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], "is forbidden") || !strings.Contains(got[0], "403 Forbidden") {
			t.Errorf("log line %q, want a warning with the API's message and code", got[0])
		}
	})
	t.Run("no answer", func(t *testing.T) {
		f := newFakeAPI(t)
		f.holdLists()
		snaps, _, stop := runSource(t, f.client(), PortSelector{})
		testkit.Eventually(t, 10*time.Second, func() bool { return len(f.requests("list")) > 0 }, "a list request")
		stop() // returns nil while the list is still in flight
		select {
		case s := <-snaps:
			t.Fatalf("published %v without a list", summarize(s))
		default:
		}
	})
}

// An empty Service syncs too: ready with no endpoints.
func TestKubernetesSourceEmptyService(t *testing.T) {
	snaps, _, _ := runSource(t, newFakeAPI(t).client(), PortSelector{})
	expect(t, next(t, snaps))
}

// A watch that ends (the API server's timeout, a restart) is resumed from
// the last resource version seen, a bookmark's included, without listing
// again.
func TestKubernetesSourceResumesWatch(t *testing.T) {
	f := newFakeAPI(t, v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condReady}))
	snaps, logs, _ := runSource(t, f.client(), PortSelector{})
	expect(t, next(t, snaps), "u1/10.0.0.1:8080 http://10.0.0.1:8080 ready")
	waitWatch(t, f)

	f.create(v4("everything-def", mcpPort, ep{"10.0.0.2", "u2", condReady}))
	expect(t, next(t, snaps),
		"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
		"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready")
	// The fake sends every pending event before it ends a watch.
	bookmarkRV := f.bookmark()
	f.endWatches()
	testkit.Eventually(t, 10*time.Second, func() bool { return len(f.requests("watch")) >= 2 }, "a second watch")
	if got := query(f.requests("watch")[1]).Get("resourceVersion"); got != bookmarkRV {
		t.Errorf("re-watch from %q, want the bookmark's %s", got, bookmarkRV)
	}
	waitWatch(t, f)
	f.delete("everything-abc")
	expect(t, next(t, snaps), "u2/10.0.0.2:8080 http://10.0.0.2:8080 ready")
	if n := len(f.requests("list")); n != 1 {
		t.Errorf("%d lists, want 1: a watch that ended is resumed, not re-listed", n)
	}
	if got := logs.lines("level=WARN"); len(got) != 0 {
		t.Errorf("warnings for a routine watch end:\n%s", strings.Join(got, "\n"))
	}
}

// When the API server no longer has the watch's resource version (410, as
// an HTTP answer or an ERROR event), the source lists again and the list
// replaces the whole set: a slice deleted while the watch was down
// disappears, one created meanwhile appears, and the new watch carries on.
func TestKubernetesSourceRelistsWhenExpired(t *testing.T) {
	for _, asEvent := range []bool{false, true} {
		name := "HTTP 410"
		if asEvent {
			name = "ERROR event 410"
		}
		t.Run(name, func(t *testing.T) {
			f := newFakeAPI(t,
				v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condReady}),
				v4("everything-def", mcpPort, ep{"10.0.0.2", "u2", condReady}),
			)
			snaps, logs, _ := runSource(t, f.client(), PortSelector{})
			expect(t, next(t, snaps),
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready")
			waitWatch(t, f)

			// Behind the watch's back: one slice goes, another comes.
			f.apply(EventDeleted, v4("everything-def", mcpPort), true)
			f.apply(EventAdded, v4("everything-ghi", mcpPort, ep{"10.0.0.3", "u3", condReady}), true)
			// A bookmark from before the compaction: the watch worked
			// (a watch that ends at once with nothing is a failure).
			f.bookmark()
			f.compact(asEvent)

			until(t, snaps,
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")
			if n := len(f.requests("list")); n != 2 {
				t.Errorf("%d lists, want 2", n)
			}
			if got := logs.lines(`slice=everything-def relisted=true`); len(got) != 1 || !strings.Contains(got[0], `msg="EndpointSlice gone"`) {
				t.Errorf("the delete missed by the watch was not found by the list; log:\n%s", strings.Join(logs.lines("EndpointSlice"), "\n"))
			}
			if got := logs.lines("level=WARN"); len(got) != 0 {
				t.Errorf("warnings for an expired watch:\n%s", strings.Join(got, "\n"))
			}

			waitWatch(t, f)
			f.update(v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condTerminating}))
			expect(t, next(t, snaps),
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced",
				"u3/10.0.0.3:8080 http://10.0.0.3:8080 ready")
		})
	}
}

// Failures of every kind are survived: a warning, a backoff, a retry, and
// the last published set stays in force; nothing panics.
func TestKubernetesSourceRetries(t *testing.T) {
	status500 := func(w http.ResponseWriter, _ *http.Request) {
		writeStatus(w, http.StatusInternalServerError, "InternalError", "etcdserver: leader changed")
	}
	body := func(code int, s string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, s)
		}
	}
	event := func(s string) http.HandlerFunc { return body(http.StatusOK, s+"\n") }
	tests := []struct {
		name string
		kind string // the request that fails: "list" or "watch"
		h    http.HandlerFunc
		warn string // in the warning
	}{
		{"list 500", "list", status500, "etcdserver: leader changed (500 InternalError)"},
		{"list not a Status", "list", body(http.StatusBadGateway, "<html>bad gateway</html>"), "<html>bad gateway</html> (502)"},
		{"list garbage", "list", body(http.StatusOK, "{not json"), "malformed"},
		{"list truncated", "list", body(http.StatusOK, `{"metadata":{"resourceVersion":"1"},"items":[{"metadata":`), "unexpected EOF"},
		{"list of the wrong shape", "list", body(http.StatusOK, `{"metadata":{"resourceVersion":"1"},"items":[{"endpoints":"x"}]}`), "malformed"},
		{"list without a version", "list", body(http.StatusOK, `{"items":[]}`), "no resourceVersion"},
		{"list oversized", "list", body(http.StatusOK, `{"items":[`+strings.Repeat(" ", 8192)+`]}`), "over 4096 bytes"},
		{"watch 500", "watch", status500, "leader changed"},
		{"watch garbage", "watch", event("]]]"), "malformed"},
		{"watch unknown event", "watch", event(`{"type":"EXPLODED","object":{}}`), `EXPLODED`},
		{"watch event of the wrong shape", "watch", event(`{"type":"ADDED","object":{"ports":[{"port":"x"}]}}`), "malformed"},
		{"watch ERROR event", "watch", event(`{"type":"ERROR","object":{"kind":"Status","code":500,"reason":"InternalError","message":"boom"}}`), "boom (500 InternalError)"},
		{"watch event oversized", "watch", event(`{"type":"ADDED","object":{"metadata":{"name":"` + strings.Repeat("x", 8192) + `"}}}`), "over 1024 bytes"},
		{"watch ended at once", "watch", body(http.StatusOK, ""), "ended the watch at once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, v4("everything-abc", mcpPort, ep{"10.0.0.1", "u1", condReady}))
			c := f.client()
			c.maxList, c.maxEvent = 4096, 1024
			// Fail twice, then answer normally.
			f.answerNext(tt.kind, tt.h)
			f.answerNext(tt.kind, tt.h)
			snaps, logs, _ := runSource(t, c, PortSelector{})
			expect(t, next(t, snaps), "u1/10.0.0.1:8080 http://10.0.0.1:8080 ready")
			waitWatch(t, f)
			f.create(v4("everything-def", mcpPort, ep{"10.0.0.2", "u2", condReady}))
			until(t, snaps,
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready")
			got := logs.lines(`level=WARN msg="EndpointSlice list/watch failed, retrying"`)
			if len(got) != 2 {
				t.Fatalf("%d warnings, want 2:\n%s", len(got), strings.Join(got, "\n"))
			}
			if !strings.Contains(got[0], tt.warn) {
				t.Errorf("warning %q, want it to contain %q", got[0], tt.warn)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	b := backoff{initial: time.Second, max: 30 * time.Second}
	for i, step := range []time.Duration{1, 2, 4, 8, 16, 30, 30} {
		step *= time.Second
		if d := b.next(); d < step/2 || d > step {
			t.Errorf("wait %d: %s, want %s to %s", i, d, step/2, step)
		}
	}
	b.reset()
	if d := b.next(); d > time.Second {
		t.Errorf("after reset: %s, want at most 1s", d)
	}
}

// The tracker on its own: sets, deletes, relists, slices of another Service.
func TestSliceTracker(t *testing.T) {
	logs := &logBuffer{}
	tr := newSliceTracker(testService, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	names := func() []string {
		var out []string
		for _, s := range tr.list() {
			out = append(out, s.Name)
		}
		slices.Sort(out)
		return out
	}
	a := v4("everything-a", mcpPort, ips("10.0.0.1")...)
	b := v4("everything-b", mcpPort, ips("10.0.0.2")...)
	c := v4("everything-c", mcpPort, ips("10.0.0.3")...)

	for _, s := range []*EndpointSlice{a, b, c} {
		if !tr.set(s) {
			t.Errorf("set %s: no change", s.Name)
		}
	}
	if diff := cmp.Diff(names(), []string{"everything-a", "everything-b", "everything-c"}); diff != "" {
		t.Errorf("after sets (-got +want):\n%s", diff)
	}
	if !tr.remove("everything-b", false) || tr.remove("everything-z", false) {
		t.Error("remove: want a change for a known slice only")
	}

	// Relabelled away from the Service: gone. Another namespace: never in.
	moved := *a
	moved.Labels = map[string]string{LabelServiceName: "other"}
	if !tr.set(&moved) {
		t.Error("relabel: no change")
	}
	elsewhere := *c
	elsewhere.Name, elsewhere.Namespace = "everything-x", "default"
	tr.set(&elsewhere)
	if diff := cmp.Diff(names(), []string{"everything-c"}); diff != "" {
		t.Errorf("after relabel (-got +want):\n%s", diff)
	}

	// A list replaces everything; what it lacks is logged as gone.
	stray := moved
	stray.Name = "other-x"
	tr.replace([]EndpointSlice{*a, *b, stray})
	if diff := cmp.Diff(names(), []string{"everything-a", "everything-b"}); diff != "" {
		t.Errorf("after replace (-got +want):\n%s", diff)
	}
	if got := logs.lines("slice=everything-c relisted=true"); len(got) != 1 {
		t.Errorf("the slice a list lacked was not logged as gone: %q", got)
	}
}

func TestNewKubernetesValidates(t *testing.T) {
	if _, err := NewKubernetes(KubernetesOptions{Service: testService}); err == nil {
		t.Error("no client: no error")
	}
	if _, err := NewKubernetes(KubernetesOptions{Client: &apiClient{}, Service: ServiceRef{Name: "x"}}); err == nil {
		t.Error("no namespace: no error")
	}
}
