package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/session"
)

const modernVersion = "2026-07-28"

// modernBody is a tools/call as a 2026-07-28 client writes it: the version
// in _meta as well as in the header.
func modernBody(method, paramsMember string) string {
	return `{"jsonrpc":"2.0","id":7,"method":"` + method + `","params":{` + paramsMember +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"` + modernVersion + `",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
}

// jsonRPCError reads a JSON-RPC error answer.
type jsonRPCError struct {
	ID    json.RawMessage `json:"id"`
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Every malformed modern request is answered by tether with the spec's
// error and never reaches a backend; the well-formed ones, and legacy
// requests whatever their routing headers say, are forwarded.
func TestModernHeaderValidation(t *testing.T) {
	rb := newRecordingBackend(t, nil)
	h := newStaticHarness(t, rb.URL)

	const pv = "Mcp-Protocol-Version"
	refused := []struct {
		name    string
		body    string
		headers []string
		code    int
		message string // a part of the error message
	}{
		{"method missing", modernBody("tools/list", ""), []string{pv, modernVersion},
			-32020, "missing required Mcp-Method header"},
		{"method mismatch", modernBody("tools/list", ""), []string{pv, modernVersion, "Mcp-Method", "prompts/list"},
			-32020, "Mcp-Method header value 'prompts/list' does not match body value 'tools/list'"},
		{"method case differs", modernBody("tools/list", ""), []string{pv, modernVersion, "Mcp-Method", "TOOLS/LIST"},
			-32020, "does not match body value 'tools/list'"},
		{"name missing", modernBody("tools/call", `"name":"whoami",`), []string{pv, modernVersion, "Mcp-Method", "tools/call"},
			-32020, "missing required Mcp-Name header for method 'tools/call'"},
		{"name mismatch", modernBody("tools/call", `"name":"bar",`), []string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "foo"},
			-32020, "Mcp-Name header value 'foo' does not match body value 'bar'"},
		{"prompt name mismatch", modernBody("prompts/get", `"name":"bar",`), []string{pv, modernVersion, "Mcp-Method", "prompts/get", "Mcp-Name", "foo"},
			-32020, "does not match body value 'bar'"},
		{"uri mismatch", modernBody("resources/read", `"uri":"file:///a",`), []string{pv, modernVersion, "Mcp-Method", "resources/read", "Mcp-Name", "file:///b"},
			-32020, "Mcp-Name header value 'file:///b' does not match body value 'file:///a'"},
		{"resources/read named by params.name", modernBody("resources/read", `"name":"file:///a","uri":"file:///b",`), []string{pv, modernVersion, "Mcp-Method", "resources/read", "Mcp-Name", "file:///a"},
			-32020, "does not match body value 'file:///b'"},
		{"task id missing", modernBody("tasks/get", `"taskId":"t-1",`), []string{pv, modernVersion, "Mcp-Method", "tasks/get"},
			-32020, "missing required Mcp-Name header for method 'tasks/get'"},
		{"task id mismatch", modernBody("tasks/cancel", `"taskId":"t-1",`), []string{pv, modernVersion, "Mcp-Method", "tasks/cancel", "Mcp-Name", "t-2"},
			-32020, "Mcp-Name header value 't-2' does not match body value 't-1'"},
		{"base64 name mismatch", modernBody("tools/call", `"name":"bar",`), []string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "=?base64?Zm9v?="},
			-32020, "Mcp-Name header value 'foo' does not match body value 'bar'"},
		{"base64 invalid", modernBody("tools/call", `"name":"bar",`), []string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "=?base64?SGVs!!!bG8=?="},
			-32020, "not valid =?base64?...?= encoding"},
		{"name not in body", modernBody("tools/call", ""), []string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "whoami"},
			-32020, "params.name is missing"},
		{"name twice in body", modernBody("tools/call", `"name":"whoami","name":"other",`), []string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "whoami"},
			-32020, "appears more than once"},
		{"version mismatch with _meta", `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-09-01"}}}`,
			[]string{pv, modernVersion, "Mcp-Method", "tools/list"},
			-32020, "MCP-Protocol-Version header value '2026-07-28' does not match body value '2026-09-01'"},
		{"batch", `[` + modernBody("tools/list", "") + `]`, []string{pv, modernVersion, "Mcp-Method", "tools/list"},
			-32600, "must be a single JSON-RPC message"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post("", tc.body, tc.headers...)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400; body %s", resp.StatusCode, body)
			}
			var e jsonRPCError
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("answer is not JSON-RPC: %v: %s", err, body)
			}
			if e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.message) {
				t.Errorf("error %d %q, want %d containing %q", e.Error.Code, e.Error.Message, tc.code, tc.message)
			}
			if tc.code == -32020 && string(e.ID) != "7" {
				t.Errorf("error id %s, want the request's 7", e.ID)
			}
			if !strings.HasPrefix(e.Error.Message, "Header mismatch") && tc.code == -32020 {
				t.Errorf("message %q does not start as the spec's (\"Header mismatch: ...\")", e.Error.Message)
			}
		})
	}
	if req, _ := rb.last(); req != nil {
		t.Fatalf("a refused request reached the backend: %s %v", req.Method, req.Header)
	}

	forwarded := []struct {
		name    string
		body    string
		headers []string
	}{
		{"modern tools/call", modernBody("tools/call", `"name":"whoami",`),
			[]string{pv, modernVersion, "mcp-method", "tools/call", "MCP-NAME", "whoami"}},
		{"modern base64 name", modernBody("tools/call", `"name":"Hello, 世界",`),
			[]string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "=?base64?SGVsbG8sIOS4lueVjA==?="}},
		{"modern escaped body name", modernBody("tools/call", `"n\u0061me":"wh\u006fami",`),
			[]string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "whoami"}},
		{"modern notification without Mcp-Method", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}`,
			[]string{pv, modernVersion}},
		// Older versions: headers neither required nor trusted, routed as before.
		{"legacy mismatching headers", modernBody("tools/call", `"name":"bar",`),
			[]string{pv, "2025-11-25", "Mcp-Method", "prompts/get", "Mcp-Name", "foo"}},
		{"no version", modernBody("tools/call", `"name":"bar",`), nil},
		{"malformed version", modernBody("tools/call", `"name":"bar",`), []string{pv, "9999"}},
		{"modern version with a session", modernBody("tools/call", `"name":"bar",`), []string{pv, modernVersion}},
	}
	for i, tc := range forwarded {
		t.Run(tc.name, func(t *testing.T) {
			sid := ""
			if strings.Contains(tc.name, "session") {
				// A session tether does not know: 404 from tether, and
				// the request is judged as a legacy one, not -32020.
				sid = "unknown-session"
			}
			resp := h.post(sid, tc.body, tc.headers...)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if sid != "" {
				var e jsonRPCError
				json.Unmarshal(body, &e)
				if resp.StatusCode != http.StatusNotFound || e.Error.Code != -32001 {
					t.Fatalf("status %d %s, want the unknown session's 404", resp.StatusCode, body)
				}
				return
			}
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
				t.Fatalf("status %d, want it forwarded: %s", resp.StatusCode, body)
			}
			rb.mu.Lock()
			n := len(rb.requests)
			rb.mu.Unlock()
			if n != i+1 {
				t.Fatalf("backend saw %d requests, want %d", n, i+1)
			}
		})
	}

	// A valid modern tasks/get passes validation and is then routed by its
	// task record (taskroute.go): tether recorded no task "t-1", so it
	// answers SEP-2663's unknown-task error itself.
	resp := h.post("", modernBody("tasks/get", `"taskId":"t-1",`), pv, modernVersion, "Mcp-Method", "tasks/get", "Mcp-Name", "t-1")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e jsonRPCError
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusOK || e.Error.Code != -32602 || string(e.ID) != "7" {
		t.Fatalf("tasks/get of an unrecorded task: status %d %s, want 200 with -32602", resp.StatusCode, body)
	}
	rb.mu.Lock()
	n := len(rb.requests)
	rb.mu.Unlock()
	if n != len(forwarded)-1 {
		t.Fatalf("backend saw %d requests, want %d: the unrecorded task's request was forwarded", n, len(forwarded)-1)
	}
}

// go-sdk v1.8.0 peers on both sides at 2026-07-28: every call succeeds,
// and the calls, each its own pick, spread evenly over the backends.
func TestModernCallsSpreadWithGoSDKPeers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	modern := newHarness(t, harnessOptions{backends: 3, stateless: true})

	// Modern: 1,000 calls from 10 clients in parallel. Each call is its
	// own pick (no session), by in-flight load (p2c).
	const clients, callsEach = 10, 100
	var mu sync.Mutex
	perBackend := map[string]int{}
	errs := make(chan error, clients)
	for range clients {
		go func() {
			cs, err := connectAt(ctx, modern.endpoint(), modernVersion)
			if err != nil {
				errs <- err
				return
			}
			defer cs.Close()
			if v := cs.InitializeResult().ProtocolVersion; v != modernVersion {
				errs <- &versionError{v}
				return
			}
			for range callsEach {
				name, err := mcpbackend.Whoami(ctx, cs)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				perBackend[name]++
				mu.Unlock()
			}
			errs <- nil
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	spread := spreadOver3(t, perBackend, clients*callsEach)
	t.Logf("modern calls per backend %v: max/mean %.3f", perBackend, spread)
	if spread > 1.1 {
		t.Errorf("max/mean %.3f over 1,000 modern calls, want <= 1.1 (%v)", spread, perBackend)
	}

}

// Legacy clients keep working next to modern ones: against dual-era
// servers without a session, against stateful ones in sticky sessions;
// a modern client falls back to a legacy session where the servers are
// legacy-only.
func TestLegacyEraWithGoSDKPeers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dual := newHarness(t, harnessOptions{backends: 3, stateless: true})

	// Legacy (2025-11-25) against dual-era servers: no session is minted,
	// every call succeeds.
	cs, err := connectAt(ctx, dual.endpoint(), "2025-11-25")
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := mcpbackend.Whoami(ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	cs.Close()

	// Legacy against stateful servers: each session keeps its backend.
	legacy := newHarness(t, harnessOptions{backends: 3})
	homes := map[string]bool{}
	for range 6 {
		cs, err := connectAt(ctx, legacy.endpoint(), "2025-11-25")
		if err != nil {
			t.Fatal(err)
		}
		if cs.ID() == "" {
			t.Fatal("a legacy session against a stateful server has no id")
		}
		first, err := mcpbackend.Whoami(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		homes[first] = true
		for range 10 {
			got, err := mcpbackend.Whoami(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			if got != first {
				t.Fatalf("session %s moved from %s to %s", session.HashID(cs.ID()), first, got)
			}
		}
		cs.Close()
	}
	if len(homes) < 2 {
		t.Errorf("6 legacy sessions all placed on %v", homes)
	}

	// A modern client against the stateful (legacy-only) servers: go-sdk
	// falls back to initialize after the server's modern error, which
	// tether relays, and ends up in a sticky legacy session.
	cs, err = connectAt(ctx, legacy.endpoint(), modernVersion)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if cs.ID() == "" {
		t.Fatal("a modern client against a legacy server did not fall back to a session")
	}
	if _, err := mcpbackend.Whoami(ctx, cs); err != nil {
		t.Fatal(err)
	}
}

type versionError struct{ got string }

func (e *versionError) Error() string {
	return "negotiated protocol version " + e.got + ", want " + modernVersion
}

// connectAt opens a go-sdk client session asking for protocol version v.
func connectAt(ctx context.Context, endpoint, v string) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "era-client", Version: "1.0.0"}, nil)
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, DisableStandaloneSSE: true},
		&mcp.ClientSessionOptions{ProtocolVersion: v})
}

// The server span says which era a request is and what it names: mcp.name
// for tools, prompts and resources, a task's id only hashed; refused
// requests carry them too.
func TestEraSpanAttributes(t *testing.T) {
	rb := newRecordingBackend(t, nil)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	h := newTether(t, []string{rb.URL}, harnessOptions{tracer: tp.Tracer("test")})

	const pv = "Mcp-Protocol-Version"
	for _, tc := range []struct {
		name    string
		body    string
		headers []string
		want    map[attribute.Key]string // "" = absent
	}{
		{"modern tool", modernBody("tools/call", `"name":"whoami",`),
			[]string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "whoami"},
			map[attribute.Key]string{"mcp.era": "modern", "mcp.method": "tools/call", "mcp.name": "whoami",
				"mcp.protocol.version": modernVersion, "mcp.task.id": "", "tether.route": "stateless"}},
		{"modern task", modernBody("tasks/get", `"taskId":"task-secret",`),
			[]string{pv, modernVersion, "Mcp-Method", "tasks/get", "Mcp-Name", "task-secret"},
			map[attribute.Key]string{"mcp.era": "modern", "mcp.method": "tasks/get", "mcp.name": "",
				"mcp.task.id": session.HashID("task-secret")}},
		{"modern refused", modernBody("tools/call", `"name":"bar",`),
			[]string{pv, modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", "foo"},
			map[attribute.Key]string{"mcp.era": "modern", "mcp.method": "tools/call", "mcp.name": "bar", "tether.route": "refused"}},
		{"legacy resource", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///x"}}`,
			[]string{pv, "2025-11-25"},
			map[attribute.Key]string{"mcp.era": "legacy", "mcp.method": "resources/read", "mcp.name": "file:///x",
				"mcp.protocol.version": "2025-11-25"}},
		{"legacy list", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, nil,
			map[attribute.Key]string{"mcp.era": "legacy", "mcp.method": "tools/list", "mcp.name": "", "mcp.protocol.version": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClientSpan()
			resp := h.post("", tc.body, append([]string{"traceparent", c.traceparent()}, tc.headers...)...)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			got := attrs(waitServerSpan(t, sr, c.traceID).server)
			for k, want := range tc.want {
				v, ok := got[k]
				switch {
				case want == "" && ok:
					t.Errorf("%s = %q, want it absent", k, v.AsString())
				case want != "" && v.AsString() != want:
					t.Errorf("%s = %q, want %q", k, v.AsString(), want)
				}
			}
		})
	}
}

