package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/server"
	sessionstore "github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

const (
	// drainRate is the test's --drain-rate, low enough that the rate limit
	// shows in the time a backend of about 10 sessions takes to empty (the
	// default, 100/s, would empty it within the API watch's own latency).
	drainRate = 5.0
	// drainRelistPeriod is how often a drain lists its backend's sessions
	// again when nothing wakes it (proxy's drainRelist): a session busy at
	// its turn moves on a later pass, up to this much later.
	drainRelistPeriod = time.Second
	// drainAllowance covers what the rate does not: the API server's watch
	// delivering the slice update to tether, the balancer's update, and the
	// moves' own round trips (an initialize and a notification on a
	// survivor each), under the race detector on a loaded machine.
	drainAllowance = 2 * time.Second
	// inflightWaitMS is how long the call in flight on the terminating
	// backend takes (mcpbackend's wait tool).
	inflightWaitMS = 1500
	// drainSessions is how many idle sessions the clients open.
	drainSessions = 30
	// drainCallEvery is the mean pause between a client's whoami calls:
	// the sessions are idle between calls, busy a few milliseconds each
	// time. Each pause is drawn from [0.5, 1.5) × the mean, so that the
	// clients are independent: a drain checks whether a session is quiet
	// at its rate limiter's ticks (every 1/rate), and clients calling in
	// lockstep on the same period would be busy at every check.
	drainCallEvery = 200 * time.Millisecond
)

// Phases of TestDrainTerminatingEndpoint, for counting client errors.
const (
	phaseBefore  = iota // before the endpoint turned terminating
	phaseDuring         // from the slice update until tether found it empty
	phaseAfter          // empty, still in the slice, process running
	phaseRemoved        // gone from the slice, then its process killed
	phaseCount
)

var phaseNames = [phaseCount]string{"before", "during", "after", "removed"}

