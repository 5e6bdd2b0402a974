package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-mcp/tether/bench/internal/svg"
)

// streamsConfig is the open-streams scenario's shape, from the flags.
type streamsConfig struct {
	Sizes  []int         // open streams per run
	Window time.Duration // each CPU window: pinging, then nothing flowing
	Ping   time.Duration // between two pings of one stream while pinging
	// Repeats is how many times each proxy is measured at each size:
	// every proxy at every size, then all again, so that the machine's
	// drift meets each alike; the report's figures are the medians.
	Repeats int
	// Settle is the wait after the streams are open, before their RSS is
	// read: longer than tether's --memory-release-after (5 s), so that
	// what opening them left behind has been given back as it would be.
	Settle time.Duration
}

// parseStreamsConfig checks the scenario's flags.
func parseStreamsConfig(sizes string, window, ping time.Duration, repeats int) (streamsConfig, error) {
	cfg := streamsConfig{Window: window, Ping: ping, Repeats: repeats, Settle: 6 * time.Second}
	if repeats < 1 {
		return cfg, fmt.Errorf("-streams-runs %d: want at least 1", repeats)
	}
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-streams-sizes %q: want positive numbers, comma-separated", sizes)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	if window <= 0 || ping <= 0 {
		return cfg, fmt.Errorf("-streams-window %v, -streams-ping %v: want both above 0", window, ping)
	}
	return cfg, nil
}

// streamsRun is one proxy holding Streams open streams, fresh for the run.
type streamsRun struct {
	Proxy   string
	Streams int
	// The proxy's RSS in KiB (every process's VmRSS): before the streams
	// (after one was opened and closed), with all of them open before any
	// event, and once every stream has had a ping (after the pinging
	// window, and at least one ping interval after the pings began).
	RSSBefore, RSSOpen, RSSAfterEvents int64
	// KiB per stream: (RSSOpen − RSSBefore) / Streams, and the same after
	// events have flowed.
	KiBPerStream, KiBPerStreamAfterEvents float64
	// tether's go_goroutines before and with the streams open (0 for the
	// others, which have none).
	GoroutinesBefore, GoroutinesOpen float64
	// CPU of the proxy's processes in % of one core over each window, from
	// the threads' schedstat (ns); the *Ticks figures are the same windows
	// from /proc/PID/stat utime+stime (10 ms ticks).
	CPUPinging, CPUIdle           float64
	CPUPingingTicks, CPUIdleTicks float64
	// Events is the ping events the clients received during the pinging
	// window (about Streams × Window / Ping).
	Events int64
	// Opening is how long opening the streams took, 32 at a time, until
	// the backend held them all.
	Opening time.Duration
	// OpenAtEnd is the streams that were still open at the end: each one
	// received the final "mark" event, and none had ended.
	OpenAtEnd int
	// Failed says why the run failed: streams refused or dropped.
	Failed string `json:",omitempty"`
}

type streamsResult struct {
	streamsConfig
	// CPUClock names where the CPU figures come from: "schedstat", or
	// "stat" when the kernel has no schedstat.
	CPUClock string
	Runs     []*streamsRun
	// Notes says which sizes were lowered to fit the file descriptors
	// this machine allows.
	Notes []string
}

// streamsProxy starts one proxy in front of an SSE backend, configured for
// n open streams, and returns its client address (tether's proc has its
// admin URL, the others' none).
type streamsProxy struct {
	name  string
	start func(ctx context.Context, env *reportEnv, backend string, n int) (p *proc, addr string, err error)
}

var streamsProxies = []streamsProxy{
	{"tether", func(ctx context.Context, env *reportEnv, backend string, n int) (*proc, string, error) {
		// --max-streams above n: the default (10,000) is the size of
		// the largest run, and its limit is not what is measured.
		p, url, err := startTether(ctx, env.tether, env.logDir, fmt.Sprintf("streams-tether-%d", n), []string{"http://" + backend},
			"--max-streams", strconv.Itoa(n+1000))
		return p, strings.TrimPrefix(url, "http://"), err
	}},
	{"nginx", startStreamsNginx},
	{"HAProxy", startStreamsHAProxy},
}

