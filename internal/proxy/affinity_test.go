package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

const affinityHeader = "Mcp-Param-Workspace"

// workspaceInput is the argument of the modern backends' tool: the
// workspace handle, which the tool's schema exposes as the
// Mcp-Param-Workspace header (SEP-2243's x-mcp-header), so that the
// go-sdk client sets the header from the argument.
type workspaceInput struct {
	Workspace string `json:"workspace"`
}

// startModernBackend runs a stateless go-sdk server, which speaks MCP
// 2026-07-28, whose tool "where" names the backend.
func startModernBackend(t *testing.T, name string) string {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1.0.0"}, nil)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "where",
		Description: "name the backend that serves this workspace",
		InputSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"workspace": map[string]any{"type": "string", "x-mcp-header": "Workspace"},
			},
			"required": []string{"workspace"},
		},
	}, func(ctx context.Context, req *mcp.CallToolRequest, in workspaceInput) (*mcp.CallToolResult, mcpbackendWhere, error) {
		return nil, mcpbackendWhere{Backend: name, Workspace: in.Workspace}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true})
	return testkit.StartServer(t, h).URL
}

type mcpbackendWhere struct {
	Backend   string `json:"backend"`
	Workspace string `json:"workspace"`
}

// TestAffinityHeaderRoutesByKey: a go-sdk client at 2026-07-28 calls a
// tool whose workspace argument travels as Mcp-Param-Workspace; with
// --affinity-header Mcp-Param-Workspace every call of a workspace reaches
// the one backend that PickByKey gives its value, on a balancer built
// independently (another replica), and the workspaces spread over the
// backends.
func TestAffinityHeaderRoutesByKey(t *testing.T) {
	names := map[string]string{} // URL → backend name
	var urls []string
	for i := range 3 {
		name := fmt.Sprintf("modern-%d", i)
		u := startModernBackend(t, name)
		names[u] = name
		urls = append(urls, u)
	}
	newBalancer := func() *balancer.Balancer {
		picker, err := balancer.NewPicker("p2c", nil)
		if err != nil {
			t.Fatal(err)
		}
		b := balancer.New(balancer.Options{Picker: picker, Affinity: &balancer.AffinityOptions{}})
		src, err := discovery.NewStatic(urls)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		synced := make(chan struct{})
		go src.Run(ctx, func(s discovery.Snapshot) {
			b.Update(s)
			select {
			case <-synced:
			default:
				close(synced)
			}
		})
		<-synced
		return b
	}
	bal := newBalancer()
	store := session.NewMemory(session.MemoryOptions{TTL: time.Hour, OnChange: proxy.CountSessions(bal)})
	t.Cleanup(func() { store.Close() })
	p := proxy.New(proxy.Config{Balancer: bal, Store: store, AffinityHeader: affinityHeader, AffinityArgument: "workspace"})
	front := testkit.StartServer(t, p)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "affinity-test", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: front.URL + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if got := cs.InitializeResult().ProtocolVersion; got != "2026-07-28" {
		t.Fatalf("negotiated protocol %q, want 2026-07-28", got)
	}
	// The client learns the tool's x-mcp-header annotation from the list.
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}

	other := newBalancer() // another replica's view of the same backends
	used := map[string]int{}
	for w := range 30 {
		workspace := fmt.Sprintf("ws-%d", w)
		home, err := other.PickByKey(workspace, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := names[home.String()]
		for range 4 {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "where", Arguments: workspaceInput{Workspace: workspace}})
			if err != nil {
				t.Fatalf("call for %s: %v", workspace, err)
			}
			raw, err := json.Marshal(res.StructuredContent)
			if err != nil {
				t.Fatal(err)
			}
			var got mcpbackendWhere
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if got.Workspace != workspace || got.Backend != want {
				t.Fatalf("call for %s reached %s (workspace %q), want %s, its endpoint by PickByKey", workspace, got.Backend, got.Workspace, want)
			}
			used[got.Backend]++
		}
	}
	if len(used) < 2 {
		t.Errorf("30 workspaces all reached %v, want them spread over the backends", used)
	}
	t.Logf("calls per backend: %v", used)
}

