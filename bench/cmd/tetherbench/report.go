package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/tether-mcp/tether/bench/internal/svg"
)

// reportEnv is what every scenario gets.
type reportEnv struct {
	full    bool
	profile bool
	outDir  string // report files
	logDir  string // child processes' logs and configs (a temp dir)
	tether  string // the tether binary, built from ./cmd/tether
	logf    func(format string, a ...any)

	// failoverKills is how many graceful kills the failover scenario runs,
	// each with fresh sessions (the abrupt kill runs once).
	failoverKills int
	// manySessions is how many live sessions tether's RSS is measured
	// with in the overhead scenario (hack/sessionmem); 0 skips it.
	manySessions int
	// rollouts is how many times the rolling update runs in each mode,
	// alternating.
	rollouts int
	// rolloutDrainRate is tether's --drain-rate in the proactive rollouts
	// (0: tether's default).
	rolloutDrainRate float64
	// rolloutWaitMS makes the rolling update's calls stay in flight that
	// long (the wait tool); 0: echo.
	rolloutWaitMS int
	// streams is the open-streams scenario's shape.
	streams streamsConfig
}

func reportCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tetherbench report", flag.ContinueOnError)
	full := fs.Bool("full", false, "longer runs and more rounds (make bench-full)")
	out := fs.String("out", "results", "directory for the summary, charts and raw figures")
	readme := fs.String("readme", "", "README whose figures block (between the markers) is replaced with the summary")
	scenarios := fs.String("scenarios", "seed,overhead,failover,placement,rollout,streams", "comma-separated scenarios to run")
	tetherBin := fs.String("tether", "", "tether binary (default: go build ./cmd/tether into a temp dir)")
	profile := fs.Bool("profile", false, "also profile tether in-process under load (always on with -full)")
	keep := fs.Bool("keep", false, "keep the temp dir with the child processes' logs and configs")
	manySessions := fs.Int("many-sessions", 100000, "live sessions tether's RSS is measured with in the overhead scenario (0 skips it)")
	rollouts := fs.Int("rollouts", 1, "rolling updates per --drain mode (on-failure and proactive, alternating), each with fresh backends, tether and sessions (3 with -full unless set)")
	rolloutDrainRate := fs.Float64("rollout-drain-rate", 0, "tether's --drain-rate in the proactive rolling updates (0: tether's default)")
	rolloutWaitMS := fs.Int("rollout-wait-ms", 0, "the rolling update's calls stay in flight this long on the backend (its wait tool; 0: echo, which answers at once)")
	failoverKills := fs.Int("failover-kills", 1, "graceful kills in the failover scenario per protocol (HTTP/1.1 and h2c), each a run of its own with fresh sessions (rare races need many; the abrupt kill runs once)")
	streamsSizes := fs.String("streams-sizes", "1000,5000,10000", "open streams per run of the streams scenario, comma-separated (a fresh proxy per size)")
	streamsWindow := fs.Duration("streams-window", 10*time.Second, "the streams scenario's CPU windows, pinging and idle (30s with -full unless set)")
	streamsPing := fs.Duration("streams-ping", 15*time.Second, "the streams scenario's interval between two pings of one stream")
	streamsRuns := fs.Int("streams-runs", 1, "the streams scenario's runs of each proxy at each size, made in turn; its figures are their medians")
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]string{} // the flags given, with their values
	fs.Visit(func(f *flag.Flag) { set[f.Name] = f.Value.String() })
	_, rolloutsSet := set["rollouts"]
	if *full && !rolloutsSet {
		*rollouts = 3
	}
	if *failoverKills < 1 {
		return fmt.Errorf("-failover-kills %d: want at least 1", *failoverKills)
	}
	if _, ok := set["streams-window"]; *full && !ok {
		*streamsWindow = 30 * time.Second
	}
	streams, err := parseStreamsConfig(*streamsSizes, *streamsWindow, *streamsPing, *streamsRuns)
	if err != nil {
		return err
	}
	env := &reportEnv{full: *full, profile: *profile || *full, outDir: *out, failoverKills: *failoverKills, manySessions: *manySessions, rollouts: *rollouts, rolloutDrainRate: *rolloutDrainRate, rolloutWaitMS: *rolloutWaitMS, streams: streams}
	start := time.Now()
	env.logf = func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	if err := os.MkdirAll(env.outDir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "tetherbench-")
	if err != nil {
		return err
	}
	if *keep {
		env.logf("logs and configs in %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	env.logDir = tmp
	env.tether = *tetherBin
	if env.tether == "" {
		env.logf("building ./cmd/tether")
		if env.tether, err = buildTether(tmp); err != nil {
			return err
		}
	}

	want := map[string]bool{}
	for _, s := range strings.Split(*scenarios, ",") {
		want[strings.TrimSpace(s)] = true
	}
	rep := &report{Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Machine: machine(), Command: commandLine(*full, *scenarios, set), Full: *full, LoadBefore: loadAvg()}
	if l := loadAvg(); l > float64(runtime.NumCPU())/2 {
		env.logf("warning: load average %.2f on %d cores before the run: other work will distort the figures", l, runtime.NumCPU())
	}
	var failed []string
	fail := func(name string, err error) {
		env.logf("%s: FAILED: %v", name, err)
		failed = append(failed, fmt.Sprintf("%s: %v", name, err))
	}
	if want["seed"] && ctx.Err() == nil {
		env.logf("scenario 1: the seed bug")
		if r, err := runSeed(ctx, env); err != nil {
			fail("seed", err)
		} else {
			rep.Seed = r
			writeSVG(env, "seed.svg", seedChart(r))
		}
	}
	if want["overhead"] && ctx.Err() == nil {
		env.logf("scenario 2: overhead")
		if r, err := runOverhead(ctx, env); err != nil {
			fail("overhead", err)
		} else {
			rep.Overhead = r
			writeSVG(env, "overhead.svg", overheadChart(r))
		}
	}
	if want["failover"] && ctx.Err() == nil {
		env.logf("scenario 3: failover")
		if r, err := runFailover(ctx, env); err != nil {
			fail("failover", err)
		} else {
			rep.Failover = r
			writeSVG(env, "failover.svg", failoverChart(r))
		}
	}
	if want["placement"] && ctx.Err() == nil {
		env.logf("scenario 4: placement")
		r := runPlacement(env.full)
		rep.Placement = r
		writeSVG(env, "placement.svg", placementChart(r))
	}
	if want["rollout"] && ctx.Err() == nil {
		env.logf("scenario 5: rolling update")
		if r, err := runRollout(ctx, env); err != nil {
			fail("rollout", err)
		} else {
			rep.Rollout = r
			writeSVG(env, "rollout.svg", rolloutChart(r))
		}
	}
	if want["streams"] && ctx.Err() == nil {
		env.logf("scenario 6: open streams")
		if r, err := runStreams(ctx, env); err != nil {
			fail("streams", err)
		} else {
			rep.Streams = r
			for _, f := range r.failures() {
				fail("streams", errors.New(f))
			}
			writeSVG(env, "streams.svg", streamsChart(r))
		}
	}
	rep.Failed = failed
	rep.LoadAfter = loadAvg()
	rep.Elapsed = time.Since(start).Round(time.Second).String()
	md := rep.markdown()
	if err := os.WriteFile(filepath.Join(env.outDir, "summary.md"), []byte(md), 0o644); err != nil {
		return err
	}
	// A figure that could not be measured is NaN or ±Inf, which JSON cannot
	// carry: say so rather than write an empty file.
	if raw, err := json.MarshalIndent(rep, "", "  "); err != nil {
		env.logf("results.json not written: %v", err)
	} else if err := os.WriteFile(filepath.Join(env.outDir, "results.json"), raw, 0o644); err != nil {
		return err
	}
	if *readme != "" {
		if err := replaceBlock(*readme, md); err != nil {
			return err
		}
	}
	fmt.Print(md)
	env.logf("done in %s; report in %s", rep.Elapsed, env.outDir)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d scenario(s) failed", len(failed))
	}
	return nil
}

