package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// cpuCommand measures proxy CPU per 1,000 follow-ups, the overhead
// scenario's CPU figure, without its rate search: every target in turn at
// one fixed rate, for several interleaved rounds. Several tether binaries
// may be given, so that two builds are compared in one run against the same
// nginx and HAProxy:
//
//	cd bench && go run ./cmd/tetherbench cpu -tether /tmp/a,/tmp/b -rounds 6
//
// It prints each round's figures and the median per target, with its ratio
// to nginx's, split into user space and the kernel (utime and stime), and
// the context switches of all the target's threads per follow-up; then each
// target's CPU against the first target's and nginx's, paired by round
// (what an A/B of two builds should read). A proxy's kernel work per
// request is mostly the same sockets' reads and writes whatever the proxy,
// so the split says whether a difference is in the proxy's own code or in
// how often it sleeps and wakes. The figures are not the report's (no
// latency, no rate search); they answer "did this change make tether
// cheaper than that one", quickly. -overload first overloads each target
// as the overhead scenario's rate search does, for what an overload
// leaves behind (after one, tether's runtime gives the heap's growth back
// in the background while the rounds fault pages in again).
func cpuCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cpu", flag.ContinueOnError)
	tethers := fs.String("tether", "", "comma-separated tether binaries (default: go build ./cmd/tether)")
	rate := fs.Float64("rate", 1000, "follow-ups per second, open loop")
	dur := fs.Duration("round", 3*time.Second, "length of one target's turn in a round")
	rounds := fs.Int("rounds", 5, "interleaved rounds")
	sessions := fs.Int("sessions", 32, "live sessions per target")
	others := fs.Bool("others", true, "also measure nginx and HAProxy")
	keep := fs.Bool("keep", false, "keep the temp dir with the child processes' logs")
	overload := fs.Duration("overload", 0, "before the rounds, overload each target in turn for this long (as the overhead scenario's rate search does), then a second each at -rate to settle")
	overloadRate := fs.Float64("overload-rate", 5000, "follow-ups per second of -overload, open loop (up to 2,000 in flight)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logDir, err := os.MkdirTemp("", "tetherbench-cpu-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "logs in", logDir)
	} else {
		defer os.RemoveAll(logDir)
	}
	bins := strings.Split(*tethers, ",")
	if *tethers == "" {
		bin, err := buildTether(logDir)
		if err != nil {
			return err
		}
		bins = []string{bin}
	}
	if err := ensureTools(func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }, "nginx", "haproxy"); err != nil {
		return err
	}

	backends, addrs, names, err := startBackends(logDir, "backends", nil, "-names", "b0,b1,b2", "-named-ids")
	if err != nil {
		return err
	}
	defer backends.stop()
	var urls []string
	for _, n := range names {
		urls = append(urls, "http://"+addrs[n])
	}
	type target struct {
		name  string
		base  string
		procs []*proc
		live  []liveSession
		// Per round: CPU, and its user-space and kernel parts, in s per
		// 1k; context switches per follow-up.
		cpu, user, sys, switches []float64
		p99                      []float64 // ms, per round
	}
	var targets []*target
	for i, bin := range bins {
		p, url, err := startTether(ctx, bin, logDir, fmt.Sprintf("tether-%d", i), urls)
		if err != nil {
			return err
		}
		defer p.stop()
		targets = append(targets, &target{name: bin, base: url, procs: []*proc{p}})
	}
	if *others {
		ngx, ngxURL, _, err := startNginx(ctx, logDir, names, addrs)
		if err != nil {
			return err
		}
		defer ngx.stop()
		hap, hapURL, err := startHAProxy(ctx, logDir, names, addrs)
		if err != nil {
			return err
		}
		defer hap.stop()
		targets = append(targets, &target{name: "nginx", base: ngxURL, procs: []*proc{ngx}},
			&target{name: "HAProxy", base: hapURL, procs: []*proc{hap}})
	}
	httpc := newClient()
	for _, t := range targets {
		for range *sessions {
			sid, backend, err := openSession(ctx, httpc, t.base+"/mcp")
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			t.live = append(t.live, liveSession{url: t.base + "/mcp", header: mcpHeaders(sid), backend: backend})
		}
		attack(ctx, followUpTargeter(t.live), *rate, time.Second, 2000) // warm up
	}
	if *overload > 0 {
		for _, t := range targets {
			r := attack(ctx, followUpTargeter(t.live), *overloadRate, *overload, 2000)
			s := summarize(r.Samples, *overload)
			fmt.Printf("overload %-24s %.0f req/s offered, %.0f sent: p50 %.2fms p99 %.2fms\n", t.name, *overloadRate, s.Achieved, ms(s.P50), ms(s.P99))
		}
		for _, t := range targets {
			attack(ctx, followUpTargeter(t.live), *rate, time.Second, 2000)
		}
	}
	for round := range *rounds {
		for _, t := range targets {
			pids := procPids(t.procs)
			before := treeUsage(pids...)
			r := attack(ctx, followUpTargeter(t.live), *rate, *dur, 2000)
			after := treeUsage(pids...)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s := summarize(r.Samples, *dur)
			n := len(r.Samples)
			per1k := cpuPer1k(after.CPU-before.CPU, n)
			t.cpu = append(t.cpu, per1k)
			t.user = append(t.user, cpuPer1k(after.User-before.User, n))
			t.sys = append(t.sys, cpuPer1k(after.Sys-before.Sys, n))
			t.switches = append(t.switches, float64(after.Switches-before.Switches)/float64(max(n, 1)))
			t.p99 = append(t.p99, ms(s.P99))
			fmt.Printf("round %d %-24s %5d req  %.3f s/1k (user %.3f, kernel %.3f)  %.2f switches/req  p99 %.2fms  errors %v\n",
				round+1, t.name, n, per1k, t.user[round], t.sys[round], t.switches[round], ms(s.P99), s.Errors)
		}
	}
	var ngx *target
	for _, t := range targets {
		if t.name == "nginx" {
			ngx = t
		}
	}
	fmt.Println()
	for _, t := range targets {
		m := median(t.cpu)
		ratio := ""
		if ngx != nil {
			ratio = fmt.Sprintf("  %.2f× nginx", m/median(ngx.cpu))
		}
		fmt.Printf("%-24s median %.3f s/1k%s  (user %.3f, kernel %.3f; %.2f context switches per follow-up; p99 %.2f ms)\n",
			t.name, m, ratio, median(t.user), median(t.sys), median(t.switches), median(t.p99))
	}
	// Paired by round: the machine's speed drifts between rounds more
	// than two builds differ, and a round's targets share its drift.
	refs := []*target{targets[0]}
	if ngx != nil {
		refs = append(refs, ngx)
	}
	fmt.Println()
	for _, ref := range refs {
		for _, t := range targets {
			if t == ref {
				continue
			}
			p := pairedRatios(t.cpu, ref.cpu)
			fmt.Printf("%-24s %.3f× %s by round (median; %.3f–%.3f over %d rounds)\n", t.name, p.median, ref.name, p.lo, p.hi, len(t.cpu))
		}
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// paired is a target's CPU against a reference's, round by round.
type paired struct{ median, lo, hi float64 }

// pairedRatios is the median, least and greatest of a[i]/b[i], the
// rounds where both were measured.
func pairedRatios(a, b []float64) paired {
	var r []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			r = append(r, a[i]/b[i])
		}
	}
	if len(r) == 0 {
		return paired{}
	}
	return paired{median(r), slices.Min(r), slices.Max(r)}
}
