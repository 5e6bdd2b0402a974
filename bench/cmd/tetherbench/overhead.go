package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-mcp/tether/bench/internal/svg"
)

// overheadTarget is one way of reaching the backends.
type overheadTarget struct {
	Name     string
	base     string  // proxy URL; "" for direct
	procs    []*proc // the proxy's processes (CPU and RSS are theirs)
	sessions []liveSession
	Note     string

	Estimate float64 // closed-loop throughput, requests/s
	MaxRate  float64 // highest sustainable offered rate found
	StopWhy  string  // why the next step up was not sustainable
	Steps    []overheadStep

	fixed    []sample
	fixedDur time.Duration
	Fixed    summary
	ProxyCPU time.Duration // over the fixed-rate runs
	BackCPU  time.Duration
	Requests int // sent during the fixed-rate runs
	// ProxyRSS is the proxy's RSS after the rounds, in KiB; PeakRSS the
	// most seen after one of them (the first rounds may still hold what
	// the rate search's overload made the proxy take).
	ProxyRSS  int64
	PeakRSS   int64
	BackRSS   int64
	IdleRSS   int64   // KiB, the proxy's processes before any request
	Syscalls  float64 // per sequential follow-up (strace -c -f), 0 when not measured
	Misrouted int     // sessions whose follow-up reached another backend
	// RoundP99 is p99 of each fixed-rate round; AddedP99 is the median over
	// rounds of (this target's p99 − direct's p99 in the same round), which
	// a single noisy round cannot swing.
	RoundP99 []time.Duration
	AddedP99 time.Duration
}

type overheadStep struct {
	Rate float64
	S    summary
	OK   bool
	Why  string
}

type overheadResult struct {
	Targets    []*overheadTarget
	Search     ratePlan
	FixedRate  float64
	Sessions   int
	HashWrong  int // nginx `hash $http_mcp_session_id consistent`: follow-ups answered 404
	HashTotal  int
	ProfileTop string

	// OwnAllocs is tether's allocations per sticky follow-up, AllAllocs
	// the same with the test harness's (TestFollowUpAllocations).
	OwnAllocs, AllAllocs int
	// ManyRSS is tether's RSS in MiB with ManySessions live sessions in
	// its memory store (hack/sessionmem), 0 when not measured.
	ManyRSS      float64
	ManySessions int
	// Notes says which of the per-request figures could not be measured.
	Notes []string
}