func writeSVG(env *reportEnv, name string, f *svg.Figure) {
	if err := os.WriteFile(filepath.Join(env.outDir, name), []byte(f.String()), 0o644); err != nil {
		env.logf("%s: %v", name, err)
	}
}

// report is everything one run measured.
type report struct {
	Date, Machine, Command string
	Full                   bool
	Elapsed                string
	// 1-minute load averages before and after: anything else running on
	// the machine shows here, and distorts every timing.
	LoadBefore, LoadAfter float64
	Seed                  *seedResult
	Overhead              *overheadResult
	Failover              *failoverResult
	Placement             *placementResult
	Rollout               *rolloutResult
	Streams               *streamsResult
	Failed                []string
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s, with `%s` (%s; 1-minute load average %.2f before, %.2f after).\n\n", r.Date, r.Machine, r.Command, r.Elapsed, r.LoadBefore, r.LoadAfter)
	if len(r.Failed) > 0 {
		b.WriteString("**Failed scenarios:**\n\n")
		for _, f := range r.Failed {
			fmt.Fprintf(&b, "- %s\n", f)
		}
		b.WriteString("\n")
	}
	b.WriteString(r.targetsMarkdown())
	if r.Seed != nil {
		b.WriteString("\n### 1. The seed bug: ClientIP affinity against tether\n\n![seed](results/seed.svg)\n\n")
		b.WriteString(seedMarkdown(r.Seed))
	}
	if r.Overhead != nil {
		b.WriteString("\n### 2. Overhead against direct, nginx and HAProxy\n\n![overhead](results/overhead.svg)\n\n")
		b.WriteString(overheadMarkdown(r.Overhead))
	}
	if r.Failover != nil {
		b.WriteString("\n### 3. Failover under load\n\n![failover](results/failover.svg)\n\n")
		b.WriteString(failoverMarkdown(r.Failover))
	}
	if r.Placement != nil {
		b.WriteString("\n### 4. Placement quality\n\n![placement](results/placement.svg)\n\n")
		b.WriteString(placementMarkdown(r.Placement))
	}
	if r.Rollout != nil {
		b.WriteString("\n### 5. Rolling update\n\n![rollout](results/rollout.svg)\n\n")
		b.WriteString(rolloutMarkdown(r.Rollout))
	}
	if r.Streams != nil {
		b.WriteString("\n### 6. Open streams\n\n![streams](results/streams.svg)\n\n")
		b.WriteString(streamsMarkdown(r.Streams))
	}
	return b.String()
}

