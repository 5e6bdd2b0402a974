// Package taskbackend is an MCP server implementing the tasks extension
// (io.modelcontextprotocol/tasks, SEP-2663) at protocol version 2026-07-28,
// and a client for it: the backend of tether's task-affinity tests.
//
// go-sdk v1.8.0 does not implement the extension (its results know
// resultType "complete" and "input_required" only, and it has no tasks/*
// methods), so this is a small server of its own, written from the SEP's
// text (seps/2663-tasks-extension.md in modelcontextprotocol/
// modelcontextprotocol) and the 2026-07-28 Streamable HTTP transport page.
// Like any server without shared task storage, it keeps its tasks in
// process memory: a task exists only on the instance that created it,
// which is why tether must route tasks/* there.
//
// What it implements:
//   - POST only (GET and DELETE: 405), one JSON-RPC request per POST, no
//     sessions; the MCP-Protocol-Version header must be 2026-07-28 and
//     match the body's _meta (else 400 with -32020 or -32022).
//   - Mcp-Method on every request and Mcp-Name on tools/call (the tool
//     name) and tasks/* (the task id) are checked against the body, plain
//     or in the Base64 sentinel form: a missing or mismatched header is
//     400 with -32020 (HeaderMismatch).
//   - server/discover advertises the extension; tools/list lists two tools.
//   - tools/call of "work" answers a CreateTaskResult when the request's
//     _meta capabilities declare the extension, and -32021 (Missing
//     Required Client Capability) otherwise. The task completes after
//     arguments.ms milliseconds (Options.WorkFor by default; negative:
//     never), its result naming the server.
//   - tools/call of "greet" creates a task that needs input, as the SEP's
//     message flow: input_required with an elicitation under
//     inputRequests["name"]; a tasks/update answering it completes the
//     task with "Hello, NAME!".
//   - tasks/get returns the DetailedTask (resultType "complete");
//     tasks/update and tasks/cancel acknowledge (resultType "complete").
//     An unknown or expired task id is -32602 (Invalid params) for all
//     three; a client not declaring the extension gets -32021.
//   - tasks/result, removed by the SEP, and every other method: 404 with
//     -32601.
//   - Tasks expire TTL after their creation (ttlMs), and at most MaxTasks
//     are kept.
package taskbackend

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Protocol constants of the 2026-07-28 revision and SEP-2663.
const (
	protocolVersion = "2026-07-28"
	Extension       = "io.modelcontextprotocol/tasks"

	metaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	metaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"

	CodeInvalidParams       = -32602
	CodeMethodNotFound      = -32601
	codeInternal            = -32603
	CodeHeaderMismatch      = -32020
	CodeMissingCapability   = -32021
	CodeUnsupportedProtocol = -32022
)

// Options configures a Server. The zero value is usable.
type Options struct {
	// WorkFor is how long a "work" task works when its call gives no ms
	// argument; default 0 (the task is completed at its first poll).
	WorkFor time.Duration
	// TTL is every task's ttlMs; default 1h.
	TTL time.Duration
	// PollInterval is every task's pollIntervalMs; default 100ms.
	PollInterval time.Duration
	// MaxTasks bounds the tasks held; default 100,000. A creation beyond
	// it, once expired tasks are dropped, is -32603.
	MaxTasks int
	// SSE answers tools/call with an event stream (a comment, then the
	// response event) instead of a JSON body.
	SSE bool
	// Now is the server's clock; nil means time.Now.
	Now func() time.Time
}

// Server is the tasks backend. It is an http.Handler; its tasks live in
// its memory.
type Server struct {
	name string
	opts Options

	mu    sync.Mutex
	tasks map[string]*task

	created, unknown atomic.Int64
}

// task is one task; guarded by Server.mu.
type task struct {
	id        string
	tool      string
	status    string // working, input_required, completed, cancelled, failed
	message   string
	created   time.Time
	updated   time.Time
	doneAt    time.Time // a working "work" task completes then (zero: never)
	result    json.RawMessage
	inputReqs map[string]json.RawMessage
}

