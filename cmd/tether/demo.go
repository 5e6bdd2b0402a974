//go:build !tether_sidecar

package main

// tether demo: one command, nothing else to install or start. It runs MCP
// backends (the go-sdk's Streamable HTTP server) in process, tether in front
// of them, and go-sdk clients through tether, in either era of MCP (--era):
//
//   - legacy (the default): stateful backends and client sessions
//     (initialize, Mcp-Session-Id); it kills the backend holding the most
//     sessions and shows those sessions carrying on elsewhere without a
//     client error.
//   - 2026-07-28 (demo_modern.go): stateless backends and clients at MCP
//     2026-07-28, which have no session: every call is placed on its own,
//     so the calls spread over the backends; killing one leaves nothing to
//     move.
//   - both: the first, then the second.
//
// Everything listens on 127.0.0.1 with ephemeral ports, and everything
// started is stopped before it returns.
//
// The demo doubles as a smoke test: it fails (non-zero exit) if any client
// call fails, if a session is answered by two backends within one phase, if
// a session of a surviving backend moves, or, at 2026-07-28, if a client
// does not get that version, gets a session, or a call reaches the killed
// backend.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/session"
)

const (
	// demoTimeout bounds the whole demo; a normal run takes about a second.
	demoTimeout = 60 * time.Second
	// demoParallel is how many client sessions work at once.
	demoParallel = 8
	// demoKillGrace is what the killed backend gives its requests in flight,
	// as a terminating pod does before its connections are cut.
	demoKillGrace = 200 * time.Millisecond
	// demoBarWidth is the longest bar in a table.
	demoBarWidth = 40
)

// The values of --era.
const (
	eraLegacy = "legacy"
	eraModern = "2026-07-28" // the protocol version, as clients ask for it
	eraBoth   = "both"
)

var demoEras = []string{eraLegacy, eraModern, eraBoth}

var errDemoTimeout = fmt.Errorf("demo: did not finish within %s", demoTimeout)

// demoOptions are the demo's flags.
type demoOptions struct {
	Era      string
	Sessions int // client sessions (legacy), clients (2026-07-28)
	Backends int
	Balancer string
	Calls    int // whoami calls per session (client) per phase
}

func parseDemoFlags(args []string, stderr io.Writer) (demoOptions, error) {
	o := demoOptions{Era: eraLegacy, Sessions: 30, Backends: 3, Balancer: "p2c", Calls: 5}
	fs := flag.NewFlagSet("tether demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Era, "era", o.Era, "MCP era: legacy (sessions, sticky) | 2026-07-28 (no sessions, a pick per call) | both")
	fs.IntVar(&o.Sessions, "sessions", o.Sessions, "client sessions, or clients at 2026-07-28 (1-200)")
	fs.IntVar(&o.Backends, "backends", o.Backends, "in-process MCP backends (2-20); the busiest one is killed")
	fs.StringVar(&o.Balancer, "balancer", o.Balancer, "placement of new sessions and of 2026-07-28 calls: "+strings.Join(balancer.PickerNames, " | "))
	fs.IntVar(&o.Calls, "calls", o.Calls, "whoami calls per session (client) before and after the kill (1-20)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("demo: unexpected argument %q", fs.Arg(0))
	}
	return o, o.validate()
}

// validate rejects bad flags with one-line errors. The bounds keep the demo
// a few seconds long.
func (o demoOptions) validate() error {
	switch {
	case !slices.Contains(demoEras, o.Era):
		return fmt.Errorf("demo: --era %q: want one of %s", o.Era, strings.Join(demoEras, ", "))
	case o.Sessions < 1 || o.Sessions > 200:
		return fmt.Errorf("demo: --sessions must be 1 to 200, got %d", o.Sessions)
	case o.Backends < 2 || o.Backends > 20:
		return fmt.Errorf("demo: --backends must be 2 to 20 (one is killed), got %d", o.Backends)
	case o.Calls < 1 || o.Calls > 20:
		return fmt.Errorf("demo: --calls must be 1 to 20, got %d", o.Calls)
	case !slices.Contains(balancer.PickerNames, o.Balancer):
		return fmt.Errorf("demo: --balancer %q: want one of %s", o.Balancer, strings.Join(balancer.PickerNames, ", "))
	}
	return nil
}

func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseDemoFlags(args, stderr)
	if err != nil {
		return err
	}
	switch o.Era {
	case eraLegacy:
		return runDemo(ctx, o, eraLegacy, stdout, stderr)
	case eraModern:
		return runDemo(ctx, o, eraModern, stdout, stderr)
	}
	// both: each era on backends and a tether of its own, one after the
	// other, so each table shows one era's traffic alone.
	if err := runDemo(ctx, o, eraLegacy, stdout, stderr); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	return runDemo(ctx, o, eraModern, stdout, stderr)
}