func TestAffinityHeaderNeedsAffinityBalancer(t *testing.T) {
	picker, err := balancer.NewPicker("p2c", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("proxy.New with AffinityHeader and a Balancer without Affinity did not panic")
		}
	}()
	proxy.New(proxy.Config{Balancer: balancer.New(balancer.Options{Picker: picker}), AffinityHeader: affinityHeader, AffinityArgument: "workspace"})
}

// TestAffinityHeaderValidated: tether routes on the affinity header only
// after checking it against the tool argument it carries, so a client
// cannot steer a call to another handle's backend with a header its body
// contradicts. A mismatch, or a header naming an argument the call lacks,
// is answered 400 with HeaderMismatch (-32020) and reaches no backend; a
// matching header (literal, Base64, or a number's JSON text) is routed.
func TestAffinityHeaderValidated(t *testing.T) {
	rb := newRecordingBackend(t, nil)
	picker, err := balancer.NewPicker("p2c", nil)
	if err != nil {
		t.Fatal(err)
	}
	bal := balancer.New(balancer.Options{Picker: picker, Affinity: &balancer.AffinityOptions{}})
	src, err := discovery.NewStatic([]string{rb.URL})
	if err != nil {
		t.Fatal(err)
	}
	synced := make(chan struct{})
	var once sync.Once
	go src.Run(t.Context(), func(s discovery.Snapshot) { bal.Update(s); once.Do(func() { close(synced) }) })
	<-synced
	store := session.NewMemory(session.MemoryOptions{})
	t.Cleanup(func() { store.Close() })
	p := proxy.New(proxy.Config{Balancer: bal, Store: store, AffinityHeader: affinityHeader, AffinityArgument: "workspace"})
	front := testkit.StartServer(t, p)

	call := func(arguments, header string) (int, jsonRPCError) {
		t.Helper()
		body := modernBody("tools/call", `"name":"where","arguments":`+arguments+`,`)
		req, err := http.NewRequest(http.MethodPost, front.URL+"/mcp", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", modernVersion)
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "where")
		if header != "" {
			req.Header.Set(affinityHeader, header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var e jsonRPCError
		json.Unmarshal(raw, &e)
		return resp.StatusCode, e
	}
	for _, tc := range []struct{ name, arguments, header, message string }{
		{"mismatch", `{"workspace":"ws-2"}`, "ws-1", "Mcp-Param-Workspace header value 'ws-1' does not match body value 'ws-2'"},
		{"argument missing", `{"other":"ws-1"}`, "ws-1", "params.arguments.workspace is missing"},
		{"argument an object", `{"workspace":{"id":"ws-1"}}`, "ws-1", "params.arguments.workspace is missing"},
		{"base64 mismatch", `{"workspace":"ws-2"}`, "=?base64?d3MtMQ==?=", "header value 'ws-1' does not match"},
		{"argument twice", `{"workspace":"ws-1","workspace":"ws-2"}`, "ws-1", "appears more than once"},
	} {
		status, e := call(tc.arguments, tc.header)
		if status != http.StatusBadRequest || e.Error.Code != -32020 || !strings.Contains(e.Error.Message, tc.message) {
			t.Errorf("%s: %d %d %q, want 400 -32020 containing %q", tc.name, status, e.Error.Code, e.Error.Message, tc.message)
		}
	}
	if req, _ := rb.last(); req != nil {
		t.Fatalf("a refused call reached the backend: %v", req.Header)
	}
	for _, tc := range []struct{ name, arguments, header string }{
		{"literal", `{"workspace":"ws-1"}`, "ws-1"},
		{"base64", `{"workspace":"Hello, 世界"}`, "=?base64?SGVsbG8sIOS4lueVjA==?="},
		{"number", `{"workspace":42}`, "42"},
		{"no header: picked by load", `{"workspace":"ws-1"}`, ""},
	} {
		if status, e := call(tc.arguments, tc.header); status != http.StatusOK || e.Error.Code != 0 {
			t.Errorf("%s: %d %d %q, want it forwarded", tc.name, status, e.Error.Code, e.Error.Message)
		}
	}
	if req, _ := rb.last(); req == nil || req.Header.Get(affinityHeader) != "" {
		t.Errorf("the last call (no header) did not reach the backend as sent: %v", req)
	}
}
