package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Per-request costs that a load test cannot show: system calls per proxied
// follow-up (strace), tether's allocations per follow-up (its allocation
// test), and tether's RSS holding many sessions (hack/sessionmem).

// straceRequests is how many sequential follow-ups each proxy is traced
// over, after straceWarm untraced ones.
const (
	straceRequests = 500
	straceWarm     = 50
)

// syscallsPerRequest traces every process and thread of pids with
// `strace -c -f` while one keep-alive client sends straceRequests
// sequential follow-ups on one session, and returns the system calls per
// request, nanosleep left out (the Go runtime's sysmon sleeps by the clock,
// not by the request).
func syscallsPerRequest(ctx context.Context, pids []int, s liveSession, logDir, name string) (float64, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	defer c.CloseIdleConnections()
	sid := s.header.Get("Mcp-Session-Id")
	for range straceWarm {
		if _, _, err := post(ctx, c, s.url, sid, echoBody); err != nil {
			return 0, err
		}
	}
	out := filepath.Join(logDir, "strace-"+strings.NewReplacer(" ", "-", "(", "", ")", "").Replace(name)+".txt")
	args := []string{"-c", "-f", "-o", out}
	for _, p := range pids {
		args = append(args, "-p", strconv.Itoa(p))
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	strace := exec.CommandContext(tctx, "strace", args...)
	if err := strace.Start(); err != nil {
		return 0, err
	}
	stop := func() {
		// strace writes its summary on SIGINT.
		strace.Process.Signal(os.Interrupt)
		strace.Wait()
	}
	if err := awaitTraced(pids, 10*time.Second); err != nil {
		stop()
		return 0, err
	}
	for range straceRequests {
		if _, _, err := post(tctx, c, s.url, sid, echoBody); err != nil {
			stop()
			return 0, err
		}
	}
	stop()
	calls, err := straceCalls(out)
	if err != nil {
		return 0, err
	}
	return float64(calls) / straceRequests, nil
}

// awaitTraced waits until every thread of pids has a tracer.
func awaitTraced(pids []int, limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; time.Sleep(20 * time.Millisecond) {
		all, traced := 0, 0
		for _, pid := range pids {
			tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
			for _, f := range tasks {
				all++
				b, _ := os.ReadFile(f)
				for line := range strings.Lines(string(b)) {
					if v, ok := strings.CutPrefix(line, "TracerPid:"); ok && strings.TrimSpace(v) != "0" {
						traced++
					}
				}
			}
		}
		if all > 0 && traced == all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("strace attached to %d of %d threads in %s", traced, all, limit)
		}
	}
}

// straceCalls sums the calls of an `strace -c` summary, nanosleep left out.
func straceCalls(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	total, rows := 0, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// % time, seconds, usecs/call, calls, [errors,] syscall
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[len(fields)-1] == "total" {
			continue
		}
		if _, err := strconv.ParseFloat(fields[0], 64); err != nil {
			continue
		}
		calls, err := strconv.Atoi(fields[3])
		if err != nil {
			continue
		}
		rows++
		if fields[len(fields)-1] != "nanosleep" {
			total += calls
		}
	}
	if rows == 0 {
		return 0, fmt.Errorf("no strace summary in %s", path)
	}
	return total, sc.Err()
}

// treePids is pids and all their descendants (nginx's workers).
func treePids(pids ...int) []int {
	var out []int
	for pid := range descendants(pids...) {
		out = append(out, pid)
	}
	return out
}

// tetherModuleDir is the checkout of tether's module the bench module uses.
func tetherModuleDir() (string, error) {
	list, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/tether-mcp/tether").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/tether-mcp/tether: %w (run tetherbench from the bench module)", err)
	}
	return strings.TrimSpace(string(list)), nil
}

var ownAllocsRe = regexp.MustCompile(`allocations per follow-up: (\d+), of which the harness (\d+), tether (\d+)`)

// tetherAllocs runs tether's allocation test (TestFollowUpAllocations:
// ServeHTTP of a sticky follow-up, less the harness's own allocations) and
// returns tether's allocations per follow-up and the total with the
// harness.
func tetherAllocs(ctx context.Context) (own, total int, err error) {
	dir, err := tetherModuleDir()
	if err != nil {
		return 0, 0, err
	}
	tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(tctx, "go", "test", "-count=1", "-run", "^TestFollowUpAllocations$", "-v", "./internal/proxy/")
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	m := ownAllocsRe.FindSubmatch(b)
	if m == nil {
		return 0, 0, fmt.Errorf("go test TestFollowUpAllocations: %v: %s", err, lastLines(b, 5))
	}
	total, _ = strconv.Atoi(string(m[1]))
	own, _ = strconv.Atoi(string(m[3]))
	return own, total, nil
}

var sessionsRSSRe = regexp.MustCompile(`after: RSS ([0-9.]+) MiB.*sessions (\d+)`)

// tetherSessionsRSS runs hack/sessionmem: the tether binary's RSS holding n
// live sessions in its memory store.
func tetherSessionsRSS(ctx context.Context, bin string, n int) (float64, error) {
	dir, err := tetherModuleDir()
	if err != nil {
		return 0, err
	}
	const limit = 6 * time.Minute
	tctx, cancel := context.WithTimeout(ctx, limit+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(tctx, "go", "run", "./hack/sessionmem", "-tether", bin, "-sessions", strconv.Itoa(n), "-timeout", limit.String())
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	m := sessionsRSSRe.FindSubmatch(b)
	if m == nil || string(m[2]) != strconv.Itoa(n) {
		return 0, fmt.Errorf("hack/sessionmem -sessions %d: %v: %s", n, err, lastLines(b, 5))
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}
