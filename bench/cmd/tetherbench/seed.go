package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/tether-mcp/tether/bench/internal/kubeproxy"
	"github.com/tether-mcp/tether/bench/internal/netlab"
	"github.com/tether-mcp/tether/bench/internal/svg"
)

// The seed bug: two proxy pods reach a three-pod MCP backend through a
// ClusterIP Service with sessionAffinity: ClientIP while health-checking it;
// kube-proxy's recent-list affinity pins each proxy pod to one backend pod,
// so at most two pods ever work and often one does everything.

type seedVariant struct {
	Name     string
	Buckets  []driveBucket // both proxy pods together
	PerProxy []map[string]int
	Sessions map[string]int // started, by backend
	Calls    map[string]int // answered, by backend
	Errors   map[string]int
	Started  int
	Broken   int
}

type seedResult struct {
	Mode     string // "netns" or "emulated"
	Pods     []string
	Variants []seedVariant
	Duration time.Duration
	Rate     float64 // new sessions per second per proxy pod
	Rules    string  // the ClientIP variant's nat table
}

var seedPods = []string{"pod-0", "pod-1", "pod-2"}

const (
	serviceIP   = "10.96.0.10"
	servicePort = 80
	podPort     = 8080
)

func runSeed(ctx context.Context, env *reportEnv) (*seedResult, error) {
	res := &seedResult{Pods: seedPods, Duration: 10 * time.Second, Rate: 5}
	if env.full {
		res.Duration = 30 * time.Second
	}
	if why := netnsUnavailable(env); why != "" {
		env.logf("seed: %s: using the in-process emulation", why)
		res.Mode = "emulated"
		return res, runSeedEmulated(ctx, env, res)
	}
	res.Mode = "netns"
	return res, runSeedNetns(ctx, env, res)
}

// netnsUnavailable says why the real thing cannot be built here ("" if it can).
func netnsUnavailable(env *reportEnv) string {
	if os.Getenv("TETHERBENCH_EMULATE") != "" {
		return "TETHERBENCH_EMULATE is set"
	}
	if os.Geteuid() != 0 {
		return "not root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no iproute2"
	}
	if err := ensureTools(env.logf, "iptables-restore"); err != nil {
		return err.Error()
	}
	return ""
}

func seedVariants() []string {
	return []string{"Service, sessionAffinity: ClientIP", "Service, sessionAffinity: None",
		"tether p2c", "tether least-loaded", "tether round-robin", "tether random"}
}

func runSeedNetns(ctx context.Context, env *reportEnv, res *seedResult) error {
	netlab.RemoveStale()
	lab, err := netlab.New()
	if err != nil {
		return err
	}
	defer lab.Close() // namespaces, links, routes and rules go with it
	var proxies, backends []netlab.Pod
	for i := range 2 {
		p, err := lab.AddPod(fmt.Sprintf("proxy%d", i))
		if err != nil {
			return err
		}
		proxies = append(proxies, p)
	}
	var eps, urls []string
	for i, name := range seedPods {
		p, err := lab.AddPod(fmt.Sprintf("backend%d", i))
		if err != nil {
			return err
		}
		backends = append(backends, p)
		addr := fmt.Sprintf("%s:%d", p.IP, podPort)
		eps, urls = append(eps, addr), append(urls, "http://"+addr)
		bp, _, _, err := startBackends(env.logDir, "seed-"+name, lab.Prefix(fmt.Sprintf("backend%d", i)), "-names", name, "-listen", addr)
		if err != nil {
			return err
		}
		defer bp.stop()
	}
	svc := kubeproxy.Service{Namespace: "mcp", Name: "mcp-server", PortName: "http", Protocol: "tcp",
		ClusterIP: serviceIP, Port: servicePort, Endpoints: eps, ClusterCIDR: "10.244.0.0/16"}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, name := range seedVariants() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var url string
		var sidecars []*proc
		switch {
		case strings.HasSuffix(name, "ClientIP"), strings.HasSuffix(name, "None"):
			svc.Affinity = kubeproxy.AffinityNone
			if strings.HasSuffix(name, "ClientIP") {
				svc.Affinity = kubeproxy.AffinityClientIP
			}
			rules := kubeproxy.NATRules(svc)
			if svc.Affinity == kubeproxy.AffinityClientIP {
				res.Rules = rules
			}
			if err := lab.ExecInput("node", rules, "iptables-restore"); err != nil {
				return fmt.Errorf("loading kube-proxy's rules: %w", err)
			}
			// Fresh affinity lists for the variant (kube-proxy keeps them
			// across rule syncs; here every variant starts from nothing).
			for _, ep := range eps {
				lab.Exec("node", "sh", "-c", fmt.Sprintf("test -e /proc/net/xt_recent/%[1]s && echo / > /proc/net/xt_recent/%[1]s || true", svc.SEPChain(ep)))
			}
			url = fmt.Sprintf("http://%s:%d/mcp", serviceIP, servicePort)
		default:
			picker := strings.TrimPrefix(name, "tether ")
			for i := range proxies {
				argv := append(lab.Prefix(fmt.Sprintf("proxy%d", i)), env.tether, "serve", "--backends", strings.Join(urls, ","),
					"--listen", "127.0.0.1:7480", "--admin-listen", "127.0.0.1:7481", "--balancer", picker,
					"--log-level", "warn", "--shutdown-grace", "1s")
				p, err := startProc(env.logDir, fmt.Sprintf("seed-tether-%s-%d", picker, i), argv...)
				if err != nil {
					return err
				}
				sidecars = append(sidecars, p)
			}
			url = "http://127.0.0.1:7480/mcp"
		}
		var drivers [][]string
		for i := range proxies {
			argv := append(lab.Prefix(fmt.Sprintf("proxy%d", i)), self, "drive", "-url", url,
				"-duration", res.Duration.String(), "-rate", fmt.Sprint(res.Rate))
			if sidecars != nil {
				argv = append(argv, "-ready", "http://127.0.0.1:7481/readyz")
			}
			drivers = append(drivers, argv)
		}
		v, err := runDrivers(env, name, drivers)
		for _, p := range sidecars {
			p.stop()
		}
		if err != nil {
			return err
		}
		res.Variants = append(res.Variants, v)
		env.logf("seed: %-36s sessions %s; calls %s; %d of %d sessions broken", name, shares(v.Sessions), shares(v.Calls), v.Broken, v.Started)
	}
	// Leave no rules behind even if the namespace deletion were to fail.
	lab.ExecInput("node", "*nat\nCOMMIT\n", "iptables-restore")
	return nil
}