// runStreams opens many SSE streams through each proxy, each on its own
// client connection, and measures what holding them costs: RSS per stream,
// tether's goroutines, and CPU while every stream pings and while nothing
// flows. Sizes go in order, every proxy at one size before the next size.
func runStreams(ctx context.Context, env *reportEnv) (*streamsResult, error) {
	cfg := env.streams
	if err := ensureTools(env.logf, "nginx", "haproxy"); err != nil {
		return nil, err
	}
	// A proxy holds two sockets per stream, the bench's and the backend's;
	// the children inherit the limit set here. A size that does not fit
	// under the hard limit (which only CAP_SYS_RESOURCE raises) is measured
	// at the most that fits instead, and the report says so.
	limit, err := raiseNoFile(uint64(streamsFDs(slices.Max(cfg.Sizes))))
	if err != nil {
		return nil, err
	}
	res := &streamsResult{streamsConfig: cfg, CPUClock: "schedstat"}
	res.Sizes, res.Notes = fitSizes(cfg.Sizes, limit)
	for _, n := range res.Notes {
		env.logf("streams: %s", n)
	}
	if _, ok := onCPU(os.Getpid()); !ok {
		res.CPUClock = "stat"
	}
	for rep := 1; rep <= cfg.Repeats; rep++ { // at least 1 (parseStreamsConfig)
		for _, n := range res.Sizes {
			for _, px := range streamsProxies {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				r, err := runStreamsOnce(ctx, env, px, n)
				if err != nil {
					return nil, fmt.Errorf("%s at %d streams: %w", px.name, n, err)
				}
				res.Runs = append(res.Runs, r)
				if r.RSSOpen == 0 { // failed before its streams were open
					env.logf("streams: run %d: %-7s %6d streams: failed: %s", rep, r.Proxy, n, r.Failed)
					continue
				}
				env.logf("streams: run %d: %-7s %6d streams: RSS %.1f → %.1f MiB (%.1f KiB/stream; %.1f after events), goroutines %.0f, CPU %.3f%% pinging (%d events), %.3f%% idle; %d open at the end %s (opened in %v)",
					rep, r.Proxy, n, mib(r.RSSBefore), mib(r.RSSOpen), r.KiBPerStream, r.KiBPerStreamAfterEvents, r.GoroutinesOpen, r.CPUPinging, r.Events, r.CPUIdle, r.OpenAtEnd, r.Failed, r.Opening.Round(time.Millisecond))
			}
		}
	}
	return res, nil
}

