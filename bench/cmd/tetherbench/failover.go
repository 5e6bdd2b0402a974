package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-mcp/tether/bench/internal/svg"
)

type failoverRun struct {
	Kind      string
	Proto     string // what tether speaks to the backends: "HTTP/1.1" or "h2c"
	Rate      float64
	Sent      int
	Errors    int
	Codes     map[string]int
	KillAt    float64 // seconds since the attack began
	P99Before time.Duration
	P99After  time.Duration // requests started in the second after the kill
	MaxAfter  time.Duration
	OnVictim  int // sessions that lived on the killed backend
	Reinits   float64
	// per 100 ms bucket
	T, OK, Err, P99 []float64
}

type failoverResult struct {
	Sessions int
	Runs     []failoverRun
}

// failoverKill is one kind of kill: its name in the report and the grace
// period the backend gives requests in flight.
type failoverKill struct{ name, grace string }

var (
	gracefulKill = failoverKill{"graceful: SIGTERM, 1 s drain", "1s"}
	abruptKill   = failoverKill{"abrupt: every connection cut", "0s"}
)

const failoverSessions, failoverVictim = 60, "pod-1"

// runFailover kills a backend under a fixed rate of follow-ups through
// tether: as a pod deletion does it (SIGTERM, in-flight requests drain for
// 1 s), env.failoverKills times with tether speaking HTTP/1.1 to the
// backends and as many with h2c (--backend-h2c), and once abruptly (every
// connection cut at once) over HTTP/1.1. The protocols differ on a
// graceful kill: a Go server that is shutting down reads an HTTP/1.1
// request that reaches it on a keep-alive connection at that moment and
// closes the connection without answering (tether cannot tell that from a
// crash mid-handler, and answers 502), while over HTTP/2 its GOAWAY names
// the last request it took and the client sends later ones again.
func runFailover(ctx context.Context, env *reportEnv) (*failoverResult, error) {
	backends, addrs, names, err := startBackends(env.logDir, "failover-backends", nil, "-names", "pod-0,pod-1,pod-2")
	if err != nil {
		return nil, err
	}
	defer backends.stop()
	var urls []string
	for _, n := range names {
		urls = append(urls, "http://"+addrs[n])
	}
	res := &failoverResult{Sessions: failoverSessions}
	for _, proto := range []string{"HTTP/1.1", "h2c"} {
		var kinds []failoverKill
		for range max(env.failoverKills, 1) {
			kinds = append(kinds, gracefulKill)
		}
		var extra []string
		if proto == "h2c" {
			extra = append(extra, "--backend-h2c")
		} else {
			kinds = append(kinds, abruptKill)
		}
		if err := runFailoverKills(ctx, env, res, backends, addrs, urls, proto, extra, kinds); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// runFailoverKills runs kinds in turn through one tether started with
// extra flags, each kill a run of its own with fresh sessions.
func runFailoverKills(ctx context.Context, env *reportEnv, res *failoverResult, backends *proc, addrs map[string]string, urls []string,
	proto string, extra []string, kinds []failoverKill) error {
	const sessions, victim = failoverSessions, failoverVictim
	rate, dur, killAt := 500.0, 6*time.Second, 2*time.Second
	if env.full {
		rate, dur, killAt = 1000, 12*time.Second, 4*time.Second
	}
	name := "failover-tether"
	if proto == "h2c" {
		name += "-h2c"
	}
	tp, turl, err := startTether(ctx, env.tether, env.logDir, name, urls, extra...)
	if err != nil {
		return err
	}
	defer tp.stop()
	httpc := newClient()
	for _, kind := range kinds {
		var ss []liveSession
		onVictim := 0
		for range sessions {
			sid, backend, err := openSession(ctx, httpc, turl+"/mcp")
			if err != nil {
				return err
			}
			ss = append(ss, liveSession{url: turl + "/mcp", header: mcpHeaders(sid), backend: backend})
			if backend == victim {
				onVictim++
			}
		}
		before := reinitCount(tp.admin)
		attack(ctx, followUpTargeter(ss), 200, time.Second, 256) // warm-up
		killed := make(chan time.Time, 1)
		var r attackResult
		go func() {
			time.Sleep(killAt)
			t := time.Now()
			backends.send("kill " + victim + " " + kind.grace)
			killed <- t
		}()
		r = attack(ctx, followUpTargeter(ss), rate, dur, 2000)
		kt := <-killed
		if _, err := backends.expect("ok", 10*time.Second, nil); err != nil {
			return err
		}
		run := failoverRun{Kind: kind.name, Proto: proto, Rate: rate, OnVictim: onVictim, Codes: map[string]int{}, KillAt: kt.Sub(r.Started).Seconds()}
		run.Reinits = reinitCount(tp.admin) - before
		var pre, post []time.Duration
		for _, s := range r.Samples {
			run.Sent++
			if !s.ok {
				run.Errors++
				run.Codes[strconv.Itoa(int(s.code))]++
			}
			switch at := s.at.Seconds(); {
			case at < run.KillAt:
				pre = append(pre, s.latency)
			case at < run.KillAt+1:
				post = append(post, s.latency)
			}
		}
		slices.Sort(pre)
		slices.Sort(post)
		run.P99Before, run.P99After = quantile(pre, 0.99), quantile(post, 0.99)
		if len(post) > 0 {
			run.MaxAfter = post[len(post)-1]
		}
		run.T, run.OK, run.Err, run.P99 = timeline(r.Samples, dur, 100*time.Millisecond)
		res.Runs = append(res.Runs, run)
		env.logf("failover: %s over %s: %d errors of %d, p99 %.2fms before, %.2fms in the second after the kill (max %.1fms), %d sessions on %s, %.0f re-initializations",
			kind.name, proto, run.Errors, run.Sent, ms(run.P99Before), ms(run.P99After), ms(run.MaxAfter), onVictim, victim, run.Reinits)
		for _, s := range ss {
			closeSession(ctx, httpc, s.url, s.header.Get("Mcp-Session-Id"))
		}
		if err := backends.send("restart " + victim); err != nil {
			return err
		}
		if _, err := backends.expect("ok", 10*time.Second, nil); err != nil {
			return err
		}
		// The next run starts when tether has readmitted the pod (its
		// ejection backoff doubles while the pod is down).
		if err := waitReadmitted(ctx, tp.admin, "http://"+addrs[victim], 40*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// failoverKind sums the runs of one kind of kill over one protocol.
type failoverKind struct {
	Kind, Proto            string
	Kills, KillsWithErrors int
	Sent, Errors           int
	WorstP99After          time.Duration
}

// byKind sums the runs per kind of kill and protocol, in the order they
// first ran.
func (f *failoverResult) byKind() []failoverKind {
	var kinds []failoverKind
	at := map[[2]string]int{}
	for _, r := range f.Runs {
		key := [2]string{r.Kind, r.Proto}
		i, ok := at[key]
		if !ok {
			i = len(kinds)
			at[key] = i
			kinds = append(kinds, failoverKind{Kind: r.Kind, Proto: r.Proto})
		}
		k := &kinds[i]
		k.Kills++
		k.Sent += r.Sent
		k.Errors += r.Errors
		if r.Errors > 0 {
			k.KillsWithErrors++
		}
		k.WorstP99After = max(k.WorstP99After, r.P99After)
	}
	return kinds
}

// waitReadmitted polls tether's /debug/endpoints until the endpoint at url
// is ready (not ejected).
func waitReadmitted(ctx context.Context, admin, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var v struct {
			Endpoints []struct{ URL, State string }
		}
		if resp, err := http.Get(admin + "/debug/endpoints"); err == nil {
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if err != nil {
				return fmt.Errorf("/debug/endpoints: %w", err)
			}
		}
		for _, e := range v.Endpoints {
			if strings.TrimSuffix(e.URL, "/") == url && e.State == "ready" {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not readmitted by tether within %v", url, timeout)
}

// timeline buckets samples by start time: successes and errors per second,
// and p99 latency in ms.
func timeline(samples []sample, dur, bucket time.Duration) (t, ok, errs, p99 []float64) {
	n := int(dur/bucket) + 1
	lat := make([][]time.Duration, n)
	ok, errs = make([]float64, n), make([]float64, n)
	for _, s := range samples {
		i := min(int(s.at/bucket), n-1)
		if s.ok {
			ok[i]++
		} else {
			errs[i]++
		}
		lat[i] = append(lat[i], s.latency)
	}
	per := float64(time.Second) / float64(bucket)
	for i := range n {
		t = append(t, (time.Duration(i) * bucket).Seconds())
		ok[i] *= per
		errs[i] *= per
		slices.Sort(lat[i])
		p99 = append(p99, ms(quantile(lat[i], 0.99)))
	}
	return t, ok, errs, p99
}

// reinitCount reads tether_reinitializations_total (all labels) from the
// admin listener.
func reinitCount(admin string) float64 {
	return metricSum(admin, "tether_reinitializations_total")
}

// metricSum is the sum of the series of one metric (all labels) on the
// admin listener's /metrics, 0 when it cannot be read.
func metricSum(admin, name string) float64 {
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}

func failoverMarkdown(f *failoverResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d sessions through tether (p2c, memory store) over 3 go-sdk backends; follow-ups at a fixed rate; `pod-1` killed during the run (internal/mcpbackend's Kill: http.Server.Shutdown, so listener closed, idle HTTP/1.1 connections closed, GOAWAY on HTTP/2 connections, in-flight requests drained for the grace period, then every connection and MCP session ended). tether speaks HTTP/1.1 to the backends, or h2c with `--backend-h2c`; each kill is a run of its own with fresh sessions. Errors are client-visible failures of any kind.\n\n", f.Sessions)
	b.WriteString("| kill | tether → backends | rate | errors / requests | codes | sessions on the killed pod | re-initializations | p99 before | p99 in the second after | max in that second |\n|---|---|---:|---:|---|---:|---:|---:|---:|---:|\n")
	for _, r := range f.Runs {
		codes := "–"
		if len(r.Codes) > 0 {
			var parts []string
			for c, n := range r.Codes {
				if c == "0" {
					c = "transport"
				}
				parts = append(parts, fmt.Sprintf("%s×%d", c, n))
			}
			slices.Sort(parts)
			codes = strings.Join(parts, ", ")
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f/s | %d / %d | %s | %d | %.0f | %.2f ms | %.2f ms | %.1f ms |\n",
			r.Kind, r.Proto, r.Rate, r.Errors, r.Sent, codes, r.OnVictim, r.Reinits, ms(r.P99Before), ms(r.P99After), ms(r.MaxAfter))
	}
	for _, k := range f.byKind() {
		if k.Kills > 1 {
			fmt.Fprintf(&b, "\n%s over %s, %d kills: %d errors of %d requests; %d kills with errors.\n", k.Kind, k.Proto, k.Kills, k.Errors, k.Sent, k.KillsWithErrors)
		}
	}
	return b.String()
}

func failoverChart(f *failoverResult) *svg.Figure {
	fig := &svg.Figure{Title: "Failover under load: a backend killed behind tether", Cols: 2, PanelW: 560, PanelH: 280,
		Footnote: "Per 100 ms bucket of request start times; the dashed line is the kill."}
	charted := map[[2]string]bool{}
	for _, r := range f.Runs {
		if charted[[2]string{r.Kind, r.Proto}] {
			continue // repeated kills: the first of each kind and protocol is charted
		}
		charted[[2]string{r.Kind, r.Proto}] = true
		mk := []svg.Marker{{X: r.KillAt, Label: "kill"}}
		title := r.Kind + " (" + r.Proto + ")"
		fig.Add(&svg.LineChart{Title: title + ": requests/s", XLabel: "s", YLabel: "req/s", Markers: mk,
			Series: []svg.Series{{Name: "ok", X: r.T, Y: r.OK}, {Name: "errors", X: r.T, Y: r.Err}}})
		fig.Add(&svg.LineChart{Title: title + ": p99 latency", XLabel: "s", YLabel: "p99 ms", LogY: true, Markers: mk,
			Series: []svg.Series{{Name: "p99", X: r.T, Y: r.P99}}})
	}
	return fig
}