// runDemo runs one era's demonstration, bounded by demoTimeout.
func runDemo(ctx context.Context, o demoOptions, era string, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithTimeoutCause(ctx, demoTimeout, errDemoTimeout)
	defer cancel()

	if era == eraModern {
		fmt.Fprintf(stdout, "tether demo, MCP 2026-07-28: %d stateless in-process MCP backends (go-sdk), tether in front (balancer %s), %d clients without sessions\n\n",
			o.Backends, o.Balancer, o.Sessions)
	} else {
		fmt.Fprintf(stdout, "tether demo: %d in-process MCP backends (go-sdk), tether in front (balancer %s), %d client sessions\n\n",
			o.Backends, o.Balancer, o.Sessions)
	}
	d, err := startDemo(ctx, o, era, stdout, stderr)
	if err != nil {
		return err
	}
	if era == eraModern {
		err = d.runModern(ctx)
	} else {
		err = d.run(ctx)
	}
	if stopErr := d.stop(); err == nil {
		err = stopErr
	}
	return err
}

// demo is the running demonstration: backends, tether, and the client
// sessions. sessions[i] is nil if session i failed to connect.
type demo struct {
	opts     demoOptions
	era      string // eraLegacy or eraModern
	out      io.Writer
	backends []*mcpbackend.Backend
	tether   *server.Server
	url      string // tether's client endpoint

	stopTether context.CancelFunc
	tetherDone chan error

	transport *http.Transport // the clients' own, closed at the end
	client    *mcp.Client
	sessions  []*mcp.ClientSession
}

// startDemo starts the backends and tether, waits until tether knows the
// backends, and prints where everything listens. At 2026-07-28 the backends
// are stateless (go-sdk v1.8.0 takes 2026-07-28 requests only in that mode).
func startDemo(ctx context.Context, o demoOptions, era string, stdout, stderr io.Writer) (*demo, error) {
	d := &demo{opts: o, era: era, out: stdout, sessions: make([]*mcp.ClientSession, o.Sessions)}
	var urls []string
	for i := range o.Backends {
		b, err := mcpbackend.StartWith(fmt.Sprintf("backend-%d", i+1), "127.0.0.1:0",
			mcpbackend.Options{Stateless: era == eraModern})
		if err != nil {
			d.stop()
			return nil, fmt.Errorf("demo: %w", err)
		}
		d.backends = append(d.backends, b)
		urls = append(urls, b.URL())
	}

	cfg := defaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Backends = urls
	cfg.Balancer = o.Balancer
	cfg.ShutdownGrace = time.Second
	cfg.LogLevel = "warn" // the demo's own output is the report; problems still show
	if err := cfg.validate(); err != nil {
		d.stop()
		return nil, fmt.Errorf("demo: %w", err)
	}
	var err error
	d.tether, err = newServer(cfg, newLogger(stderr, cfg.LogFormat, cfg.LogLevel))
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("demo: %w", err)
	}
	d.url = "http://" + d.tether.ClientAddr().String() + "/mcp"

	// tether runs on its own context, not ctx: on Ctrl-C the client sessions
	// are still closed through it before it stops.
	runCtx, stopTether := context.WithCancel(context.Background())
	d.stopTether = stopTether
	d.tetherDone = make(chan error, 1)
	go func() { d.tetherDone <- d.tether.Run(runCtx) }()
	select {
	case <-d.tether.Synced():
	case err := <-d.tetherDone:
		if err == nil {
			err = errors.New("stopped before it knew its backends")
		}
		d.tetherDone <- nil // for stop
		d.stop()
		return nil, fmt.Errorf("demo: tether: %w", err)
	case <-ctx.Done():
		d.stop()
		return nil, interrupted(ctx)
	}

	d.transport = &http.Transport{MaxIdleConnsPerHost: demoParallel * 2, IdleConnTimeout: 30 * time.Second}
	d.client = mcp.NewClient(&mcp.Implementation{Name: "tether-demo", Version: version}, nil)

	fmt.Fprintln(d.out, "1. start the backends and tether")
	w := len("tether")
	for _, b := range d.backends {
		w = max(w, len(b.Name))
	}
	fmt.Fprintf(d.out, "   %-*s  %s   (admin http://%s)\n", w, "tether", d.url, d.tether.AdminAddr())
	for _, b := range d.backends {
		fmt.Fprintf(d.out, "   %-*s  %s\n", w, b.Name, b.URL())
	}
	fmt.Fprintln(d.out)
	return d, nil
}

