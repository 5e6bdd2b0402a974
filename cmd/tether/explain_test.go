package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

// explainFixture is tether in front of two go-sdk backends with one live
// client session.
type explainFixture struct {
	s        *server.Server
	admin    string
	backends map[string]*mcpbackend.Backend // by name
	cs       *mcp.ClientSession
	home     *mcpbackend.Backend // the backend holding the session
	// sent counts the client's requests other than GET streams; finished,
	// those tether's handler has returned from (and so recorded).
	sent, finished atomic.Int64
	// backendConns counts tether's open connections to each backend.
	backendConns connCounter
}

func newExplainFixture(t *testing.T) *explainFixture {
	t.Helper()
	return startExplainFixture(t, &mcp.StreamableClientTransport{})
}

// startExplainFixture connects the client with transport (its Endpoint and
// HTTPClient are filled in).
func startExplainFixture(t *testing.T, transport *mcp.StreamableClientTransport) *explainFixture {
	t.Helper()
	f := &explainFixture{backends: map[string]*mcpbackend.Backend{}}
	started := testkit.StartBackends(t, 2)
	for _, b := range started {
		f.backends[b.Name] = b
	}
	urls := testkit.URLs(started)
	f.s = startServerPrepared(t, nil, func(sc *server.Config) {
		sc.Transport = backend.NewTransportDial(sc.BackendH2C, f.backendConns.dialer(backend.Dial))
		sc.WrapHandler = func(handler http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodGet {
					defer f.finished.Add(1)
				}
				handler.ServeHTTP(w, r)
			})
		}
	}, urls...)
	f.admin = "http://" + f.s.AdminAddr().String()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	client := mcp.NewClient(&mcp.Implementation{Name: "explain-test", Version: "1"}, nil)
	transport.Endpoint = "http://" + f.s.ClientAddr().String() + "/mcp"
	transport.HTTPClient = &http.Client{Transport: countingTransport{&f.sent}}
	cs, err := client.Connect(ctx, transport, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	f.cs = cs
	name, err := mcpbackend.Whoami(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	f.home = f.backends[name]
	f.settle(t)
	return f
}

// settle waits until tether has finished (counted, and recorded in its
// decision log) every request the client has sent but its GET streams. The
// client can read a response to its end before tether's handler has
// returned and recorded it, so explain, asked at once, could show the
// decision before.
func (f *explainFixture) settle(t *testing.T) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool { return f.finished.Load() >= f.sent.Load() }, "tether to finish the client's requests")
}

// connCounter counts the open connections a transport has dialled, by
// address.
type connCounter struct {
	mu    sync.Mutex
	conns map[string]int
}

func (c *connCounter) open(addr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conns[addr]
}

func (c *connCounter) add(addr string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		c.conns = map[string]int{}
	}
	c.conns[addr] += n
}

// dialer wraps dial so that every connection it makes is counted until it
// is closed.
func (c *connCounter) dialer(dial func(context.Context, string, string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.add(addr, 1)
		return &countedConn{Conn: conn, release: func() { c.add(addr, -1) }}, nil
	}
}

type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// SyscallConn passes the socket through, as tether's client peeks at it
// before writing into a pooled connection.
func (c *countedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// countingTransport counts the requests sent, GET streams excepted.
type countingTransport struct{ sent *atomic.Int64 }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		c.sent.Add(1)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (f *explainFixture) other() *mcpbackend.Backend {
	for _, b := range f.backends {
		if b != f.home {
			return b
		}
	}
	return nil
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, func(string) string { return "" }, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestExplainLiveSession(t *testing.T) {
	f := newExplainFixture(t)
	sid := f.cs.ID()

	code, out, errOut := runCLI("explain", sid, "--admin", f.admin)
	if code != 0 {
		t.Fatalf("explain: exit %d, stderr %q", code, errOut)
	}
	t.Logf("tether explain:\n%s", out)
	for _, want := range []string{
		"session   " + sid,
		"mcp.session.id=" + session.HashID(sid),
		"lives on  " + f.home.URL() + "  ready, 1 session, ",
		"protocol 2025-", // the version the go-sdk client asked for
		"re-initialized      0 times",
		"placed  on " + f.home.URL(),
		"candidate", "load",
		f.home.URL() + "       0  <- chosen", // p2c weighed both idle backends
		f.other().URL(),
		"last re-initialization  none",
		"last decision  sticky, status 200",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q", want)
		}
	}

	// The flag may come first too.
	if code, out2, _ := runCLI("explain", "--admin", f.admin, sid); code != 0 || !strings.Contains(out2, f.home.URL()) {
		t.Errorf("explain --admin URL ID: exit %d", code)
	}
}

// After the session's backend dies, explain shows the move and why.
//
// The client opens no GET stream here: its stream to the killed backend
// would end at a moment of its own (a sticky decision recorded before or
// after the move), and its reconnection, 1–2 s later, could be the request
// that moves the session (a stream, recorded only when it ends). Under CPU
// load either made the last decision or the last re-initialization differ
// from run to run.
func TestExplainAfterReinitialization(t *testing.T) {
	f := startExplainFixture(t, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	sid := f.cs.ID()
	from, to := f.home, f.other()
	from.Kill(200 * time.Millisecond) // as a terminating pod (see the report on Kill(0))
	// The killed backend has closed its connections. tether's client
	// looks at a pooled connection before writing into it, so the next
	// request closes those connections unused, dials, is refused, and
	// moves the session.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if name, err := mcpbackend.Whoami(ctx, f.cs); err != nil || name != to.Name {
		t.Fatalf("after the kill: %q, %v; want %s", name, err, to.Name)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return f.backendConns.open(from.Addr) == 0 }, "tether's connections to the killed backend closed")
	f.settle(t)

	code, out, errOut := runCLI("explain", sid, "--admin", f.admin)
	if code != 0 {
		t.Fatalf("explain: exit %d, stderr %q", code, errOut)
	}
	t.Logf("tether explain:\n%s", out)
	for _, want := range []string{
		"lives on  " + to.URL() + "  ready, 1 session",
		"backend session id  its own since the last re-initialization",
		"re-initialized      1 time",
		"placed  on " + from.URL(),
		"last re-initialization  to " + to.URL() + " (dial_failed)",
		to.URL() + "       0  <- chosen",
		"last decision  reinit, status 200",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q", want)
		}
	}

	code, out, _ = runCLI("status", "--admin", f.admin)
	if code != 0 {
		t.Fatalf("status: exit %d", code)
	}
	t.Logf("tether status:\n%s", out)
	if !containsRow(out, from.URL(), "ejected", "0", "0%") || !containsRow(out, to.URL(), "ready", "1", "100%") {
		t.Errorf("status after the move:\n%s", out)
	}
}

