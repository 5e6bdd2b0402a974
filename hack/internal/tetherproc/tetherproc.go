// Package tetherproc starts a tether binary for the measuring tools under
// hack/: on free loopback ports, ready before it returns.
package tetherproc

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Proc is a running tether.
type Proc struct {
	Cmd           *exec.Cmd
	Listen, Admin string // host:port of the client and admin listeners
}

// Start runs bin with args plus --listen, --admin-listen and --log-level
// error, and waits (10 s at most) until /readyz answers 200.
func Start(bin string, args ...string) (*Proc, error) {
	p := &Proc{Listen: FreeAddr(), Admin: FreeAddr()}
	args = append(args, "--listen", p.Listen, "--admin-listen", p.Admin, "--log-level", "error")
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Stderr = os.Stderr
	if err := p.Cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if resp, err := http.Get("http://" + p.Admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			p.Cmd.Process.Kill()
			return nil, fmt.Errorf("%s not ready after 10s", bin)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the process.
func (p *Proc) Stop() { p.Cmd.Process.Kill(); p.Cmd.Wait() }

// FreeAddr returns a loopback address that was free a moment ago.
func FreeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// CPUSeconds is a process's user + system CPU time (/proc/PID/stat).
func CPUSeconds(pid int) float64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}