func (o *overheadResult) target(name string) *overheadTarget {
	for _, t := range o.Targets {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// runOverhead measures follow-up tools/call requests on live sessions
// through each proxy and directly, interleaving the runs.
func runOverhead(ctx context.Context, env *reportEnv) (*overheadResult, error) {
	if err := ensureTools(env.logf, "nginx", "haproxy", "redis-server"); err != nil {
		return nil, err
	}
	cfg := struct {
		sessions                    int
		probe, step, fixed, profile time.Duration
		rounds                      int
		search                      ratePlan
	}{32, 2 * time.Second, 2 * time.Second, 3 * time.Second, 6 * time.Second, 7,
		ratePlan{Fractions: []float64{0.6, 0.75, 0.85, 0.95, 1.05, 1.15}, StepFraction: 0.1, MaxFraction: 2, Refine: 2, Rest: time.Second}}
	// Seven rounds: a round's p99 on 2 shared cores swings by several ms
	// with whatever else the machine schedules, and the median of fewer
	// let one or two disturbed rounds decide the p99 comparison.
	if env.full {
		cfg.probe, cfg.step, cfg.fixed, cfg.rounds = 4*time.Second, 5*time.Second, 8*time.Second, 5
		cfg.search.Fractions = []float64{0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2}
		cfg.search.Refine = 3
	}
	res := &overheadResult{Sessions: cfg.sessions, Search: cfg.search}

	backends, addrs, names, err := startBackends(env.logDir, "overhead-backends", nil, "-names", "b0,b1,b2", "-named-ids")
	if err != nil {
		return nil, err
	}
	defer backends.stop()
	var urls []string
	for _, n := range names {
		urls = append(urls, "http://"+addrs[n])
	}

	redis, redisURL, err := startRedis(ctx, env.logDir)
	if err != nil {
		return nil, err
	}
	defer redis.stop()
	tmem, tmemURL, err := startTether(ctx, env.tether, env.logDir, "tether-memory", urls)
	if err != nil {
		return nil, err
	}
	defer tmem.stop()
	tred, tredURL, err := startTether(ctx, env.tether, env.logDir, "tether-redis", urls, "--redis-url", redisURL)
	if err != nil {
		return nil, err
	}
	defer tred.stop()
	ngx, ngxURL, ngxHashURL, err := startNginx(ctx, env.logDir, names, addrs)
	if err != nil {
		return nil, err
	}
	defer ngx.stop()
	hap, hapURL, err := startHAProxy(ctx, env.logDir, names, addrs)
	if err != nil {
		return nil, err
	}
	defer hap.stop()

	res.Targets = []*overheadTarget{
		{Name: "direct", Note: "client → backend"},
		{Name: "tether (memory)", base: tmemURL, procs: []*proc{tmem}, Note: "tether serve, in-memory store"},
		{Name: "tether (Redis)", base: tredURL, procs: []*proc{tred, redis}, Note: "tether serve --redis-url; redis-server's CPU and RSS included"},
		{Name: "nginx", base: ngxURL, procs: []*proc{ngx}, Note: "map from the session id's backend prefix to per-backend upstreams, keepalive 64"},
		{Name: "HAProxy", base: hapURL, procs: []*proc{hap}, Note: "stick table learning the id from the response"},
	}
	for _, t := range res.Targets {
		if len(t.procs) > 0 {
			t.IdleRSS = treeUsage(procPids(t.procs)...).RSSKiB
		}
	}
	httpc := newClient()
	for _, t := range res.Targets {
		for i := range cfg.sessions {
			url := t.base + "/mcp"
			if t.base == "" {
				url = urls[i%len(urls)] + "/mcp"
			}
			sid, backend, err := openSession(ctx, httpc, url)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t.Name, err)
			}
			t.sessions = append(t.sessions, liveSession{url: url, header: mcpHeaders(sid), backend: backend})
			if got, err := whoami(ctx, httpc, url, sid); err != nil || got != backend {
				t.Misrouted++
			}
		}
		if t.Misrouted > 0 {
			return nil, fmt.Errorf("%s: %d of %d sessions' follow-ups did not reach their backend", t.Name, t.Misrouted, cfg.sessions)
		}
	}
	res.HashWrong, res.HashTotal = hashMisroutes(ctx, httpc, ngxHashURL+"/mcp", 30)
	env.logf("overhead: nginx `hash $http_mcp_session_id consistent`: %d of %d follow-ups answered 404", res.HashWrong, res.HashTotal)

	for _, t := range res.Targets { // warm connections and code paths
		attack(ctx, followUpTargeter(t.sessions), 300, time.Second, 256)
	}
	// Closed-loop estimate, then fixed rates at fractions of it, interleaved
	// (ratePlan).
	for _, t := range res.Targets {
		r := attack(ctx, followUpTargeter(t.sessions), 0, cfg.probe, 64)
		t.Estimate = summarize(r.Samples, cfg.probe).Goodput
		env.logf("overhead: %-16s closed loop (64 in flight): %.0f req/s", t.Name, t.Estimate)
	}
	searchMaxRates(ctx, res.Targets, cfg.search, func(t *overheadTarget, rate float64) overheadStep {
		r := attack(ctx, followUpTargeter(t.sessions), rate, cfg.step, 2000)
		s := summarize(r.Samples, cfg.step)
		ok, why := s.sustainable(rate)
		env.logf("overhead: %-16s %6.0f req/s offered: p50 %6.2fms p99 %6.2fms ok %d/%d %s %v", t.Name, rate, ms(s.P50), ms(s.P99), s.OK, s.Sent, why, s.Errors)
		return overheadStep{Rate: rate, S: s, OK: ok, Why: why}
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	direct := res.Targets[0]
	res.FixedRate = math.Round(direct.MaxRate / 2)
	if res.FixedRate < 100 { // no sustainable rate at all: the machine is swamped
		res.FixedRate = 100
	}
	// The search's last steps overloaded every process (queues of
	// hundreds of ms): a short untimed turn each at the fixed rate lets
	// them settle before the first measured round.
	for _, t := range res.Targets {
		attack(ctx, followUpTargeter(t.sessions), res.FixedRate, time.Second, 2000)
	}
	for round := range cfg.rounds {
		// Each round starts one target further on, so that no target
		// always follows the same one (the backends' state after a turn
		// through direct is not the one after a turn through a proxy).
		for i := range res.Targets {
			t := res.Targets[(round+i)%len(res.Targets)]
			pids := procPids(t.procs)
			pb, bb := treeUsage(pids...), treeUsage(backends.pid())
			r := attack(ctx, followUpTargeter(t.sessions), res.FixedRate, cfg.fixed, 2000)
			pa, ba := treeUsage(pids...), treeUsage(backends.pid())
			t.fixed = append(t.fixed, r.Samples...)
			t.fixedDur += cfg.fixed
			t.Requests += len(r.Samples)
			if len(pids) > 0 {
				t.ProxyCPU += pa.CPU - pb.CPU
				t.PeakRSS = max(t.PeakRSS, pa.RSSKiB)
			}
			t.BackCPU += ba.CPU - bb.CPU
			t.BackRSS = max(t.BackRSS, ba.RSSKiB)
			s := summarize(r.Samples, cfg.fixed)
			t.RoundP99 = append(t.RoundP99, s.P99)
			cpu := "" // the round's own, to tell a round that cost more from the rest
			if len(pids) > 0 && len(r.Samples) > 0 {
				cpu = fmt.Sprintf(" proxy CPU %.3f s/1k", (pa.CPU-pb.CPU).Seconds()*1000/float64(len(r.Samples)))
			}
			env.logf("overhead: round %d %-16s %.0f req/s: p50 %.2fms p99 %.2fms p99.9 %.2fms%s %v", round+1, t.Name, res.FixedRate, ms(s.P50), ms(s.P99), ms(s.P999), cpu, s.Errors)
		}
	}
	for _, t := range res.Targets {
		if pids := procPids(t.procs); len(pids) > 0 {
			t.ProxyRSS = treeUsage(pids...).RSSKiB
		}
		for _, p := range t.procs {
			if p.admin != "" {
				logRuntimeMemory(env, t.Name, p.admin)
			}
		}
		t.Fixed = summarize(t.fixed, t.fixedDur)
		var added []time.Duration
		for i := range t.RoundP99 {
			added = append(added, t.RoundP99[i]-direct.RoundP99[i])
		}
		slices.Sort(added)
		if len(added) > 0 {
			t.AddedP99 = added[len(added)/2]
		}
	}
	perRequestCosts(ctx, env, res)
	if env.profile {
		top, err := profileTether(ctx, env, urls, res.target("tether (memory)").MaxRate, cfg.profile, cfg.sessions)
		if err != nil {
			env.logf("overhead: profile: %v", err)
		}
		res.ProfileTop = top
	}
	return res, nil
}

func procPids(ps []*proc) []int {
	var pids []int
	for _, p := range ps {
		pids = append(pids, p.pid())
	}
	return pids
}

// perRequestCosts measures what the rounds cannot: system calls per
// follow-up of every proxy, traced in turn over the same sequential load;
// tether's allocations per follow-up; tether's RSS with many sessions. Each
// is bounded in time, and one that cannot be measured is noted, not fatal.
func perRequestCosts(ctx context.Context, env *reportEnv, res *overheadResult) {
	note := func(format string, a ...any) {
		msg := fmt.Sprintf(format, a...)
		env.logf("overhead: %s", msg)
		res.Notes = append(res.Notes, msg)
	}
	if err := ensureTools(env.logf, "strace"); err != nil {
		note("no syscall counts: %v", err)
	} else {
		for _, t := range res.Targets {
			if len(t.procs) == 0 || ctx.Err() != nil {
				continue
			}
			n, err := syscallsPerRequest(ctx, treePids(procPids(t.procs)...), t.sessions[0], env.logDir, t.Name)
			if err != nil {
				note("%s: no syscall count: %v", t.Name, err)
				continue
			}
			t.Syscalls = n
			env.logf("overhead: %-16s %.1f syscalls per follow-up (strace -c -f, %d sequential)", t.Name, n, straceRequests)
		}
	}
	if ctx.Err() != nil {
		return
	}
	if own, all, err := tetherAllocs(ctx); err != nil {
		note("no allocation count: %v", err)
	} else {
		res.OwnAllocs, res.AllAllocs = own, all
		env.logf("overhead: tether allocates %d times per follow-up (%d with the test harness)", own, all)
	}
	if env.manySessions > 0 && ctx.Err() == nil {
		env.logf("overhead: tether with %d sessions (hack/sessionmem)", env.manySessions)
		if rss, err := tetherSessionsRSS(ctx, env.tether, env.manySessions); err != nil {
			note("no RSS with %d sessions: %v", env.manySessions, err)
		} else {
			res.ManyRSS, res.ManySessions = rss, env.manySessions
			env.logf("overhead: tether RSS with %d sessions: %.1f MiB", env.manySessions, rss)
		}
	}
}

// hashMisroutes opens n sessions through nginx's consistent hash on the
// session header and sends each one follow-up: the initialize has no id
// (nginx hashes the empty key by falling back to round-robin), so a
// follow-up reaches the backend that minted its id only by chance.
func hashMisroutes(ctx context.Context, c *http.Client, url string, n int) (wrong, total int) {
	for range n {
		sid, _, err := openSession(ctx, c, url)
		if err != nil {
			// notifications/initialized itself may hash elsewhere: 404.
			wrong++
			total++
			continue
		}
		total++
		if _, err := whoami(ctx, c, url, sid); err != nil {
			wrong++
		}
	}
	return wrong, total
}

// profileTether runs tether in-process in a separate bench process with a
// CPU profile, loads it at rate, and returns `go tool pprof -top`.
func profileTether(ctx context.Context, env *reportEnv, urls []string, rate float64, dur time.Duration, sessions int) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	port, _ := freePort()
	prof := filepath.Join(env.logDir, "tether-cpu.pprof") // kept with -keep
	p, err := startProc(env.logDir, "tether-profiled", self, "tether-profiled",
		"-backends", strings.Join(urls, ","), "-listen", fmt.Sprintf("127.0.0.1:%d", port), "-cpuprofile", prof)
	if err != nil {
		return "", err
	}
	defer p.stop()
	if _, err := p.expect("ready", 10*time.Second, nil); err != nil {
		return "", err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	c := newClient()
	var ss []liveSession
	for range sessions {
		sid, backend, err := openSession(ctx, c, url)
		if err != nil {
			return "", err
		}
		ss = append(ss, liveSession{url: url, header: mcpHeaders(sid), backend: backend})
	}
	if err := p.send("start"); err != nil {
		return "", err
	}
	if _, err := p.expect("profiling", 5*time.Second, nil); err != nil {
		return "", err
	}
	r := attack(ctx, followUpTargeter(ss), rate, dur, 2000)
	s := summarize(r.Samples, dur)
	env.logf("overhead: profiled tether at %.0f req/s: p50 %.2fms p99 %.2fms ok %d/%d", rate, ms(s.P50), ms(s.P99), s.OK, s.Sent)
	p.stop()
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=35", prof).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %v: %s", err, out)
	}
	cum, _ := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=45", prof).CombinedOutput()
	text := fmt.Sprintf("tether in-process (tetherbench tether-profiled), %.0f req/s of follow-ups for %v: p50 %.2fms p99 %.2fms\n\n## flat\n%s\n## cumulative\n%s",
		rate, dur, ms(s.P50), ms(s.P99), out, cum)
	if err := os.WriteFile(filepath.Join(env.outDir, "tether-cpu-top.txt"), []byte(text), 0o644); err != nil {
		return "", err
	}
	return text, nil
}