// New returns a server whose results name it name.
func New(name string, opts Options) *Server {
	if opts.TTL <= 0 {
		opts.TTL = time.Hour
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 100 * time.Millisecond
	}
	if opts.MaxTasks <= 0 {
		opts.MaxTasks = 100_000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Server{name: name, opts: opts, tasks: map[string]*task{}}
}

// Name is the name the server's results carry.
func (s *Server) Name() string { return s.name }

// Tasks returns the number of tasks held (expired ones not yet dropped
// included).
func (s *Server) Tasks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tasks)
}

// Created returns the number of tasks created.
func (s *Server) Created() int64 { return s.created.Load() }

// UnknownTaskRequests returns the number of tasks/* requests for a task
// this server does not hold: through a correct router, only requests for
// tasks that expired or whose server was lost.
func (s *Server) UnknownTaskRequests() int64 { return s.unknown.Load() }

// request is a JSON-RPC request as read here.
type request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  struct {
		Name           string                     `json:"name"`
		TaskID         string                     `json:"taskId"`
		Arguments      map[string]json.RawMessage `json:"arguments"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
		Meta           struct {
			ProtocolVersion    string `json:"io.modelcontextprotocol/protocolVersion"`
			ClientCapabilities struct {
				Extensions map[string]json.RawMessage `json:"extensions"`
			} `json:"io.modelcontextprotocol/clientCapabilities"`
		} `json:"_meta"`
	} `json:"params"`
}

// rpcError is a JSON-RPC error with the HTTP status it is sent with.
type rpcError struct {
	status  int
	code    int
	message string
	data    any
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	var req request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&req); err != nil || req.JSONRPC != "2.0" || req.Method == "" {
		writeError(w, nil, &rpcError{status: http.StatusBadRequest, code: -32600, message: "invalid request"})
		return
	}
	if req.ID == nil { // a notification: nothing to answer
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if rerr := checkHeaders(r, &req); rerr != nil {
		writeError(w, req.ID, rerr)
		return
	}
	result, rerr := s.dispatch(&req)
	if rerr != nil {
		writeError(w, req.ID, rerr)
		return
	}
	msg, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
	if err != nil {
		writeError(w, req.ID, &rpcError{status: http.StatusInternalServerError, code: codeInternal, message: err.Error()})
		return
	}
	if s.opts.SSE && req.Method == "tools/call" {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, ": %s is working\n\nid: 1\nevent: message\ndata: %s\n\n", s.name, msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(msg)
}

// checkHeaders validates the request metadata headers against the body
// (transport page, "Server Validation").
func checkHeaders(r *http.Request, req *request) *rpcError {
	mismatch := func(format string, args ...any) *rpcError {
		return &rpcError{status: http.StatusBadRequest, code: CodeHeaderMismatch, message: "Header mismatch: " + fmt.Sprintf(format, args...)}
	}
	pv := r.Header.Get("MCP-Protocol-Version")
	switch {
	case pv == "":
		return mismatch("MCP-Protocol-Version header missing")
	case pv != req.Params.Meta.ProtocolVersion:
		return mismatch("MCP-Protocol-Version header value %q does not match body value %q", pv, req.Params.Meta.ProtocolVersion)
	case pv != protocolVersion:
		return &rpcError{status: http.StatusBadRequest, code: CodeUnsupportedProtocol, message: "Unsupported protocol version",
			data: map[string]any{"supported": []string{protocolVersion}, "requested": pv}}
	}
	if m := r.Header.Get("Mcp-Method"); m != req.Method {
		return mismatch("Mcp-Method header value %q does not match body value %q", m, req.Method)
	}
	var want string
	switch req.Method {
	case "tools/call":
		want = req.Params.Name
	case "tasks/get", "tasks/update", "tasks/cancel":
		want = req.Params.TaskID
	default:
		return nil
	}
	vv, ok := r.Header["Mcp-Name"]
	if !ok || len(vv) != 1 {
		return mismatch("Mcp-Name header missing")
	}
	got, ok := decodeHeaderValue(vv[0])
	if !ok || got != want {
		return mismatch("Mcp-Name header value %q does not match body value %q", vv[0], want)
	}
	return nil
}

// decodeHeaderValue undoes the Base64 sentinel encoding
// (=?base64?...?=), which is case-sensitive.
func decodeHeaderValue(v string) (string, bool) {
	enc, ok := strings.CutPrefix(v, "=?base64?")
	if !ok {
		return v, true
	}
	enc, ok = strings.CutSuffix(enc, "?=")
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(enc)
	return string(b), err == nil
}

// EncodeHeaderValue is how a client carries value in Mcp-Name: as is when
// it is plain visible ASCII, in the Base64 sentinel form otherwise.
func EncodeHeaderValue(value string) string {
	plain := value != "" && value == strings.TrimSpace(value)
	for i := 0; plain && i < len(value); i++ {
		plain = value[i] >= 0x20 && value[i] <= 0x7e
	}
	if plain && !strings.HasPrefix(value, "=?base64?") {
		return value
	}
	return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(value)) + "?="
}

func writeError(w http.ResponseWriter, id json.RawMessage, e *rpcError) {
	body := map[string]any{"code": e.code, "message": e.message}
	if e.data != nil {
		body["data"] = e.data
	}
	msg := map[string]any{"jsonrpc": "2.0", "error": body}
	if id != nil {
		msg["id"] = id
	}
	w.Header().Set("Content-Type", "application/json")
	status := e.status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(msg)
}

func (s *Server) dispatch(req *request) (any, *rpcError) {
	declared := req.Params.Meta.ClientCapabilities.Extensions[Extension] != nil
	switch req.Method {
	case "server/discover":
		return map[string]any{
			"resultType":        "complete",
			"supportedVersions": []string{protocolVersion},
			"capabilities":      map[string]any{"tools": map[string]any{}, "extensions": map[string]any{Extension: map[string]any{}}},
			"_meta":             map[string]any{"io.modelcontextprotocol/serverInfo": map[string]any{"name": s.name, "version": "1.0.0"}},
		}, nil
	case "tools/list":
		return map[string]any{"resultType": "complete", "tools": []any{
			map[string]any{"name": "work", "description": "Works for ms milliseconds as a task.",
				"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"ms": map[string]any{"type": "integer"}}}},
			map[string]any{"name": "greet", "description": "Asks the user's name, then greets them, as a task.",
				"inputSchema": map[string]any{"type": "object"}},
		}}, nil
	case "tools/call":
		if !declared {
			return nil, missingCapability()
		}
		return s.create(req)
	case "tasks/get", "tasks/update", "tasks/cancel":
		if !declared {
			return nil, missingCapability()
		}
		return s.taskMethod(req)
	}
	return nil, &rpcError{status: http.StatusNotFound, code: CodeMethodNotFound, message: "Method not found: " + req.Method}
}

func missingCapability() *rpcError {
	return &rpcError{status: http.StatusBadRequest, code: CodeMissingCapability, message: "Missing required client capability",
		data: map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{Extension: map[string]any{}}}}}
}

func (s *Server) create(req *request) (any, *rpcError) {
	now := s.opts.Now()
	t := &task{tool: req.Params.Name, status: "working", created: now, updated: now}
	switch req.Params.Name {
	case "work":
		work := s.opts.WorkFor
		if raw, ok := req.Params.Arguments["ms"]; ok {
			var ms int64
			if json.Unmarshal(raw, &ms) != nil {
				return nil, &rpcError{code: CodeInvalidParams, message: "ms must be an integer"}
			}
			work = time.Duration(ms) * time.Millisecond
		}
		if work >= 0 {
			t.doneAt = now.Add(work)
		}
	case "greet":
		t.status = "input_required"
		t.inputReqs = map[string]json.RawMessage{"name": json.RawMessage(`{"method":"elicitation/create","params":{"mode":"form","message":"Please enter your name.","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}}`)}
	default:
		return nil, &rpcError{code: CodeInvalidParams, message: "Unknown tool: " + req.Params.Name}
	}
	var id [16]byte
	rand.Read(id[:]) // unguessable, as the SEP requires; never fails
	t.id = hex.EncodeToString(id[:])

	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tasks) >= s.opts.MaxTasks {
		s.dropExpiredLocked(now)
		if len(s.tasks) >= s.opts.MaxTasks {
			return nil, &rpcError{code: codeInternal, message: "too many tasks"}
		}
	}
	s.tasks[t.id] = t
	s.created.Add(1)
	// Stored before answering: a tasks/get for the id resolves from now on.
	res := s.viewLocked(t)
	res["resultType"] = "task"
	return res, nil
}

