package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/taskbackend"
)

// TestExplainTask: a task created through tether is explained by its id:
// where it lives, whether it is bound to its creator, when it expires; an
// id that is neither a session nor a task is reported as such.
func TestExplainTask(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := taskbackend.Start("task-0", "127.0.0.1:0", taskbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Kill)
	s := startServerPrepared(t, nil, nil, b.URL())
	admin := "http://" + s.AdminAddr().String()
	c := &taskbackend.Client{URL: "http://" + s.ClientAddr().String() + "/mcp", Header: http.Header{"Authorization": {"Bearer alice"}}}
	task, err := c.CreateTask(ctx, "work", map[string]any{"ms": -1})
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runCLI("explain", task.TaskID, "--admin", admin)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"task      " + task.TaskID,
		"lives on  " + b.URL() + "  ready",
		"bound to its creator's credentials",
		"TTL 1h0m0s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}

	resp, err := http.Get(admin + "/debug/tasks/" + task.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	var v server.TaskView
	err = json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/debug/tasks: %d, %v", resp.StatusCode, err)
	}
	if v.Task.ID != task.TaskID || v.Task.BackendURL != b.URL() || !v.Task.PrincipalBound || v.Task.TTLSeconds != 3600 || v.Task.IDHash == task.TaskID {
		t.Errorf("/debug/tasks view: %+v", v.Task)
	}

	code, out, errOut = runCLI("explain", "no-such-task", "--admin", admin)
	if code != 1 || out != "" || !strings.Contains(errOut, `session "no-such-task" not found, nor a task of that id`) {
		t.Errorf("unknown id: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