// runStreamsOnce is one proxy at n streams, with a backend and a proxy of
// its own. A run whose streams were refused or dropped is returned with
// Failed set; an error is a run that could not be made at all.
func runStreamsOnce(ctx context.Context, env *reportEnv, px streamsProxy, n int) (*streamsRun, error) {
	cfg := env.streams
	run := &streamsRun{Proxy: px.name, Streams: n}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	be, err := startProc(env.logDir, fmt.Sprintf("streams-backend-%s-%d", strings.ToLower(px.name), n), self, "sse-backend")
	if err != nil {
		return nil, err
	}
	defer be.stop()
	l, err := be.expect("backend ", 10*time.Second, nil)
	if err != nil {
		return nil, err
	}
	backend := strings.TrimPrefix(l, "backend ")
	if _, err := be.expect("ready", 10*time.Second, nil); err != nil {
		return nil, err
	}
	p, addr, err := px.start(ctx, env, backend, n)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	pids := []int{p.pid()}
	// window measures the proxy's CPU over d, in % of one core: from
	// schedstat, and from utime+stime.
	window := func(d time.Duration) (pct, pctTicks float64, err error) {
		c0, t0, w0 := cpuNow(pids), treeUsage(pids...).CPU, time.Now()
		if err := pause(ctx, d); err != nil {
			return 0, 0, err
		}
		c1, t1, w1 := cpuNow(pids), treeUsage(pids...).CPU, time.Now()
		return percentOfCore(c1-c0, w1.Sub(w0)), percentOfCore(t1-t0, w1.Sub(w0)), nil
	}
	goroutines := func() float64 {
		if p.admin == "" {
			return 0
		}
		return metricSum(p.admin, "go_goroutines")
	}

	// One stream opened and closed first: what a proxy sets up once, on
	// its first stream, is not a cost per stream.
	warm, err := openSSEClients(ctx, addr, 1, 1)
	warm.close()
	if err != nil {
		return nil, fmt.Errorf("first stream: %w", err)
	}
	if err := pause(ctx, 2*time.Second); err != nil {
		return nil, err
	}
	run.RSSBefore = treeUsage(pids...).RSSKiB
	run.GoroutinesBefore = goroutines()

	began := time.Now()
	clients, err := openSSEClients(ctx, addr, n, 32)
	defer clients.close()
	if err != nil {
		run.Failed = fmt.Sprintf("%d of %d streams opened: %v", clients.opened(), n, err)
		return run, nil
	}
	if got, err := waitBackendStreams(ctx, be, n, 30*time.Second); err != nil {
		run.Failed = fmt.Sprintf("the backend holds %d of %d streams: %v", got, n, err)
		return run, nil
	}
	run.Opening = time.Since(began)
	if err := pause(ctx, cfg.Settle); err != nil {
		return nil, err
	}
	run.RSSOpen = treeUsage(pids...).RSSKiB
	run.GoroutinesOpen = goroutines()

	if err := backendCommand(be, "ping "+cfg.Ping.String()); err != nil {
		return nil, err
	}
	ev0 := clients.events.Load()
	if run.CPUPinging, run.CPUPingingTicks, err = window(cfg.Window); err != nil {
		return nil, err
	}
	run.Events = clients.events.Load() - ev0
	if err := pause(ctx, cfg.Ping-cfg.Window); err != nil { // every stream has had its ping
		return nil, err
	}
	run.RSSAfterEvents = treeUsage(pids...).RSSKiB

	if err := backendCommand(be, "ping 0"); err != nil {
		return nil, err
	}
	if err := pause(ctx, 2*time.Second); err != nil { // the last pings' writes
		return nil, err
	}
	if run.CPUIdle, run.CPUIdleTicks, err = window(cfg.Window); err != nil {
		return nil, err
	}
	run.KiBPerStream = float64(run.RSSOpen-run.RSSBefore) / float64(n)
	run.KiBPerStreamAfterEvents = float64(run.RSSAfterEvents-run.RSSBefore) / float64(n)

	// Every stream still open: each one carries one last event through.
	if err := backendCommand(be, "mark"); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for clients.marks.Load()+clients.ended.Load() < int64(n) && time.Now().Before(deadline) {
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return nil, err
		}
	}
	run.OpenAtEnd = int(clients.marks.Load())
	if ended := clients.ended.Load(); ended > 0 || run.OpenAtEnd < n {
		held, _ := backendStreams(be)
		run.Failed = fmt.Sprintf("%d of %d streams dropped (%d ended at the client; the backend holds %d)", n-run.OpenAtEnd, n, ended, held)
	}
	return run, nil
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// percentOfCore is cpu over a window of wall time, in % of one core.
func percentOfCore(cpu, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return 100 * cpu.Seconds() / window.Seconds()
}

// pause waits d, or less if ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// backendCommand sends one command to the SSE backend and waits for "ok".
func backendCommand(be *proc, line string) error {
	if err := be.send(line); err != nil {
		return err
	}
	l, err := be.expect("", 10*time.Second, nil)
	if err != nil {
		return err
	}
	if l != "ok" {
		return fmt.Errorf("sse-backend %q: %s", line, l)
	}
	return nil
}

// backendStreams asks the SSE backend how many streams it holds.
func backendStreams(be *proc) (int, error) {
	if err := be.send("count"); err != nil {
		return 0, err
	}
	l, err := be.expect("count ", 10*time.Second, nil)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimPrefix(l, "count "))
}

// waitBackendStreams waits until the backend holds n streams: a proxy may
// answer a client before its request to the backend is through.
func waitBackendStreams(ctx context.Context, be *proc, n int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		got, err := backendStreams(be)
		if err != nil || got >= n {
			return got, err
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("not within %v", timeout)
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return got, err
		}
	}
}

