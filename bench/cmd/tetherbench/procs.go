package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process the benchmark owns: its own process group (so a
// stop reaches its children, nginx workers included), killed if the
// benchmark dies (Pdeathsig), stderr to a log file, stdout as lines.
type proc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	logPath string
	done    chan struct{}
	admin   string // tether's admin listener URL, for tether processes
}

// startProc starts argv with its log in logDir/name.log.
func startProc(logDir, name string, argv ...string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), logPath: logPath, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() {
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// expect reads stdout lines until one starts with prefix and returns it.
// Lines before it go to collect, when not nil.
func (p *proc) expect(prefix string, timeout time.Duration, collect func(string)) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", fmt.Errorf("%s exited before %q (log: %s)%s", p.name, prefix, p.logPath, p.logTail())
			}
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
			if collect != nil {
				collect(l)
			}
		case <-t.C:
			return "", fmt.Errorf("%s: no %q within %v (log: %s)%s", p.name, prefix, timeout, p.logPath, p.logTail())
		}
	}
}

// send writes one command line to the process's stdin.
func (p *proc) send(line string) error {
	_, err := io.WriteString(p.stdin, line+"\n")
	return err
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	s := strings.TrimSpace(string(b))
	if len(s) > 800 {
		s = "…" + s[len(s)-800:]
	}
	if s == "" {
		return ""
	}
	return ":\n" + s
}

// stop sends SIGTERM to the process group, waits up to 5 s, then SIGKILLs.
func (p *proc) stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	p.stdin.Close()
	syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
}

// usage is the CPU time and resident memory of a process and its
// descendants, from /proc.
type usage struct {
	CPU       time.Duration
	User, Sys time.Duration // CPU's two parts: user space and the kernel
	RSSKiB    int64
	// Switches counts the context switches of all threads, voluntary (a
	// thread slept: waited for I/O, a timer, a lock) and not (preempted).
	Switches int64
}

// clkTck is USER_HZ, the unit of utime/stime in /proc/<pid>/stat; 100 on
// every Linux architecture Go supports.
const clkTck = 100

// treeUsage sums CPU and RSS over pid and all its descendants.
func treeUsage(pids ...int) usage {
	in := descendants(pids...)
	var u usage
	for pid := range in {
		f, ok := statFields(pid)
		if !ok {
			continue
		}
		ut, st, ok := statTimes(f)
		if !ok {
			continue
		}
		u.CPU += ut + st
		u.User += ut
		u.Sys += st
		u.RSSKiB += rssKiB(pid)
		u.Switches += contextSwitches(pid)
	}
	return u
}

// descendants is pids and every process below them.
func descendants(pids ...int) map[int]bool {
	parents := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := statFields(pid); ok && len(f) > 1 {
			pp, _ := strconv.Atoi(f[1])
			parents[pid] = pp
		}
	}
	in := map[int]bool{}
	for _, p := range pids {
		in[p] = true
	}
	for changed := true; changed; {
		changed = false
		for pid, pp := range parents {
			if in[pp] && !in[pid] {
				in[pid], changed = true, true
			}
		}
	}
	return in
}

// statFields returns /proc/pid/stat's fields after "(comm)": state, ppid, ...
func statFields(pid int) ([]string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	return parseStat(string(b))
}

// parseStat splits a /proc/PID/stat line after "(comm)", whose comm may
// hold spaces and parentheses of its own.
func parseStat(s string) ([]string, bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(s[i+1:]), true
}

// statTimes is utime and stime from parseStat's fields: fields 14 and 15
// of /proc/PID/stat, 12 and 13 after "pid (comm) state", in clock ticks.
func statTimes(f []string) (user, sys time.Duration, ok bool) {
	if len(f) < 13 {
		return 0, 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return time.Duration(ut) * time.Second / clkTck, time.Duration(st) * time.Second / clkTck, true
}

// contextSwitches sums the context switches of pid's threads.
func contextSwitches(pid int) int64 {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, _ := os.ReadDir(dir)
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/status")
		if err != nil {
			continue // the thread ended
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				k, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += k
			} else if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
				k, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += k
			}
		}
	}
	return n
}

func rssKiB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	return parseVmRSS(string(b))
}

// parseVmRSS is the VmRSS line of /proc/PID/status, in KiB; 0 without
// one (a zombie, a kernel thread).
func parseVmRSS(status string) int64 {
	for l := range strings.Lines(status) {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls url until it answers with want (0: any status) or the
// timeout passes.
func waitHTTP(ctx context.Context, url string, want int, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resp, err := c.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if want == 0 || resp.StatusCode == want {
				return nil
			}
			last = fmt.Errorf("status %d", resp.StatusCode)
		} else {
			last = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %v: %v", url, timeout, last)
}

// waitTCP polls addr until it accepts a connection.
func waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New(addr + " did not accept connections in time")
}

// startBackends runs `tetherbench backends` (optionally through a prefix
// such as `ip netns exec NS`) and returns the process and name → address.
func startBackends(logDir, name string, prefix []string, args ...string) (*proc, map[string]string, []string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	argv := append(append(append([]string{}, prefix...), self, "backends"), args...)
	p, err := startProc(logDir, name, argv...)
	if err != nil {
		return nil, nil, nil, err
	}
	addrs := map[string]string{}
	var order []string
	if _, err := p.expect("ready", 20*time.Second, func(l string) {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "backend" {
			addrs[f[1]] = f[2]
			order = append(order, f[1])
		}
	}); err != nil {
		p.stop()
		return nil, nil, nil, err
	}
	return p, addrs, order, nil
}
