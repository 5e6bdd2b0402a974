// Command bodymem measures what announced-but-unsent request bodies cost
// tether: it starts a tether binary, opens requests that announce
// Content-Length: 4194304 and send no body (over h2c: -conns connections
// × -streams streams; or -h1 HTTP/1.1 connections), waits, and prints the
// growth of tether's Go heap, its in-flight body bytes and the answers
// received so far (503s once --max-inflight-body-bytes is spent).
//
//	go build -o /tmp/tether ./cmd/tether
//	go run ./hack/bodymem -tether /tmp/tether               # 4 h2c connections × 250 streams
//	go run ./hack/bodymem -tether /tmp/tether -h1 500       # 500 HTTP/1.1 connections
//
// Old main took the heap to 4.2 GB (h2c) and RSS to 3.15 GB (HTTP/1.1).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/tether-mcp/tether/hack/internal/tetherproc"
)

func main() {
	bin := flag.String("tether", "", "tether binary")
	conns := flag.Int("conns", 4, "h2c connections")
	streams := flag.Int("streams", 250, "streams per h2c connection")
	h1 := flag.Int("h1", 0, "HTTP/1.1 connections instead of h2c")
	wait := flag.Duration("wait", 5*time.Second, "how long the requests are held before measuring")
	flag.Parse()

	proc, err := tetherproc.Start(*bin, "--backends", "http://127.0.0.1:1")
	if err != nil {
		panic(err)
	}
	defer proc.Stop()
	listen, admin := proc.Listen, proc.Admin
	before := tetherproc.Scrape(admin)

	var mu sync.Mutex
	answers := map[string]int{}
	answer := func(code string) { mu.Lock(); answers[code]++; mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var bodies []*io.PipeWriter
	if *h1 > 0 {
		for range *h1 {
			c, err := net.Dial("tcp", listen)
			if err != nil {
				panic(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: tether\r\nContent-Type: application/json\r\nContent-Length: 4194304\r\n\r\n")
			go func() {
				status := make([]byte, 12) // "HTTP/1.1 503"
				if _, err := io.ReadFull(c, status); err == nil {
					answer(string(status[9:]))
				}
			}()
		}
	} else {
		for range *conns {
			var protos http.Protocols
			protos.SetUnencryptedHTTP2(true)
			client := &http.Client{Transport: &http.Transport{Protocols: &protos, MaxConnsPerHost: 1}}
			for range *streams {
				pr, pw := io.Pipe()
				bodies = append(bodies, pw)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+listen+"/mcp", pr)
				req.ContentLength = 4 << 20
				go func() {
					resp, err := client.Do(req)
					if err != nil {
						return
					}
					resp.Body.Close()
					answer(strconv.Itoa(resp.StatusCode))
				}()
			}
		}
	}
	time.Sleep(*wait)
	after := tetherproc.Scrape(admin)
	mu.Lock()
	var got []string
	for code, n := range answers {
		got = append(got, fmt.Sprintf("%s×%d", code, n))
	}
	mu.Unlock()
	sort.Strings(got)
	fmt.Printf("after %s: heap in use %+.1f MB, in-flight body bytes %.0f, answers %v\n", *wait,
		(after["go_memstats_heap_inuse_bytes"]-before["go_memstats_heap_inuse_bytes"])/1e6, after["tether_inflight_body_bytes"], got)
	for _, pw := range bodies {
		pw.Close()
	}
}
