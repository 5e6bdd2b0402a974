package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/mcpbackend"
)

// backendProcEnv makes the test binary an MCP backend process (see
// TestMain): "NAME@ADDR".
const backendProcEnv = "TETHER_TEST_BACKEND_PROC"

func TestMain(m *testing.M) {
	if spec := os.Getenv(backendProcEnv); spec != "" {
		os.Exit(serveBackendProc(spec))
	}
	os.Exit(m.Run())
}

// serveBackendProc runs one go-sdk MCP backend until stdin closes (the test
// ended), SIGTERM stops it as a terminating pod stops (http.Server.Shutdown
// with backendProcGrace) or SIGKILL crashes it.
func serveBackendProc(spec string) int {
	name, addr, _ := strings.Cut(spec, "@")
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	b, err := mcpbackend.Start(name, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("listening", b.Addr)
	stdinClosed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	select {
	case <-stdinClosed:
	case <-term:
		b.Kill(backendProcGrace)
	}
	return 0
}

// backendProcGrace is how long a SIGTERMed backend process lets requests in
// flight finish.
const backendProcGrace = 2 * time.Second

// backendProc is an MCP backend in its own process, so that it can crash.
type backendProc struct {
	name, addr string
	cmd        *exec.Cmd
	stdin      io.Closer
}

func startBackendProc(t *testing.T, name, addr string) *backendProc {
	t.Helper()
	var err error
	for range 50 { // after a crash the port may take a moment to be free
		var p *backendProc
		if p, err = tryStartBackendProc(name, addr); err == nil {
			t.Cleanup(p.stop)
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("backend %s: %v", name, err)
	return nil
}

func tryStartBackendProc(name, addr string) (*backendProc, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), backendProcEnv+"="+name+"@"+addr)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	got, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("backend process did not start: %q, %v", line, err)
	}
	return &backendProc{name: name, addr: got, cmd: cmd, stdin: stdin}, nil
}

// crash SIGKILLs the backend and returns once it has exited: the kernel has
// closed its sockets, so tether's pooled connections have their FIN.
func (p *backendProc) crash() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

// terminate sends SIGTERM, as a pod deletion does, and returns once the
// backend has shut down and exited.
func (p *backendProc) terminate() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.cmd.Wait()
}

func (p *backendProc) stop() {
	p.stdin.Close()
	p.crash()
}

// crashClient is an MCP client over raw HTTP: one keep-alive pool, one
// JSON-RPC call per request, every answer checked.
type crashClient struct {
	http *http.Client
	url  string
}

func (c *crashClient) post(ctx context.Context, sid, body string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func (c *crashClient) open(ctx context.Context) (string, error) {
	resp, _, err := c.post(ctx, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"crash-test","version":"1"}}}`)
	if err != nil {
		return "", err
	}
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		return "", fmt.Errorf("initialize: status %d, session %q", resp.StatusCode, sid)
	}
	if resp, _, err = c.post(ctx, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil || resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("notifications/initialized: %v", err)
	}
	return sid, nil
}

// whoami calls the whoami tool on a session and returns the backend's name.
func (c *crashClient) whoami(ctx context.Context, sid string) (string, error) {
	resp, body, err := c.post(ctx, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	if i := bytes.Index(body, []byte("data: ")); i >= 0 { // an SSE answer: one event
		body = body[i+len("data: "):]
	}
	var msg struct {
		Result struct {
			StructuredContent mcpbackend.WhoamiOutput `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(body), &msg); err != nil || msg.Result.StructuredContent.Backend == "" {
		return "", fmt.Errorf("no whoami result in %q (%v)", body, err)
	}
	return msg.Result.StructuredContent.Backend, nil
}

// waitAllAdmitted waits until no endpoint is ejected.
func waitAllAdmitted(t *testing.T, h *harness) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		ejected := 0
		for _, ep := range h.bal.Endpoints() {
			if ep.Ejected() {
				ejected++
			}
		}
		if ejected == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends still ejected after 20s", ejected)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The busiest backend crashes (SIGKILL) between call rounds, 50 times, with
// tether's keep-alive pool holding connections to it; right after each
// crash every session calls again, at once. A pooled connection may still
// look alive to net/http then (its readLoop has not run since the FIN
// arrived), but the request must not be written into it: every call
// succeeds, on a session re-initialized elsewhere. (Before the fix, some
// of these calls got 502 "backend failed after the request was sent".)
func TestBackendCrashLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts backend processes")
	}
	const backends, sessions, crashes = 3, 12, 50
	procs := map[string]*backendProc{}
	var urls []string
	for i := range backends {
		p := startBackendProc(t, fmt.Sprintf("backend-%d", i), "127.0.0.1:0")
		procs[p.name] = p
		urls = append(urls, "http://"+p.addr)
	}
	h := newTether(t, urls, harnessOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	client := &crashClient{
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: sessions}, Timeout: 10 * time.Second},
		url:  h.endpoint(),
	}
	sids := make([]string, sessions)
	for i := range sids {
		sid, err := client.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sids[i] = sid
	}

	// round calls whoami on every session at once and returns where each
	// call landed and the calls that failed.
	round := func() (placed map[string]int, failed []string) {
		placed = map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, sid := range sids {
			wg.Go(func() {
				backend, err := client.whoami(ctx, sid)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = append(failed, err.Error())
					return
				}
				placed[backend]++
			})
		}
		wg.Wait()
		return placed, failed
	}

	errorsAfterCrash, errorsBefore := 0, 0
	start := time.Now()
	for crash := range crashes {
		if ctx.Err() != nil {
			t.Fatalf("out of time after %d crashes", crash)
		}
		// Warm the pool: this round leaves idle connections to every backend
		// that holds sessions.
		placed, failed := round()
		errorsBefore += len(failed)
		for _, f := range failed {
			t.Logf("crash %d, round before: %s", crash, f)
		}
		victim, most := "", -1
		for name, n := range placed {
			if n > most {
				victim, most = name, n
			}
		}
		if victim == "" {
			t.Fatalf("crash %d: no call succeeded before the crash", crash)
		}
		p := procs[victim]
		p.crash()
		_, failed = round()
		errorsAfterCrash += len(failed)
		for _, f := range failed {
			t.Logf("crash %d of %s (%d sessions): %s", crash, victim, most, f)
		}
		procs[victim] = startBackendProc(t, victim, p.addr) // a restarted pod: same address, no sessions
		// Crashes are sequential, as a busy fleet sees them: the next one
		// comes once tether has readmitted the restarted backend (otherwise
		// three quick crashes eject all three and calls rightly get 503).
		waitAllAdmitted(t, h)
	}
	t.Logf("%d crashes in %v: %d client errors right after a crash, %d in the rounds between",
		crashes, time.Since(start).Round(time.Millisecond), errorsAfterCrash, errorsBefore)
	if errorsAfterCrash+errorsBefore > 0 {
		t.Errorf("%d client errors over %d crashes (%d right after a crash), want 0", errorsAfterCrash+errorsBefore, crashes, errorsAfterCrash)
	}
}