// TestDrainTerminatingEndpoint is issue 30's Kubernetes end-to-end test of
// the proactive drain, against a real kube-apiserver: three go-sdk MCP
// backends behind a Service's EndpointSlice, tether (the binary) with
// --k8s-service and --drain-rate, and 30 go-sdk client sessions, each
// calling whoami in a paced loop throughout. One endpoint turns terminating
// (serving, not ready): its sessions all move to the others within a bound
// derived from the rate, a call in flight on it is answered by it, no
// client call fails, no session traffic reaches it once it is empty, the
// moved sessions' GET streams reopen on their new backends, and its removal
// from the slice and its exit cost no client anything either.
func TestDrainTerminatingEndpoint(t *testing.T) {
	if os.Getenv(tetherBinEnv) == "" {
		kubetest.Require(t)
		t.Setenv(tetherBinEnv, buildTether(t))
	}
	if !kubetest.InNetns(t, podIPs[:3]...) {
		return
	}
	bin := os.Getenv(tetherBinEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tetherUser := kubetest.ServiceAccountUser(namespace, "tether")
	env := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{tetherUser}})
	admin := env.AdminClient()
	slices := admin.DiscoveryV1().EndpointSlices(namespace)

	var pods []*pod
	for i, ip := range podIPs[:3] {
		name := "everything-" + string(rune('a'+i))
		b, err := mcpbackend.Start(name, fmt.Sprintf("%s:%d", ip, mcpPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		pods = append(pods, &pod{name: name, ip: ip, uid: fmt.Sprintf("0000000%c-0000-4000-8000-00000000d000", 'a'+i), backend: b})
	}
	must(t, create(ctx, admin.CoreV1().Namespaces(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}))
	must(t, create(ctx, admin.CoreV1().Services(namespace), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": service},
			Ports:    []corev1.ServicePort{{Name: "mcp", Port: 80, TargetPort: intstr.FromInt32(mcpPort)}},
		},
	}))
	applyRBAC(ctx, t, admin, "../deploy/rbac")
	must(t, create(ctx, slices, endpointSlice("everything-1", ready(pods[0]), ready(pods[1]), ready(pods[2]))))

	tether := startTether(t, bin,
		"--k8s-service", namespace+"/"+service, "--k8s-port", "mcp",
		"--kubeconfig", env.Kubeconfig(tetherUser.Name),
		"--drain", "proactive", "--drain-rate", strconv.FormatFloat(drainRate, 'f', -1, 64))
	tether.waitStatus("/readyz", 200, 60*time.Second)
	tether.waitLog("the sync", 10*time.Second, msgIs("EndpointSlices synced", "ready", "3", "fenced", "0"))

	// 30 idle sessions, placed by tether over the three.
	load := &drainLoad{}
	per := map[string]int{}
	for range drainSessions {
		c := load.connect(ctx, t, tether.listen)
		per[c.home]++
	}
	t.Logf("%d sessions placed: %v", drainSessions, per)
	for _, p := range pods {
		if per[p.name] == 0 {
			t.Fatalf("%s got none of %d sessions: nothing to check the drain against", p.name, drainSessions)
		}
	}
	load.start(ctx)
	defer load.stop()
	load.waitCalls(t, 3, "3 calls by every client before the drain")

	// The endpoint to drain: the one with the most sessions.
	x := pods[0]
	for _, p := range pods {
		if per[p.name] > per[x.name] {
			x = p
		}
	}
	var survivors []*pod
	for _, p := range pods {
		if p != x {
			survivors = append(survivors, p)
		}
	}
	n := per[x.name]
	xURL := fmt.Sprintf("http://%s:%d", x.ip, mcpPort)

	// A slow call on one of x's sessions, in flight when x turns
	// terminating: tether must let x answer it. It is in flight once
	// tether has shown a request in flight on x for longer than any
	// whoami takes.
	slow := load.sessionOn(x.name)
	inflight := slow.callWait(ctx, inflightWaitMS)
	var seenSince time.Time
	testkit.Eventually(t, 10*time.Second, func() bool {
		e, ok := endpointByURL(tether.endpoints(t), xURL)
		switch {
		case !ok || e.Inflight == 0:
			seenSince = time.Time{}
		case seenSince.IsZero():
			seenSince = time.Now()
		}
		return !seenSince.IsZero() && time.Since(seenSince) >= 100*time.Millisecond
	}, "the slow call in flight on %s", x.name)

	initsOnX := x.backend.Initializes.Load()
	initsOnSurvivors := map[string]int64{}
	for _, p := range survivors {
		initsOnSurvivors[p.name] = p.backend.Initializes.Load()
	}

	// x turns terminating: serving, not ready, as the EndpointSlice
	// controller writes a pod being deleted.
	load.phase.Store(phaseDuring)
	updated := time.Now()
	waitLeft := time.Duration(inflightWaitMS)*time.Millisecond - updated.Sub(inflight.started)
	must(t, update(ctx, slices, endpointSlice("everything-1", terminating(x), ready(survivors[0]), ready(survivors[1]))))

	// The bound, from the slice update until tether holds no session on
	// x: each of the n sessions waits its turn at drainRate (n/rate), or
	// the slow call's session for that call to end (waitLeft), whichever
	// is longer; a session busy at its turn moves on the next pass, up to
	// one relist period later; and the allowance covers the watch and the
	// moves' round trips:
	//
	//	bound = max(n/rate, waitLeft) + drainRelist + drainAllowance
	rateTime := time.Duration(float64(n) / drainRate * float64(time.Second))
	bound := max(rateTime, waitLeft) + drainRelistPeriod + drainAllowance
	var drain *server.EndpointView
	testkit.EventuallyNoError(t, bound+30*time.Second, func() error {
		e, ok := endpointByURL(tether.endpoints(t), xURL)
		if !ok {
			return fmt.Errorf("%s is not listed", xURL)
		}
		if e.Drain == nil || e.Drain.EmptiedAfter == 0 || e.Sessions != 0 {
			return fmt.Errorf("%s not empty yet: %+v, drain %+v", x.name, e, e.Drain)
		}
		drain = &e
		return nil
	}, "tether to drain %s", x.name)
	observed := time.Since(updated)
	load.phase.Store(phaseAfter)
	emptiedAt := drain.Drain.Since.Add(drain.Drain.EmptiedAfter)
	toEmpty := emptiedAt.Sub(updated)
	t.Logf("%s (%d sessions) emptied %s after the slice update (watch %s, drain %s; seen by polling after %s); bound %s = max(%d/%g/s, slow call's %s left) + %s + %s",
		x.name, n, toEmpty.Round(time.Millisecond), drain.Drain.Since.Sub(updated).Round(time.Millisecond),
		drain.Drain.EmptiedAfter.Round(time.Millisecond), observed.Round(time.Millisecond),
		bound, n, drainRate, waitLeft.Round(time.Millisecond), drainRelistPeriod, drainAllowance)
	if toEmpty > bound {
		t.Errorf("%s took %s to empty, over the bound %s", x.name, toEmpty.Round(time.Millisecond), bound)
	}
	// The rate holds: the limiter lets the first move go at once and each
	// later one 1/rate after the one before, so k moves span at least
	// (k-1)/rate, less the spread of the moves' own round trips. The slow
	// call's session is left out: it moves when its call is over, whatever
	// the rate.
	moveTimes := tether.drainMoves(t, xURL)
	t.Logf("drain moves, ms after the slice update: %s", msAfter(updated, moveTimes))
	if len(moveTimes) != n {
		t.Errorf("tether logged %d drain moves off %s, want %d", len(moveTimes), x.name, n)
	}
	slowHash := sessionstore.HashID(slow.cs.ID())
	if at, ok := moveTimes[slowHash]; ok {
		t.Logf("the slow call's session moved %s after the slice update", at.Sub(updated).Round(time.Millisecond))
	}
	delete(moveTimes, slowHash)
	if first, last, k := timeSpan(moveTimes); k >= 3 {
		floor := time.Duration(float64(k-1)/drainRate*float64(time.Second)) - 50*time.Millisecond
		if last.Sub(first) < floor {
			t.Errorf("%d sessions moved within %s: faster than --drain-rate %g/s allows", k, last.Sub(first), drainRate)
		}
	}
	if drain.Drain.Reason != "terminating" || drain.State != "fenced" || !drain.Draining || drain.Drain.Moved != int64(n) {
		t.Errorf("/debug/endpoints shows %s as %+v, drain %+v; want fenced, draining, reason terminating, %d moved", x.name, *drain, *drain.Drain, n)
	}

	// The slow call: answered by x, though x turned terminating while it
	// was in flight.
	res := inflight.wait(t)
	t.Logf("slow call: %s to %s (started %s before the update, drain began %s into it)", res.answer, res.took.Round(time.Millisecond),
		updated.Sub(inflight.started).Round(time.Millisecond), drain.Drain.Since.Sub(inflight.started).Round(time.Millisecond))
	switch {
	case res.err != nil:
		t.Errorf("the call in flight on %s when it turned terminating failed: %v", x.name, res.err)
	case res.answer != x.name:
		t.Errorf("the call in flight on %s when it turned terminating was answered by %s", x.name, res.answer)
	case !drain.Drain.Since.After(inflight.started) || !drain.Drain.Since.Before(inflight.started.Add(res.took)):
		t.Errorf("the drain began at %s, not while the slow call was in flight (%s for %s)", drain.Drain.Since, inflight.started, res.took)
	}

	// Each move is one initialize on a survivor, and none reached x.
	moves := int64(0)
	spread := map[string]int64{}
	for _, p := range survivors {
		spread[p.name] = p.backend.Initializes.Load() - initsOnSurvivors[p.name]
		moves += spread[p.name]
	}
	t.Logf("moves per survivor: %v", spread)
	if moves != int64(n) {
		t.Errorf("the survivors saw %d initializes during the drain, want %d (one per moved session)", moves, n)
	}

	// Nothing of a session reaches x any more: every client calls on, and
	// lands elsewhere.
	callsOnX := x.backend.Calls.Load()
	load.waitCalls(t, 3, "3 calls by every client after the drain")
	if got := x.backend.Calls.Load(); got != callsOnX {
		t.Errorf("%s served %d calls after tether found it empty", x.name, got-callsOnX)
	}
	for _, c := range load.clients {
		if got := c.lastAnswer(); got == x.name {
			t.Errorf("a session of %s is still served by it after the drain", c.home)
		}
	}

	// The moved sessions' GET streams end on x and reopen on the new
	// backend: a tools/list_changed notification from the survivors
	// reaches every client before x exits. (go-sdk's server drops a
	// notification for a session with no GET stream open, so a client
	// whose stream stayed on x would never see one.)
	load.waitNotified(t, survivors, 20*time.Second)
	if got := x.backend.Calls.Load(); got != callsOnX {
		t.Errorf("%s served %d calls after tether found it empty", x.name, got-callsOnX)
	}

	// What an operator sees.
	status := runTetherCLI(t, bin, "status", "--admin", tether.admin)
	if want := "draining " + xURL + " (it terminates)"; !strings.Contains(status, want) || !strings.Contains(status, "emptied after") {
		t.Errorf("tether status does not show the drain (%q, emptied after):\n%s", want, status)
	}
	movedSession := load.movedOff(x.name)
	explain := runTetherCLI(t, bin, "explain", movedSession.cs.ID(), "--admin", tether.admin)
	if want := "moved off " + xURL + " while it terminated"; !strings.Contains(explain, want) {
		t.Errorf("tether explain of a moved session does not say %q:\n%s", want, explain)
	}
	metrics := tether.metrics(t)
	if got := metricValue(metrics, `tether_backend_draining{backend="`+xURL+`"}`); got != 1 {
		t.Errorf("tether_backend_draining for %s: %v, want 1", x.name, got)
	}
	if got := metricValue(metrics, "tether_drain_duration_seconds_count"); got != 1 {
		t.Errorf("tether_drain_duration_seconds_count: %v, want 1", got)
	}
	if got := metricValue(metrics, `tether_reinitializations_total{reason="drain",result="ok"}`); got != float64(n) {
		t.Errorf(`tether_reinitializations_total{reason="drain",result="ok"}: %v, want %d`, got, n)
	}

	// x leaves the slice, then its process exits: its sessions have moved,
	// so neither costs a client anything.
	load.phase.Store(phaseRemoved)
	must(t, update(ctx, slices, endpointSlice("everything-1", ready(survivors[0]), ready(survivors[1]))))
	tether.waitLog("x removed", 30*time.Second, msgIs("endpoint removed", "id", x.endpointID()))
	oldSessions := x.backend.LiveSessions()
	x.backend.Kill(100 * time.Millisecond)
	load.waitCalls(t, 5, "5 calls by every client after the removal and the exit")
	if got := x.backend.Initializes.Load(); got != initsOnX {
		t.Errorf("%s saw %d initializes after it turned terminating, want none", x.name, got-initsOnX)
	}
	metrics = tether.metrics(t)
	if got := metricValue(metrics, "tether_drain_duration_seconds_count"); got != 1 {
		t.Errorf("tether_drain_duration_seconds_count after the removal: %v, want 1", got)
	}
	if got := metricSum(metrics, "tether_reinitializations_total"); got != float64(n) {
		t.Errorf("tether_reinitializations_total over all reasons: %v, want %d (the drain's moves, none paid by a request)", got, n)
	}
	load.stop()

	sessionsNow := map[string]int64{}
	for _, e := range tether.endpoints(t).Endpoints {
		sessionsNow[e.URL] = e.Sessions
	}
	t.Logf("sessions per backend at the end: %v; %s still held %d old backend sessions when it exited (drain moves do not DELETE them)",
		sessionsNow, x.name, oldSessions)
	calls, errs := load.totals()
	t.Logf("%d client calls, errors by phase: %v", calls, errs)
	for ph := range phaseCount {
		n, mean, worst := load.latency(ph)
		t.Logf("whoami calls %-7s: %4d, mean %s, max %s", phaseNames[ph], n, mean, worst)
	}
	for ph, n := range errs {
		if n != 0 {
			t.Errorf("%d client calls failed %s the drain", n, phaseNames[ph])
		}
	}
	for _, e := range load.firstErrors() {
		t.Log("client error: " + e)
	}
}

