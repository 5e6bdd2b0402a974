package taskbackend_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/taskbackend"
)

func start(t *testing.T, opts taskbackend.Options) (*taskbackend.Server, *taskbackend.Client) {
	t.Helper()
	s := taskbackend.New("b1", opts)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, &taskbackend.Client{URL: hs.URL}
}

func wantCode(t *testing.T, what string, err error, code, status int) {
	t.Helper()
	var e *taskbackend.Error
	if !errors.As(err, &e) || e.Code != code || e.HTTPStatus != status {
		t.Errorf("%s: %v, want JSON-RPC error %d with HTTP %d", what, err, code, status)
	}
}

func TestTaskLifecycle(t *testing.T) {
	for _, sse := range []bool{false, true} {
		s, c := start(t, taskbackend.Options{SSE: sse})
		ctx := t.Context()

		// Completed at its first poll.
		created, err := c.CreateTask(ctx, "work", nil)
		if err != nil {
			t.Fatal(err)
		}
		if created.Status != "working" || created.TTLMs == nil || *created.TTLMs != 3_600_000 || created.PollIntervalMs != 100 || len(created.TaskID) != 32 {
			t.Errorf("creation %+v", created)
		}
		got, err := c.GetTask(ctx, created.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ResultType != "complete" || got.Status != "completed" || got.Text() != "done by b1" {
			t.Errorf("tasks/get %+v (%s)", got, got.Result)
		}

		// Working until cancelled.
		slow, err := c.CreateTask(ctx, "work", map[string]any{"ms": -1})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.GetTask(ctx, slow.TaskID); err != nil || got.Status != "working" {
			t.Fatalf("a never-ending task: %+v, %v", got, err)
		}
		if err := c.CancelTask(ctx, slow.TaskID); err != nil {
			t.Fatal(err)
		}
		if got, err := c.GetTask(ctx, slow.TaskID); err != nil || got.Status != "cancelled" {
			t.Fatalf("after tasks/cancel: %+v, %v", got, err)
		}

		// The SEP's message flow: input required, answered by tasks/update.
		greet, err := c.CreateTask(ctx, "greet", nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err = c.GetTask(ctx, greet.TaskID)
		if err != nil || got.Status != "input_required" || got.InputRequests["name"] == nil {
			t.Fatalf("greet: %+v, %v", got, err)
		}
		if err := c.UpdateTask(ctx, greet.TaskID, map[string]any{"name": map[string]any{"action": "accept", "content": map[string]any{"name": "Luca"}}}); err != nil {
			t.Fatal(err)
		}
		if got, err := c.GetTask(ctx, greet.TaskID); err != nil || got.Status != "completed" || got.Text() != "Hello, Luca!" {
			t.Fatalf("greet after tasks/update: %+v, %v", got, err)
		}
		if s.Created() != 3 || s.Tasks() != 3 || s.UnknownTaskRequests() != 0 {
			t.Errorf("created %d, held %d, unknown requests %d", s.Created(), s.Tasks(), s.UnknownTaskRequests())
		}
	}
}

// An unknown task id is -32602 (Invalid params) for every tasks method,
// and counted.
func TestUnknownTask(t *testing.T) {
	s, c := start(t, taskbackend.Options{})
	ctx := t.Context()
	_, err := c.GetTask(ctx, "no-such-task")
	wantCode(t, "tasks/get", err, taskbackend.CodeInvalidParams, http.StatusOK)
	if !taskbackend.IsUnknownTask(err) {
		t.Errorf("IsUnknownTask(%v) = false", err)
	}
	wantCode(t, "tasks/update", c.UpdateTask(ctx, "no-such-task", map[string]any{}), taskbackend.CodeInvalidParams, http.StatusOK)
	wantCode(t, "tasks/cancel", c.CancelTask(ctx, "no-such-task"), taskbackend.CodeInvalidParams, http.StatusOK)
	if n := s.UnknownTaskRequests(); n != 3 {
		t.Errorf("unknown task requests counted %d, want 3", n)
	}
}

// A task is gone TTL after its creation.
func TestTaskExpiry(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 7, 28, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	_, c := start(t, taskbackend.Options{TTL: time.Minute, Now: clock})
	ctx := t.Context()
	task, err := c.CreateTask(ctx, "work", map[string]any{"ms": -1})
	if err != nil {
		t.Fatal(err)
	}
	now.Add(int64(time.Minute - time.Millisecond))
	if _, err := c.GetTask(ctx, task.TaskID); err != nil {
		t.Fatalf("before its TTL: %v", err)
	}
	now.Add(int64(time.Millisecond))
	_, err = c.GetTask(ctx, task.TaskID)
	wantCode(t, "tasks/get after the TTL", err, taskbackend.CodeInvalidParams, http.StatusOK)
}

// A client that does not declare the extension gets no task: -32021.
func TestExtensionNotDeclared(t *testing.T) {
	_, c := start(t, taskbackend.Options{})
	ctx := t.Context()
	task, err := c.CreateTask(ctx, "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.NoExtension = true
	_, err = c.CreateTask(ctx, "work", nil)
	wantCode(t, "tools/call", err, taskbackend.CodeMissingCapability, http.StatusBadRequest)
	_, err = c.GetTask(ctx, task.TaskID)
	wantCode(t, "tasks/get", err, taskbackend.CodeMissingCapability, http.StatusBadRequest)
	// tasks/result was removed by the SEP.
	c.NoExtension = false
	wantCode(t, "tasks/result", c.Call(ctx, "tasks/result", task.TaskID, map[string]any{"taskId": task.TaskID}, nil), taskbackend.CodeMethodNotFound, http.StatusNotFound)
}

// The metadata headers are checked against the body.
func TestHeaderValidation(t *testing.T) {
	s, c := start(t, taskbackend.Options{})
	ctx := t.Context()
	task, err := c.CreateTask(ctx, "work", map[string]any{"ms": -1})
	if err != nil {
		t.Fatal(err)
	}
	body := func(method, version string) []byte {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": map[string]any{
			"taskId": task.TaskID,
			"_meta": map[string]any{"io.modelcontextprotocol/protocolVersion": version,
				"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{taskbackend.Extension: map[string]any{}}}},
		}})
		return b
	}
	tests := []struct {
		name    string
		version string // the body's
		headers map[string]string
		status  int
		code    int
	}{
		{"valid", "2026-07-28", map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": task.TaskID}, 200, 0},
		{"Base64 sentinel name", "2026-07-28", map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": "=?base64?" + b64(task.TaskID) + "?="}, 200, 0},
		{"no Mcp-Name", "2026-07-28", map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get"}, 400, taskbackend.CodeHeaderMismatch},
		{"another task's name", "2026-07-28", map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": "other"}, 400, taskbackend.CodeHeaderMismatch},
		{"wrong Mcp-Method", "2026-07-28", map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/cancel", "Mcp-Name": task.TaskID}, 400, taskbackend.CodeHeaderMismatch},
		{"no protocol version header", "2026-07-28", map[string]string{"Mcp-Method": "tasks/get", "Mcp-Name": task.TaskID}, 400, taskbackend.CodeHeaderMismatch},
		{"version header and body differ", "2026-07-28", map[string]string{"MCP-Protocol-Version": "2025-11-25", "Mcp-Method": "tasks/get", "Mcp-Name": task.TaskID}, 400, taskbackend.CodeHeaderMismatch},
		{"unsupported version", "2025-11-25", map[string]string{"MCP-Protocol-Version": "2025-11-25", "Mcp-Method": "tasks/get", "Mcp-Name": task.TaskID}, 400, taskbackend.CodeUnsupportedProtocol},
	}
	for _, tt := range tests {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urlOf(c), bytes.NewReader(body("tasks/get", tt.version)))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range tt.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Error *struct{ Code int } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		code := 0
		if m.Error != nil {
			code = m.Error.Code
		}
		if resp.StatusCode != tt.status || code != tt.code {
			t.Errorf("%s: HTTP %d error %d, want HTTP %d error %d", tt.name, resp.StatusCode, code, tt.status, tt.code)
		}
	}
	resp, err := http.Get(urlOf(c))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: HTTP %d, want 405", resp.StatusCode)
	}
	if s.UnknownTaskRequests() != 0 {
		t.Errorf("rejected requests counted as unknown tasks")
	}
}

// Names that are not plain ASCII travel in the Base64 sentinel form.
func TestEncodeHeaderValue(t *testing.T) {
	for in, want := range map[string]string{
		"get_weather":   "get_weather",
		"héllo":         "=?base64?aMOpbGxv?=",
		" padded":       "=?base64?IHBhZGRlZA==?=",
		"=?base64?x?=":  "=?base64?PT9iYXNlNjQ/eD89?=",
		"line\nbreak":   "=?base64?bGluZQpicmVhaw==?=",
		"tab\tinside":   "=?base64?dGFiCWluc2lkZQ==?=",
		"visible~ascii": "visible~ascii",
	} {
		if got := taskbackend.EncodeHeaderValue(in); got != want {
			t.Errorf("EncodeHeaderValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func urlOf(c *taskbackend.Client) string { return c.URL }

// A started backend serves on its address until killed; its tasks die
// with it.
func TestStartAndKill(t *testing.T) {
	b, err := taskbackend.Start("b2", "127.0.0.1:0", taskbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Kill)
	c := &taskbackend.Client{URL: b.URL() + "/mcp"}
	task, err := c.CreateTask(t.Context(), "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetTask(t.Context(), task.TaskID); err != nil || got.Text() != "done by b2" {
		t.Fatalf("tasks/get: %+v, %v", got, err)
	}
	b.Kill()
	if _, err := c.GetTask(t.Context(), task.TaskID); err == nil {
		t.Error("a killed backend answered")
	}
}
