// Command streammem measures tether's memory per open GET (SSE) stream: it
// runs an SSE backend that holds every GET open, starts a tether binary in
// front of it, opens N HTTP/1.1 streams through it and compares tether's RSS
// and Go heap (in use, plus goroutine stacks) before and after.
//
//	go build -o /tmp/tether ./cmd/tether
//	go run ./hack/streammem -tether /tmp/tether -n 2000
//
// -old measures a binary from before --max-streams existed; -detail also
// prints how each of the runtime's memory figures grew per stream (off the
// heap too: each socket's runtime poll descriptor is counted in
// go_memstats_other_sys_bytes). -cpu then measures tether's CPU per event
// while every stream gets one each -ping, at its own phase (the bench's
// streams scenario, tether alone and quicker, for builds side by side):
//
//	go run ./hack/streammem -tether /tmp/tether -n 5000 -ping 15s -cpu 30s
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tether-mcp/tether/hack/internal/tetherproc"
)

func main() {
	bin := flag.String("tether", "", "tether binary")
	n := flag.Int("n", 2000, "streams")
	old := flag.Bool("old", false, "the binary has no --max-streams")
	detail := flag.Bool("detail", false, "also print how each of the runtime's memory figures (go_memstats_*_bytes) grew per stream")
	settle := flag.Duration("settle", 2*time.Second, "how long after the streams open to measure (past --memory-release-after, 5s, the runtime has given back what the opening left)")
	ping := flag.Duration("ping", 0, "with -cpu: the interval between two events of one stream (each stream at its own phase)")
	cpuWindow := flag.Duration("cpu", 0, "after the memory figures, measure tether's CPU over this window while every stream gets an event each -ping")
	flag.Parse()
	if *cpuWindow > 0 && *ping <= 0 {
		fmt.Fprintln(os.Stderr, "streammem: -cpu needs -ping")
		os.Exit(2)
	}

	var events atomic.Int64
	pinging := make(chan struct{})
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-pinging:
		case <-r.Context().Done():
			return
		}
		// Each stream at its own phase: events spread over the interval.
		phase := time.NewTimer(rand.N(*ping))
		select {
		case <-phase.C:
		case <-r.Context().Done():
			return
		}
		tick := time.NewTicker(*ping)
		defer tick.Stop()
		for {
			if _, err := io.WriteString(w, "event: ping\ndata: {}\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			events.Add(1)
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return
			}
		}
	})}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go backend.Serve(bln)

	args := []string{"--backends", "http://" + bln.Addr().String()}
	if !*old {
		args = append(args, "--max-streams", "100000")
	}
	proc, err := tetherproc.Start(*bin, args...)
	if err != nil {
		panic(err)
	}
	defer proc.Stop()
	listen, admin, cmd := proc.Listen, proc.Admin, proc.Cmd
	// Warm up: one stream opened and closed, so pools and code paths exist.
	c := openStream(listen)
	c.Close()
	time.Sleep(500 * time.Millisecond)
	rss0, heap0, gr0, stats0 := measure(cmd.Process.Pid, admin)
	var conns []net.Conn
	for range *n {
		conns = append(conns, openStream(listen))
	}
	time.Sleep(*settle)
	rss1, heap1, gr1, stats1 := measure(cmd.Process.Pid, admin)
	fmt.Printf("%d streams: RSS %+.1f KB/stream, Go heap+stacks %+.1f KB/stream, goroutines %+.1f/stream\n",
		*n, float64(rss1-rss0)/1024/float64(*n), float64(heap1-heap0)/1024/float64(*n), float64(gr1-gr0)/float64(*n))
	if *detail {
		for _, name := range slices.Sorted(maps.Keys(stats1)) {
			if !strings.HasPrefix(name, "go_memstats_") || !strings.HasSuffix(name, "_bytes") {
				continue
			}
			if d := stats1[name] - stats0[name]; d != 0 {
				fmt.Printf("  %-45s %+8.0f B/stream\n", name, d/float64(*n))
			}
		}
	}
	if *cpuWindow > 0 {
		for _, c := range conns {
			go io.Copy(io.Discard, c) // the client reads every event
		}
		close(pinging)
		time.Sleep(*ping) // every stream past its phase
		pid := cmd.Process.Pid
		cpu0, ev0 := threadsRunTime(pid), events.Load()
		time.Sleep(*cpuWindow)
		cpu1, ev1 := threadsRunTime(pid), events.Load()
		cpu, ev := cpu1-cpu0, ev1-ev0
		fmt.Printf("pinging every %v: %d events in %v, tether CPU %.3f%% of a core, %.1f µs per event\n",
			*ping, ev, *cpuWindow, 100*float64(cpu)/float64(*cpuWindow), float64(cpu)/1e3/float64(max(ev, 1)))
	}
	for _, c := range conns {
		c.Close()
	}
}

// threadsRunTime is the time every thread of the process pid has run, in
// ns (the first field of each thread's schedstat, as the bench reads it).
func threadsRunTime(pid int) time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		panic(err)
	}
	var total int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			total += ns
		}
	}
	return time.Duration(total)
}

func openStream(addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(c, "GET /mcp HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		panic(fmt.Sprint(resp, err))
	}
	return c
}

// metrics returns tether's metrics without labels (the runtime's among
// them) by name.
func metrics(admin string) map[string]float64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := map[string]float64{}
	for _, l := range strings.Split(string(body), "\n") {
		if f := strings.Fields(l); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			m[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	return m
}

// measure returns tether's RSS, its Go heap in use plus stacks, and its
// goroutines.
func measure(pid int, admin string) (rss, heap, goroutines int64, stats map[string]float64) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb * 1024
		}
	}
	stats = metrics(admin)
	heap = int64(stats["go_memstats_heap_inuse_bytes"] + stats["go_memstats_stack_inuse_bytes"])
	return rss, heap, int64(stats["go_goroutines"]), stats
}