// targetsMarkdown states where tether stands against the targets.
func (r *report) targetsMarkdown() string {
	var b strings.Builder
	b.WriteString("| target | measured | met |\n|---|---|---|\n")
	row := func(target, measured string, met bool) {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", target, measured, map[bool]string{true: "yes", false: "**no**"}[met])
	}
	if o := r.Overhead; o != nil {
		d, tm, ng := o.target("direct"), o.target("tether (memory)"), o.target("nginx")
		ratio := func(a, b float64) float64 {
			if b <= 0 {
				return 0
			}
			return a / b
		}
		row("follow-up RPS ≥ 0.9× direct", fmt.Sprintf("%.0f vs %.0f req/s: %.2f×", tm.MaxRate, d.MaxRate, ratio(tm.MaxRate, d.MaxRate)), d.MaxRate > 0 && tm.MaxRate >= 0.9*d.MaxRate)
		row("follow-up RPS ≥ 1.0× nginx", fmt.Sprintf("%.0f vs %.0f req/s: %.2f×", tm.MaxRate, ng.MaxRate, ratio(tm.MaxRate, ng.MaxRate)), ng.MaxRate > 0 && tm.MaxRate >= ng.MaxRate)
		ta, na := tm.AddedP99, ng.AddedP99
		row("p99 added ≤ nginx's", fmt.Sprintf("%+.2f ms vs %+.2f ms at %.0f req/s (median over rounds of p99 − direct's p99 in the same round)", ms(ta), ms(na), o.FixedRate), ta <= na)
		o.sidecarTargets(row)
	}
	if p := r.Placement; p != nil {
		s := p.Static
		row("sessions max/mean ≤ 1.05 at 100 sessions over 3 backends (p2c)",
			fmt.Sprintf("mean %.3f, worst %.3f over %d seeds", s.MeanRatio["p2c"], s.WorstRatio["p2c"], s.Seeds), s.WorstRatio["p2c"] <= 1.05)
	}
	if f := r.Failover; f != nil {
		for _, k := range f.byKind() {
			what := fmt.Sprintf("%d errors of %d requests; p99 %.1f ms in the second after the kill", k.Errors, k.Sent, ms(k.WorstP99After))
			if k.Kills > 1 {
				what = fmt.Sprintf("%d errors of %d requests over %d kills (%d with errors); worst p99 %.1f ms in the second after a kill", k.Errors, k.Sent, k.Kills, k.KillsWithErrors, ms(k.WorstP99After))
			}
			row("0 errors on failover ("+k.Kind+", "+k.Proto+")", what, k.Errors == 0)
		}
	}
	if r.Rollout != nil {
		r.Rollout.rolloutTargets(row)
	}
	if r.Streams != nil {
		r.Streams.streamsTargets(row)
	}
	return b.String()
}