// sseClients is the streams' client side: one connection per stream, each
// read by a goroutine that counts the events.
type sseClients struct {
	mu      sync.Mutex
	conns   []net.Conn
	closing atomic.Bool
	// events counts ping events received, marks mark events, ended the
	// streams that ended before close.
	events, marks, ended atomic.Int64
	wg                   sync.WaitGroup
}

// openSSEClients opens n streams to addr, `parallel` at a time; on error
// it returns those opened so far with it.
func openSSEClients(ctx context.Context, addr string, n, parallel int) (*sseClients, error) {
	c := &sseClients{}
	next := make(chan struct{})
	errc := make(chan error, parallel)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for range next {
				if err := c.open(ctx, addr); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for range n {
		select {
		case next <- struct{}{}:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return c, err
}

func (c *sseClients) open(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /mcp HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", addr); err != nil {
		conn.Close()
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1024), nil)
	if err != nil {
		conn.Close()
		return err
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		conn.Close()
		return fmt.Errorf("status %d, Content-Type %q: %s", resp.StatusCode, ct, strings.TrimSpace(string(body)))
	}
	conn.SetDeadline(time.Time{})
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
	c.wg.Go(func() { c.read(resp.Body) })
	return nil
}

// read counts a stream's events until it ends.
func (c *sseClients) read(body io.Reader) {
	br := bufio.NewReaderSize(body, 128)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case string(line) == "event: ping\n":
			c.events.Add(1)
		case string(line) == "event: mark\n":
			c.marks.Add(1)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if !c.closing.Load() {
				c.ended.Add(1)
			}
			return
		}
	}
}

func (c *sseClients) opened() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// close ends every stream and waits for their readers.
func (c *sseClients) close() {
	c.closing.Store(true)
	c.mu.Lock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// raiseNoFile raises RLIMIT_NOFILE to at least want (as root, the hard
// limit too); the processes started afterwards inherit it.
func raiseNoFile(want uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur >= want {
		return l.Cur, nil
	}
	if l.Max < want {
		raised := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			return want, nil
		}
		// Without CAP_SYS_RESOURCE: up to the hard limit.
	}
	l.Cur = min(want, l.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("RLIMIT_NOFILE to %d: %w", l.Cur, err)
	}
	return l.Cur, nil
}

// streamsFDs is the file descriptors a proxy needs for n streams: two
// sockets each, and some to spare for listeners, logs and the poller.
func streamsFDs(n int) int { return 2*n + 128 }

// fitSizes is sizes with each one that needs more file descriptors than
// limit lowered to the most that fits (in hundreds), and a note for each.
func fitSizes(sizes []int, limit uint64) ([]int, []string) {
	most := (int(limit) - streamsFDs(0)) / 2 / 100 * 100
	var fit []int
	var notes []string
	for _, n := range sizes {
		if uint64(streamsFDs(n)) > limit {
			notes = append(notes, fmt.Sprintf("%s streams need %s file descriptors in the proxy, above RLIMIT_NOFILE's hard limit here (%s; only CAP_SYS_RESOURCE raises it): measured at %s instead",
				thousands(n), thousands(streamsFDs(n)), thousands(int(limit)), thousands(most)))
			n = most
		}
		if n > 0 && !slices.Contains(fit, n) {
			fit = append(fit, n)
		}
	}
	return fit, notes
}

// onCPU is the time the threads of pids and their descendants have run,
// from schedstat, in nanoseconds (utime and stime count 10 ms ticks, too
// coarse to tell 0.00% from 0.03% of a core over a few seconds). ok is
// false when the kernel has no schedstat. A thread that ends takes its
// time with it, which none of the proxies' threads do while they run.
func onCPU(pids ...int) (total time.Duration, ok bool) {
	ok = true
	for pid := range descendants(pids...) {
		dir := "/proc/" + strconv.Itoa(pid) + "/task"
		tasks, err := os.ReadDir(dir)
		if err != nil {
			continue // the process ended
		}
		for _, t := range tasks {
			b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
			if errors.Is(err, os.ErrNotExist) {
				if _, serr := os.Stat(filepath.Join(dir, t.Name())); serr == nil {
					ok = false // the thread is there, its schedstat is not
				}
				continue
			}
			if d, good := parseSchedstat(string(b)); good {
				total += d
			}
		}
	}
	return total, ok
}

