// Command sessionmem measures a tether binary's memory and CPU: its RSS
// when idle, then either after a bounded loop of follow-ups to a go-sdk
// backend (-followups, with the process's CPU time), or with -sessions live
// sessions in the memory store. -env passes variables to tether (GOGC=50,
// GOMEMLIMIT=...), so runs with different settings compare.
//
//	go build -tags tether_sidecar -trimpath -ldflags "-s -w" -o /tmp/tether ./cmd/tether
//	go run ./hack/sessionmem -tether /tmp/tether -sessions 100000
//	go run ./hack/sessionmem -tether /tmp/tether -followups 20000 -env GOGC=50
//	go run ./hack/sessionmem -tether /tmp/tether -followups 20000 -workers 500 -linger 10s
//
// The sessions' backend is a minimal MCP responder (initialize answered
// with a fresh Mcp-Session-Id), not go-sdk: a go-sdk server would hold the
// 100,000 sessions in this process. Every session sends the same
// initialize body, as the clients of one proxy mostly do.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/hack/internal/tetherproc"
	"github.com/tether-mcp/tether/internal/mcpbackend"
)

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{"listChanged":true},"sampling":{},"elicitation":{}},"clientInfo":{"name":"claude-code","version":"2.0.14"}}}`

func main() {
	bin := flag.String("tether", "", "tether binary")
	sessions := flag.Int("sessions", 0, "live sessions to create (minimal backend)")
	followups := flag.Int("followups", 0, "follow-ups to send (go-sdk backend)")
	workers := flag.Int("workers", 16, "concurrent clients (each its own session for -followups)")
	env := flag.String("env", "", "comma-separated NAME=VALUE for tether's environment")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	linger := flag.Duration("linger", 0, "measure again this long after the load, then this long after closing the clients' connections")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "sessionmem: -tether is required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var backendURL string
	if *followups > 0 {
		b, err := mcpbackend.Start("backend", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		defer b.Close()
		backendURL = b.URL()
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		go http.Serve(ln, http.HandlerFunc(tetherproc.MinimalBackend))
		backendURL = "http://" + ln.Addr().String()
	}

	args := []string{"--backends", backendURL}
	if *sessions > 0 {
		args = append(args, "--max-sessions", strconv.Itoa(*sessions+1000))
	}
	if *env != "" {
		for _, kv := range strings.Split(*env, ",") {
			k, v, _ := strings.Cut(kv, "=")
			os.Setenv(k, v) // inherited by tether
		}
	}
	proc, err := tetherproc.Start(*bin, args...)
	if err != nil {
		panic(err)
	}
	defer proc.Stop()
	pid := proc.Cmd.Process.Pid
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *workers}}
	url := "http://" + proc.Listen + "/mcp"

	time.Sleep(2 * time.Second)
	fmt.Printf("idle:  %s\n", measure(pid, proc.Admin))

	start := time.Now()
	cpu0 := tetherproc.CPUSeconds(pid)
	var failed atomic.Int64
	var wg sync.WaitGroup
	switch {
	case *followups > 0:
		per := *followups / *workers
		for range *workers {
			wg.Go(func() {
				sid, err := initialize(ctx, client, url)
				if err != nil {
					failed.Add(int64(per))
					return
				}
				tetherproc.Post(ctx, client, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
				for i := range per {
					body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello %d"}}}`, i+2, i)
					if _, err := tetherproc.Post(ctx, client, url, sid, body); err != nil {
						failed.Add(1)
					}
				}
			})
		}
	case *sessions > 0:
		var next atomic.Int64
		for range *workers {
			wg.Go(func() {
				for next.Add(1) <= int64(*sessions) {
					if _, err := initialize(ctx, client, url); err != nil {
						failed.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := tetherproc.CPUSeconds(pid) - cpu0
	n := max(*followups, *sessions)
	fmt.Printf("after: %s\n", measure(pid, proc.Admin))
	fmt.Printf("%d requests (%d failed) in %.1fs; tether CPU %.2fs (%.3fs per 1,000)\n",
		n, failed.Load(), elapsed.Seconds(), cpu, cpu/float64(n)*1000)
	if *linger > 0 {
		// What the load leaves behind: first with the clients' keep-alive
		// connections open and idle, then once they are closed.
		time.Sleep(*linger)
		fmt.Printf("after %v with %d idle connections: %s\n", *linger, *workers, measure(pid, proc.Admin))
		client.CloseIdleConnections()
		time.Sleep(*linger)
		fmt.Printf("after %v more with them closed: %s\n", *linger, measure(pid, proc.Admin))
	}
}

func initialize(ctx context.Context, c *http.Client, url string) (string, error) {
	resp, err := tetherproc.Post(ctx, c, url, "", initBody)
	if err != nil {
		return "", err
	}
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" {
		return "", fmt.Errorf("no session id")
	}
	return sid, nil
}

// measure reports RSS (and its peak) from /proc and the Go heap and session
// figures from /metrics.
func measure(pid int, admin string) string {
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	kib := map[string]float64{}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && (strings.HasPrefix(f[0], "Vm") || strings.HasPrefix(f[0], "Rss")) {
			v, _ := strconv.ParseFloat(f[1], 64)
			kib[strings.TrimSuffix(f[0], ":")] = v
		}
	}
	m := tetherproc.Scrape(admin)
	return fmt.Sprintf("RSS %.1f MiB (anon %.1f, file %.1f, peak %.1f), heap in use %.1f MiB, stacks %.1f MiB, Go sys %.1f MiB, goroutines %.0f, sessions %.0f, init bytes %.0f, GC cycles %.0f",
		kib["VmRSS"]/1024, kib["RssAnon"]/1024, kib["RssFile"]/1024, kib["VmHWM"]/1024,
		m["go_memstats_heap_inuse_bytes"]/(1<<20), m["go_memstats_stack_inuse_bytes"]/(1<<20), m["go_memstats_sys_bytes"]/(1<<20), m["go_goroutines"],
		m["tether_session_records"], m["tether_session_init_bytes"], m["go_gc_duration_seconds_count"])
}