// stop closes the client sessions still open, then stops tether, then the
// backends. It is safe on a partly started demo and returns tether's run
// error, if any.
func (d *demo) stop() error {
	d.closeSessions()
	var err error
	if d.stopTether != nil {
		d.stopTether()
		// run returns within its shutdown grace plus a bounded cut-off.
		if err = <-d.tetherDone; err != nil {
			err = fmt.Errorf("demo: tether: %w", err)
		}
		d.stopTether = nil
	}
	for _, b := range d.backends {
		b.Close()
	}
	if d.transport != nil {
		d.transport.CloseIdleConnections()
	}
	return err
}

// closeSessions closes every open client session (a DELETE through tether)
// and returns how many closes failed.
func (d *demo) closeSessions() int {
	var wg sync.WaitGroup
	errs := make([]error, len(d.sessions))
	sem := make(chan struct{}, demoParallel)
	for i, cs := range d.sessions {
		if cs == nil {
			continue
		}
		d.sessions[i] = nil
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = cs.Close() // bounded by the go-sdk's own DELETE timeout
		})
	}
	wg.Wait()
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// phase is what the client sessions saw in one phase; every slice is
// indexed by session.
type phase struct {
	home     []string         // the backend that answered first ("" if none did)
	calls    []int            // successful calls
	split    []bool           // answered by more than one backend
	answered []map[string]int // calls answered, by backend
	errs     []error          // the first client error
}

// backendStats is one table row.
type backendStats struct {
	sessions, calls int
}

func (p *phase) stats() map[string]backendStats {
	m := map[string]backendStats{}
	for i, home := range p.home {
		if home != "" {
			s := m[home]
			s.sessions++
			s.calls += p.calls[i]
			m[home] = s
		}
	}
	return m
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

func countErrors(errs []error) int {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// callAll has every session call whoami opts.Calls times, demoParallel
// sessions at a time; with connect, each session first connects through
// tether (asking for 2026-07-28 in that era). A session stops at its first
// error.
func (d *demo) callAll(ctx context.Context, connect bool) *phase {
	n := len(d.sessions)
	p := &phase{
		home: make([]string, n), calls: make([]int, n), split: make([]bool, n),
		answered: make([]map[string]int, n), errs: make([]error, n),
	}
	var sessionOpts *mcp.ClientSessionOptions
	if d.era == eraModern {
		sessionOpts = &mcp.ClientSessionOptions{ProtocolVersion: eraModern}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, demoParallel)
	for i := range n {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				p.errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			if connect {
				cs, err := d.client.Connect(ctx, &mcp.StreamableClientTransport{
					Endpoint:   d.url,
					HTTPClient: &http.Client{Transport: d.transport},
				}, sessionOpts)
				if err != nil {
					p.errs[i] = fmt.Errorf("session %d: connect: %w", i+1, err)
					return
				}
				d.sessions[i] = cs
			}
			cs := d.sessions[i]
			if cs == nil {
				return // never connected: counted in the phase that tried
			}
			p.answered[i] = map[string]int{}
			for c := range d.opts.Calls {
				got, err := mcpbackend.Whoami(ctx, cs)
				if err != nil {
					p.errs[i] = fmt.Errorf("session %d: call %d: %w", i+1, c+1, err)
					return
				}
				p.calls[i]++
				p.answered[i][got]++
				switch p.home[i] {
				case "":
					p.home[i] = got
				case got:
				default:
					p.split[i] = true
				}
			}
		})
	}
	wg.Wait()
	return p
}

