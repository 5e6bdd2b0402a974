// Package mcpbackend runs real MCP servers (the go-sdk's Streamable HTTP
// handler: stateful by default, stateless with Options.Stateless) on
// loopback listeners, for the demo, the tests and the benchmarks. Each
// backend speaks HTTP/1.1 and h2c (HTTP/2 by prior knowledge) on the same
// port, can be killed the way a terminating pod is, and restarted in place
// on the same address with none of its sessions.
package mcpbackend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Backend is one MCP server.
type Backend struct {
	Name string
	Addr string // host:port it listens on

	opts Options

	// Counters, for assertions and the demo's report.
	Initializes atomic.Int64 // initialize requests answered
	Initialized atomic.Int64 // notifications/initialized received
	Calls       atomic.Int64 // tools/call handled

	mu     sync.Mutex
	srv    *http.Server
	server *mcp.Server
}

// WhoamiOutput is the structured result of the whoami tool.
type WhoamiOutput struct {
	Backend string `json:"backend"`
}

// EchoInput is the argument of the echo tool.
type EchoInput struct {
	Text string `json:"text"`
}

// EchoOutput is the structured result of the echo tool.
type EchoOutput struct {
	Text    string `json:"text"`
	Backend string `json:"backend"`
}

// WaitInput is the argument of the wait tool.
type WaitInput struct {
	MS int `json:"ms"`
}

// Options configure a backend.
type Options struct {
	// Stateless serves every request on its own (go-sdk's
	// StreamableHTTPOptions.Stateless): no Mcp-Session-Id, and the only
	// mode in which go-sdk v1.8.0 accepts MCP 2026-07-28 requests. It
	// still answers initialize, so it serves both eras (a dual-era server,
	// versioning.mdx of the 2026-07-28 specification), legacy clients
	// without a session.
	Stateless bool
}

// Start runs a stateful backend named name on addr ("127.0.0.1:0" for any
// port).
func Start(name, addr string) (*Backend, error) {
	return StartWith(name, addr, Options{})
}

// StartWith runs a backend configured by o.
func StartWith(name, addr string, o Options) (*Backend, error) {
	b := &Backend{Name: name, opts: o}
	if err := b.listen(addr); err != nil {
		return nil, err
	}
	return b, nil
}

// URL is the backend's base URL (tether appends the client's path).
func (b *Backend) URL() string { return "http://" + b.Addr }

func (b *Backend) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("backend %s: %w", b.Name, err)
	}
	b.Addr = ln.Addr().String()
	handler, server := b.handler()
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, Protocols: &protos}
	conns := map[*trackedConn]struct{}{}
	srv.RegisterOnShutdown(func() { closeUnread(&b.mu, conns) })
	b.mu.Lock()
	b.srv, b.server = srv, server
	b.mu.Unlock()
	go srv.Serve(&trackingListener{Listener: ln, mu: &b.mu, conns: conns})
	return nil
}

// trackingListener records the connections it accepts, so that Kill can
// tell those that have not delivered a byte yet.
type trackingListener struct {
	net.Listener
	mu    *sync.Mutex
	conns map[*trackedConn]struct{}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, mu: l.mu, conns: l.conns}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

// trackedConn is an accepted connection that knows whether it has
// delivered any byte to the server.
type trackedConn struct {
	net.Conn
	mu    *sync.Mutex
	conns map[*trackedConn]struct{}
	read  atomic.Bool // some Read returned bytes
	once  sync.Once
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.read.Load() {
		c.read.Store(true)
	}
	return n, err
}

// CloseWrite half-closes the connection, as net/http does on a raw TCP
// connection before it hangs up on a client still sending a body.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		delete(c.conns, c)
		c.mu.Unlock()
	})
	return c.Conn.Close()
}

// closeUnread closes every connection that has not delivered a byte to the
// server. It runs as an OnShutdown hook, that is once http.Server.Shutdown
// has marked the server as shutting down and closed its listener.
//
// Why close them: http.Server.Shutdown leaves a connection that never
// carried a request (StateNew) open for 5 s in case a request is arriving,
// and the grace period's end then cuts it, at exactly the moment a client
// resumes; a test's kill would race the client's connection pool rather
// than test what happens to sessions. Closing it first lets the client see
// it closed, as it sees Shutdown's idle connections closed. This is kinder
// than a real Go server, which reads an HTTP/1.1 request arriving on such a
// connection and drops it unanswered (conn.serve returns right after
// readRequest once the server is shutting down): a client cannot tell that
// from a crash mid-handler.
//
// Why only here and only for connections that delivered nothing (not for
// every StateNew one, as before): a connection stays StateNew until
// readRequest has returned, so one whose request the server has already
// read still looks new; if Shutdown had not begun by then, a real server
// serves that request, and cutting the connection under its handler drops
// a call a real pod answers (the client sees a FIN with nothing unread,
// and must answer 502). Nothing here has delivered a byte, and any HTTP/1.1
// request it would still deliver arrives after Shutdown began, when a real
// server drops it too. An h2c connection whose preface the server has not
// read yet may already hold streams in its socket: they are reset unread,
// before the server's own preface, which tether's h2c transport tells and
// sends again (proxy's prefaceConn). (A real Go server would serve such a
// late connection without a GOAWAY and cut it when the grace period ends.)
// An h2c connection the server has read from gets Shutdown's GOAWAY.
func closeUnread(mu *sync.Mutex, conns map[*trackedConn]struct{}) {
	mu.Lock()
	var unread []*trackedConn
	for c := range conns {
		if !c.read.Load() {
			unread = append(unread, c)
		}
	}
	mu.Unlock()
	for _, c := range unread {
		c.Close()
	}
}