// cpuNow is onCPU's figure, or utime+stime without schedstat (the
// scenario's CPUClock says which).
func cpuNow(pids []int) time.Duration {
	if c, ok := onCPU(pids...); ok {
		return c
	}
	return treeUsage(pids...).CPU
}

// parseSchedstat is the first field of /proc/PID/task/TID/schedstat: the
// time the thread has run, in nanoseconds.
func parseSchedstat(s string) (time.Duration, bool) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || ns < 0 {
		return 0, false
	}
	return time.Duration(ns), true
}

// streamsNginxConfig is nginx with one worker, for n open streams: each
// takes two of the worker's connections (client and upstream), with room
// to spare, no
// buffering of the response (proxy_buffering off, as in the overhead
// scenario), and idle streams are not timed out (proxy_read_timeout).
func streamsNginxConfig(dir string, port int, backend string, n int) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("worker_processes 1;") // its RLIMIT_NOFILE is the bench's, raised for n streams
	w("daemon off;")
	w("pid %s/nginx.pid;", dir)
	w("error_log %s/error.log warn;", dir)
	// Past 15/16 of worker_connections in use nginx closes connections it
	// deems reusable, a new one waiting for its request among them.
	w("events { worker_connections %d; }", (2*n+64)*9/8)
	w("http {")
	w("  access_log off;")
	for _, t := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		w("  %s_temp_path %s/%s;", t, dir, t)
	}
	w("  upstream sse { server %s; }", backend)
	w("  server {")
	w("    listen 127.0.0.1:%d backlog=4096;", port)
	w("    location / {")
	w("      proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $http_host;")
	w("      proxy_buffering off; proxy_read_timeout 1h; send_timeout 1h;")
	w("      proxy_pass http://sse;")
	w("    }")
	w("  }")
	w("}")
	return b.String()
}

func startStreamsNginx(ctx context.Context, env *reportEnv, backend string, n int) (*proc, string, error) {
	dir := filepath.Join(env.logDir, fmt.Sprintf("nginx-streams-%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(streamsNginxConfig(dir, port, backend, n)), 0o644); err != nil {
		return nil, "", err
	}
	p, err := startProc(env.logDir, fmt.Sprintf("streams-nginx-%d", n), "nginx", "-e", filepath.Join(dir, "error.log"), "-p", dir, "-c", conf)
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := waitTCP(ctx, addr, 10*time.Second); err != nil {
		p.stop()
		return nil, "", fmt.Errorf("nginx: %w%s", err, p.logTail())
	}
	return p, addr, nil
}

// streamsHAProxyConfig is HAProxy with one thread, for n open streams: the
// connection limits above n, idle streams not timed out, and what arrives
// sent at once (http-no-delay: otherwise HAProxy sends a streamed
// response's headers with MSG_MORE, and the kernel holds them up to
// 200 ms, as nginx and tether do not).
func streamsHAProxyConfig(port int, backend string, n int) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("global")
	w("  maxconn %d", n+16)
	w("  nbthread 1")
	w("defaults")
	w("  mode http")
	w("  maxconn %d", n+16)
	w("  timeout connect 2s")
	w("  timeout client 1h")
	w("  timeout server 1h")
	w("  option http-no-delay")
	w("frontend sse_in")
	w("  bind 127.0.0.1:%d", port)
	w("  default_backend sse")
	w("backend sse")
	w("  server s0 %s", backend)
	return b.String()
}

func startStreamsHAProxy(ctx context.Context, env *reportEnv, backend string, n int) (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	conf := filepath.Join(env.logDir, fmt.Sprintf("haproxy-streams-%d.cfg", n))
	if err := os.WriteFile(conf, []byte(streamsHAProxyConfig(port, backend, n)), 0o644); err != nil {
		return nil, "", err
	}
	p, err := startProc(env.logDir, fmt.Sprintf("streams-haproxy-%d", n), "haproxy", "-db", "-f", conf)
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := waitTCP(ctx, addr, 10*time.Second); err != nil {
		p.stop()
		return nil, "", fmt.Errorf("haproxy: %w%s", err, p.logTail())
	}
	return p, addr, nil
}