func TestStatusTable(t *testing.T) {
	f := newExplainFixture(t)
	code, out, errOut := runCLI("status", "--admin", f.admin)
	if code != 0 {
		t.Fatalf("status: exit %d, stderr %q", code, errOut)
	}
	t.Logf("tether status:\n%s", out)
	for _, want := range []string{"balancer p2c, store memory", "backend", "state", "sessions", "share", "in-flight", "2 endpoints"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q", want)
		}
	}
	if !containsRow(out, f.home.URL(), "ready", "1", "100%") {
		t.Errorf("no row for %s with 1 session:\n%s", f.home.URL(), out)
	}
	if !containsRow(out, f.other().URL(), "ready", "0", "0%") {
		t.Errorf("no row for %s with 0 sessions:\n%s", f.other().URL(), out)
	}
}

// containsRow reports whether a line of out has these fields in order.
func containsRow(out string, fields ...string) bool {
	for line := range strings.SplitSeq(out, "\n") {
		got := strings.Fields(line)
		if len(got) >= len(fields) && equalPrefix(got, fields) {
			return true
		}
	}
	return false
}

func equalPrefix(got, want []string) bool {
	for i := range want {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

func TestExplainErrors(t *testing.T) {
	f := newExplainFixture(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown session", []string{"explain", "no-such-session", "--admin", f.admin}, `session "no-such-session" not found`},
		{"id with a slash", []string{"explain", "a/b", "--admin", f.admin}, `session "a/b" not found`},
		{"no id", []string{"explain", "--admin", f.admin}, "want one SESSION_ID"},
		{"two ids", []string{"explain", "a", "b", "--admin", f.admin}, "want one SESSION_ID"},
		{"admin unreachable", []string{"explain", f.cs.ID(), "--admin", testkit.FreeAddr(t)}, "unreachable"},
		{"status, admin unreachable", []string{"status", "--admin", testkit.FreeAddr(t)}, "unreachable"},
		{"bad admin", []string{"status", "--admin", "nonsense"}, "--admin"},
		{"not tether", []string{"status", "--admin", f.admin + "/healthz"}, "404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(tc.args...)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			if !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "tether: ") {
				t.Errorf("stderr %q, want one line containing %q", errOut, tc.want)
			}
		})
	}
}

func TestDebugSessionJSON(t *testing.T) {
	f := newExplainFixture(t)
	sid := f.cs.ID()
	resp, err := http.Get(f.admin + "/debug/sessions/" + sid)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// The initialize body is kept for re-initialization but never shown.
	for _, secret := range []string{"explain-test", "clientInfo", "capabilities"} {
		if bytes.Contains(body, []byte(secret)) {
			t.Errorf("debug JSON shows the initialize body (%q):\n%s", secret, body)
		}
	}
	var v sessionView
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	if v.Session.ID != sid || v.Session.IDHash != session.HashID(sid) || v.Session.InitializeBytes == 0 ||
		v.Session.Version != 1 || v.Session.BackendURL != f.home.URL() || v.Session.ProtocolVersion == "" {
		t.Errorf("session: %+v", v.Session)
	}
	if v.Backend.State != "ready" || v.Backend.Sessions != 1 || v.Backend.URL != f.home.URL() {
		t.Errorf("backend: %+v", v.Backend)
	}
	if v.History == nil || v.History.Placed == nil || len(v.History.Placed.Candidates) != 2 || v.History.Requests < 2 {
		t.Errorf("history: %+v", v.History)
	}

	resp, err = http.Get(f.admin + "/debug/sessions/nope")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(body), `"error": "session not found"`) {
		t.Errorf("unknown session: %d %s", resp.StatusCode, body)
	}

	resp, err = http.Get(f.admin + "/debug/endpoints")
	if err != nil {
		t.Fatal(err)
	}
	var ev endpointsView
	err = json.NewDecoder(resp.Body).Decode(&ev)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if ev.Balancer != "p2c" || ev.Store.Kind != "memory" || ev.Store.Degraded || !ev.Ready || len(ev.Endpoints) != 2 {
		t.Errorf("endpoints: %+v", ev)
	}
}
