// Command streammem measures tether's memory per open GET (SSE) stream: it
// runs an SSE backend that holds every GET open, starts a tether binary in
// front of it, opens N HTTP/1.1 streams through it and compares tether's RSS
// and Go heap (in use, plus goroutine stacks) before and after.
//
//	go build -o /tmp/tether ./cmd/tether
//	go run ./hack/streammem -tether /tmp/tether -n 2000
//
// -old measures a binary from before --max-streams existed.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tether-mcp/tether/hack/internal/tetherproc"
)

func main() {
	bin := flag.String("tether", "", "tether binary")
	n := flag.Int("n", 2000, "streams")
	old := flag.Bool("old", false, "the binary has no --max-streams")
	flag.Parse()

	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
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
	rss0, heap0, gr0 := measure(cmd.Process.Pid, admin)
	var conns []net.Conn
	for range *n {
		conns = append(conns, openStream(listen))
	}
	time.Sleep(2 * time.Second)
	rss1, heap1, gr1 := measure(cmd.Process.Pid, admin)
	fmt.Printf("%d streams: RSS %+.1f KB/stream, Go heap+stacks %+.1f KB/stream, goroutines %+.1f/stream\n",
		*n, float64(rss1-rss0)/1024/float64(*n), float64(heap1-heap0)/1024/float64(*n), float64(gr1-gr0)/float64(*n))
	for _, c := range conns {
		c.Close()
	}
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

// measure returns tether's RSS, its Go heap in use plus stacks, and its goroutines.
func measure(pid int, admin string) (rss, heap, goroutines int64) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb * 1024
		}
	}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes":
			heap += int64(v)
		case "go_goroutines":
			goroutines = int64(v)
		}
	}
	return
}
