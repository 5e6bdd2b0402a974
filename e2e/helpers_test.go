package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/testkit"
)

// buildTether compiles ./cmd/tether as the sidecar image has it (-tags
// tether_sidecar; with -race when this test runs with it) into a temporary
// directory.
func buildTether(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tether")
	args := []string{"build", "-tags", "tether_sidecar", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/tether-mcp/tether/cmd/tether")
	start := time.Now()
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built tether in %s", time.Since(start).Round(100*time.Millisecond))
	return bin
}

// tetherProc is a running tether binary whose JSON log lines are kept.
type tetherProc struct {
	t      *testing.T
	listen string
	admin  string
	cmd    *exec.Cmd
	done   chan struct{}

	mu    sync.Mutex
	lines []map[string]any
	raw   []string
	grew  chan struct{} // closed and replaced on every new line
}

func startTether(t *testing.T, bin string, args ...string) *tetherProc {
	t.Helper()
	p := &tetherProc{t: t, listen: testkit.FreeAddr(t), admin: testkit.FreeAddr(t), done: make(chan struct{}), grew: make(chan struct{})}
	args = append([]string{"serve", "--listen", p.listen, "--admin-listen", p.admin, "--log-format", "json", "--log-level", "debug"}, args...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "KUBECONFIG=", "KUBERNETES_SERVICE_HOST=")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var m map[string]any
			json.Unmarshal(sc.Bytes(), &m) // non-JSON lines (race reports) are kept raw only
			p.mu.Lock()
			p.raw = append(p.raw, sc.Text())
			if m != nil {
				p.lines = append(p.lines, m)
			}
			close(p.grew)
			p.grew = make(chan struct{})
			p.mu.Unlock()
		}
		p.cmd.Wait()
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.raw {
			if strings.Contains(l, "WARNING: DATA RACE") {
				t.Errorf("tether reported a data race:\n%s", strings.Join(p.raw, "\n"))
				break
			}
		}
		if t.Failed() {
			t.Logf("tether log:\n%s", strings.Join(p.raw, "\n"))
		}
	})
	return p
}

// waitLog waits until a log line satisfies match, and returns it.
func (p *tetherProc) waitLog(what string, timeout time.Duration, match func(map[string]any) bool) map[string]any {
	p.t.Helper()
	deadline := time.After(timeout)
	seen := 0
	for {
		p.mu.Lock()
		lines, grew := p.lines, p.grew
		p.mu.Unlock()
		for ; seen < len(lines); seen++ {
			if match(lines[seen]) {
				return lines[seen]
			}
		}
		select {
		case <-grew:
		case <-p.done:
			p.t.Fatalf("tether exited while waiting for %s", what)
		case <-deadline:
			p.t.Fatalf("no log line for %s within %s", what, timeout)
		}
	}
}

// countLog counts the log lines that satisfy match.
func (p *tetherProc) countLog(match func(map[string]any) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if match(l) {
			n++
		}
	}
	return n
}

func msgIs(msg string, kv ...string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		if m["msg"] != msg {
			return false
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if fmt.Sprint(m[kv[i]]) != kv[i+1] {
				return false
			}
		}
		return true
	}
}

// status GETs an admin path and returns its status code (0 when the
// request failed).
func (p *tetherProc) status(path string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (p *tetherProc) waitStatus(path string, want int, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	got := 0
	for time.Now().Before(deadline) {
		if got = p.status(path); got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("%s: status %d after %s, want %d", path, got, timeout, want)
}

// session is one go-sdk client session through tether.
type session struct {
	cs   *mcp.ClientSession
	home string // the backend that served its first call
}

func connect(ctx context.Context, t *testing.T, tetherAddr string) *session {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-client", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + tetherAddr + "/mcp"}, nil)
	if err != nil {
		t.Fatalf("connect through tether: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	s := &session{cs: cs}
	if s.home, err = whoami(ctx, cs); err != nil {
		t.Fatalf("first call of a new session: %v", err)
	}
	return s
}

// whoami calls the whoami tool and returns the backend's name.
func whoami(ctx context.Context, cs *mcp.ClientSession) (string, error) {
	return mcpbackend.Whoami(ctx, cs)
}
