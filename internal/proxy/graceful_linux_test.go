package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/backend"
	"github.com/tether-mcp/tether/internal/testkit"
)

// The busiest backend, an h2c go-sdk server in its own process, is stopped
// as a pod deletion stops it (SIGTERM: http.Server.Shutdown) 20 times while
// clients call it without pause through tether speaking h2c to backends.
// Every call must succeed: a closing HTTP/2 server's GOAWAY names the last
// stream it took, the transport sends later streams again (tether gives
// every request a GetBody), the dial to the closed listener fails, and
// tether re-initializes the session elsewhere. (Over HTTP/1.1 a Go server
// reads a request that arrives as it shuts down and closes the connection
// without answering, which no client can tell from a crash mid-handler;
// that costs a rare 502 and is not tested here.)
func TestBackendGracefulKillLoopH2C(t *testing.T) {
	if testing.Short() {
		t.Skip("starts backend processes")
	}
	const backends, sessions, workers, kills = 3, 12, 6, 20
	procs := map[string]*backendProc{}
	var urls []string
	for i := range backends {
		p := startBackendProc(t, fmt.Sprintf("backend-%d", i), "127.0.0.1:0")
		procs[p.name] = p
		urls = append(urls, "http://"+p.addr)
	}
	var resent atomic.Int64
	var logs testkit.LockedBuffer
	h := newTether(t, urls, harnessOptions{transport: resendCounter{backend.NewTransport(true), &resent}, logTo: &logs})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	client := &crashClient{
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 10 * time.Second},
		url:  h.endpoint(),
	}
	sids := make([]string, sessions)
	for i := range sids {
		sid, err := client.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sids[i] = sid
	}

	// Workers call whoami on their sessions in turn until stopped, and
	// record where each session was last served.
	var (
		mu     sync.Mutex
		home   = map[string]string{} // session → backend that last answered
		failed []string
		calls  atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				sid := sids[(w+i*workers)%sessions]
				backend, err := client.whoami(ctx, sid)
				mu.Lock()
				if err != nil {
					if ctx.Err() == nil {
						failed = append(failed, err.Error())
					}
				} else {
					home[sid] = backend
					calls.Add(1)
				}
				mu.Unlock()
			}
		})
	}
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopLoad()

	// waitCalls waits until n more calls have succeeded.
	waitCalls := func(n int64) {
		t.Helper()
		for target := calls.Load() + n; calls.Load() < target; {
			if ctx.Err() != nil {
				t.Fatalf("calls stopped: %d", calls.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	var duringShutdown int64
	start := time.Now()
	for kill := range kills {
		waitCalls(2 * sessions) // the load runs and every backend that holds sessions has connections in use
		mu.Lock()
		placed := map[string]int{}
		for _, b := range home {
			placed[b]++
		}
		mu.Unlock()
		victim, most := "", -1
		for name, n := range placed {
			if n > most {
				victim, most = name, n
			}
		}
		p := procs[victim]
		before := calls.Load()
		p.terminate()
		duringShutdown += calls.Load() - before
		procs[victim] = startBackendProc(t, victim, p.addr) // a restarted pod: same address, no sessions
		// Kills are sequential, as a rolling update makes them: the next one
		// comes once tether has readmitted the restarted backend.
		waitAllAdmitted(t, h)
		if ctx.Err() != nil {
			t.Fatalf("out of time after %d kills", kill+1)
		}
	}
	stopLoad()
	t.Logf("%d graceful kills in %v: %d calls, %d of them completed while a backend shut down, %d requests to a backend sent again by the transport, %d errors",
		kills, time.Since(start).Round(time.Millisecond), calls.Load(), duringShutdown, resent.Load(), len(failed))
	if duringShutdown == 0 {
		t.Error("no call completed while a backend shut down: the kills were not under load")
	}
	for i, f := range failed {
		if i == 10 {
			t.Logf("… %d more", len(failed)-i)
			break
		}
		t.Logf("error: %s", f)
	}
	if len(failed) > 0 {
		t.Errorf("%d client errors over %d graceful kills, want 0", len(failed), kills)
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "backend request failed") {
				t.Logf("tether: %s", strings.TrimSpace(line)) // the transport's error
			}
		}
	}
}

// resendCounter counts the requests that the transport under it sent
// again after it had a connection for them (an HTTP/2 stream after the
// server's GOAWAY named an earlier last stream). It only informs the log:
// how many land in that window depends on the scheduler.
type resendCounter struct {
	next  http.RoundTripper
	count *atomic.Int64
}

func (r resendCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	var hadConn, counted atomic.Bool
	again := func() {
		if hadConn.Load() && counted.CompareAndSwap(false, true) {
			r.count.Add(1)
		}
	}
	trace := &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { again(); hadConn.Store(true) },
		ConnectStart: func(string, string) { again() },
	}
	return r.next.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
}
