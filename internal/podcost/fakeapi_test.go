package podcost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/discovery"
)

// fakeAPI is an API server in memory for the unit tests, which run in
// synctest bubbles (fake time): one Lease with resourceVersion checks, as
// the API server does them, and pods that take merge patches of their
// pod-deletion-cost annotation and nothing else. The tests against the
// real API server are in kube_test.go.
type fakeAPI struct {
	mu      sync.Mutex
	lease   map[string]any // nil: no Lease
	rv      int
	pods    map[string]string // name → annotation value ("" unset)
	patches []patchEvent
	// forbidPods answers pod patches with 403, as without the Role.
	forbidPods bool
	missed     map[string]int // patches of pods that do not exist, by name
}

type patchEvent struct {
	at   time.Time
	by   string
	pod  string
	cost string
}

func newFakeAPI(pods ...string) *fakeAPI {
	f := &fakeAPI{pods: map[string]string{}, missed: map[string]int{}}
	for _, p := range pods {
		f.pods[p] = ""
	}
	return f
}

const testLeasePath = "/apis/coordination.k8s.io/v1/namespaces/mcp/leases"

// caller is one replica's connection to the fake: it can be cut (a
// network partition) or refused (no RBAC).
type caller struct {
	f         *fakeAPI
	who       string
	cut       atomic.Bool
	forbidden bool
	calls     atomic.Int64
	// afterGet, when set, runs after each Lease read this caller makes,
	// before the caller goes on: another replica's move in between.
	afterGet func()
}

func (f *fakeAPI) caller(who string) *caller { return &caller{f: f, who: who} }

func (c *caller) Do(ctx context.Context, r discovery.Request) ([]byte, error) {
	c.calls.Add(1)
	if c.cut.Load() {
		return nil, errors.New("dial tcp: connection refused")
	}
	if c.forbidden {
		return nil, &discovery.APIError{Code: http.StatusForbidden, Reason: "Forbidden", Message: "forbidden"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := c.f.do(c.who, r)
	if r.Method == http.MethodGet && c.afterGet != nil {
		c.afterGet()
	}
	return b, err
}

func apiErr(code int, reason string) error {
	return &discovery.APIError{Code: code, Reason: reason, Message: reason}
}

func (f *fakeAPI) do(who string, r discovery.Request) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Path == testLeasePath+"/tether-deletion-cost-everything" && r.Method == http.MethodGet:
		if f.lease == nil {
			return nil, apiErr(http.StatusNotFound, "NotFound")
		}
		return json.Marshal(f.lease)
	case r.Path == testLeasePath && r.Method == http.MethodPost:
		if f.lease != nil {
			return nil, apiErr(http.StatusConflict, "AlreadyExists")
		}
		return f.storeLease(r.Body)
	case r.Path == testLeasePath+"/tether-deletion-cost-everything" && r.Method == http.MethodPut:
		var obj struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(r.Body, &obj); err != nil || f.lease == nil {
			return nil, apiErr(http.StatusBadRequest, "BadRequest")
		}
		// As the API server: a resourceVersion makes the update
		// conditional; without one it is unconditional.
		if v := obj.Metadata.ResourceVersion; v != "" && v != strconv.Itoa(f.rv) {
			return nil, apiErr(http.StatusConflict, "Conflict")
		}
		return f.storeLease(r.Body)
	case strings.HasPrefix(r.Path, "/api/v1/namespaces/mcp/pods/") && r.Method == http.MethodPatch:
		name := strings.TrimPrefix(r.Path, "/api/v1/namespaces/mcp/pods/")
		var p map[string]map[string]map[string]string
		if r.ContentType != "application/merge-patch+json" || json.Unmarshal(r.Body, &p) != nil ||
			len(p) != 1 || len(p["metadata"]) != 1 || len(p["metadata"]["annotations"]) != 1 {
			return nil, apiErr(http.StatusBadRequest, fmt.Sprintf("not a merge patch of the annotation alone: %s", r.Body))
		}
		cost, ok := p["metadata"]["annotations"][Annotation]
		if !ok {
			return nil, apiErr(http.StatusBadRequest, "BadRequest")
		}
		if f.forbidPods {
			return nil, apiErr(http.StatusForbidden, "Forbidden")
		}
		if _, exists := f.pods[name]; !exists {
			f.missed[name]++
			return nil, apiErr(http.StatusNotFound, "NotFound")
		}
		f.pods[name] = cost
		f.patches = append(f.patches, patchEvent{at: time.Now(), by: who, pod: name, cost: cost})
		return []byte(`{"kind":"Pod"}`), nil
	}
	return nil, apiErr(http.StatusNotFound, "NotFound "+r.Method+" "+r.Path)
}

func (f *fakeAPI) storeLease(body []byte) ([]byte, error) {
	var obj map[string]any
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, apiErr(http.StatusBadRequest, "BadRequest")
	}
	f.rv++
	obj["metadata"].(map[string]any)["resourceVersion"] = strconv.Itoa(f.rv)
	f.lease = obj
	return json.Marshal(obj)
}

// holder is the Lease's holderIdentity ("" when free or absent).
func (f *fakeAPI) holder() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lease == nil {
		return ""
	}
	h, _ := f.lease["spec"].(map[string]any)["holderIdentity"].(string)
	return h
}

func (f *fakeAPI) annotations() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for k, v := range f.pods {
		out[k] = v
	}
	return out
}

func (f *fakeAPI) missedPatches(pod string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.missed[pod]
}

func (f *fakeAPI) patchLog() []patchEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]patchEvent(nil), f.patches...)
}

// counts is a mutable session count per pod, "mcp/NAME" → n.
type counts struct {
	mu sync.Mutex
	m  map[string]int64
}

func newCounts(m map[string]int64) *counts { return &counts{m: m} }

func (c *counts) set(pod string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[pod] = n
}

func (c *counts) get() []PodSessions {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []PodSessions
	for p, n := range c.m {
		out = append(out, PodSessions{Pod: p, Sessions: n})
	}
	return out
}

// logBuffer collects log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) lines(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, substr) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

var everything = discovery.ServiceRef{Namespace: "mcp", Name: "everything"}

// start runs a Writer until the returned stop is called; stop waits for Run
// to return (the Lease released).
func start(t *testing.T, o Options) (w *Writer, stop func()) {
	t.Helper()
	o.Service = everything
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	return w, func() {
		cancel()
		<-done
	}
}
