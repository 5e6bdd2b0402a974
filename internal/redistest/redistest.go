// Package redistest runs real redis-server processes for tests, on random
// loopback ports, and breaks them on purpose: kill, freeze (SIGSTOP), thaw
// and restart on the same port.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/testkit"
)

// Server is one redis-server process owned by a test.
type Server struct {
	tb   testing.TB
	Port int
	args []string
	cmd  *exec.Cmd
}

// Start runs a redis-server with persistence off on a free loopback port.
// It fails the test when redis-server is not installed (CI installs it).
func Start(tb testing.TB, extraArgs ...string) *Server {
	tb.Helper()
	return startWith(tb, func() int { return testkit.FreePort(tb) }, func(port int, dir string) []string {
		return append(serverArgs(port, dir), extraArgs...)
	})
}

// serverArgs are the arguments of every test server: loopback, no
// persistence, quiet.
func serverArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--protected-mode", "no", "--loglevel", "warning",
	}
}

// startWith runs redis-server with the arguments args builds for a port
// pick chose and a fresh directory.
func startWith(tb testing.TB, pick func() int, args func(port int, dir string) []string) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal("redis-server not found on PATH (apt-get install redis-server)")
	}
	for attempt := 0; ; attempt++ {
		port := pick()
		s := &Server{tb: tb, Port: port}
		s.args = args(port, tb.TempDir())
		if err := s.start(bin); err != nil {
			if attempt < 3 { // the port was taken between our probe and redis binding it
				continue
			}
			tb.Fatal(err)
		}
		tb.Cleanup(s.Kill)
		return s
	}
}

func (s *Server) start(bin string) error {
	cmd := exec.Command(bin, s.args...)
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s.ping() == nil {
			return nil
		}
		if cmd.ProcessState != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	s.cmd = nil
	return fmt.Errorf("redis-server on port %d did not start", s.Port)
}

// ping speaks RESP directly so that this helper depends on nothing.
func (s *Server) ping() error {
	c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected answer %q", line)
	}
	return nil
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is a redis:// URL for the server's database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Kill ends the server at once (SIGKILL): everything in it is lost.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT) // a frozen process must be able to die
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// Freeze stops the process (SIGSTOP): connections stay open, nothing is
// answered — the worst kind of outage for a client.
func (s *Server) Freeze() {
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() {
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Restart starts a new, empty server on the same port.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	bin, _ := exec.LookPath("redis-server")
	var err error
	for range 50 {
		if err = s.start(bin); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.tb.Fatal(err)
}