// counters sums a backend counter over backends.
func counters(bs []*mcpbackend.Backend, f func(*mcpbackend.Backend) int64) int64 {
	var n int64
	for _, b := range bs {
		n += f(b)
	}
	return n
}

func initializes(b *mcpbackend.Backend) int64  { return b.Initializes.Load() }
func initializeds(b *mcpbackend.Backend) int64 { return b.Initialized.Load() }

// run is the demonstration proper, steps 2 to 5 (step 1 is startDemo).
func (d *demo) run(ctx context.Context) error {
	o := d.opts
	var failures []string

	// 2. Connect and call.
	fmt.Fprintf(d.out, "2. connect %d sessions through tether; each calls whoami %d times\n", o.Sessions, o.Calls)
	before := d.callAll(ctx, true)
	if ctx.Err() != nil {
		return interrupted(ctx)
	}
	failures = append(failures, d.report(before, nil)...)
	fmt.Fprintln(d.out)

	// 3. Kill the busiest backend.
	stats := before.stats()
	var victim *mcpbackend.Backend
	for _, b := range d.backends {
		if victim == nil || stats[b.Name].sessions > stats[victim.Name].sessions {
			victim = b
		}
	}
	held := stats[victim.Name].sessions
	if held == 0 {
		return errors.New("demo: no session reached a backend")
	}
	fmt.Fprintf(d.out, "3. kill %s (the most sessions: %d) as a terminating pod: listener closed, %s grace, connections cut\n\n",
		victim.Name, held, demoKillGrace)
	var survivors []*mcpbackend.Backend
	for _, b := range d.backends {
		if b != victim {
			survivors = append(survivors, b)
		}
	}
	initsBefore, notesBefore := counters(survivors, initializes), counters(survivors, initializeds)
	victim.Kill(demoKillGrace)

	// 4. Call again: the victim's sessions are re-initialized elsewhere.
	fmt.Fprintf(d.out, "4. every session calls whoami %d more times\n", o.Calls)
	after := d.callAll(ctx, false)
	if ctx.Err() != nil {
		return interrupted(ctx)
	}
	failures = append(failures, d.report(after, victim)...)

	destinations := map[string]int{}
	stayed, strayed := 0, 0
	for i, was := range before.home {
		now := after.home[i]
		switch {
		case was == "" || now == "":
		case was == victim.Name:
			destinations[now]++
		case now == was:
			stayed++
		default:
			strayed++
		}
	}
	var went []string
	for _, b := range survivors {
		if n := destinations[b.Name]; n > 0 {
			went = append(went, fmt.Sprintf("%s (%d)", b.Name, n))
		}
	}
	fmt.Fprintf(d.out, "   moved: %s's %d sessions went to %s; the other %d stayed put\n",
		victim.Name, held, strings.Join(went, ", "), stayed)
	if n := destinations[victim.Name]; n > 0 {
		failures = append(failures, fmt.Sprintf("%d sessions were answered by the killed backend", n))
	}
	if strayed > 0 {
		fmt.Fprintf(d.out, "   %d sessions of surviving backends moved\n", strayed)
		failures = append(failures, fmt.Sprintf("%d sessions of surviving backends moved", strayed))
	}

	reinits := 0
	for _, cs := range d.sessions {
		if cs == nil {
			continue
		}
		rec, err := d.tether.Store().Get(ctx, cs.ID())
		if err != nil {
			return fmt.Errorf("demo: session record: %w", err)
		}
		reinits += int(rec.Reinits)
	}
	fmt.Fprintf(d.out, "   re-initialized by tether: %d sessions (%d initialize + %d notifications/initialized replayed on the survivors)\n\n",
		reinits, counters(survivors, initializes)-initsBefore, counters(survivors, initializeds)-notesBefore)

	// 5. Close and stop.
	var ids []string
	for _, cs := range d.sessions {
		if cs != nil {
			ids = append(ids, cs.ID())
		}
	}
	closeErrs := d.closeSessions()
	left := 0
	for _, id := range ids {
		if _, err := d.tether.Store().Get(ctx, id); !errors.Is(err, session.ErrNotFound) {
			left++
		}
	}
	fmt.Fprintf(d.out, "5. close %d sessions (DELETE): %d failed, %d left in tether's session store; stop tether and the backends\n\n",
		len(ids), closeErrs, left)
	if closeErrs > 0 {
		failures = append(failures, fmt.Sprintf("%d session closes failed", closeErrs))
	}
	if left > 0 {
		failures = append(failures, fmt.Sprintf("%d sessions left in the store after DELETE", left))
	}

	if len(failures) > 0 {
		fmt.Fprintf(d.out, "FAIL: %s\n", strings.Join(failures, "; "))
		return fmt.Errorf("demo failed: %s", strings.Join(failures, "; "))
	}
	fmt.Fprintln(d.out, "PASS: 0 client errors, every session on one backend per phase, the killed backend's sessions moved")
	return nil
}

