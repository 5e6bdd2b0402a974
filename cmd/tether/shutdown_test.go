package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/testkit"
)

// TestMain lets the test binary stand in for the tether binary, so that
// process-level behaviour (signals, exit codes) is tested without a build.
func TestMain(m *testing.M) {
	if os.Getenv("TETHER_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// SIGTERM-equivalent: readiness goes off, the listener closes, an in-flight
// request finishes, an SSE stream is ended at the grace deadline, and run
// returns cleanly.
func TestGracefulShutdown(t *testing.T) {
	reached := make(chan string, 2)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.Method {
		case http.MethodPost:
			reached <- "post"
			time.Sleep(300 * time.Millisecond) // a tool call still running at SIGTERM
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
		case http.MethodGet:
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, ": open\n\n")
			w.(http.Flusher).Flush()
			reached <- "get"
			<-r.Context().Done() // a stream that never ends by itself
		}
	}))
	defer backend.Close()

	cfg := defaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Backends = []string{backend.URL}
	cfg.ShutdownGrace = time.Second
	s, err := newServer(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx) }()

	clientURL := "http://" + s.ClientAddr().String() + "/mcp"
	readyURL := "http://" + s.AdminAddr().String() + "/readyz"
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status(readyURL) == 200 }, "ready")

	postDone := make(chan int, 1)
	go func() {
		resp, err := http.Post(clientURL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}`))
		if err != nil {
			postDone <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		postDone <- resp.StatusCode
	}()
	streamDone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, clientURL, nil)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			streamDone <- err
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		streamDone <- fmt.Errorf("stream ended: %v", err)
	}()
	<-reached
	<-reached

	stop() // what SIGTERM does through signal.NotifyContext

	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status(readyURL) != 200 }, "readiness off")
	testkit.Eventually(t, 10*time.Second, func() bool {
		c, err := net.Dial("tcp", s.ClientAddr().String())
		if err == nil {
			c.Close()
		}
		return err != nil
	}, "listener closed")
	if code := <-postDone; code != 200 {
		t.Errorf("in-flight request finished with %d, want 200", code)
	}
	select {
	case <-streamDone:
	case <-time.After(10 * time.Second):
		t.Fatal("SSE stream still open long after the grace period")
	}
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return")
	}
}

// The real process: SIGTERM ends it with status 0; bad flags end it with a
// one-line error and status 1.
func TestProcessSignalsAndExitCodes(t *testing.T) {
	backend := httptest.NewServer(http.NotFoundHandler())
	defer backend.Close()
	serveUntilSIGTERM(t, nil, "--backends", backend.URL, "--shutdown-grace", "2s")

	bad := exec.Command(os.Args[0], "serve", "--balancer", "nope", "--backends", backend.URL)
	bad.Env = append(os.Environ(), "TETHER_TEST_MAIN=1")
	out, err := bad.CombinedOutput()
	if exitErr, ok := err.(*exec.ExitError); !ok || exitErr.ExitCode() != 1 {
		t.Fatalf("bad flag: %v, want exit status 1", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "tether: --balancer") {
		t.Errorf("bad flag output %q, want one line", out)
	}
}

// serveUntilSIGTERM runs `tether serve args...` as its own process, with env
// added to the test's, until it is ready, then sends SIGTERM and fails
// unless it exits with status 0. It returns what the process logged.
func serveUntilSIGTERM(t *testing.T, env []string, args ...string) string {
	t.Helper()
	admin := testkit.FreeAddr(t)
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", admin}, args...)...)
	cmd.Env = append(append(os.Environ(), "TETHER_TEST_MAIN=1"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status("http://"+admin+"/readyz") == 200 }, "process ready")
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
	}
	return stderr.String()
}
