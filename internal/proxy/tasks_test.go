package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/taskbackend"
)

// The responses below are SEP-2663's examples (seps/2663-tasks-extension.md
// in modelcontextprotocol/modelcontextprotocol), verbatim where marked, and
// variations on them.
var taskResponseTests = []struct {
	name     string
	body     string
	response bool
	task     bool
	id       string
	ttl      time.Duration
}{
	{"SEP: CreateTaskResult example", `{
  "jsonrpc": "2.0",
  "id": 1,
  "result": {
    "resultType": "task",
    "taskId": "786512e2-9e0d-44bd-8f29-789f320fe840",
    "status": "working",
    "statusMessage": "The operation is now in progress.",
    "createdAt": "2025-11-25T10:30:00Z",
    "lastUpdatedAt": "2025-11-25T10:40:00Z",
    "ttlMs": 60000,
    "pollIntervalMs": 5000
  }
}`, true, true, "786512e2-9e0d-44bd-8f29-789f320fe840", time.Minute},
	{"SEP: message flow creation", `{"jsonrpc":"2.0","id":2,"result":{"resultType":"task","taskId":"786512e2-9e0d-44bd-8f29-789f320fe840","status":"working","createdAt":"2025-11-25T10:30:00Z","lastUpdatedAt":"2025-11-25T10:50:00Z","ttlMs":3600000,"pollIntervalMs":5000}}`,
		true, true, "786512e2-9e0d-44bd-8f29-789f320fe840", time.Hour},
	{"SEP: task created already failed", `{"jsonrpc":"2.0","id":4,"result":{"resultType":"task","taskId":"786512e2-9e0d-44bd-8f29-789f820fe840","status":"failed","createdAt":"2025-11-25T10:30:00Z","lastUpdatedAt":"2025-11-25T10:40:00Z","ttlMs":3600000,"statusMessage":"Tool execution failed: API rate limit exceeded","error":{"code":-32603,"message":"API rate limit exceeded"}}}`,
		true, true, "786512e2-9e0d-44bd-8f29-789f820fe840", time.Hour},
	{"SEP: tasks/get result (resultType complete)", `{"jsonrpc":"2.0","id":3,"result":{"resultType":"complete","taskId":"786512e2-9e0d-44bd-8f29-789f320fe840","status":"working","createdAt":"2025-11-25T10:30:00Z","lastUpdatedAt":"2025-11-25T10:50:00Z","ttlMs":3600000,"pollIntervalMs":5000}}`,
		true, false, "", 0},
	{"SEP: tasks/update ack", `{"jsonrpc":"2.0","id":6,"result":{"resultType":"complete"}}`, true, false, "", 0},
	{"SEP: task not found", `{"jsonrpc":"2.0","id":70,"error":{"code":-32602,"message":"Failed to retrieve task: Task not found"}}`, true, false, "", 0},
	{"SEP: missing client capability", `{"jsonrpc":"2.0","id":1,"error":{"code":-32021,"message":"Missing required client capability","data":{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`, true, false, "", 0},
	{"plain CallToolResult", `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"resultType task"}],"isError":false}}`, true, false, "", 0},
	{"ttlMs null: unlimited", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t","status":"working","ttlMs":null}}`, true, true, "t", session.TaskTTLUnlimited},
	{"ttlMs absent", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t","status":"working"}}`, true, true, "t", 0},
	{"ttlMs past the cap", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t","ttlMs":99999999999999999999999}}`, true, true, "t", session.MaxTaskTTL},
	{"ttlMs with an exponent", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t","ttlMs":1.5e3}}`, true, true, "t", 1500 * time.Millisecond},
	{"ttlMs exponent past the cap", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t","ttlMs":1e300}}`, true, true, "t", session.MaxTaskTTL},
	{"ttlMs negative", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t","ttlMs":-5}}`, true, true, "t", 0},
	{"ttlMs a string", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t","ttlMs":"60000"}}`, true, true, "t", 0},
	{"members in any order, nested decoys", `{"result":{"ttlMs":1000,"meta":{"taskId":"inner","resultType":"complete"},"taskId":"outer","resultType":"task"},"id":"x","jsonrpc":"2.0"}`, true, true, "outer", time.Second},
	{"escaped task id", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"a\"b\u00e9","ttlMs":1000}}`, true, true, "a\"bé", time.Second},
	{"escaped member name", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","task\u0049d":"t","ttlMs":1000}}`, true, true, "t", time.Second},
	{"member names fold case, as encoding/json's", `{"jsonrpc":"2.0","id":1,"RESULT":{"ResultType":"task","TASKID":"t"}}`, true, true, "t", 0},
	{"resultType value is exact", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"Task","taskId":"t"}}`, true, false, "", 0},
	{"empty task id", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":""}}`, true, false, "", 0},
	{"numeric task id", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":7}}`, true, false, "", 0},
	{"result not an object", `{"jsonrpc":"2.0","id":1,"result":"task"}`, true, false, "", 0},
	{"a request is no response", `{"jsonrpc":"2.0","id":1,"method":"tools/call","result":{"resultType":"task","taskId":"t"}}`, false, false, "", 0},
	{"notification", `{"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"t","status":"completed"}}`, false, false, "", 0},
	{"batch", `[{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t"}}]`, false, false, "", 0},
	{"truncated", `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t"`, false, false, "", 0},
	{"not JSON", `event: message`, false, false, "", 0},
}

func TestParseTaskResponse(t *testing.T) {
	for _, tt := range taskResponseTests {
		t.Run(tt.name, func(t *testing.T) {
			tc, response, ok := parseTaskResponse([]byte(tt.body))
			if response != tt.response || ok != tt.task || tc.ID != tt.id || tc.TTL != tt.ttl {
				t.Errorf("got %+v response %v task %v; want id %q ttl %v response %v task %v", tc, response, ok, tt.id, tt.ttl, tt.response, tt.task)
			}
		})
	}
}

// The JSON body of a creation, read in pieces of every size: the task is
// reported once, before the reader gets the byte that completes the
// message (so tether stores it before the client can poll), and the body
// is relayed unchanged.
func TestWatchTasksJSON(t *testing.T) {
	for _, tt := range taskResponseTests {
		for _, chunk := range []int{1, 7, 4096} {
			body := tt.body + "\n"
			got, calls, seenAt := readWatched(t, body, false, chunk)
			if got != body {
				t.Fatalf("%s: body changed: %q", tt.name, got)
			}
			wantCalls := 0
			if tt.task && !strings.HasPrefix(tt.body, "[") {
				wantCalls = 1
			}
			if len(calls) != wantCalls {
				t.Fatalf("%s (reads of %d): onTask called %d times, want %d", tt.name, chunk, len(calls), wantCalls)
			}
			if wantCalls == 1 {
				if calls[0].ID != tt.id || calls[0].TTL != tt.ttl {
					t.Errorf("%s: reported %+v", tt.name, calls[0])
				}
				if end := strings.LastIndexByte(tt.body, '}') + 1; seenAt[0] >= end {
					t.Errorf("%s (reads of %d): reported after the reader had %d bytes; the message ends at %d", tt.name, chunk, seenAt[0], end)
				}
			}
		}
	}
}

// An SSE response stream: notifications, a server request, comments and
// ids before the response, data split over lines, CRLF line ends.
func TestWatchTasksSSE(t *testing.T) {
	creation := `{"jsonrpc":"2.0","id":2,"result":{"resultType":"task","taskId":"786512e2-9e0d-44bd-8f29-789f320fe840","status":"working","ttlMs":3600000,"pollIntervalMs":5000}}`
	half := strings.Index(creation, `"result":`) + len(`"result":`) // a line break there is white space
	tests := []struct {
		name   string
		stream string
		want   []taskCreation
	}{
		{"one event", "event: message\ndata: " + creation + "\n\n", []taskCreation{{"786512e2-9e0d-44bd-8f29-789f320fe840", time.Hour}}},
		{"after notifications and a request", ": keep-alive\n\n" +
			"id: 1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n" +
			"id: 2\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"elicitation/create\",\"params\":{}}\n\n" +
			"id: 3\ndata:" + creation + "\n\n", []taskCreation{{"786512e2-9e0d-44bd-8f29-789f320fe840", time.Hour}}},
		{"data over two lines, CRLF", "id: 9\r\ndata: " + creation[:half] + "\r\ndata: " + creation[half:] + "\r\n\r\n",
			[]taskCreation{{"786512e2-9e0d-44bd-8f29-789f320fe840", time.Hour}}},
		{"a large event first", "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":\"" + strings.Repeat("x", maxTaskMessage+10) + "\"}}\n\n" +
			"data: " + creation + "\n\n", []taskCreation{{"786512e2-9e0d-44bd-8f29-789f320fe840", time.Hour}}},
		{"an ordinary result", "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[]}}\n\n", nil},
		{"events after the response are not read", "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[]}}\n\ndata: " + creation + "\n\n", nil},
		{"an event never ended", "data: " + creation + "\n", nil},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 5, 64 << 10} {
			got, calls, seenAt := readWatched(t, tt.stream, true, chunk)
			if got != tt.stream {
				t.Fatalf("%s: stream changed", tt.name)
			}
			if len(calls) != len(tt.want) || (len(calls) == 1 && calls[0] != tt.want[0]) {
				t.Fatalf("%s (reads of %d): reported %+v, want %+v", tt.name, chunk, calls, tt.want)
			}
			if len(calls) == 1 && seenAt[0] >= len(tt.stream) {
				t.Errorf("%s (reads of %d): reported after the whole stream was read", tt.name, chunk)
			}
		}
	}
}

// readWatched reads body through watchTasks in reads of at most chunk
// bytes, and returns what was read, the tasks reported, and how many bytes
// the reader had received when each was.
func readWatched(t *testing.T, body string, sse bool, chunk int) (string, []taskCreation, []int) {
	t.Helper()
	var out bytes.Buffer
	var calls []taskCreation
	var seenAt []int
	w := watchTasks(io.NopCloser(iotest.HalfReader(strings.NewReader(body))), sse, func(tc taskCreation) {
		calls = append(calls, tc)
		seenAt = append(seenAt, out.Len())
	})
	buf := make([]byte, chunk)
	for {
		n, err := w.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.String(), calls, seenAt
}

// Parsing a creation costs one allocation: the task id.
func TestParseTaskResponseAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	body := []byte(taskResponseTests[0].body)
	if n := testing.AllocsPerRun(100, func() {
		if _, _, ok := parseTaskResponse(body); !ok {
			t.Fatal("not a task")
		}
	}); n > 1 {
		t.Errorf("parseTaskResponse allocates %.1f times, want at most 1", n)
	}
	plain := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}`)
	if n := testing.AllocsPerRun(100, func() { parseTaskResponse(plain) }); n != 0 {
		t.Errorf("parseTaskResponse of an ordinary result allocates %.1f times", n)
	}
}

// The fast scan of a result agrees with encoding/json on every well-formed
// input.
func FuzzScanTaskResultMatchesEncodingJSON(f *testing.F) {
	for _, tt := range taskResponseTests {
		var m struct {
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal([]byte(tt.body), &m) == nil && m.Result != nil {
			f.Add(string(m.Result))
		}
	}
	f.Add(`{"resultType":"task","taskId":"a","resultType":5}`)
	f.Add(`{"taskId":null,"resultType":"task"}`)
	f.Add(`{"resultType":"task","taſkId":"t"}`)
	f.Fuzz(func(t *testing.T, s string) {
		b := []byte(s)
		if !json.Valid(b) {
			return
		}
		fast, okFast := scanTaskResult(b)
		slow, okSlow := scanTaskResultSlow(b)
		if okFast != okSlow || fast != slow {
			t.Errorf("scan %+v %v, encoding/json %+v %v for %s", fast, okFast, slow, okSlow, s)
		}
	})
}

// The reference tasks backend's own answers, JSON and SSE, read through
// watchTasks: the id reported is the one the backend polls by.
func TestWatchTasksReferenceBackend(t *testing.T) {
	for _, sse := range []bool{false, true} {
		backend := taskbackend.New("b1", taskbackend.Options{SSE: sse, TTL: 90 * time.Second, WorkFor: -1})
		srv := httptest.NewServer(backend)
		t.Cleanup(srv.Close)
		resp := postToolsCall(t, srv.URL)
		if isEventStream(resp.Header.Get("Content-Type")) != sse {
			t.Fatalf("SSE %v: Content-Type %q", sse, resp.Header.Get("Content-Type"))
		}
		var calls []taskCreation
		w := watchTasks(resp.Body, isEventStream(resp.Header.Get("Content-Type")), func(tc taskCreation) { calls = append(calls, tc) })
		if _, err := io.Copy(io.Discard, w); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if len(calls) != 1 || calls[0].TTL != 90*time.Second {
			t.Fatalf("SSE %v: reported %+v, want one task with a 90s TTL", sse, calls)
		}
		c := &taskbackend.Client{URL: srv.URL}
		if got, err := c.GetTask(t.Context(), calls[0].ID); err != nil || got.Status != "working" {
			t.Errorf("SSE %v: polling the reported id: %+v, %v", sse, got, err)
		}
	}
}

// The pieces of task affinity end to end, short of the routing itself:
// 100 tasks created on 3 reference backends, each recorded by one
// replica's Redis store from inside the response read, are found by
// another replica's store and polled and cancelled on the backend the
// record names, with no request reaching a backend that lacks the task.
func TestTaskRecordsAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	replica := func() *session.Redis {
		opt, err := redis.ParseURL(rs.URL())
		if err != nil {
			t.Fatal(err)
		}
		s := session.NewRedis(session.RedisOptions{Client: session.NewRedisClient(opt, time.Second), Timeout: time.Second})
		t.Cleanup(func() { s.Close() })
		return s
	}
	creator, poller := replica(), replica()
	var backends []*taskbackend.Backend
	byID := map[string]*taskbackend.Backend{}
	for i := range 3 {
		b, err := taskbackend.Start("b"+strconv.Itoa(i), "127.0.0.1:0", taskbackend.Options{WorkFor: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Kill)
		backends = append(backends, b)
		byID["pod-"+b.Name()] = b
	}
	ctx := t.Context()
	const principal = "v1:principal"
	var created []string
	for i := range 100 {
		b := backends[i%3]
		resp := postToolsCall(t, b.URL())
		var putErr error
		recorded := false
		body := watchTasks(resp.Body, isEventStream(resp.Header.Get("Content-Type")), func(tc taskCreation) {
			recorded = true
			putErr = creator.PutTask(ctx, session.TaskRecord{TaskID: tc.ID, BackendID: "pod-" + b.Name(), BackendURL: b.URL(), Principal: principal, TTL: tc.TTL})
		})
		var res struct {
			Result taskbackend.Task `json:"result"`
		}
		if err := json.NewDecoder(body).Decode(&res); err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, body)
		body.Close()
		if !recorded || putErr != nil {
			t.Fatalf("task %d: recorded %v, %v", i, recorded, putErr)
		}
		created = append(created, res.Result.TaskID)
	}
	for _, id := range created {
		rec, err := poller.GetTask(ctx, id)
		if err != nil {
			t.Fatalf("task %s: %v", id, err)
		}
		b := byID[rec.BackendID]
		if b == nil || rec.Principal != principal || rec.TTL != time.Hour {
			t.Fatalf("task %s: record %+v", id, rec)
		}
		c := &taskbackend.Client{URL: b.URL()}
		if got, err := c.GetTask(ctx, id); err != nil || got.Status != "working" {
			t.Fatalf("task %s on %s: %+v, %v", id, b.Name(), got, err)
		}
		if err := c.CancelTask(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range backends {
		if b.Created() != 34 && b.Created() != 33 || b.UnknownTaskRequests() != 0 {
			t.Errorf("%s: created %d, requests for tasks it lacks %d", b.Name(), b.Created(), b.UnknownTaskRequests())
		}
	}
}

// postToolsCall sends a task-augmented tools/call of the work tool.
func postToolsCall(t *testing.T, url string) *http.Response {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"work","arguments":{},"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", "work")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// BenchmarkWatchTasks is the cost the watcher adds to a task-capable
// tools/call response, a creation (JSON body, SSE stream) or an ordinary
// result.
func BenchmarkWatchTasks(b *testing.B) {
	creation := `{"jsonrpc":"2.0","id":2,"result":{"resultType":"task","taskId":"786512e2-9e0d-44bd-8f29-789f320fe840","status":"working","createdAt":"2025-11-25T10:30:00Z","lastUpdatedAt":"2025-11-25T10:50:00Z","ttlMs":3600000,"pollIntervalMs":5000}}`
	plain := `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"` + strings.Repeat("x", 2000) + `"}],"isError":false}}`
	for _, bc := range []struct {
		name string
		sse  bool
		body string
	}{
		{"json creation", false, creation},
		{"sse creation", true, "id: 1\nevent: message\ndata: " + creation + "\n\n"},
		{"json ordinary result", false, plain},
	} {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 32<<10)
			src := strings.NewReader(bc.body)
			found := 0
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				src.Reset(bc.body)
				w := watchTasks(io.NopCloser(src), bc.sse, func(taskCreation) { found++ })
				for {
					if _, err := w.Read(buf); err != nil {
						break
					}
				}
				w.Close()
			}
			if strings.Contains(bc.body, `"task"`) && found == 0 {
				b.Fatal("no task found")
			}
		})
	}
}
