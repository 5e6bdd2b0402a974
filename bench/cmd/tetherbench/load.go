package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// liveSession is one open MCP session: the URL its follow-ups go to and
// the headers they carry.
type liveSession struct {
	url     string
	header  http.Header
	backend string
}

// followUpTargeter cycles through the sessions, one tools/call (echo) each,
// every request with its own JSON-RPC id: a session may have several
// requests in flight, and go-sdk refuses a duplicate in-flight id.
func followUpTargeter(sessions []liveSession) vegeta.Targeter {
	var next atomic.Uint64
	return func(t *vegeta.Target) error {
		n := next.Add(1) - 1
		s := sessions[n%uint64(len(sessions))]
		t.Method, t.URL, t.Header = http.MethodPost, s.url, s.header
		t.Body = fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`, n+100)
		return nil
	}
}

// sample is one request's outcome.
type sample struct {
	at      time.Duration // since the attack began
	latency time.Duration
	ok      bool
	code    uint16
	err     string // why it failed: the transport error, or the start of the body
}

// attackResult is one fixed-rate (or closed-loop) run.
type attackResult struct {
	Rate     float64 // offered rate (0: closed loop)
	Duration time.Duration
	Samples  []sample
	Started  time.Time
}

// attack sends follow-ups at rate per second for dur, open loop: vegeta
// starts requests on schedule whatever the latency (more workers as needed,
// up to maxWorkers), so slow answers cannot slow the arrivals down
// (coordinated omission). rate 0 is closed loop with maxWorkers workers.
func attack(ctx context.Context, tr vegeta.Targeter, rate float64, dur time.Duration, maxWorkers uint64) attackResult {
	return attackObserved(ctx, tr, rate, dur, maxWorkers, nil)
}

// attackObserved is attack that also hands each result, with the sample
// made of it, to see (when not nil), in the order results arrive: for a
// scenario that reads the answers' bodies, which samples do not keep.
func attackObserved(ctx context.Context, tr vegeta.Targeter, rate float64, dur time.Duration, maxWorkers uint64, see func(*vegeta.Result, sample)) attackResult {
	workers := uint64(16)
	if rate == 0 {
		workers = maxWorkers
	}
	// Our own client, so that the run's connections are closed after it
	// and never pile up idle in the proxies across runs.
	tp := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	defer tp.CloseIdleConnections()
	client := &http.Client{Transport: tp, Timeout: 5 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	a := vegeta.NewAttacker(
		vegeta.Workers(workers), vegeta.MaxWorkers(maxWorkers),
		vegeta.Client(client), vegeta.MaxBody(4096),
	)
	var pacer vegeta.Pacer = vegeta.ConstantPacer{Freq: int(math.Round(rate)), Per: time.Second}
	if rate == 0 {
		pacer = vegeta.ConstantPacer{Freq: 0}
	}
	res := attackResult{Rate: rate, Duration: dur, Started: time.Now()}
	stop := context.AfterFunc(ctx, func() { a.Stop() })
	defer stop()
	for r := range a.Attack(tr, pacer, dur, "bench") {
		x := sample{
			at:      r.Timestamp.Sub(res.Started),
			latency: r.Latency,
			code:    r.Code,
			ok:      r.Code == http.StatusOK && r.Error == "" && bytes.Contains(r.Body, []byte(`"result"`)),
		}
		if !x.ok {
			x.err = r.Error
			if x.err == "" || r.Code != 0 {
				x.err = string(r.Body[:min(len(r.Body), 120)])
			}
		}
		res.Samples = append(res.Samples, x)
		if see != nil {
			see(r, x)
		}
	}
	return res
}

// summary condenses samples.
type summary struct {
	Sent, OK       int
	Achieved       float64 // requests started per second
	Goodput        float64 // successful requests per second
	P50, P99, P999 time.Duration
	Max            time.Duration
	Codes          map[string]int // non-200 answers and transport errors ("0")
	Errors         map[string]int // failure texts (the first few kinds)
}

func summarize(samples []sample, dur time.Duration) summary {
	s := summary{Sent: len(samples), Codes: map[string]int{}, Errors: map[string]int{}}
	lat := make([]time.Duration, 0, len(samples))
	for _, x := range samples {
		if x.ok {
			s.OK++
		} else {
			s.Codes[strconv.Itoa(int(x.code))]++
			if k := fmt.Sprintf("%d %s", x.code, x.err); s.Errors[k] > 0 || len(s.Errors) < 5 {
				s.Errors[k]++
			}
		}
		lat = append(lat, x.latency)
	}
	if dur > 0 {
		s.Achieved = float64(s.Sent) / dur.Seconds()
		s.Goodput = float64(s.OK) / dur.Seconds()
	}
	slices.Sort(lat)
	s.P50, s.P99, s.P999 = quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 0.999)
	if len(lat) > 0 {
		s.Max = lat[len(lat)-1]
	}
	return s
}

// quantile of sorted values (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// sloP99 is the latency bound of a sustainable rate.
const sloP99 = 50 * time.Millisecond

// sustainable says whether a fixed-rate run kept up: at least 99.9% of
// requests succeeded, at least 95% of the offered rate was actually sent,
// and p99 stayed within sloP99.
func (s summary) sustainable(rate float64) (bool, string) {
	switch {
	case s.Sent == 0:
		return false, "nothing sent"
	case float64(s.OK) < 0.999*float64(s.Sent):
		return false, fmt.Sprintf("%.2f%% failed", 100*float64(s.Sent-s.OK)/float64(s.Sent))
	case s.Achieved < 0.95*rate:
		return false, fmt.Sprintf("sent %.0f/s of %.0f/s", s.Achieved, rate)
	case s.P99 > sloP99:
		return false, fmt.Sprintf("p99 %v > %v", s.P99.Round(time.Millisecond), sloP99)
	}
	return true, ""
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
