package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/taskbackend"
	"github.com/tether-mcp/tether/internal/testkit"
)

// Task routing (SEP-2663) through tether, against real task backends
// (internal/taskbackend) whose tasks live in their own memory.

// startTaskBackends starts n task backends; every other one answers
// tools/call with an event stream, so both creation paths are recorded.
func startTaskBackends(t *testing.T, n int) []*taskbackend.Backend {
	t.Helper()
	var bs []*taskbackend.Backend
	for i := range n {
		b, err := taskbackend.Start(fmt.Sprintf("task-%d", i), "127.0.0.1:0", taskbackend.Options{SSE: i%2 == 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Kill)
		bs = append(bs, b)
	}
	return bs
}

func taskURLs(bs []*taskbackend.Backend) []string {
	var urls []string
	for _, b := range bs {
		urls = append(urls, b.URL())
	}
	return urls
}

// misroutes is how many task requests reached a backend that does not
// hold the task.
func misroutes(bs []*taskbackend.Backend) (n int64) {
	for _, b := range bs {
		n += b.UnknownTaskRequests()
	}
	return n
}

func taskClient(h *harness, header ...string) *taskbackend.Client {
	c := &taskbackend.Client{URL: h.endpoint(), Header: http.Header{}}
	for i := 0; i+1 < len(header); i += 2 {
		c.Header.Set(header[i], header[i+1])
	}
	return c
}

// ownerOf polls a task (a "work" task with no ms is completed at its first
// poll, its result naming the backend that ran it) and returns that name.
func ownerOf(ctx context.Context, c *taskbackend.Client, id string) (string, error) {
	task, err := c.GetTask(ctx, id)
	if err != nil {
		return "", err
	}
	name, ok := strings.CutPrefix(task.Text(), "done by ")
	if task.Status != "completed" || !ok {
		return "", fmt.Errorf("task %s: status %q, result %q", id, task.Status, task.Text())
	}
	return name, nil
}

// TestTasksAcrossReplicas creates tasks through one replica and polls,
// updates and cancels them through another sharing its Redis: every
// request reaches the backend holding its task. When a backend dies, its
// tasks get the unknown-task error from tether, and the others keep
// working.
func TestTasksAcrossReplicas(t *testing.T) {
	const tasks = 100
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bs := startTaskBackends(t, 3)
	rds := redistest.Start(t)
	a := newTether(t, taskURLs(bs), harnessOptions{redis: rds, metrics: true})
	b := newTether(t, taskURLs(bs), harnessOptions{redis: rds, metrics: true})
	ca, cb := taskClient(a), taskClient(b)

	var ids []string
	for range tasks {
		task, err := ca.CreateTask(ctx, "work", nil)
		if err != nil {
			t.Fatalf("create through replica A: %v", err)
		}
		ids = append(ids, task.TaskID)
	}
	owner := map[string]string{}
	perBackend := map[string]int{}
	for _, id := range ids {
		name, err := ownerOf(ctx, cb, id)
		if err != nil {
			t.Fatalf("tasks/get through replica B: %v", err)
		}
		owner[id] = name
		perBackend[name]++
		if err := cb.UpdateTask(ctx, id, map[string]any{}); err != nil {
			t.Fatalf("tasks/update through replica B: %v", err)
		}
		if err := cb.CancelTask(ctx, id); err != nil {
			t.Fatalf("tasks/cancel through replica B: %v", err)
		}
	}
	if n := misroutes(bs); n != 0 {
		t.Fatalf("%d task requests reached a backend without the task", n)
	}
	if len(perBackend) < 2 {
		t.Fatalf("tasks were created on %v only: the creations were not spread", perBackend)
	}
	if got := sampleValue(t, b.metrics.Registry, "tether_task_routes_total", map[string]string{"result": "routed"}); got != 3*tasks {
		t.Fatalf("replica B routed %v task requests, want %d", got, 3*tasks)
	}
	if got := sampleValue(t, a.metrics.Registry, "tether_task_records_total", map[string]string{"result": "stored"}); got != tasks {
		t.Fatalf("replica A stored %v task records, want %d", got, tasks)
	}

	t.Logf("%d tasks created through replica A by backend: %v; polled, updated and cancelled through replica B: %d misroutes", tasks, perBackend, misroutes(bs))

	// A lost pod: its tasks are lost, and tether says so itself.
	dead := bs[0]
	dead.Kill()
	for _, id := range ids {
		for _, c := range []*taskbackend.Client{ca, cb} {
			name, err := ownerOf(ctx, c, id)
			if owner[id] != dead.Name() {
				if err != nil || name != owner[id] {
					t.Fatalf("task %s of live backend %s after %s died: owner %q, %v", id, owner[id], dead.Name(), name, err)
				}
				continue
			}
			var e *taskbackend.Error
			if !errors.As(err, &e) || e.Code != taskbackend.CodeInvalidParams || e.HTTPStatus != http.StatusOK {
				t.Fatalf("task %s of dead backend: %v, want the unknown-task error (-32602, HTTP 200)", id, err)
			}
		}
	}
	if n := misroutes(bs); n != 0 {
		t.Fatalf("%d task requests of the dead backend's tasks were sent to a live backend", n)
	}
	gone := sampleValue(t, a.metrics.Registry, "tether_task_routes_total", map[string]string{"result": "backend_gone"}) +
		sampleValue(t, b.metrics.Registry, "tether_task_routes_total", map[string]string{"result": "backend_gone"})
	if want := float64(2 * perBackend[dead.Name()]); gone != want {
		t.Fatalf("backend_gone counted %v times, want %v", gone, want)
	}
}

// TestTasksMemoryStore: one replica on the memory store routes tasks the
// same way, and answers an id it never recorded itself.
func TestTasksMemoryStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bs := startTaskBackends(t, 3)
	h := newTether(t, taskURLs(bs), harnessOptions{metrics: true})
	c := taskClient(h)
	for range 30 {
		task, err := c.CreateTask(ctx, "greet", nil)
		if err != nil {
			t.Fatal(err)
		}
		// greet needs input: the update must reach the task to complete it.
		if err := c.UpdateTask(ctx, task.TaskID, map[string]any{"name": map[string]any{"action": "accept", "content": map[string]any{"name": "Ada"}}}); err != nil {
			t.Fatal(err)
		}
		got, err := c.GetTask(ctx, task.TaskID)
		if err != nil || got.Status != "completed" || got.Text() != "Hello, Ada!" {
			t.Fatalf("task after update: %+v, %v", got, err)
		}
	}
	_, err := c.GetTask(ctx, "never-created")
	if !taskbackend.IsUnknownTask(err) {
		t.Fatalf("unknown task id: %v, want -32602", err)
	}
	if n := misroutes(bs); n != 0 {
		t.Fatalf("%d task requests reached a backend without the task (the unknown id included: tether must answer it)", n)
	}
	if got := sampleValue(t, h.metrics.Registry, "tether_task_routes_total", map[string]string{"result": "unknown"}); got != 1 {
		t.Fatalf("unknown counted %v times, want 1", got)
	}
}