// tether_requests_total says the era and the method of each request, the
// method from a bounded set.
func TestEraAndMethodLabels(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 1, stateless: true, metrics: true})
	reg := h.metrics.Registry
	const pv = "Mcp-Protocol-Version"
	for _, req := range []struct {
		body    string
		headers []string
	}{
		{modernBody("tools/list", ""), []string{pv, modernVersion, "Mcp-Method", "tools/list"}},
		{modernBody("tools/list", ""), []string{pv, modernVersion}}, // refused: no Mcp-Method
		{modernBody("x/custom", ""), []string{pv, modernVersion, "Mcp-Method", "x/custom"}},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, []string{pv, "2025-11-25"}},
	} {
		resp := h.post("", req.body, req.headers...)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	waitRequests(t, reg, 4)
	for _, want := range []map[string]string{
		{"era": "modern", "method": "tools/list", "route": "stateless", "code": "200"},
		{"era": "modern", "method": "tools/list", "route": "refused", "code": "400"},
		{"era": "modern", "method": "other", "route": "stateless"},
		{"era": "legacy", "method": "tools/list", "route": "stateless", "code": "200"},
	} {
		if got := sampleValue(t, reg, "tether_requests_total", want); got != 1 {
			t.Errorf("tether_requests_total%v = %v, want 1", want, got)
		}
	}
}

// spreadOver3 checks that perBackend holds want calls over 3 backends and
// returns the spread: the busiest backend's calls over the mean.
func spreadOver3(t *testing.T, perBackend map[string]int, want int) float64 {
	t.Helper()
	total, most := 0, 0
	for _, n := range perBackend {
		total += n
		most = max(most, n)
	}
	if total != want || len(perBackend) != 3 {
		t.Fatalf("calls per backend %v: want %d calls over 3 backends", perBackend, want)
	}
	return float64(most) / (float64(total) / 3)
}
