package taskbackend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"
)

// Client speaks 2026-07-28 with the tasks extension declared on every
// request, as a client of SEP-2663 does: the metadata headers
// (MCP-Protocol-Version, Mcp-Method, Mcp-Name) match the body. It reads
// JSON and SSE answers alike. Its zero value is not usable: set URL.
type Client struct {
	URL    string
	HTTP   *http.Client // nil: http.DefaultClient
	Header http.Header  // added to every request (e.g. Authorization)
	// NoExtension leaves the tasks extension out of the capabilities, as a
	// client that does not support it.
	NoExtension bool

	ids atomic.Int64
}

// Error is a JSON-RPC error answer, with the HTTP status it came with.
type Error struct {
	HTTPStatus int
	Code       int
	Message    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("JSON-RPC error %d (HTTP %d): %s", e.Code, e.HTTPStatus, e.Message)
}

// IsUnknownTask reports the error SEP-2663 specifies for an unknown task
// (-32602).
func IsUnknownTask(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CodeInvalidParams
}

// Task is a task as tasks/get and the creation result carry it.
type Task struct {
	ResultType     string                     `json:"resultType"`
	TaskID         string                     `json:"taskId"`
	Status         string                     `json:"status"`
	StatusMessage  string                     `json:"statusMessage"`
	CreatedAt      string                     `json:"createdAt"`
	LastUpdatedAt  string                     `json:"lastUpdatedAt"`
	TTLMs          *int64                     `json:"ttlMs"`
	PollIntervalMs int64                      `json:"pollIntervalMs"`
	Result         json.RawMessage            `json:"result"`
	Error          json.RawMessage            `json:"error"`
	InputRequests  map[string]json.RawMessage `json:"inputRequests"`
}

// Text returns the first text content of a completed task's result.
func (t *Task) Text() string {
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(t.Result, &r) != nil || len(r.Content) == 0 {
		return ""
	}
	return r.Content[0].Text
}

// CreateTask calls tool with args and returns the task the server created.
// A result that is not a CreateTaskResult is an error.
func (c *Client) CreateTask(ctx context.Context, tool string, args map[string]any) (*Task, error) {
	if args == nil {
		args = map[string]any{}
	}
	var t Task
	if err := c.Call(ctx, "tools/call", tool, map[string]any{"name": tool, "arguments": args}, &t); err != nil {
		return nil, err
	}
	if t.ResultType != "task" || t.TaskID == "" {
		return nil, fmt.Errorf("tools/call %s: not a CreateTaskResult (resultType %q)", tool, t.ResultType)
	}
	return &t, nil
}

// GetTask polls a task (tasks/get).
func (c *Client) GetTask(ctx context.Context, id string) (*Task, error) {
	var t Task
	if err := c.Call(ctx, "tasks/get", id, map[string]any{"taskId": id}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// UpdateTask answers a task's input requests (tasks/update).
func (c *Client) UpdateTask(ctx context.Context, id string, inputResponses map[string]any) error {
	return c.Call(ctx, "tasks/update", id, map[string]any{"taskId": id, "inputResponses": inputResponses}, nil)
}

// CancelTask asks for a task's cancellation (tasks/cancel).
func (c *Client) CancelTask(ctx context.Context, id string) error {
	return c.Call(ctx, "tasks/cancel", id, map[string]any{"taskId": id}, nil)
}

// Call sends one request, name going in Mcp-Name ("" for none), and
// decodes its result into out (if not nil).
func (c *Client) Call(ctx context.Context, method, name string, params map[string]any, out any) error {
	caps := map[string]any{}
	if !c.NoExtension {
		caps["extensions"] = map[string]any{Extension: map[string]any{}}
	}
	params["_meta"] = map[string]any{metaProtocolVersion: protocolVersion, metaClientCapabilities: caps}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.ids.Add(1), "method": method, "params": params})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, vv := range c.Header {
		req.Header[k] = vv
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", protocolVersion)
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", EncodeHeaderValue(name))
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, err := readResponse(resp)
	if err != nil {
		return fmt.Errorf("%s: HTTP %d: %w", method, resp.StatusCode, err)
	}
	var m struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		return fmt.Errorf("%s: HTTP %d: %w: %.200s", method, resp.StatusCode, err, msg)
	}
	if m.Error != nil {
		return &Error{HTTPStatus: resp.StatusCode, Code: m.Error.Code, Message: m.Error.Message}
	}
	if resp.StatusCode != http.StatusOK || m.Result == nil {
		return fmt.Errorf("%s: HTTP %d without a result: %.200s", method, resp.StatusCode, msg)
	}
	if out != nil {
		return json.Unmarshal(m.Result, out)
	}
	return nil
}

// readResponse returns the JSON-RPC response of a JSON body, or of an SSE
// stream (the first event whose data is a response).
func readResponse(resp *http.Response) ([]byte, error) {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "text/event-stream" {
		return io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	var data []string
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if line == "" {
			msg := []byte(strings.Join(data, "\n"))
			data = data[:0]
			var probe struct {
				Method string          `json:"method"`
				Result json.RawMessage `json:"result"`
				Error  json.RawMessage `json:"error"`
			}
			if json.Unmarshal(msg, &probe) == nil && probe.Method == "" && (probe.Result != nil || probe.Error != nil) {
				return msg, nil
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(v, " "))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("event stream ended without a response")
}