// TestTasksPrincipalMismatch: a task is routed only for the credentials
// that created it; anyone else gets the answer for an unknown task.
func TestTasksPrincipalMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bs := startTaskBackends(t, 2)
	h := newTether(t, taskURLs(bs), harnessOptions{metrics: true})
	alice := taskClient(h, "Authorization", "Bearer alice")
	mallory := taskClient(h, "Authorization", "Bearer mallory")
	anonymous := taskClient(h)
	task, err := alice.CreateTask(ctx, "work", map[string]any{"ms": -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*taskbackend.Client{mallory, anonymous} {
		if _, err := c.GetTask(ctx, task.TaskID); !taskbackend.IsUnknownTask(err) {
			t.Fatalf("someone else's tasks/get: %v, want -32602", err)
		}
		if err := c.CancelTask(ctx, task.TaskID); !taskbackend.IsUnknownTask(err) {
			t.Fatalf("someone else's tasks/cancel: %v, want -32602", err)
		}
	}
	got, err := alice.GetTask(ctx, task.TaskID)
	if err != nil || got.Status != "working" {
		t.Fatalf("the creator's tasks/get: %+v, %v", got, err)
	}
	if n := misroutes(bs); n != 0 {
		t.Fatalf("%d task requests reached a backend", n)
	}
	if got := sampleValue(t, h.metrics.Registry, "tether_task_routes_total", map[string]string{"result": "principal_mismatch"}); got != 4 {
		t.Fatalf("principal_mismatch counted %v times, want 4", got)
	}
}

// TestTasksStoreOutage: while Redis does not answer, a created task's answer is
// still relayed (the task runs regardless), its polls get 503 with
// Retry-After rather than a verdict, and once Redis is back the task whose
// record timed out is routed or answered as unknown, never guessed.
func TestTasksStoreOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bs := startTaskBackends(t, 2)
	rds := redistest.Start(t)
	h := newTether(t, taskURLs(bs), harnessOptions{redis: rds, metrics: true})
	c := taskClient(h)
	recorded, err := c.CreateTask(ctx, "work", map[string]any{"ms": -1})
	if err != nil {
		t.Fatal(err)
	}

	// Frozen: connections stay open and nothing is answered, so every
	// store call runs into its timeout (the record's bound included).
	rds.Freeze()
	lost, err := c.CreateTask(ctx, "work", map[string]any{"ms": -1})
	if err != nil {
		t.Fatalf("a task created during the outage: %v, want its answer relayed", err)
	}
	if got := sampleValue(t, h.metrics.Registry, "tether_task_records_total", map[string]string{"result": "failed"}); got != 1 {
		t.Fatalf("failed records counted %v, want 1", got)
	}
	resp := h.post("", `{"jsonrpc":"2.0","id":9,"method":"tasks/get","params":{"taskId":"`+recorded.TaskID+`","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`,
		"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tasks/get", "Mcp-Name", recorded.TaskID)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("tasks/get during the outage: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	rds.Thaw()
	// The cache notices Redis is back on its own schedule: wait for the
	// recorded task to be routed again.
	testkit.EventuallyNoError(t, 20*time.Second, func() error {
		_, err := c.GetTask(ctx, recorded.TaskID)
		return err
	}, "the recorded task after Redis came back")
	// A write that timed out may still have reached Redis (it was in the
	// frozen server's socket): the task is then routed; if not, it is
	// unknown. Either way no backend is guessed (misroutes below).
	if _, err := c.GetTask(ctx, lost.TaskID); err != nil && !taskbackend.IsUnknownTask(err) {
		t.Fatalf("the task whose record timed out: %v, want it routed or the unknown-task error", err)
	}
	if n := misroutes(bs); n != 0 {
		t.Fatalf("%d task requests reached a backend without the task", n)
	}
}