// drainMoves returns when tether logged each drain move off the backend
// with this URL, by session (hashed, as the log has it).
func (p *tetherProc) drainMoves(t *testing.T, from string) map[string]time.Time {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	moves := map[string]time.Time{}
	for _, l := range p.lines {
		if l["msg"] != "session re-initialized" || l["reason"] != "drain" || l["from"] != from {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(l["time"]))
		if err != nil {
			t.Fatalf("a log line's time: %v", err)
		}
		moves[fmt.Sprint(l["session"])] = at
	}
	return moves
}

func timeSpan(times map[string]time.Time) (first, last time.Time, n int) {
	for _, at := range times {
		if n == 0 || at.Before(first) {
			first = at
		}
		if n == 0 || at.After(last) {
			last = at
		}
		n++
	}
	return first, last, n
}

// msAfter lists times as milliseconds after t0, in order.
func msAfter(t0 time.Time, times map[string]time.Time) string {
	ms := make([]int64, 0, len(times))
	for _, at := range times {
		ms = append(ms, at.Sub(t0).Milliseconds())
	}
	slices.Sort(ms)
	return fmt.Sprint(ms)
}

// drainLoad is the test's clients: one go-sdk session each, calling
// whoami about every drainCallEvery until stopped.
type drainLoad struct {
	clients []*drainClient
	phase   atomic.Int32
	errs    [phaseCount]atomic.Int64
	// Latencies of whoami calls by the phase they ended in.
	latMu    sync.Mutex
	latSum   [phaseCount]time.Duration
	latMax   [phaseCount]time.Duration
	latCount [phaseCount]int

	mu       sync.Mutex
	errTexts []string // the first few, for the log

	stopOnce sync.Once
	quit     chan struct{}
	wg       sync.WaitGroup
}