// handler builds a fresh MCP server: a restart loses every session, as a
// restarted pod does.
func (b *Backend) handler() (http.Handler, *mcp.Server) {
	server := mcp.NewServer(&mcp.Implementation{Name: b.Name, Version: "1.0.0"}, &mcp.ServerOptions{
		InitializedHandler: func(context.Context, *mcp.InitializedRequest) { b.Initialized.Add(1) },
	})
	mcp.AddTool(server, &mcp.Tool{Name: "whoami", Description: "name the backend that serves this session"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, WhoamiOutput, error) {
			b.Calls.Add(1)
			return nil, WhoamiOutput{Backend: b.Name}, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "echo the text back"},
		func(ctx context.Context, req *mcp.CallToolRequest, in EchoInput) (*mcp.CallToolResult, EchoOutput, error) {
			b.Calls.Add(1)
			return nil, EchoOutput{Text: in.Text, Backend: b.Name}, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "wait", Description: "answer after ms milliseconds (at most 10 s): a call that stays in flight"},
		func(ctx context.Context, req *mcp.CallToolRequest, in WaitInput) (*mcp.CallToolResult, WhoamiOutput, error) {
			b.Calls.Add(1)
			t := time.NewTimer(time.Duration(min(max(in.MS, 0), 10000)) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, WhoamiOutput{}, ctx.Err()
			}
			return nil, WhoamiOutput{Backend: b.Name}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: b.opts.Stateless})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" && r.ContentLength > 0 && r.ContentLength < 1<<20 {
			body := make([]byte, r.ContentLength)
			if _, err := io.ReadFull(r.Body, body); err != nil {
				http.Error(w, "short body", http.StatusBadRequest)
				return
			}
			if bytes.Contains(body, []byte(`"method":"initialize"`)) {
				b.Initializes.Add(1)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.ServeHTTP(w, r)
	}), server
}

// Kill stops the backend the way a terminating Go pod does, with
// http.Server.Shutdown: the listener closes (new connections are refused),
// idle HTTP/1.1 connections close, HTTP/2 connections get a GOAWAY naming
// the last stream the server took (the client sends later ones again
// elsewhere), requests in flight get up to grace to finish, then every
// connection, SSE streams included, is cut and the MCP sessions end.
// Connections that have not delivered a byte close at once, like idle ones
// (see closeUnread).
func (b *Backend) Kill(grace time.Duration) {
	b.mu.Lock()
	srv, server := b.srv, b.server
	b.srv, b.server = nil, nil
	b.mu.Unlock()
	if srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
	for ss := range server.Sessions() {
		ss.Close()
	}
}

// Restart kills the backend and starts a fresh one on the same address: it
// answers 404 to every session it had.
func (b *Backend) Restart(grace time.Duration) error {
	b.Kill(grace)
	var err error
	for range 50 { // the port may take a moment to be free again
		if err = b.listen(b.Addr); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Close stops the backend at once.
func (b *Backend) Close() { b.Kill(0) }

// Whoami calls a backend's whoami tool through cs and returns the name of
// the backend that answered.
func Whoami(ctx context.Context, cs *mcp.ClientSession) (string, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
	if err != nil {
		return "", err
	}
	if res.IsError {
		return "", fmt.Errorf("tool error: %v", res.Content)
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return "", err
	}
	var out WhoamiOutput
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", err
	}
	if out.Backend == "" {
		return "", errors.New("whoami named no backend")
	}
	return out.Backend, nil
}

// LiveSessions counts the MCP sessions the backend holds now.
func (b *Backend) LiveSessions() int {
	b.mu.Lock()
	server := b.server
	b.mu.Unlock()
	if server == nil {
		return 0
	}
	n := 0
	for range server.Sessions() {
		n++
	}
	return n
}

// ChangeTools adds a tool named name to the backend's server, which sends
// notifications/tools/list_changed to every client listening for it
// (a 2026-07-28 client's subscriptions/listen stream, a legacy session's
// channel). It reports false when the backend is not running.
func (b *Backend) ChangeTools(name string) bool {
	b.mu.Lock()
	server := b.server
	b.mu.Unlock()
	if server == nil {
		return false
	}
	mcp.AddTool(server, &mcp.Tool{Name: name, Description: "a tool added to announce a list change"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, WhoamiOutput, error) {
			return nil, WhoamiOutput{Backend: b.Name}, nil
		})
	return true
}