// report prints a phase's table and its checks, and returns its failures.
// killed, if set, is listed as such.
func (d *demo) report(p *phase, killed *mcpbackend.Backend) []string {
	stats := p.stats()
	total, maxSessions, live := 0, 0, 0
	nameWidth := len("backend")
	for _, b := range d.backends {
		s := stats[b.Name]
		total += s.sessions
		maxSessions = max(maxSessions, s.sessions)
		if b != killed {
			live++
		}
		nameWidth = max(nameWidth, len(b.Name))
	}
	// One bar character per session, or per unit sessions when there are
	// more than fit.
	unit := (d.opts.Sessions + demoBarWidth - 1) / demoBarWidth

	fmt.Fprintf(d.out, "   %-*s  %8s  %5s  %6s\n", nameWidth, "backend", "sessions", "share", "calls")
	for _, b := range d.backends {
		s := stats[b.Name]
		if b == killed && s.sessions == 0 {
			fmt.Fprintf(d.out, "   %-*s  %8s  %5s  %6s  (killed)\n", nameWidth, b.Name, "-", "-", "-")
			continue
		}
		share := 0.0
		if total > 0 {
			share = 100 * float64(s.sessions) / float64(total)
		}
		bar := strings.Repeat("#", (s.sessions+unit-1)/unit)
		fmt.Fprintf(d.out, "   %-*s  %8d  %4.0f%%  %6d  %s\n", nameWidth, b.Name, s.sessions, share, s.calls, bar)
	}
	scale := ""
	if unit > 1 {
		scale = fmt.Sprintf(" (# = %d sessions)", unit)
	}
	if total > 0 {
		mean := float64(total) / float64(live)
		fmt.Fprintf(d.out, "   max/mean %.2f over %d backends%s\n", float64(maxSessions)/mean, live, scale)
	}

	var failures []string
	if n := countTrue(p.split); n > 0 {
		fmt.Fprintf(d.out, "   %d sessions were answered by two backends\n", n)
		failures = append(failures, fmt.Sprintf("%d sessions on two backends within a phase", n))
	} else {
		fmt.Fprintln(d.out, "   every session stayed on one backend")
	}
	n := countErrors(p.errs)
	fmt.Fprintf(d.out, "   %d client errors\n", n)
	if n > 0 {
		shown := 0
		for _, err := range p.errs {
			if err != nil && shown < 3 {
				fmt.Fprintf(d.out, "     %v\n", err)
				shown++
			}
		}
		failures = append(failures, fmt.Sprintf("%d client errors", n))
	}
	return failures
}

// interrupted is the error of a demo whose context ended early: Ctrl-C or
// the overall timeout.
func interrupted(ctx context.Context) error {
	if err := context.Cause(ctx); errors.Is(err, errDemoTimeout) {
		return err
	}
	return errors.New("demo: interrupted")
}
