// Command gcburst measures what the collections tether forces after a
// burst (cmd/tether/gcpace.go, and the memory release of memrelease.go)
// cost when its live heap is large: -sessions live sessions in the memory
// store, then rounds of a burst (-conns clients sending follow-ups as fast
// as they are answered, for -burst, their connections closed after it, as
// spiky clients' are) and a quiet spell (-quiet), with a steady probe of
// -probe follow-ups a second throughout. Each round reports the probe's
// latency in the burst and in the spell after it (where the forced
// collections run), the collections (GODEBUG=gctrace=1: forced ones,
// stop-the-world pauses, mark time, GC CPU) and tether's CPU.
//
// Several binaries (or scripts that exec one with other settings) take
// turns round by round, each with its own sessions, so that builds compare
// under the same machine drift:
//
//	go build -tags tether_sidecar -trimpath -ldflags "-s -w" -o /tmp/tether ./cmd/tether
//	go run ./hack/gcburst -tether /tmp/before,/tmp/after -sessions 100000 -rounds 4
//
// The backend is a minimal MCP responder in this process, as
// hack/sessionmem's; the load generator shares the machine's CPUs with
// tether, so compare figures of one run.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-mcp/tether/hack/internal/tetherproc"
)

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"claude-code","version":"2.0.14"}}}`

func main() {
	bins := flag.String("tether", "", "comma-separated tether binaries (or scripts exec'ing one), taking turns")
	sessions := flag.Int("sessions", 100000, "live sessions in each tether's memory store")
	rounds := flag.Int("rounds", 4, "rounds; each target has a burst and a quiet spell per round")
	conns := flag.Int("conns", 1000, "clients in a burst, each on its own connection and session")
	burst := flag.Duration("burst", 2*time.Second, "length of a burst")
	quiet := flag.Duration("quiet", 7*time.Second, "quiet spell after a burst (the memory release comes 5 s after the last collection)")
	probeRate := flag.Float64("probe", 200, "probe follow-ups a second, throughout")
	bodySize := flag.Int("body", 8<<10, "bytes of a burst follow-up's tool arguments")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	flag.Parse()
	if *bins == "" {
		fmt.Fprintln(os.Stderr, "gcburst: -tether is required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go http.Serve(ln, http.HandlerFunc(tetherproc.MinimalBackend))
	backend := "http://" + ln.Addr().String()

	var targets []*target
	for _, bin := range strings.Split(*bins, ",") {
		t, err := start(bin, backend, *sessions)
		if err != nil {
			panic(err)
		}
		defer t.stop()
		targets = append(targets, t)
	}
	for _, t := range targets {
		begin := time.Now()
		if err := t.openSessions(ctx, *sessions); err != nil {
			panic(err)
		}
		fmt.Printf("%s: %d sessions in %.1fs; %s\n", t.name, len(t.sessions), time.Since(begin).Seconds(), t.memory())
	}
	pad := strings.Repeat("x", *bodySize)
	for r := range *rounds {
		for _, t := range targets {
			if ctx.Err() != nil {
				return
			}
			s := t.round(ctx, *conns, *burst, *quiet, *probeRate, pad)
			t.results = append(t.results, s)
			fmt.Printf("round %d %-28s %s\n", r+1, t.name, s)
		}
	}
	fmt.Println()
	for _, t := range targets {
		fmt.Printf("%-28s %s\n", t.name, summary(t.results))
		fmt.Printf("%-28s after the rounds: %s\n", "", t.memory())
	}
}

// target is one tether under test.
type target struct {
	name          string
	cmd           *exec.Cmd
	listen, admin string
	gcs           gcLog
	sessions      []string
	results       []roundStats
}

// start runs bin with gctrace on, its memory store sized for n sessions.
func start(bin, backend string, n int) (*target, error) {
	t := &target{name: bin, listen: tetherproc.FreeAddr(), admin: tetherproc.FreeAddr()}
	t.cmd = exec.Command(bin, "--backends", backend, "--max-sessions", strconv.Itoa(n+1000),
		"--listen", t.listen, "--admin-listen", t.admin, "--log-level", "warn")
	t.cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	t.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := t.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := t.cmd.Start(); err != nil {
		return nil, err
	}
	go t.gcs.read(stderr, bin)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + t.admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return t, nil
			}
		}
		if time.Now().After(deadline) {
			t.stop()
			return nil, fmt.Errorf("%s not ready after 20s", bin)
		}
	}
}

func (t *target) stop() { t.cmd.Process.Kill(); t.cmd.Wait() }

func (t *target) url() string { return "http://" + t.listen + "/mcp" }

// openSessions initializes n sessions through tether, 16 at a time.
func (t *target) openSessions(ctx context.Context, n int) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	ids := make([]string, n)
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n) && ctx.Err() == nil; i = next.Add(1) - 1 {
				resp, err := tetherproc.Post(ctx, client, t.url(), "", initBody)
				if err != nil || resp.Header.Get("Mcp-Session-Id") == "" {
					failed.Add(1)
					continue
				}
				ids[i] = resp.Header.Get("Mcp-Session-Id")
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 || ctx.Err() != nil {
		return fmt.Errorf("%s: %d of %d initializes failed (%v)", t.name, f, n, ctx.Err())
	}
	t.sessions = ids
	return nil
}

// roundStats is one target's burst and quiet spell.
type roundStats struct {
	burstReqs, burstErrs int
	burstP99             time.Duration
	// The probe's latencies in the burst and in the quiet spell after it;
	// probeEnd those of its first second, when the collections after a
	// burst run.
	probeBurst, probeQuiet, probeEnd []time.Duration
	gcs                              []gcEvent
	cpu                              float64 // tether's CPU seconds in the round
	allocatedMB                      float64 // tether's heap allocation in the round
}

func (s roundStats) String() string {
	var forced int
	var stw, mark, gcCPU float64
	var live []string
	for _, g := range s.gcs {
		l := strconv.FormatFloat(g.liveMB, 'f', 0, 64)
		if g.forced {
			forced++
			l += "f"
		}
		live = append(live, fmt.Sprintf("%s:%.0fms", l, g.cpuMs))
		stw += g.stwMs
		mark += g.markMs
		gcCPU += g.cpuMs
	}
	return fmt.Sprintf("burst %5d req (%d failed) p99 %6.1fms | probe p99 in burst %6.1fms, after %6.1fms (its first second %6.1fms, max %6.1fms) | GCs %d (forced %d; live MB:CPU %s): STW %.2fms, mark %.0fms, GC CPU %.0fms | tether CPU %.2fs, allocated %.0f MB",
		s.burstReqs, s.burstErrs, ms(s.burstP99), ms(pct(s.probeBurst, 0.99)), ms(pct(s.probeQuiet, 0.99)), ms(pct(s.probeEnd, 0.99)), ms(pct(s.probeQuiet, 1)),
		len(s.gcs), forced, strings.Join(live, " "), stw, mark, gcCPU, s.cpu, s.allocatedMB)
}

// summary is the rounds' medians and totals.
func summary(rs []roundStats) string {
	var afterP99, burstP99, cpu []float64
	var allQuiet, allEnd []time.Duration
	var gcs, forced int
	var gcCPU, stw float64
	var forcedCPU, forcedMark []float64
	for _, r := range rs {
		afterP99 = append(afterP99, ms(pct(r.probeQuiet, 0.99)))
		burstP99 = append(burstP99, ms(pct(r.probeBurst, 0.99)))
		cpu = append(cpu, r.cpu)
		allQuiet = append(allQuiet, r.probeQuiet...)
		allEnd = append(allEnd, r.probeEnd...)
		for _, g := range r.gcs {
			gcs++
			if g.forced {
				forced++
				forcedCPU = append(forcedCPU, g.cpuMs)
				forcedMark = append(forcedMark, g.markMs)
			}
			gcCPU += g.cpuMs
			stw += g.stwMs
		}
	}
	return fmt.Sprintf("median probe p99 after a burst %.1fms (all rounds' after-burst probes: p99 %.1fms, max %.1fms; their first seconds': p99 %.1fms), in a burst %.1fms; %d GCs (%d forced: median %.0fms CPU, %.0fms mark each), GC CPU %.0fms, STW %.2fms in all; median tether CPU a round %.2fs",
		median(afterP99), ms(pct(allQuiet, 0.99)), ms(pct(allQuiet, 1)), ms(pct(allEnd, 0.99)), median(burstP99), gcs, forced, median(forcedCPU), median(forcedMark), gcCPU, stw, median(cpu))
}

// round runs one burst and the quiet spell after it, with the probe
// throughout.
func (t *target) round(ctx context.Context, conns int, burst, quiet time.Duration, rate float64, pad string) roundStats {
	var s roundStats
	begin := time.Now()
	cpu0 := tetherproc.CPUSeconds(t.cmd.Process.Pid)
	alloc0 := tetherproc.Scrape(t.admin)["go_memstats_alloc_bytes_total"]

	// The probe: open loop, on sessions the burst does not use.
	var probeMu sync.Mutex
	var inBurst atomic.Bool
	inBurst.Store(true)
	var burstEnd atomic.Int64 // UnixNano
	probeClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer probeClient.CloseIdleConnections()
	probeCtx, stopProbe := context.WithCancel(ctx)
	var probes sync.WaitGroup
	probes.Go(func() {
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-probeCtx.Done():
				return
			case <-tick.C:
			}
			sid := t.sessions[len(t.sessions)-1-i%64]
			during := inBurst.Load()
			probes.Go(func() {
				start := time.Now()
				first := !during && start.UnixNano()-burstEnd.Load() < int64(time.Second)
				if _, err := tetherproc.Post(ctx, probeClient, t.url(), sid, followUp(i, "probe")); err != nil {
					return
				}
				d := time.Since(start)
				probeMu.Lock()
				defer probeMu.Unlock()
				if during {
					s.probeBurst = append(s.probeBurst, d)
				} else {
					s.probeQuiet = append(s.probeQuiet, d)
				}
				if first {
					s.probeEnd = append(s.probeEnd, d)
				}
			})
		}
	})

	// The burst: each client on its own connection and session, closed
	// after it (a client that keeps them open keeps their goroutines).
	tr := &http.Transport{MaxIdleConnsPerHost: conns}
	client := &http.Client{Transport: tr}
	var burstMu sync.Mutex
	var lat []time.Duration
	var errs int
	end := time.Now().Add(burst)
	var wg sync.WaitGroup
	for c := range conns {
		sid := t.sessions[c]
		wg.Go(func() {
			var mine []time.Duration
			var failed int
			for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
				start := time.Now()
				if _, err := tetherproc.Post(ctx, client, t.url(), sid, followUp(i, pad)); err != nil {
					failed++
					continue
				}
				mine = append(mine, time.Since(start))
			}
			burstMu.Lock()
			lat = append(lat, mine...)
			errs += failed
			burstMu.Unlock()
		})
	}
	wg.Wait()
	tr.CloseIdleConnections()
	burstEnd.Store(time.Now().UnixNano())
	inBurst.Store(false)
	s.burstReqs, s.burstErrs, s.burstP99 = len(lat), errs, pct(lat, 0.99)

	select {
	case <-time.After(quiet):
	case <-ctx.Done():
	}
	stopProbe()
	probes.Wait()
	s.cpu = tetherproc.CPUSeconds(t.cmd.Process.Pid) - cpu0
	s.allocatedMB = (tetherproc.Scrape(t.admin)["go_memstats_alloc_bytes_total"] - alloc0) / (1 << 20)
	s.gcs = t.gcs.since(begin)
	return s
}

func followUp(i int, text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":%q}}}`, i+2, text)
}