type drainClient struct {
	cs       *mcp.ClientSession
	home     string       // the backend of its first call
	done     atomic.Int64 // whoami calls finished
	notified atomic.Int64 // tools/list_changed notifications received
	mu       sync.Mutex   // guards last
	last     string       // the backend of its latest successful call
}

func (c *drainClient) lastAnswer() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// connect opens a session through tether and makes its first call.
func (l *drainLoad) connect(ctx context.Context, t *testing.T, tetherAddr string) *drainClient {
	t.Helper()
	c := &drainClient{}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-drain-client", Version: "1.0.0"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { c.notified.Add(1) },
	})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + tetherAddr + "/mcp"}, nil)
	if err != nil {
		t.Fatalf("connect through tether: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	c.cs = cs
	if c.home, err = whoami(ctx, cs); err != nil {
		t.Fatalf("first call of a new session: %v", err)
	}
	c.last = c.home
	l.clients = append(l.clients, c)
	return c
}

// start runs every client's loop: whoami calls a random pause apart
// (drainCallEvery on average), each bounded by a timeout, at most maxCalls
// of them.
func (l *drainLoad) start(ctx context.Context) {
	const maxCalls = 3000 // 10 minutes at drainCallEvery: the test ends well before
	l.quit = make(chan struct{})
	for _, c := range l.clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			pause := time.NewTimer(0)
			defer pause.Stop()
			for range maxCalls {
				pause.Reset(drainCallEvery/2 + rand.N(drainCallEvery))
				select {
				case <-l.quit:
					return
				case <-ctx.Done():
					return
				case <-pause.C:
				}
				callCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
				began := time.Now()
				name, err := whoami(callCtx, c.cs)
				l.took(time.Since(began))
				cancel()
				if err != nil {
					l.failed(fmt.Sprintf("session of %s: whoami: %v", c.home, err))
				} else {
					c.mu.Lock()
					c.last = name
					c.mu.Unlock()
				}
				c.done.Add(1)
			}
		}()
	}
}