// overheadMarkdown is the scenario's table and notes.
func overheadMarkdown(o *overheadResult) string {
	var b strings.Builder
	d := o.Targets[0]
	dcpu := cpuPer1k(d.BackCPU, d.Requests)
	fmt.Fprintf(&b, "Follow-up `tools/call` (echo) on %d live sessions per target, 3 go-sdk backends in their own process. "+
		"Latency and CPU at **%.0f req/s** (50%% of direct's max sustainable rate), runs interleaved.\n\n", o.Sessions, o.FixedRate)
	fmt.Fprintf(&b, "| target | max sustainable req/s | × direct | p50 ms | p99 ms | p99.9 ms | p99 added ms (median of rounds) | proxy CPU s/1k req | total CPU / direct | proxy RSS MiB | total RSS / direct | idle RSS MiB | RSS MiB at %s sessions | syscalls / req | allocs / req | errors |\n", thousands(o.ManySessions))
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range o.Targets {
		total := cpuPer1k(t.BackCPU+t.ProxyCPU, t.Requests)
		many, allocs := "–", "–"
		if t.Name == "tether (memory)" {
			if o.ManyRSS > 0 {
				many = fmt.Sprintf("%.1f", o.ManyRSS)
			}
			if o.AllAllocs > 0 {
				allocs = fmt.Sprintf("%d (%d with the harness)", o.OwnAllocs, o.AllAllocs)
			}
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %.2f | %.2f | %.2f | %s | %s | %.2f | %s | %.2f | %s | %s | %s | %s | %d |\n",
			t.Name, t.MaxRate, t.MaxRate/max(d.MaxRate, 1),
			ms(t.Fixed.P50), ms(t.Fixed.P99), ms(t.Fixed.P999),
			dashIf(t == d, fmt.Sprintf("%+.2f", ms(t.AddedP99))),
			dashIf(t == d, fmt.Sprintf("%.3f", cpuPer1k(t.ProxyCPU, t.Requests))),
			total/dcpu,
			dashIf(t == d, fmt.Sprintf("%.1f", float64(t.ProxyRSS)/1024)),
			float64(t.BackRSS+t.ProxyRSS)/float64(max(1, d.BackRSS)),
			dashIf(t.IdleRSS == 0, fmt.Sprintf("%.1f", float64(t.IdleRSS)/1024)),
			many,
			dashIf(t.Syscalls == 0, fmt.Sprintf("%.1f", t.Syscalls)),
			allocs,
			t.Fixed.Sent-t.Fixed.OK)
	}
	fmt.Fprintf(&b, "\n*Idle RSS*: the proxy's processes after start, before any request. *RSS at %s sessions*: `go run ./hack/sessionmem -tether BIN -sessions %d` (tether's memory store; a minimal MCP responder as the backend). "+
		"*Syscalls / req*: `strace -c -f` of every process and thread of the proxy during %d sequential follow-ups on one session and one keep-alive connection, after %d untraced ones; nanosleep (the Go runtime's clock-driven sysmon) left out. "+
		"*Allocs / req*: tether's own path for a sticky follow-up (`go test -run TestFollowUpAllocations -v ./internal/proxy/`; `BenchmarkServeHTTPFollowUp` counts the harness's allocations too).\n",
		thousands(o.ManySessions), o.ManySessions, straceRequests, straceWarm)
	var peaks []string
	for _, t := range o.Targets[1:] {
		peaks = append(peaks, fmt.Sprintf("%s %.1f", t.Name, float64(t.PeakRSS)/1024))
	}
	fmt.Fprintf(&b, "\n*Proxy RSS*: after the rounds. The most after any one round (MiB), the first ones following the rate search's overload: %s.\n", strings.Join(peaks, ", "))
	for _, n := range o.Notes {
		fmt.Fprintf(&b, "\nNot measured: %s\n", n)
	}
	fmt.Fprintf(&b, "\nBackends' CPU when reached directly: %.3f s per 1k requests. A rate is sustainable when ≥ 99.9%% succeed, ≥ 95%% of it is actually sent, and p99 ≤ %v; the search starts from each target's closed-loop throughput (64 in flight) and steps up through fractions of it, interleaved (each fraction starting one target further on), past the last by %.1f up to %.0f× it while the target sustains them, then bisects %d times between a target's last sustained rate and the one that failed (a failed step is run once more; a target whose first rate fails steps down by ×0.6 first):\n\n", dcpu, sloP99, o.Search.StepFraction, o.Search.MaxFraction, o.Search.Refine)
	for _, t := range o.Targets {
		fmt.Fprintf(&b, "- %s: closed loop %.0f req/s; stopped at %s. %s\n", t.Name, t.Estimate, cmpOr(t.StopWhy, "the last step (all sustainable)"), t.Note)
	}
	fmt.Fprintf(&b, "\nnginx as usually written, `hash $http_mcp_session_id consistent`: **%d of %d** sessions' follow-ups answered 404 (docs/design.md#benchmark-anchors: the id is minted by the backend, so the hash of a follow-up's id names an arbitrary backend).\n", o.HashWrong, o.HashTotal)
	return b.String()
}