// run is proxy's figures at n streams, nil when it had no run: its run,
// or with several the median of each figure the report reads (a run of
// its own, made up); a failed run, when one failed, so that the goals it
// was for are not met.
func (s *streamsResult) run(proxy string, n int) *streamsRun {
	runs := s.runsOf(proxy, n)
	switch {
	case len(runs) == 0:
		return nil
	case len(runs) == 1:
		return runs[0]
	}
	for _, r := range runs {
		if r.Failed != "" {
			return r
		}
	}
	// The figures the report reads; results.json has every run whole.
	med := func(v func(*streamsRun) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = v(r)
		}
		return median(xs)
	}
	return &streamsRun{Proxy: proxy, Streams: n,
		RSSBefore:               int64(med(func(r *streamsRun) float64 { return float64(r.RSSBefore) })),
		RSSOpen:                 int64(med(func(r *streamsRun) float64 { return float64(r.RSSOpen) })),
		KiBPerStream:            med(func(r *streamsRun) float64 { return r.KiBPerStream }),
		KiBPerStreamAfterEvents: med(func(r *streamsRun) float64 { return r.KiBPerStreamAfterEvents }),
		GoroutinesBefore:        med(func(r *streamsRun) float64 { return r.GoroutinesBefore }),
		GoroutinesOpen:          med(func(r *streamsRun) float64 { return r.GoroutinesOpen }),
		CPUPinging:              med(func(r *streamsRun) float64 { return r.CPUPinging }),
		CPUIdle:                 med(func(r *streamsRun) float64 { return r.CPUIdle }),
		OpenAtEnd:               int(med(func(r *streamsRun) float64 { return float64(r.OpenAtEnd) })),
	}
}

// runsOf is proxy's runs at n streams, in the order they ran.
func (s *streamsResult) runsOf(proxy string, n int) []*streamsRun {
	var runs []*streamsRun
	for _, r := range s.Runs {
		if r.Proxy == proxy && r.Streams == n {
			runs = append(runs, r)
		}
	}
	return runs
}

// cpuRange is the least and the most CPU % pinging of proxy's runs at n
// streams that did not fail, for the table when there are several.
func (s *streamsResult) cpuRange(proxy string, n int) (lo, hi float64, ok bool) {
	for _, r := range s.runsOf(proxy, n) {
		if r.Failed != "" {
			continue
		}
		if !ok || r.CPUPinging < lo {
			lo = r.CPUPinging
		}
		if !ok || r.CPUPinging > hi {
			hi = r.CPUPinging
		}
		ok = true
	}
	return lo, hi, ok
}

// failures are the runs that failed, for the report's list.
func (s *streamsResult) failures() []string {
	var f []string
	for _, r := range s.Runs {
		if r.Failed != "" {
			f = append(f, fmt.Sprintf("%s at %s streams: %s", r.Proxy, thousands(r.Streams), r.Failed))
		}
	}
	return f
}

