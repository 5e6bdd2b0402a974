package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// driveReport is what one proxy pod's driver prints (JSON) when done.
type driveReport struct {
	Buckets []driveBucket
	Errors  map[string]int
	Probes  int
}

// driveBucket counts, per backend, the sessions that started in it (by the
// backend that answered initialize) and the calls answered (by the backend
// that whoami named).
type driveBucket struct {
	Sessions map[string]int
	Calls    map[string]int
	Errors   int // failed requests
	Broken   int // sessions that could not go on (the client must re-initialize)
}

// driveCommand is the traffic of one proxy pod: new MCP sessions at -rate
// per second, started in bursts of -burst, each with a few whoami calls and
// a DELETE, through one
// keep-alive HTTP client (as a proxy's reverse proxy keeps its upstream
// connections), plus a health probe on a fresh connection every few
// seconds. It stops starting sessions after -duration and waits for the
// ones in flight (bounded by -duration + 15 s in all).
func driveCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tetherbench drive", flag.ContinueOnError)
	url := fs.String("url", "", "MCP endpoint (the Service, or the tether sidecar)")
	probeURL := fs.String("probe", "", "health-check URL (default: -url)")
	probeEvery := fs.Duration("probe-every", 2*time.Second, "health-check period")
	dur := fs.Duration("duration", 10*time.Second, "how long to start sessions")
	rate := fs.Float64("rate", 5, "new sessions per second")
	burst := fs.Int("burst", 5, "sessions started together (a proxy's traffic comes in bursts; concurrent requests are what make its pool open several upstream connections)")
	calls := fs.Int("calls", 5, "whoami calls per session")
	gap := fs.Duration("call-gap", 100*time.Millisecond, "pause between a session's calls")
	bucket := fs.Duration("bucket", time.Second, "time bucket of the report")
	ready := fs.String("ready", "", "URL to poll until it answers 200 before starting")
	localAddr := fs.String("local-addr", "", "source IP of every connection (the emulation's client IP)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *probeURL == "" {
		*probeURL = *url
	}
	if *ready != "" {
		if err := waitHTTP(ctx, *ready, 200, 15*time.Second); err != nil {
			return err
		}
	}
	dialer := &net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}
	if *localAddr != "" {
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(*localAddr)}
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: dialer.DialContext, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second, DisableCompression: true}}
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: dialer.DialContext, DisableKeepAlives: true}}

	ctx, cancel := context.WithTimeout(ctx, *dur+15*time.Second)
	defer cancel()
	start := time.Now()
	nb := int(*dur / *bucket) + 1
	rep := driveReport{Errors: map[string]int{}}
	for range nb {
		rep.Buckets = append(rep.Buckets, driveBucket{Sessions: map[string]int{}, Calls: map[string]int{}})
	}
	var mu sync.Mutex
	at := func() *driveBucket { return &rep.Buckets[min(int(time.Since(start) / *bucket), nb-1)] }
	fail := func(kind string, err error) {
		var se *statusError
		if errors.As(err, &se) {
			kind = fmt.Sprintf("%s: %d", kind, se.Code)
		} else {
			kind += ": transport"
		}
		mu.Lock()
		rep.Errors[kind]++
		at().Errors++
		mu.Unlock()
	}

	var wg sync.WaitGroup
	wg.Go(func() { // the health check
		t := time.NewTicker(*probeEvery)
		defer t.Stop()
		for time.Since(start) < *dur {
			// Any answer will do: the probe is there for the connections it
			// opens (each one renews the ClientIP affinity entry).
			post(ctx, probe, *probeURL, "", pingBody)
			mu.Lock()
			rep.Probes++
			mu.Unlock()
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	})
	total := int(*rate * dur.Seconds())
	for i := range total {
		group := i / max(*burst, 1) * max(*burst, 1)
		if wait := time.Duration(float64(group) / *rate * float64(time.Second)); time.Since(start) < wait {
			select {
			case <-time.After(wait - time.Since(start)):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			sid, backend, err := openSession(ctx, client, *url)
			if err != nil {
				fail("initialize", err)
				mu.Lock()
				at().Broken++
				mu.Unlock()
				return
			}
			mu.Lock()
			at().Sessions[backend]++
			mu.Unlock()
			for range *calls {
				time.Sleep(*gap)
				who, err := whoami(ctx, client, *url, sid)
				if err != nil {
					fail("tools/call", err)
					mu.Lock()
					at().Broken++
					mu.Unlock()
					return // 404: the session is gone for this client
				}
				mu.Lock()
				at().Calls[who]++
				mu.Unlock()
			}
			if err := closeSession(ctx, client, *url, sid); err != nil {
				fail("DELETE", err)
			}
		})
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(rep)
}