// thousands writes n with thousands separators (100,000).
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func cpuPer1k(cpu time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return cpu.Seconds() * 1000 / float64(n)
}

func dashIf(cond bool, s string) string {
	if cond {
		return "–"
	}
	return s
}

func cmpOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// overheadChart: p99 against offered rate per target, the fixed-rate
// percentiles, the max rates, and per proxy CPU, RSS and system calls.
func overheadChart(o *overheadResult) *svg.Figure {
	f := &svg.Figure{Title: "Overhead: follow-up tools/call on live sessions", Cols: 2, PanelW: 560, PanelH: 300,
		Footnote: fmt.Sprintf("Left: p99 at each offered rate of the search (open loop, vegeta). Right: p50/p99/p99.9 at %.0f req/s.", o.FixedRate)}
	lc := &svg.LineChart{Title: "p99 latency vs offered rate", XLabel: "offered req/s", YLabel: "p99 ms", LogY: true,
		HLines: []svg.Marker{{X: ms(sloP99), Label: "SLO"}}}
	for _, t := range o.Targets {
		s := svg.Series{Name: t.Name, Points: true}
		for _, st := range t.Steps {
			s.X = append(s.X, st.Rate)
			s.Y = append(s.Y, ms(st.S.P99))
		}
		lc.Series = append(lc.Series, s)
	}
	gb := &svg.GroupedBars{Title: fmt.Sprintf("latency at %.0f req/s", o.FixedRate), YLabel: "ms"}
	for _, t := range o.Targets {
		gb.Groups = append(gb.Groups, t.Name)
	}
	for _, q := range []struct {
		name string
		get  func(summary) time.Duration
	}{{"p50", func(s summary) time.Duration { return s.P50 }}, {"p99", func(s summary) time.Duration { return s.P99 }}, {"p99.9", func(s summary) time.Duration { return s.P999 }}} {
		s := svg.Series{Name: q.name}
		for _, t := range o.Targets {
			s.Y = append(s.Y, ms(q.get(t.Fixed)))
		}
		gb.Series = append(gb.Series, s)
	}
	mr := &svg.GroupedBars{Title: "max sustainable rate", YLabel: "req/s"}
	s := svg.Series{Name: "req/s"}
	for _, t := range o.Targets {
		mr.Groups = append(mr.Groups, t.Name)
		s.Y = append(s.Y, t.MaxRate)
	}
	mr.Series = []svg.Series{s}
	cpu := &svg.GroupedBars{Title: "CPU seconds per 1k requests", YLabel: "CPU s"}
	sp, sb := svg.Series{Name: "proxy"}, svg.Series{Name: "backends"}
	for _, t := range o.Targets {
		cpu.Groups = append(cpu.Groups, t.Name)
		sp.Y = append(sp.Y, cpuPer1k(t.ProxyCPU, t.Requests))
		sb.Y = append(sb.Y, cpuPer1k(t.BackCPU, t.Requests))
	}
	cpu.Series = []svg.Series{sp, sb}
	rss := &svg.GroupedBars{Title: "proxy RSS", YLabel: "MiB"}
	si, sa := svg.Series{Name: "idle"}, svg.Series{Name: "after the rounds"}
	sys := &svg.GroupedBars{Title: "system calls per sequential follow-up (strace)", YLabel: "syscalls"}
	sc := svg.Series{Name: "syscalls"}
	for _, t := range o.Targets[1:] { // direct has no proxy
		rss.Groups = append(rss.Groups, t.Name)
		si.Y = append(si.Y, float64(t.IdleRSS)/1024)
		sa.Y = append(sa.Y, float64(t.ProxyRSS)/1024)
		sys.Groups = append(sys.Groups, t.Name)
		sc.Y = append(sc.Y, t.Syscalls)
	}
	rss.Series = []svg.Series{si, sa}
	sys.Series = []svg.Series{sc}
	f.Add(lc, gb, mr, cpu, rss, sys)
	return f
}

// logRuntimeMemory logs where a tether's memory is after the rounds, as
// its Go runtime counts it: what the RSS read then is made of, and the
// heap goal and the time since the last collection (the memory release's
// is the last one when it ran).
func logRuntimeMemory(env *reportEnv, name, admin string) {
	mib := func(metric string) float64 { return metricSum(admin, metric) / (1 << 20) }
	sinceGC := float64(time.Now().UnixNano())/1e9 - metricSum(admin, "go_memstats_last_gc_time_seconds")
	env.logf("overhead: %s after the rounds: heap in use %.1f MiB (goal %.1f, GOGC %.0f, last collection %.1fs ago), heap free not released %.1f MiB, stacks %.1f MiB, goroutines %.0f",
		name, mib("go_memstats_heap_inuse_bytes"), mib("go_memstats_next_gc_bytes"), metricSum(admin, "go_gc_gogc_percent"), sinceGC,
		mib("go_memstats_heap_idle_bytes")-mib("go_memstats_heap_released_bytes"),
		mib("go_memstats_stack_inuse_bytes"), metricSum(admin, "go_goroutines"))
}