// gcEvent is one gctrace line.
type gcEvent struct {
	at            time.Time // when the line was read
	forced        bool
	stwMs, markMs float64 // the two stop-the-world phases' wall time; the concurrent mark's
	cpuMs         float64 // all of the cycle's CPU: its pauses, assists, background and idle marking
	liveMB        float64 // the heap marked live
}

// gcLog keeps the gctrace lines of one process's stderr; the others go to
// ours.
type gcLog struct {
	mu     sync.Mutex
	events []gcEvent
}

func (l *gcLog) read(r io.Reader, name string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		e, ok := parseGCTrace(line)
		if !ok {
			fmt.Fprintf(os.Stderr, "%s: %s\n", name, line)
			continue
		}
		e.at = time.Now()
		l.mu.Lock()
		l.events = append(l.events, e)
		l.mu.Unlock()
	}
}

func (l *gcLog) since(t time.Time) []gcEvent {
	// The last line of a round may be read a moment after it ends.
	time.Sleep(100 * time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []gcEvent
	for _, e := range l.events {
		if !e.at.Before(t) {
			out = append(out, e)
		}
	}
	return out
}

// parseGCTrace reads a line such as
//
//	gc 12 @3.402s 2%: 0.019+41+0.028 ms clock, 0.038+0.2/20/0+0.057 ms cpu, 96->97->90 MB, 180 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)
func parseGCTrace(line string) (gcEvent, bool) {
	var e gcEvent
	if !strings.HasPrefix(line, "gc ") {
		return e, false
	}
	_, rest, ok := strings.Cut(line, ": ")
	if !ok {
		return e, false
	}
	fields := strings.Split(rest, ", ")
	if len(fields) < 3 {
		return e, false
	}
	clock := sumParts(strings.TrimSuffix(fields[0], " ms clock"))
	if len(clock) != 3 {
		return e, false
	}
	e.stwMs, e.markMs = clock[0]+clock[2], clock[1]
	for _, v := range sumParts(strings.TrimSuffix(fields[1], " ms cpu")) {
		e.cpuMs += v
	}
	if heap := strings.Split(strings.TrimSuffix(fields[2], " MB"), "->"); len(heap) == 3 {
		e.liveMB, _ = strconv.ParseFloat(heap[2], 64)
	}
	e.forced = strings.HasSuffix(line, "(forced)")
	return e, true
}

// sumParts splits "a+b/c/d+e" into its '+' terms, each the sum of its
// '/' parts.
func sumParts(s string) []float64 {
	var out []float64
	for _, term := range strings.Split(s, "+") {
		var v float64
		for _, p := range strings.Split(term, "/") {
			f, _ := strconv.ParseFloat(p, 64)
			v += f
		}
		out = append(out, v)
	}
	return out
}

// memory is the process's RSS (and its peak) and heap.
func (t *target) memory() string {
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(t.cmd.Process.Pid) + "/status")
	kib := map[string]float64{}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			kib[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	m := tetherproc.Scrape(t.admin)
	return fmt.Sprintf("RSS %.1f MiB (peak %.1f), heap in use %.1f MiB, sessions %.0f",
		kib["VmRSS:"]/1024, kib["VmHWM:"]/1024, m["go_memstats_heap_inuse_bytes"]/(1<<20), m["tether_session_records"])
}

// pct is the q quantile of d (0 for none).
func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