func (s *Server) dropExpiredLocked(now time.Time) {
	for id, t := range s.tasks {
		if s.expired(t, now) {
			delete(s.tasks, id)
		}
	}
}

func (s *Server) expired(t *task, now time.Time) bool { return !now.Before(t.created.Add(s.opts.TTL)) }

func (s *Server) taskMethod(req *request) (any, *rpcError) {
	now := s.opts.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[req.Params.TaskID]
	if t != nil && s.expired(t, now) {
		delete(s.tasks, t.id)
		t = nil
	}
	if t == nil {
		s.unknown.Add(1)
		return nil, &rpcError{code: CodeInvalidParams, message: "Failed to retrieve task: Task not found"}
	}
	s.advanceLocked(t, now)
	switch req.Method {
	case "tasks/get":
		res := s.viewLocked(t)
		res["resultType"] = "complete"
		return res, nil
	case "tasks/update":
		// Responses to keys not outstanding are ignored, as the SEP says.
		if raw, ok := req.Params.InputResponses["name"]; ok && t.status == "input_required" && t.inputReqs["name"] != nil {
			var resp struct {
				Action  string `json:"action"`
				Content struct {
					Name string `json:"name"`
				} `json:"content"`
			}
			if json.Unmarshal(raw, &resp) == nil && resp.Action == "accept" {
				t.inputReqs = nil
				t.finishLocked(now, "Hello, "+resp.Content.Name+"!")
			} else {
				t.inputReqs = nil
				t.status, t.updated = "cancelled", now
				t.message = "the user declined"
			}
		}
	case "tasks/cancel":
		if !terminal(t.status) {
			t.status, t.updated, t.message = "cancelled", now, "cancelled by the client"
			t.inputReqs = nil
		}
	}
	return map[string]any{"resultType": "complete"}, nil
}

// advanceLocked completes a "work" task whose time has come.
func (s *Server) advanceLocked(t *task, now time.Time) {
	if t.status == "working" && !t.doneAt.IsZero() && !now.Before(t.doneAt) {
		t.finishLocked(now, "done by "+s.name)
	}
}

func (t *task) finishLocked(now time.Time, text string) {
	t.status, t.updated = "completed", now
	t.result, _ = json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}, "isError": false})
}

func terminal(status string) bool {
	return status == "completed" || status == "cancelled" || status == "failed"
}

// viewLocked is the task's DetailedTask without its resultType.
func (s *Server) viewLocked(t *task) map[string]any {
	v := map[string]any{
		"taskId":         t.id,
		"status":         t.status,
		"createdAt":      t.created.UTC().Format(time.RFC3339Nano),
		"lastUpdatedAt":  t.updated.UTC().Format(time.RFC3339Nano),
		"ttlMs":          s.opts.TTL.Milliseconds(),
		"pollIntervalMs": s.opts.PollInterval.Milliseconds(),
	}
	if t.message != "" {
		v["statusMessage"] = t.message
	}
	switch t.status {
	case "completed":
		v["result"] = t.result
	case "input_required":
		v["inputRequests"] = t.inputReqs
	}
	return v
}