// runDrivers runs one driver per proxy pod at the same time and merges
// their reports.
func runDrivers(env *reportEnv, name string, drivers [][]string) (seedVariant, error) {
	v := seedVariant{Name: name, Sessions: map[string]int{}, Calls: map[string]int{}, Errors: map[string]int{}}
	reports := make([]driveReport, len(drivers))
	errs := make([]error, len(drivers))
	var wg sync.WaitGroup
	for i, argv := range drivers {
		wg.Go(func() {
			p, err := startProc(env.logDir, fmt.Sprintf("drive-%s-%d", strings.NewReplacer(" ", "-", ":", "", ",", "").Replace(name), i), argv...)
			if err != nil {
				errs[i] = err
				return
			}
			defer p.stop()
			line, err := p.expect("{", 2*time.Minute, nil)
			if err != nil {
				errs[i] = err
				return
			}
			errs[i] = json.Unmarshal([]byte(line), &reports[i])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return v, fmt.Errorf("%s: %w", name, err)
	}
	for _, r := range reports {
		per := map[string]int{}
		for i, b := range r.Buckets {
			if i >= len(v.Buckets) {
				v.Buckets = append(v.Buckets, driveBucket{Sessions: map[string]int{}, Calls: map[string]int{}})
			}
			for k, n := range b.Sessions {
				v.Buckets[i].Sessions[k] += n
				v.Sessions[k] += n
				per[k] += n
				v.Started += n
			}
			for k, n := range b.Calls {
				v.Buckets[i].Calls[k] += n
				v.Calls[k] += n
			}
			v.Buckets[i].Errors += b.Errors
			v.Buckets[i].Broken += b.Broken
			v.Broken += b.Broken
		}
		for k, n := range r.Errors {
			v.Errors[k] += n
		}
		v.PerProxy = append(v.PerProxy, per)
	}
	return v, nil
}

func shares(m map[string]int) string {
	total := 0
	for _, n := range m {
		total += n
	}
	var parts []string
	for _, p := range seedPods {
		parts = append(parts, fmt.Sprintf("%s %3.0f%%", p, 100*float64(m[p])/float64(max(total, 1))))
	}
	return strings.Join(parts, " ")
}

// runSeedEmulated replaces the namespaces and iptables with an in-process
// TCP forwarder that decides per accepted connection exactly as
// kube-proxy's rules decide per new conntrack entry: with ClientIP, a
// client address seen within the timeout goes to the backend it went to
// last (and refreshes its entry, like `--set`); otherwise a uniform random
// pick. Backends and tether listen on loopback, and the two proxy pods are
// two client addresses, 127.0.0.2 and 127.0.0.3.
func runSeedEmulated(ctx context.Context, env *reportEnv, res *seedResult) error {
	bp, addrs, _, err := startBackends(env.logDir, "seed-backends", nil, "-names", strings.Join(seedPods, ","))
	if err != nil {
		return err
	}
	defer bp.stop()
	var backends, urls []string
	for _, p := range seedPods {
		backends, urls = append(backends, addrs[p]), append(urls, "http://"+addrs[p])
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	clients := []string{"127.0.0.2", "127.0.0.3"}
	for _, name := range seedVariants() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var url string
		var stop func()
		switch {
		case strings.HasSuffix(name, "ClientIP"), strings.HasSuffix(name, "None"):
			svc, err := newEmuService(backends, strings.HasSuffix(name, "ClientIP"), kubeproxy.DefaultAffinityTimeout*time.Second)
			if err != nil {
				return err
			}
			url, stop = "http://"+svc.ln.Addr().String()+"/mcp", svc.close
		default:
			picker := strings.TrimPrefix(name, "tether ")
			var ps []*proc
			var turls []string
			for i := range clients {
				p, u, err := startTether(ctx, env.tether, env.logDir, fmt.Sprintf("seed-tether-%s-%d", picker, i), urls, "--balancer", picker)
				if err != nil {
					return err
				}
				ps, turls = append(ps, p), append(turls, u)
			}
			url = strings.Join(turls, " ")
			stop = func() {
				for _, p := range ps {
					p.stop()
				}
			}
		}
		var drivers [][]string
		for i, c := range clients {
			u := url
			if f := strings.Fields(url); len(f) == len(clients) {
				u = f[i] + "/mcp"
			}
			drivers = append(drivers, []string{self, "drive", "-url", u, "-local-addr", c,
				"-duration", res.Duration.String(), "-rate", fmt.Sprint(res.Rate)})
		}
		v, err := runDrivers(env, name, drivers)
		stop()
		if err != nil {
			return err
		}
		res.Variants = append(res.Variants, v)
		env.logf("seed (emulated): %-36s sessions %s; calls %s; %d of %d sessions broken", name, shares(v.Sessions), shares(v.Calls), v.Broken, v.Started)
	}
	return nil
}

type emuService struct {
	ln       net.Listener
	backends []string
	affinity bool
	timeout  time.Duration
	mu       sync.Mutex
	recent   map[string]emuEntry
	rng      *rand.Rand
	wg       sync.WaitGroup
}

type emuEntry struct {
	backend int
	seen    time.Time
}

func newEmuService(backends []string, affinity bool, timeout time.Duration) (*emuService, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &emuService{ln: ln, backends: backends, affinity: affinity, timeout: timeout, recent: map[string]emuEntry{}, rng: rand.New(rand.NewPCG(1, 2))}
	s.wg.Go(s.serve)
	return s, nil
}

func (s *emuService) pick(client string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.affinity {
		if e, ok := s.recent[client]; ok && now.Sub(e.seen) <= s.timeout {
			s.recent[client] = emuEntry{e.backend, now}
			return e.backend
		}
	}
	// kube-proxy's cascade: endpoint i with probability 1/(n-i).
	b := len(s.backends) - 1
	for i := range len(s.backends) - 1 {
		if s.rng.Float64() < 1/float64(len(s.backends)-i) {
			b = i
			break
		}
	}
	if s.affinity {
		s.recent[client] = emuEntry{b, now}
	}
	return b
}

func (s *emuService) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		b := s.backends[s.pick(host)]
		s.wg.Go(func() {
			defer c.Close()
			u, err := net.Dial("tcp", b)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			go func() { io.Copy(c, u); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			<-done
			<-done
		})
	}
}

func (s *emuService) close() {
	s.ln.Close()
	// Connections end when the drivers close theirs; do not wait forever.
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
}

func seedMarkdown(r *seedResult) string {
	var b strings.Builder
	switch r.Mode {
	case "netns":
		fmt.Fprintf(&b, "Built for real: network namespaces for a node, two proxy pods and three backend pods (veth pairs, each pod on its own /30 in 10.244.0.0/16, routed by the node), a Service IP %s:%d, and kube-proxy's iptables-mode nat rules in the node (KUBE-SERVICES → KUBE-SVC-* → KUBE-SEP-*, `-m recent --rcheck --seconds 10800 --reap`, `-m statistic --mode random --probability`, DNAT), loaded with iptables-restore. ", serviceIP, servicePort)
	default:
		b.WriteString("**Emulated** (not root, or no iptables): an in-process TCP forwarder decides per accepted connection as kube-proxy's rules decide per new conntrack entry (ClientIP: the backend a client address went to last, within the timeout; otherwise a uniform pick through the same 1/(n−i) cascade); the proxy pods are the client addresses 127.0.0.2 and 127.0.0.3. The decisions are the same; the forwarder adds a user-space hop the kernel's DNAT does not. ")
	}
	fmt.Fprintf(&b, "Each proxy pod opens %.0f sessions/s for %v, in bursts of 5 started together (initialize, notifications/initialized, 5 `whoami` calls 100 ms apart, DELETE), through one keep-alive client whose pool grows to the concurrency of the bursts, and health-checks the upstream on a fresh connection every 2 s. "+
		"For tether, a sidecar in each proxy pod's namespace dials the pod addresses directly (`--backends`), one tether per pod, in-memory store.\n\n", r.Rate, r.Duration)
	b.WriteString("| variant | sessions started per pod | requests answered per pod | max/mean requests | per proxy pod (sessions) | sessions broken (404, client must re-initialize) |\n|---|---|---|---:|---|---:|\n")
	for _, v := range r.Variants {
		var pp []string
		for i, m := range v.PerProxy {
			pp = append(pp, fmt.Sprintf("proxy %d: %s", i, compactShares(m)))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %s | %d of %d |\n", v.Name, shares(v.Sessions), shares(v.Calls), maxMean(v.Calls), strings.Join(pp, "; "), v.Broken, v.Started+brokenAtInit(v))
	}
	b.WriteString("\nWith ClientIP every connection of a proxy pod, health checks included, lands on the pod its address was first sent to, for the 3-hour affinity timeout that the health checks keep renewing: one or two pods take all the sessions, whatever their load. With None, each new connection is a fresh random pick, so a session's later requests, sent over whichever pooled connection is free, reach pods that never saw it: 404, and the client must start again — which is why ClientIP gets turned on. tether places each session by load and keeps it where it started.\n")
	if r.Rules != "" {
		b.WriteString("\n<details><summary>The nat table loaded for ClientIP (generated by bench/internal/kubeproxy)</summary>\n\n```\n" + r.Rules + "```\n</details>\n")
	}
	return b.String()
}

// brokenAtInit counts the sessions that failed before a backend was known
// (they are in Broken but not in Started).
func brokenAtInit(v seedVariant) int {
	n := 0
	for k, c := range v.Errors {
		if strings.HasPrefix(k, "initialize") {
			n += c
		}
	}
	return n
}

func compactShares(m map[string]int) string {
	total := 0
	for _, n := range m {
		total += n
	}
	var parts []string
	for _, p := range seedPods {
		if m[p] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", strings.TrimPrefix(p, "pod-"), 100*float64(m[p])/float64(max(total, 1))))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return "pod " + strings.Join(parts, ", ")
}

func maxMean(m map[string]int) float64 {
	total, mx := 0, 0
	for _, p := range seedPods {
		total += m[p]
		mx = max(mx, m[p])
	}
	if total == 0 {
		return 0
	}
	return float64(mx) / (float64(total) / float64(len(seedPods)))
}

func seedChart(r *seedResult) *svg.Figure {
	mode := "network namespaces + kube-proxy iptables rules"
	if r.Mode != "netns" {
		mode = "in-process emulation of kube-proxy's rules"
	}
	f := &svg.Figure{Title: "The seed bug: share of sessions and requests per backend pod over time", Cols: 2, PanelW: 520, PanelH: 210,
		Footnote: "Two proxy pods, three backend pods (" + mode + "); each bar is one second of both proxy pods' traffic. Sessions: the pod that answered initialize. Requests: the pod that answered whoami."}
	for _, v := range r.Variants {
		for _, what := range []string{"sessions", "requests"} {
			sb := &svg.StackedBars{Title: v.Name + ": " + what, XLabel: "s", Categories: r.Pods}
			for range r.Pods {
				sb.Values = append(sb.Values, make([]float64, len(v.Buckets)))
			}
			for i, bk := range v.Buckets {
				sb.X = append(sb.X, float64(i))
				m := bk.Sessions
				if what == "requests" {
					m = bk.Calls
				}
				for k, p := range r.Pods {
					sb.Values[k][i] = float64(m[p])
				}
			}
			if what == "sessions" && v.Broken > 0 {
				sb.Note = fmt.Sprintf("%d sessions broken", v.Broken)
			}
			f.Add(sb)
		}
	}
	return f
}
