// Command syscalls counts the system calls a tether binary makes per
// proxied follow-up: it starts a go-sdk MCP backend (in this process, so
// that only tether is traced) and the binary in front of it, opens a
// session, warms the connections, then traces the binary with
// `strace -c -f -p` during -n sequential tools/call follow-ups on one
// keep-alive connection, and prints the calls per request.
//
//	go build -o /tmp/tether ./cmd/tether
//	go run ./hack/syscalls -tether /tmp/tether -n 1000
//
// It also prints the process's heap allocations per follow-up (from
// /metrics). nanosleep is the Go runtime's sysmon, which sleeps by the clock, not by
// the request; it is shown, and left out of the second total.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tether-mcp/tether/hack/internal/tetherproc"
	"github.com/tether-mcp/tether/internal/mcpbackend"
)

func main() {
	bin := flag.String("tether", "", "tether binary to measure")
	n := flag.Int("n", 1000, "follow-ups traced")
	warm := flag.Int("warm", 50, "follow-ups before tracing starts")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "syscalls: -tether is required")
		os.Exit(2)
	}
	if err := run(*bin, *n, *warm); err != nil {
		fmt.Fprintln(os.Stderr, "syscalls:", err)
		os.Exit(1)
	}
}

func run(bin string, n, warm int) error {
	backend, err := mcpbackend.Start("b0", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer backend.Close()
	proc, err := tetherproc.Start(bin, "serve", "--backends", backend.URL())
	if err != nil {
		return err
	}
	defer proc.Stop()

	url := "http://" + proc.Listen + "/mcp"
	client := &http.Client{}
	resp, err := tetherproc.Post(context.Background(), client, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"syscalls","version":"1"}}}`)
	if err != nil {
		return err
	}
	sid := resp.Header.Get("Mcp-Session-Id")
	if _, err := tetherproc.Post(context.Background(), client, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		return err
	}
	const call = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`
	for range warm {
		if _, err := tetherproc.Post(context.Background(), client, url, sid, call); err != nil {
			return err
		}
	}

	out := filepath.Join(os.TempDir(), fmt.Sprintf("syscalls-%d.txt", os.Getpid()))
	defer os.Remove(out)
	pid := proc.Cmd.Process.Pid
	strace := exec.Command("strace", "-c", "-f", "-p", strconv.Itoa(pid), "-o", out)
	if err := strace.Start(); err != nil {
		return fmt.Errorf("strace (apt-get install -y strace): %w", err)
	}
	if err := awaitTraced(pid, 10*time.Second); err != nil {
		strace.Process.Kill()
		return err
	}
	before := tetherproc.Scrape(proc.Admin)["go_memstats_mallocs_total"]
	for range n {
		if _, err := tetherproc.Post(context.Background(), client, url, sid, call); err != nil {
			strace.Process.Kill()
			return err
		}
	}
	mallocs := tetherproc.Scrape(proc.Admin)["go_memstats_mallocs_total"] - before
	// strace writes its summary on SIGINT, then dies of the signal: the
	// summary says whether it worked.
	strace.Process.Signal(os.Interrupt)
	strace.Wait()
	if err := report(out, n); err != nil {
		return err
	}
	// The process's allocations, tether's path and the server's and
	// client's HTTP plumbing alike (and one /metrics answer).
	fmt.Printf("%-14s %8.0f %7.1f/req\n", "allocations", mallocs, mallocs/float64(n))
	return nil
}

// awaitTraced waits until every thread of pid has a tracer.
func awaitTraced(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
		traced := 0
		for _, f := range tasks {
			b, _ := os.ReadFile(f)
			for line := range strings.Lines(string(b)) {
				if v, ok := strings.CutPrefix(line, "TracerPid:"); ok && strings.TrimSpace(v) != "0" {
					traced++
				}
			}
		}
		if len(tasks) > 0 && traced == len(tasks) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("strace did not attach to every thread of %d in %s", pid, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// report prints strace's summary per request.
func report(path string, n int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	type row struct {
		name  string
		calls int
	}
	var rows []row
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
		rows = append(rows, row{fields[len(fields)-1], calls})
	}
	if len(rows) == 0 {
		return fmt.Errorf("no strace summary in %s", path)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].calls > rows[j].calls })
	total, sysmon := 0, 0
	for _, r := range rows {
		total += r.calls
		if r.name == "nanosleep" {
			sysmon += r.calls
		}
		if per := float64(r.calls) / float64(n); per >= 0.05 {
			fmt.Printf("%-14s %8d %7.2f/req\n", r.name, r.calls, per)
		}
	}
	fmt.Printf("%-14s %8d %7.2f/req\n", "total", total, float64(total)/float64(n))
	fmt.Printf("%-14s %8d %7.2f/req\n", "w/o nanosleep", total-sysmon, float64(total-sysmon)/float64(n))
	return sc.Err()
}