func (l *drainLoad) took(d time.Duration) {
	ph := l.phase.Load()
	l.latMu.Lock()
	l.latSum[ph] += d
	l.latMax[ph] = max(l.latMax[ph], d)
	l.latCount[ph]++
	l.latMu.Unlock()
}

// latency is the count, mean and max of the whoami calls that ended in
// phase ph.
func (l *drainLoad) latency(ph int) (n int, mean, worst time.Duration) {
	l.latMu.Lock()
	defer l.latMu.Unlock()
	if n = l.latCount[ph]; n > 0 {
		mean = (l.latSum[ph] / time.Duration(n)).Round(10 * time.Microsecond)
	}
	return n, mean, l.latMax[ph].Round(10 * time.Microsecond)
}

func (l *drainLoad) failed(msg string) {
	ph := l.phase.Load()
	l.errs[ph].Add(1)
	l.mu.Lock()
	if len(l.errTexts) < 20 {
		l.errTexts = append(l.errTexts, phaseNames[ph]+": "+msg)
	}
	l.mu.Unlock()
}

func (l *drainLoad) stop() {
	l.stopOnce.Do(func() {
		if l.quit != nil {
			close(l.quit)
		}
	})
	l.wg.Wait()
}

// waitCalls waits until every client has finished k calls begun after
// now: k+1 more than it has finished now, one of which may be in flight.
func (l *drainLoad) waitCalls(t *testing.T, k int64, what string) {
	t.Helper()
	base := make([]int64, len(l.clients))
	for i, c := range l.clients {
		base[i] = c.done.Load()
	}
	testkit.Eventually(t, 30*time.Second, func() bool {
		for i, c := range l.clients {
			if c.done.Load() < base[i]+k+1 {
				return false
			}
		}
		return true
	}, "%s", what)
}