// replaceBlock puts md between the figures markers of a README.
func replaceBlock(path, md string) error {
	const begin, end = "<!-- figures:begin -->", "<!-- figures:end -->"
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s … %s block", path, begin, end)
	}
	s = s[:i+len(begin)] + "\n" + md + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

// loadAvg is the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	kernel, _ := exec.Command("uname", "-r").Output()
	return fmt.Sprintf("%d × %s, Linux %s, %s", runtime.NumCPU(), cpu, strings.TrimSpace(string(kernel)), runtime.Version())
}

// commandLine is how the report was made: make's targets run every
// scenario; a subset says which, and the rolling update's flags.
func commandLine(full bool, scenarios string, set map[string]string) string {
	if _, ok := set["scenarios"]; ok {
		c := "go run ./cmd/tetherbench -scenarios " + scenarios
		if full {
			c += " -full"
		}
		for _, f := range []string{"rollouts", "rollout-drain-rate", "rollout-wait-ms", "streams-sizes", "streams-window", "streams-ping", "streams-runs"} {
			if v, ok := set[f]; ok {
				c += " -" + f + " " + v
			}
		}
		return c
	}
	if full {
		return "make bench-full"
	}
	return "make bench"
}

// sidecarTargets are the rows of the sidecar's own budget (CPU, memory,
// tail latency and system calls against nginx and HAProxy in the same
// run), given to row; a figure not measured in this run is not met.
func (o *overheadResult) sidecarTargets(row func(target, measured string, met bool)) {
	d, tm, ng, hp := o.target("direct"), o.target("tether (memory)"), o.target("nginx"), o.target("HAProxy")
	if d == nil || tm == nil || ng == nil || hp == nil {
		return
	}
	cpu := func(t *overheadTarget) float64 { return cpuPer1k(t.ProxyCPU, t.Requests) }
	mib := func(kib int64) float64 { return float64(kib) / 1024 }
	row("proxy CPU per 1k follow-ups ≤ nginx's (stretch: ≤ HAProxy's)",
		fmt.Sprintf("%.3f s vs nginx %.3f s (%.2f×), HAProxy %.3f s", cpu(tm), cpu(ng), cpu(tm)/max(cpu(ng), 1e-9), cpu(hp)),
		tm.Requests > 0 && cpu(tm) <= cpu(ng))
	row("idle RSS ≤ 20 MiB", fmt.Sprintf("%.1f MiB", mib(tm.IdleRSS)), tm.IdleRSS > 0 && mib(tm.IdleRSS) <= 20)
	row("RSS after the overhead rounds ≤ 40 MiB", fmt.Sprintf("%.1f MiB", mib(tm.ProxyRSS)), tm.ProxyRSS > 0 && mib(tm.ProxyRSS) <= 40)
	row(fmt.Sprintf("RSS with %s live sessions ≤ 150 MiB", thousands(o.ManySessions)), fmt.Sprintf("%.1f MiB", o.ManyRSS), o.ManyRSS > 0 && o.ManyRSS <= 150)
	row("max sustainable follow-up rate ≥ HAProxy's and ≥ 0.9× direct",
		// Each proxy's share of direct's rate is shown: on 2 shared cores it
		// is set by the machine (the backends' CPU per request against the
		// proxies'), and says whether a shortfall is tether's or any proxy's.
		fmt.Sprintf("%.0f vs HAProxy %.0f, direct %.0f req/s (× direct: tether %.2f, HAProxy %.2f, nginx %.2f)",
			tm.MaxRate, hp.MaxRate, d.MaxRate, tm.MaxRate/max(d.MaxRate, 1e-9), hp.MaxRate/max(d.MaxRate, 1e-9), ng.MaxRate/max(d.MaxRate, 1e-9)),
		tm.MaxRate >= hp.MaxRate && tm.MaxRate >= 0.9*d.MaxRate)
	row("p99 added ≤ HAProxy's", fmt.Sprintf("%+.2f ms vs %+.2f ms", ms(tm.AddedP99), ms(hp.AddedP99)), tm.AddedP99 <= hp.AddedP99)
	row("syscalls per follow-up ≤ nginx's + 4", fmt.Sprintf("%.1f vs nginx %.1f", tm.Syscalls, ng.Syscalls), tm.Syscalls > 0 && ng.Syscalls > 0 && tm.Syscalls <= ng.Syscalls+4)
	row("allocations per follow-up in tether's path ≤ 15", fmt.Sprintf("%d", o.OwnAllocs), o.AllAllocs > 0 && o.OwnAllocs <= 15)
}