// streamsMarkdown is the scenario's table and how it was measured.
func streamsMarkdown(s *streamsResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Open SSE streams (GET, `text/event-stream`), each on its own client connection, held by one Go backend process; a fresh proxy and backend per run. "+
		"RSS: every process of the proxy (`VmRSS`), before the streams (after one opened and closed) and %v after all are open; *KiB / stream* = ΔRSS / streams, idle (before any event) and once every stream has had a ping. "+
		"CPU: the proxy's threads (%s), over %v while every stream gets a ping event every %v (each at its own phase), then over %v with nothing flowing, in %% of one core. "+
		"At the end one last event goes down every stream; a stream that does not deliver it is dropped, and the run failed.\n\n",
		s.Settle, cpuClockName(s.CPUClock), s.Window, s.Ping, s.Window)
	if s.Repeats > 1 {
		fmt.Fprintf(&b, "Each figure is the median of %d runs, made in turn (every proxy at every size, then all again); CPU %% pinging gives the least and the most too. results.json has every run.\n\n", s.Repeats)
	}
	b.WriteString("| proxy | streams | RSS MiB (before → open) | KiB / stream idle | KiB / stream after events | goroutines | CPU % pinging | CPU % idle | open at the end |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range s.Sizes {
		for _, px := range streamsProxies {
			r := s.run(px.name, n)
			if r == nil {
				continue
			}
			if r.Failed != "" && r.RSSOpen == 0 {
				fmt.Fprintf(&b, "| %s | %s | – | – | – | – | – | – | **failed**: %s |\n", r.Proxy, thousands(n), r.Failed)
				continue
			}
			g := "n/a"
			if r.GoroutinesOpen > 0 {
				g = fmt.Sprintf("%s (%.2f per stream)", thousands(int(r.GoroutinesOpen)), (r.GoroutinesOpen-r.GoroutinesBefore)/float64(n))
			}
			open := thousands(r.OpenAtEnd)
			if r.Failed != "" {
				open = "**failed**: " + r.Failed
			}
			ping := fmt.Sprintf("%.2f", r.CPUPinging)
			if lo, hi, ok := s.cpuRange(px.name, n); ok && s.Repeats > 1 {
				ping += fmt.Sprintf(" (%.2f–%.2f)", lo, hi)
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f → %.1f | %.1f | %.1f | %s | %s | %.2f | %s |\n",
				r.Proxy, thousands(n), mib(r.RSSBefore), mib(r.RSSOpen), r.KiBPerStream, r.KiBPerStreamAfterEvents, g, ping, r.CPUIdle, open)
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "\nNot measured as asked: %s.\n", n)
	}
	fmt.Fprintf(&b, "\ntether: the sidecar build, `--max-streams` above the run's size. nginx: 1 worker, `proxy_buffering off`, `proxy_read_timeout 1h`. HAProxy: `nbthread 1`, `timeout client/server 1h`, `option http-no-delay`. "+
		"Command: `cd bench && go run ./cmd/tetherbench -scenarios streams` (`-streams-sizes`, `-streams-window`, `-streams-ping`, `-streams-runs`).\n")
	return b.String()
}

func cpuClockName(c string) string {
	if c == "stat" {
		return "utime+stime of `/proc/PID/stat`, in 10 ms ticks"
	}
	return "the run time of every thread from `/proc/PID/task/TID/schedstat`, in ns; results.json also has utime+stime"
}