// waitNotified changes the survivors' tool lists until every client has
// received a tools/list_changed notification. The changes are spaced,
// since go-sdk's server folds changes closer than 10 ms into one
// notification and holds it while they keep coming.
func (l *drainLoad) waitNotified(t *testing.T, survivors []*pod, timeout time.Duration) {
	t.Helper()
	base := make([]int64, len(l.clients))
	for i, c := range l.clients {
		base[i] = c.notified.Load()
	}
	var announced time.Time
	changes := 0
	start := time.Now()
	testkit.EventuallyNoError(t, timeout, func() error {
		waiting := map[string]int{} // by the backend of their first call
		for i, c := range l.clients {
			if c.notified.Load() == base[i] {
				waiting[c.home]++
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if time.Since(announced) >= 250*time.Millisecond {
			changes++
			for _, p := range survivors {
				p.backend.ChangeTools(fmt.Sprintf("announce-%d", changes))
			}
			announced = time.Now()
		}
		return fmt.Errorf("after %d changes, clients not notified yet, by the backend their session began on: %v", changes, waiting)
	}, "a tools/list_changed notification to every client from the survivors")
	t.Logf("every client got a tools/list_changed notification from its backend %s after the first change (%d changes)",
		time.Since(start).Round(time.Millisecond), changes)
}

// sessionOn returns a client whose session is on backend name.
func (l *drainLoad) sessionOn(name string) *drainClient {
	for _, c := range l.clients {
		if c.home == name {
			return c
		}
	}
	return nil
}

// movedOff returns a client whose session started on backend name and is
// served elsewhere now.
func (l *drainLoad) movedOff(name string) *drainClient {
	for _, c := range l.clients {
		if c.home == name && c.lastAnswer() != name {
			return c
		}
	}
	return l.sessionOn(name)
}

func (l *drainLoad) totals() (calls int64, errs [phaseCount]int64) {
	for _, c := range l.clients {
		calls += c.done.Load()
	}
	for i := range errs {
		errs[i] = l.errs[i].Load()
	}
	return calls, errs
}

func (l *drainLoad) firstErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errTexts...)
}

// slowCall is a wait call in flight.
type slowCall struct {
	started time.Time
	done    chan slowResult
}

type slowResult struct {
	answer string // the backend that answered
	took   time.Duration
	err    error
}

// callWait calls the wait tool of c's backend in the background.
func (c *drainClient) callWait(ctx context.Context, ms int) *slowCall {
	s := &slowCall{started: time.Now(), done: make(chan slowResult, 1)}
	go func() {
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		res, err := c.cs.CallTool(callCtx, &mcp.CallToolParams{Name: "wait", Arguments: mcpbackend.WaitInput{MS: ms}})
		r := slowResult{took: time.Since(s.started), err: err}
		if err == nil {
			r.answer, r.err = answeredBy(res)
		}
		s.done <- r
	}()
	return s
}

func (s *slowCall) wait(t *testing.T) slowResult {
	t.Helper()
	select {
	case r := <-s.done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the slow call did not end within 30 s")
		return slowResult{}
	}
}

// answeredBy is the backend named in a whoami-shaped tool result.
func answeredBy(res *mcp.CallToolResult) (string, error) {
	if res.IsError {
		return "", fmt.Errorf("tool error: %v", res.Content)
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return "", err
	}
	var out mcpbackend.WhoamiOutput
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", err
	}
	if out.Backend == "" {
		return "", errors.New("the result names no backend")
	}
	return out.Backend, nil
}

// endpoints GETs tether's /debug/endpoints.
func (p *tetherProc) endpoints(t *testing.T) server.EndpointsView {
	t.Helper()
	var v server.EndpointsView
	body := p.adminGet(t, "/debug/endpoints")
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/debug/endpoints: %v\n%s", err, body)
	}
	return v
}

// metrics GETs tether's /metrics.
func (p *tetherProc) metrics(t *testing.T) string {
	t.Helper()
	return p.adminGet(t, "/metrics")
}

func (p *tetherProc) adminGet(t *testing.T, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", path, resp.Status, b.String())
	}
	return b.String()
}

func endpointByURL(v server.EndpointsView, url string) (server.EndpointView, bool) {
	for _, e := range v.Endpoints {
		if e.URL == url {
			return e, true
		}
	}
	return server.EndpointView{}, false
}

// metricValue is the value of the sample named series (name and labels as
// the text exposition writes them), NaN when there is none.
func metricValue(exposition, series string) float64 {
	for _, line := range strings.Split(exposition, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return math.NaN()
}

// metricSum adds up every sample of the metric name, whatever its labels.
func metricSum(exposition, name string) float64 {
	sum := 0.0
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// runTetherCLI runs a tether subcommand and returns its standard output.
func runTetherCLI(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tether %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}