// streamsTargets are the rows of the open-streams goals (issue 32), given
// to row; a figure not measured in this run is not met.
func (s *streamsResult) streamsTargets(row func(target, measured string, met bool)) {
	if len(s.Sizes) == 0 {
		return
	}
	ok := func(r *streamsRun) bool { return r != nil && r.Failed == "" }
	// Per stream, idle and after events, at every size.
	var parts []string
	met := true
	for _, n := range s.Sizes {
		t, ng, hp := s.run("tether", n), s.run("nginx", n), s.run("HAProxy", n)
		if !ok(t) || !ok(ng) || !ok(hp) {
			met = false
			parts = append(parts, fmt.Sprintf("at %s: a run failed", thousands(n)))
			continue
		}
		parts = append(parts, fmt.Sprintf("at %s: %.1f / %.1f vs HAProxy %.1f / %.1f, nginx %.1f / %.1f", thousands(n),
			t.KiBPerStream, t.KiBPerStreamAfterEvents, hp.KiBPerStream, hp.KiBPerStreamAfterEvents, ng.KiBPerStream, ng.KiBPerStreamAfterEvents))
		if t.KiBPerStream > hp.KiBPerStream || t.KiBPerStreamAfterEvents > hp.KiBPerStreamAfterEvents ||
			t.KiBPerStream > ng.KiBPerStream || t.KiBPerStreamAfterEvents > ng.KiBPerStreamAfterEvents {
			met = false
		}
	}
	row("RSS per open stream ≤ HAProxy's, never above nginx's (KiB, idle / after events)", strings.Join(parts, "; "), met)

	// At 10,000; where this machine's file descriptors stop short of it,
	// projected from the most streams measured (5,000 or more).
	const tenK, tenKRow = 10000, "10,000 idle streams within 80 MiB RSS"
	var most *streamsRun
	for _, n := range s.Sizes {
		if r := s.run("tether", n); ok(r) && n >= 5000 && (most == nil || n > most.Streams) {
			most = r
		}
	}
	switch t := s.run("tether", tenK); {
	case t != nil && ok(t):
		row(tenKRow, fmt.Sprintf("%.1f MiB", mib(t.RSSOpen)), mib(t.RSSOpen) <= 80)
	case t != nil:
		row(tenKRow, "the run failed", false)
	case most != nil:
		projected := mib(most.RSSBefore) + most.KiBPerStream*tenK/1024
		row(tenKRow, fmt.Sprintf("%.1f MiB projected from %s streams (%.1f MiB): RSS before them + 10,000 × %.1f KiB",
			projected, thousands(most.Streams), mib(most.RSSOpen), most.KiBPerStream), projected <= 80)
	default:
		row(tenKRow, "not measured", false)
	}

	// CPU with pinging streams at 5,000 (the figure), else the
	// largest size.
	n := s.Sizes[len(s.Sizes)-1]
	if slices.Contains(s.Sizes, 5000) {
		n = 5000
	}
	t, ng := s.run("tether", n), s.run("nginx", n)
	if ok(t) && ok(ng) {
		row(fmt.Sprintf("CPU with %s streams pinging every %v ≤ nginx's", thousands(n), s.Ping),
			fmt.Sprintf("%.2f%% vs %.2f%% of a core", t.CPUPinging, ng.CPUPinging), t.CPUPinging <= ng.CPUPinging)
	} else {
		row(fmt.Sprintf("CPU with %s streams pinging every %v ≤ nginx's", thousands(n), s.Ping), "not measured", false)
	}

	// Nothing flowing: 0.00% at every size, as shown (rounded to 0.01%).
	parts, met = nil, true
	for _, n := range s.Sizes {
		t, ng := s.run("tether", n), s.run("nginx", n)
		if !ok(t) {
			met = false
			parts = append(parts, fmt.Sprintf("at %s: failed", thousands(n)))
			continue
		}
		p := fmt.Sprintf("at %s: %.2f%%", thousands(n), t.CPUIdle)
		if ok(ng) {
			p += fmt.Sprintf(" (nginx %.2f%%)", ng.CPUIdle)
		}
		parts = append(parts, p)
		if t.CPUIdle >= 0.005 {
			met = false
		}
	}
	row("CPU with open streams and nothing flowing 0.00%", strings.Join(parts, "; "), met)
}

// streamsChart: per size, each proxy's KiB per stream, CPU with nothing
// flowing and while pinging, and RSS with the streams open.
func streamsChart(s *streamsResult) *svg.Figure {
	f := &svg.Figure{Title: "Open streams: what holding them costs each proxy", Cols: 2, PanelW: 520, PanelH: 280,
		Footnote: fmt.Sprintf("A fresh proxy per size; one SSE stream per client connection; CPU over %v, pings every %v per stream.", s.Window, s.Ping)}
	panel := func(title, ylabel string, v func(*streamsRun) float64) *svg.GroupedBars {
		gb := &svg.GroupedBars{Title: title, YLabel: ylabel}
		for _, n := range s.Sizes {
			gb.Groups = append(gb.Groups, thousands(n)+" streams")
		}
		for _, px := range streamsProxies {
			ser := svg.Series{Name: px.name}
			for _, n := range s.Sizes {
				r := s.run(px.name, n)
				if r == nil || r.RSSOpen == 0 {
					ser.Y = append(ser.Y, math.NaN())
					continue
				}
				ser.Y = append(ser.Y, v(r))
			}
			gb.Series = append(gb.Series, ser)
		}
		return gb
	}
	f.Add(
		panel("RSS per open idle stream", "KiB", func(r *streamsRun) float64 { return r.KiBPerStream }),
		panel("CPU with nothing flowing", "% of one core", func(r *streamsRun) float64 { return r.CPUIdle }),
		panel("CPU while every stream pings", "% of one core", func(r *streamsRun) float64 { return r.CPUPinging }),
		panel("RSS with the streams open", "MiB", func(r *streamsRun) float64 { return mib(r.RSSOpen) }),
	)
	return f
}
