package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/tether-mcp/tether/bench/internal/svg"
)

// The rolling update: each of three backends replaced in turn under a
// steady load of follow-ups through tether (static mode), once with
// --drain=on-failure (sessions move when a request finds their pod gone)
// and once with --drain=proactive (an operator drain, POST /drain on the
// admin listener, moves them ahead of the pod's exit).
//
// Each backend is its own process (`tetherbench backends`), as a pod is. A
// replacement is what a pod's deletion does, on one address: the pod turns
// terminating (proactive: POST /drain for it), keeps serving for a fixed
// grace (rolloutGrace, the preStop delay; waited in full in both modes, as a
// kubelet does, whether the pod still has sessions or not), then gets
// SIGTERM (http.Server.Shutdown: requests in flight have rolloutTermGrace to
// finish), exits, and a new process (the new version, named "-v2") starts on
// the same address; proactive: DELETE /drain for it.
const (
	rolloutSessions  = 60
	rolloutPerSess   = 5.0 // tools/call per second per session
	rolloutSteady    = 10 * time.Second
	rolloutGrace     = 5 * time.Second
	rolloutTermGrace = time.Second
	rolloutStep      = 10 * time.Second // from one pod's drain to the next's
	rolloutSettle    = 5 * time.Second  // load after the last replacement
	rolloutPoll      = 50 * time.Millisecond
	rolloutPods      = 3
)

// rolloutStepResult is the replacement of one pod.
type rolloutStepResult struct {
	Pod, URL string
	// Seconds since the load began: the drain (or, on-failure, the moment
	// the pod would turn terminating), SIGTERM, the old process's exit, the
	// new one's readiness, DELETE /drain.
	Start, SIGTERM, Exited, NewReady, Undrained float64
	DrainAnswer                                 string // POST /drain's answer
	// Sessions on the pod by tether's count when it turned terminating and
	// when SIGTERM was sent (the last poll before each).
	SessionsAtStart, SessionsAtSIGTERM int64
	// ClientsOnOld is how many sessions the clients last saw answered by the
	// old process when it turned terminating.
	ClientsOnOld int
	// TetherEmpty is the time from Start until tether first counted no
	// session on the pod's address while the old process still ran (-1:
	// not before it exited). ClientsMoved is the time from Start until the
	// last of ClientsOnOld was answered by another process (-1: never).
	TetherEmpty, ClientsMoved float64
	// OldAnswersAfterEmpty counts answers by the old process to requests
	// started after tether counted it empty: traffic a drain should not send.
	OldAnswersAfterEmpty int
	// Requests started from this step's Start to the next one's (or the
	// end), the start times of the failed ones in seconds from SIGTERM (the
	// first 20), and their p99.
	Sent, Errors int
	ErrorsAt     []float64
	P99          time.Duration
	// p99 of the requests started in the second after Start, and after
	// SIGTERM.
	P99AfterStart, P99AfterSIGTERM time.Duration
	// Re-initializations during the step, by "reason/result".
	Reinits map[string]float64
	// Moved is what /debug/endpoints said the drain had moved (its last
	// reading while draining), -1 when it did not say.
	Moved int64
	// DrainingSeen counts the polls that showed the pod draining between
	// Start and SIGTERM; DrainingAfterUndo those that still did from 0.2 s
	// after DELETE /drain on (proactive: a drain that does not end).
	DrainingSeen, DrainingAfterUndo int
}

// rolloutMode is one rollout.
type rolloutMode struct {
	Mode string // proactive or on-failure
	Run  int    // 1, 2, ... with -rollouts
	// WaitMS is how long each call stays in flight on the backend (the
	// wait tool); 0: echo, which answers at once.
	WaitMS int
	Flags  string // tether's flags for it
	Rate   float64
	// Whole run, steady state (before the first drain), rollout (from the
	// first drain to the end of the settle time).
	Sent, Errors               int
	SteadySent, SteadyErrors   int
	RolloutSent, RolloutErrors int
	Codes                      map[string]int
	ErrorTexts                 map[string]int
	P50Steady, P99Steady       time.Duration
	P50Rollout, P99Rollout     time.Duration
	WorstSecondP99, MaxRollout time.Duration
	// The worst pod's p99 of the requests started in the second after it
	// turned terminating, and in the second after its SIGTERM.
	P99AfterStart, P99AfterSIGTERM time.Duration
	// A moved session's first answer from another process: what the
	// request that found it moved (on-failure: that re-initialized it) took.
	FirstMovedP50, FirstMovedMax time.Duration
	Reinits                      map[string]float64 // "reason/result" over the rollout
	PaidByClients, ByDrain       float64            // re-initializations not "drain", and "drain"
	DrainDurSum, DrainDurCount   float64            // tether_drain_duration_seconds
	Steps                        []rolloutStepResult
	SessionsAfter                map[string]int // per process, by the clients' last answers
	MaxMeanAfter                 float64
	T, OK, Err, P99, ST          []float64
	Sess                         [][]float64 // per pod (address), tether's count, at ST
	Answers                      int         // answers parsed for the backend's name
}

type rolloutResult struct {
	Sessions int
	Rate     float64
	Modes    []rolloutMode
	Note     string
}

// runRollout runs the rolling update with --drain=on-failure, then with
// --drain=proactive, env.rollouts times in alternation (this machine's
// speed drifts). A tether built before the drain has neither flag: it
// behaves as on-failure, and the proactive runs are skipped (said in Note).
func runRollout(ctx context.Context, env *reportEnv) (*rolloutResult, error) {
	res := &rolloutResult{Sessions: rolloutSessions, Rate: rolloutSessions * rolloutPerSess}
	hasFlag := drainFlagSupported(env.tether)
	if !hasFlag {
		res.Note = "This tether has no --drain flag (built before the drain): the proactive rollout was not run; the on-failure one ran without the flag, which is the same behaviour."
		env.logf("rollout: %s", res.Note)
	}
	for run := 1; run <= max(env.rollouts, 1); run++ {
		for _, mode := range []string{"on-failure", "proactive"} {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if mode == "proactive" && !hasFlag {
				continue
			}
			m, err := runRolloutMode(ctx, env, mode, hasFlag)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			m.Run = run
			res.Modes = append(res.Modes, *m)
		}
	}
	return res, nil
}

var drainFlagRE = regexp.MustCompile(`(?m)^\s+-drain\s`)

// drainFlagSupported says whether `tether serve` has --drain.
func drainFlagSupported(bin string) bool {
	out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	return drainFlagRE.Match(out)
}

// rolloutPod is one pod's process.
type rolloutPod struct {
	name, addr string
	p          *proc
}

// startRolloutPod runs one backend process named name on listen, retrying
// while the address is still taken by the process it replaces.
func startRolloutPod(env *reportEnv, logName, name, listen string) (*rolloutPod, error) {
	var last error
	for range 50 {
		p, addrs, _, err := startBackends(env.logDir, logName, nil, "-names", name, "-listen", listen, "-term-grace", rolloutTermGrace.String())
		if err == nil {
			return &rolloutPod{name: name, addr: addrs[name], p: p}, nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return nil, last
}

// terminate sends SIGTERM to the pod's process and waits for it to exit,
// SIGKILL after its grace and 5 s more. Its stdin stays open: `backends`
// stops at once, without the grace, when stdin closes.
func (r *rolloutPod) terminate() {
	syscall.Kill(-r.p.pid(), syscall.SIGTERM)
	select {
	case <-r.p.done:
	case <-time.After(rolloutTermGrace + 5*time.Second):
		syscall.Kill(-r.p.pid(), syscall.SIGKILL)
		<-r.p.done
	}
}

// endpointPoll is one reading of /debug/endpoints.
type endpointPoll struct {
	at       time.Time
	sessions map[string]int64 // by URL
	draining map[string]bool
	moved    map[string]int64
}

type debugEndpoint struct {
	URL      string `json:"url"`
	Sessions int64  `json:"sessions"`
	Draining bool   `json:"draining"`
	Drain    *struct {
		Moved int64 `json:"moved"`
	} `json:"drain"`
}

func readEndpoints(c *http.Client, admin string) (endpointPoll, error) {
	e := endpointPoll{at: time.Now(), sessions: map[string]int64{}, draining: map[string]bool{}, moved: map[string]int64{}}
	resp, err := c.Get(admin + "/debug/endpoints")
	if err != nil {
		return e, err
	}
	defer resp.Body.Close()
	var v struct{ Endpoints []debugEndpoint }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return e, err
	}
	for _, ep := range v.Endpoints {
		u := strings.TrimSuffix(ep.URL, "/")
		e.sessions[u] = ep.Sessions
		e.draining[u] = ep.Draining
		if ep.Drain != nil {
			e.moved[u] = ep.Drain.Moved
		}
	}
	return e, nil
}

// rolloutAnswer is a successful answer: when it came, for which session,
// from which process.
type rolloutAnswer struct {
	start, end time.Duration // since the load began
	session    int
	backend    string
}

var (
	jsonRPCIDRE     = regexp.MustCompile(`"id":\d+,`)
	answerBackendRE = regexp.MustCompile(`"backend":"([^"]+)"`)
	answerIDRE      = regexp.MustCompile(`"id":(\d+)`)
)

// rolloutTargeter is followUpTargeter, calling the wait tool for waitMS
// milliseconds when waitMS > 0 (calls that stay in flight). A request's
// JSON-RPC id says its session (rolloutSession); the answer names the
// process that served it.
func rolloutTargeter(sessions []liveSession, waitMS int) vegeta.Targeter {
	var next atomic.Uint64
	return func(t *vegeta.Target) error {
		n := next.Add(1) - 1
		s := sessions[n%uint64(len(sessions))]
		t.Method, t.URL, t.Header = http.MethodPost, s.url, s.header
		if waitMS > 0 {
			t.Body = fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"wait","arguments":{"ms":%d}}}`, n+100, waitMS)
		} else {
			t.Body = fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`, n+100)
		}
		return nil
	}
}

// rolloutSession is the session of the request whose JSON-RPC id is id
// (rolloutTargeter's numbering), or -1.
func rolloutSession(id, sessions int) int {
	if id < 100 || sessions <= 0 {
		return -1
	}
	return (id - 100) % sessions
}

// drainCall sends POST or DELETE /drain for backend to the admin listener.
func drainCall(c *http.Client, admin, method, backend string) (string, error) {
	req, err := http.NewRequest(method, admin+"/drain?backend="+url.QueryEscape(backend), nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return string(b), &statusError{Code: resp.StatusCode, Body: string(b)}
	}
	return strings.TrimSpace(string(b)), nil
}

func runRolloutMode(ctx context.Context, env *reportEnv, mode string, hasFlag bool) (*rolloutMode, error) {
	proactive := mode == "proactive"
	m := &rolloutMode{Mode: mode, WaitMS: env.rolloutWaitMS, Rate: rolloutSessions * rolloutPerSess, Codes: map[string]int{}, ErrorTexts: map[string]int{}}
	pods := make([]*rolloutPod, rolloutPods)
	var urls []string
	defer func() {
		for _, p := range pods {
			if p != nil {
				p.p.stop()
			}
		}
	}()
	for i := range pods {
		name := fmt.Sprintf("pod-%d", i)
		p, err := startRolloutPod(env, "rollout-"+mode+"-"+name, name, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		pods[i] = p
		urls = append(urls, "http://"+p.addr)
	}
	var extra []string
	if hasFlag {
		extra = append(extra, "--drain", mode)
	}
	if proactive && env.rolloutDrainRate > 0 {
		extra = append(extra, "--drain-rate", strconv.FormatFloat(env.rolloutDrainRate, 'g', -1, 64))
	}
	m.Flags = strings.Join(extra, " ")
	tp, turl, err := startTether(ctx, env.tether, env.logDir, "rollout-tether-"+mode, urls, extra...)
	if err != nil {
		return nil, err
	}
	defer tp.stop()
	admin := &http.Client{Timeout: 5 * time.Second}
	httpc := newClient()
	var ss []liveSession
	for range rolloutSessions {
		sid, backend, err := openSession(ctx, httpc, turl+"/mcp")
		if err != nil {
			return nil, err
		}
		ss = append(ss, liveSession{url: turl + "/mcp", header: mcpHeaders(sid), backend: backend})
	}
	defer func() {
		for _, s := range ss {
			closeSession(context.Background(), httpc, s.url, s.header.Get("Mcp-Session-Id"))
		}
	}()
	attack(ctx, rolloutTargeter(ss, env.rolloutWaitMS), m.Rate, time.Second, 256) // warm-up

	// The answers, the polls and the steps are filled while the load runs.
	var (
		mu      sync.Mutex
		answers []rolloutAnswer
		polls   []endpointPoll
		steps   []rolloutStepResult
		stepErr error
		reinits []map[string]float64 // at each step's start, then at the end
	)
	loadCtx, endLoad := context.WithCancel(ctx)
	defer endLoad()
	began := time.Now()
	since := func(t time.Time) float64 { return t.Sub(began).Seconds() }
	lastPoll := func() endpointPoll {
		mu.Lock()
		defer mu.Unlock()
		if len(polls) == 0 {
			return endpointPoll{}
		}
		return polls[len(polls)-1]
	}
	var bg sync.WaitGroup
	bg.Go(func() { // tether's count of sessions per pod, until the load ends
		t := time.NewTicker(rolloutPoll)
		defer t.Stop()
		for range 10000 {
			select {
			case <-loadCtx.Done():
				return
			case <-t.C:
			}
			if e, err := readEndpoints(admin, tp.admin); err == nil {
				mu.Lock()
				polls = append(polls, e)
				mu.Unlock()
			}
		}
	})
	bg.Go(func() { // the rollout
		defer endLoad()
		if !sleepCtx(loadCtx, rolloutSteady) {
			return
		}
		for i := range pods {
			start := time.Now()
			st := rolloutStepResult{Pod: pods[i].name, URL: urls[i], Start: since(start), Moved: -1}
			mu.Lock()
			reinits = append(reinits, reinitsByLabel(tp.admin))
			mu.Unlock()
			st.SessionsAtStart = lastPoll().sessions[urls[i]]
			if proactive {
				ans, err := drainCall(admin, tp.admin, http.MethodPost, urls[i])
				if err != nil {
					stepErr = fmt.Errorf("POST /drain?backend=%s: %w", urls[i], err)
					return
				}
				st.DrainAnswer = ans
			}
			if !sleepCtx(loadCtx, rolloutGrace) {
				return
			}
			last := lastPoll()
			st.SessionsAtSIGTERM = last.sessions[urls[i]]
			if mv, ok := last.moved[urls[i]]; ok {
				st.Moved = mv
			}
			st.SIGTERM = since(time.Now())
			pods[i].terminate()
			st.Exited = since(time.Now())
			next, err := startRolloutPod(env, fmt.Sprintf("rollout-%s-pod-%d-v2", mode, i), fmt.Sprintf("pod-%d-v2", i), pods[i].addr)
			if err != nil {
				stepErr = fmt.Errorf("replacing %s: %w", pods[i].name, err)
				return
			}
			pods[i] = next
			st.NewReady = since(time.Now())
			if proactive {
				if _, err := drainCall(admin, tp.admin, http.MethodDelete, urls[i]); err != nil {
					stepErr = fmt.Errorf("DELETE /drain?backend=%s: %w", urls[i], err)
					return
				}
				st.Undrained = since(time.Now())
			}
			// The next pod turns terminating once tether takes this one
			// again (on-failure: a dial that failed while no process
			// listened ejects it for a backoff) and the step's time is up.
			if err := waitReadmitted(loadCtx, tp.admin, urls[i], 15*time.Second); err != nil && loadCtx.Err() == nil {
				env.logf("rollout %s: %v", mode, err)
			}
			mu.Lock()
			steps = append(steps, st)
			mu.Unlock()
			if !sleepCtx(loadCtx, time.Until(start.Add(rolloutStep))) {
				return
			}
		}
		mu.Lock()
		reinits = append(reinits, reinitsByLabel(tp.admin))
		mu.Unlock()
		sleepCtx(loadCtx, rolloutSettle)
	})
	// The load runs until the rollout ends; the bound is only a backstop.
	bound := rolloutSteady + rolloutPods*(rolloutStep+20*time.Second) + rolloutSettle
	r := attackObserved(loadCtx, rolloutTargeter(ss, env.rolloutWaitMS), m.Rate, bound, 2000, func(res *vegeta.Result, s sample) {
		if !s.ok {
			why := res.Error
			if why == "" || res.Code != 0 {
				why = string(res.Body[:min(len(res.Body), 300)])
			}
			// The JSON-RPC id differs in every answer; the kinds of error do not.
			k := fmt.Sprintf("%d %s", res.Code, jsonRPCIDRE.ReplaceAllString(why, ""))
			mu.Lock()
			if m.ErrorTexts[k] > 0 || len(m.ErrorTexts) < 5 {
				m.ErrorTexts[k]++
			}
			mu.Unlock()
			return
		}
		b, id := answerBackendRE.FindSubmatch(res.Body), answerIDRE.FindSubmatch(res.Body)
		if b == nil || id == nil {
			return
		}
		n, _ := strconv.Atoi(string(id[1]))
		i := rolloutSession(n, len(ss))
		if i < 0 {
			return
		}
		mu.Lock()
		answers = append(answers, rolloutAnswer{start: res.Timestamp.Sub(began), end: res.Timestamp.Sub(began) + res.Latency, session: i, backend: string(b[1])})
		mu.Unlock()
	})
	endLoad()
	bg.Wait()
	if stepErr != nil {
		return nil, stepErr
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if len(steps) != rolloutPods {
		return nil, fmt.Errorf("%d of %d replacements done", len(steps), rolloutPods)
	}
	// Samples are timed from the attack's own start, a moment after began.
	offset := r.Started.Sub(began)
	for i := range r.Samples {
		r.Samples[i].at += offset
	}
	m.Steps, m.Answers = steps, len(answers)
	m.rolloutFigures(r, began, answers, polls, reinits, urls)
	m.DrainDurSum = metricSum(tp.admin, "tether_drain_duration_seconds_sum")
	m.DrainDurCount = metricSum(tp.admin, "tether_drain_duration_seconds_count")
	env.logf("rollout %s: %d errors of %d (steady %d of %d); p99 %.2f ms steady, %.2f ms during the rollout (worst second %.2f ms, after a drain %.2f ms, after a SIGTERM %.2f ms); a moved session's first answer elsewhere %.2f ms median, %.2f ms max; re-initializations paid by clients %.0f, by the drain %.0f; sessions after %v",
		mode, m.Errors, m.Sent, m.SteadyErrors, m.SteadySent, ms(m.P99Steady), ms(m.P99Rollout), ms(m.WorstSecondP99), ms(m.P99AfterStart), ms(m.P99AfterSIGTERM), ms(m.FirstMovedP50), ms(m.FirstMovedMax), m.PaidByClients, m.ByDrain, m.SessionsAfter)
	for _, st := range m.Steps {
		env.logf("rollout %s: %s: %d sessions (clients: %d); tether empty after %s, clients moved after %s; %d left at SIGTERM; %d answers by the old pod after tether's 0; %d errors of %d; re-initializations %v; draining in %d polls, %d after DELETE /drain; moved %d",
			mode, st.Pod, st.SessionsAtStart, st.ClientsOnOld, secs(st.TetherEmpty), secs(st.ClientsMoved), st.SessionsAtSIGTERM, st.OldAnswersAfterEmpty, st.Errors, st.Sent, st.Reinits,
			st.DrainingSeen, st.DrainingAfterUndo, st.Moved)
	}
	return m, nil
}

// rolloutFigures condenses one rollout's samples, answers and polls, all
// timed from began (the samples moved onto its clock).
func (m *rolloutMode) rolloutFigures(r attackResult, began time.Time, answers []rolloutAnswer, polls []endpointPoll, reinits []map[string]float64, urls []string) {
	first := time.Duration(m.Steps[0].Start * float64(time.Second))
	var steady, roll []time.Duration
	for _, s := range r.Samples {
		m.Sent++
		if !s.ok {
			m.Errors++
			m.Codes[strconv.Itoa(int(s.code))]++
		}
		if s.at < first {
			m.SteadySent++
			if !s.ok {
				m.SteadyErrors++
			}
			steady = append(steady, s.latency)
		} else {
			m.RolloutSent++
			if !s.ok {
				m.RolloutErrors++
			}
			roll = append(roll, s.latency)
		}
	}
	slices.Sort(steady)
	slices.Sort(roll)
	m.P50Steady, m.P99Steady = quantile(steady, 0.5), quantile(steady, 0.99)
	m.P50Rollout, m.P99Rollout = quantile(roll, 0.5), quantile(roll, 0.99)
	if len(roll) > 0 {
		m.MaxRollout = roll[len(roll)-1]
	}
	end := time.Duration(0)
	for _, s := range r.Samples {
		end = max(end, s.at)
	}
	// The worst p99 of any whole second of the rollout.
	for t := first; t+time.Second <= end; t += 250 * time.Millisecond {
		var w []time.Duration
		for _, s := range r.Samples {
			if s.at >= t && s.at < t+time.Second {
				w = append(w, s.latency)
			}
		}
		slices.Sort(w)
		m.WorstSecondP99 = max(m.WorstSecondP99, quantile(w, 0.99))
	}
	m.T, m.OK, m.Err, m.P99 = timeline(r.Samples, end, 250*time.Millisecond)

	// Re-initializations: over the rollout, and per step.
	m.Reinits = map[string]float64{}
	if len(reinits) == len(m.Steps)+1 {
		for k, v := range diffCounts(reinits[len(reinits)-1], reinits[0]) {
			m.Reinits[k] = v
		}
		for i := range m.Steps {
			m.Steps[i].Reinits = diffCounts(reinits[i+1], reinits[i])
		}
	}
	for k, v := range m.Reinits {
		if strings.HasPrefix(k, "drain/") {
			m.ByDrain += v
		} else {
			m.PaidByClients += v
		}
	}

	// Each session's process over time, from the answers in the order they
	// came back.
	slices.SortFunc(answers, func(a, b rolloutAnswer) int { return int(a.end - b.end) })
	var firstMoved []time.Duration
	for i := range m.Steps {
		st := &m.Steps[i]
		start := time.Duration(st.Start * float64(time.Second))
		stepEnd := end + time.Second
		if i+1 < len(m.Steps) {
			stepEnd = time.Duration(m.Steps[i+1].Start * float64(time.Second))
		}
		old := st.Pod
		lastSeen := map[int]string{}
		for _, a := range answers {
			if a.end < start {
				lastSeen[a.session] = a.backend
			}
		}
		onOld := map[int]bool{}
		for s, b := range lastSeen {
			if b == old {
				onOld[s] = true
			}
		}
		st.ClientsOnOld = len(onOld)
		moved := map[int]time.Duration{}
		for _, a := range answers {
			if a.end >= start && onOld[a.session] && a.backend != old {
				if _, ok := moved[a.session]; !ok {
					moved[a.session] = a.end - start
					firstMoved = append(firstMoved, a.end-a.start)
				}
			}
		}
		st.ClientsMoved = -1
		if len(moved) == len(onOld) {
			st.ClientsMoved = 0
			for _, d := range moved {
				st.ClientsMoved = max(st.ClientsMoved, d.Seconds())
			}
		}
		st.TetherEmpty = -1
		var emptyAt time.Duration
		for _, p := range polls {
			at := p.at.Sub(began)
			if at < start || at.Seconds() > st.Exited {
				continue
			}
			if p.sessions[st.URL] == 0 {
				st.TetherEmpty = (at - start).Seconds()
				emptyAt = at
				break
			}
		}
		for _, p := range polls {
			at := p.at.Sub(began).Seconds()
			switch {
			case at >= st.Start && at < st.SIGTERM && p.draining[st.URL]:
				st.DrainingSeen++
			case st.Undrained > 0 && at > st.Undrained+0.2 && p.draining[st.URL]:
				st.DrainingAfterUndo++
			}
		}
		for _, a := range answers {
			if st.TetherEmpty >= 0 && a.start > emptyAt && a.backend == old {
				st.OldAnswersAfterEmpty++
			}
		}
		var lat, afterStart, afterKill []time.Duration
		kill := time.Duration(st.SIGTERM * float64(time.Second))
		for _, s := range r.Samples {
			if s.at >= start && s.at < start+time.Second {
				afterStart = append(afterStart, s.latency)
			}
			if s.at >= kill && s.at < kill+time.Second {
				afterKill = append(afterKill, s.latency)
			}
			if s.at >= start && s.at < stepEnd {
				st.Sent++
				if !s.ok {
					st.Errors++
					if len(st.ErrorsAt) < 20 {
						st.ErrorsAt = append(st.ErrorsAt, s.at.Seconds()-st.SIGTERM)
					}
				}
				lat = append(lat, s.latency)
			}
		}
		slices.Sort(lat)
		st.P99 = quantile(lat, 0.99)
		slices.Sort(afterStart)
		slices.Sort(afterKill)
		st.P99AfterStart, st.P99AfterSIGTERM = quantile(afterStart, 0.99), quantile(afterKill, 0.99)
		m.P99AfterStart, m.P99AfterSIGTERM = max(m.P99AfterStart, st.P99AfterStart), max(m.P99AfterSIGTERM, st.P99AfterSIGTERM)
	}
	slices.Sort(firstMoved)
	m.FirstMovedP50 = quantile(firstMoved, 0.5)
	if len(firstMoved) > 0 {
		m.FirstMovedMax = firstMoved[len(firstMoved)-1]
	}

	// Sessions per process after the rollout, by each session's last answer.
	m.SessionsAfter = map[string]int{}
	last := map[int]string{}
	for _, a := range answers {
		last[a.session] = a.backend
	}
	for _, b := range last {
		m.SessionsAfter[b]++
	}
	if len(m.SessionsAfter) > 0 {
		most := 0
		for _, n := range m.SessionsAfter {
			most = max(most, n)
		}
		m.MaxMeanAfter = float64(most) / (float64(len(last)) / rolloutPods)
	}

	// tether's count per pod over time.
	m.Sess = make([][]float64, len(urls))
	for _, p := range polls {
		m.ST = append(m.ST, p.at.Sub(began).Seconds())
		for i, u := range urls {
			m.Sess[i] = append(m.Sess[i], float64(p.sessions[u]))
		}
	}
}

// sleepCtx waits for d and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	sleep(ctx, d)
	return ctx.Err() == nil
}

// reinitsByLabel reads tether_reinitializations_total per series, keyed
// "reason/result".
func reinitsByLabel(admin string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if k, v, ok := reinitSeries(sc.Text()); ok {
			out[k] += v
		}
	}
	return out
}

var labelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// reinitSeries parses one exposition line of tether_reinitializations_total.
func reinitSeries(line string) (key string, v float64, ok bool) {
	rest, found := strings.CutPrefix(line, "tether_reinitializations_total{")
	if !found {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, '}')
	if i < 0 {
		return "", 0, false
	}
	labels := map[string]string{}
	for _, m := range labelRE.FindAllStringSubmatch(rest[:i], -1) {
		labels[m[1]] = m[2]
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(rest[i+1:]), 64)
	if err != nil {
		return "", 0, false
	}
	return labels["reason"] + "/" + labels["result"], v, true
}

// diffCounts is after − before, per key, leaving out keys that did not move.
func diffCounts(after, before map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if x := v - before[k]; x != 0 {
			d[k] = x
		}
	}
	return d
}

// secs formats seconds, "–" for a negative value (it did not happen).
func secs(v float64) string {
	if v < 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f s", v)
}

// countsText is "k ×n" pairs in key order, "–" when empty.
func countsText(m map[string]float64) string {
	if len(m) == 0 {
		return "–"
	}
	keys := slices.Sorted(maps.Keys(m))
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s ×%.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// label names a run in the tables: the mode, and the run when there are
// several.
func (m *rolloutMode) label(runs int) string {
	l := m.Mode
	if m.Flags == "" {
		l += " (no flag: a build before the drain)"
	}
	if _, rate, ok := strings.Cut(m.Flags, "--drain-rate "); ok {
		l += ", --drain-rate " + rate
	}
	if m.WaitMS > 0 {
		l += fmt.Sprintf(", calls of %d ms", m.WaitMS)
	}
	if runs > 1 {
		l += fmt.Sprintf(", run %d", m.Run)
	}
	return l
}

func (r *rolloutResult) runs() int {
	n := 0
	for _, m := range r.Modes {
		n = max(n, m.Run)
	}
	return n
}

func rolloutMarkdown(r *rolloutResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "tether (`--backends`, p2c, memory store) in front of %d go-sdk backends, each its own process (`tetherbench backends`, sessions in memory); %d sessions send `tools/call` (echo, unless a row says calls of N ms: the wait tool) at %.0f/s each (%.0f/s in all, open loop), raw Streamable HTTP with each session's `Mcp-Session-Id`. After %s of steady state each pod is replaced in turn, one every %s: it turns terminating (proactive: `POST /drain?backend=URL` on tether's admin listener; on-failure: nothing tells tether), keeps serving for a fixed grace of %s (waited in full in both modes, as a kubelet waits out a preStop hook, whether sessions are left or not), gets SIGTERM (`http.Server.Shutdown`: requests in flight have %s), exits, and a new process (`pod-N-v2`) starts on the same address (proactive: then `DELETE /drain`); %s of load follow the last one. Each run has fresh backends, tether and sessions. An error is any request that did not get a successful JSON-RPC answer. *Paid by clients*: re-initializations of any reason but `drain` (each made inside a client's request). *Time until the old pod had no sessions*, from the moment it turned terminating: by tether's count (`/debug/endpoints`, polled every %s, while the old process ran; – when it never read 0 then) and by the clients' (the last of its sessions answered by another process).\n\n",
		rolloutPods, r.Sessions, rolloutPerSess, r.Rate, rolloutSteady, rolloutStep, rolloutGrace, rolloutTermGrace, rolloutSettle, rolloutPoll)
	if r.Note != "" {
		b.WriteString(r.Note + "\n\n")
	}
	runs := r.runs()
	b.WriteString("| `--drain` | errors / requests during the rollout | codes | p99 steady | p99 during the rollout | worst 1 s p99 | p99 in the second after a pod turned terminating (worst pod) | p99 in the second after a SIGTERM (worst pod) | a moved session's first answer elsewhere: median, max | re-initializations paid by clients | moved by the drain | time until each old pod had no sessions: tether's count | clients' view | sessions left at SIGTERM | sessions max/mean after |\n|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|---:|\n")
	for _, m := range r.Modes {
		codes := map[string]float64{}
		for c, n := range m.Codes {
			if c == "0" {
				c = "transport"
			}
			codes[c] = float64(n)
		}
		var empty, moved, left []string
		for _, st := range m.Steps {
			empty = append(empty, secs(st.TetherEmpty))
			moved = append(moved, secs(st.ClientsMoved))
			left = append(left, strconv.FormatInt(st.SessionsAtSIGTERM, 10))
		}
		fmt.Fprintf(&b, "| %s | %d / %d | %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f ms, %.2f ms | %.0f | %.0f | %s | %s | %s | %.2f |\n",
			m.label(runs), m.RolloutErrors, m.RolloutSent, countsText(codes), ms(m.P99Steady), ms(m.P99Rollout), ms(m.WorstSecondP99),
			ms(m.P99AfterStart), ms(m.P99AfterSIGTERM), ms(m.FirstMovedP50), ms(m.FirstMovedMax), m.PaidByClients, m.ByDrain, strings.Join(empty, ", "), strings.Join(moved, ", "), strings.Join(left, ", "), m.MaxMeanAfter)
	}
	b.WriteString("\nPer pod, in the order replaced (*errors at*: start times of the failed requests, seconds from the pod's SIGTERM):\n\n| `--drain` | pod | sessions when it turned terminating (tether; clients) | tether's count 0 after | clients all moved after | answers by the old pod after tether's 0 | left at SIGTERM | errors / requests in its step | errors at | p99 in its step | re-initializations in its step (reason/result) |\n|---|---|---|---|---|---:|---:|---:|---|---:|---|\n")
	for _, m := range r.Modes {
		for _, st := range m.Steps {
			at := "–"
			if len(st.ErrorsAt) > 0 {
				var parts []string
				for _, x := range st.ErrorsAt {
					parts = append(parts, fmt.Sprintf("%+.2f", x))
				}
				at = strings.Join(parts, ", ")
			}
			fmt.Fprintf(&b, "| %s | %s | %d; %d | %s | %s | %d | %d | %d / %d | %s | %.2f ms | %s |\n",
				m.label(runs), st.Pod, st.SessionsAtStart, st.ClientsOnOld, secs(st.TetherEmpty), secs(st.ClientsMoved),
				st.OldAnswersAfterEmpty, st.SessionsAtSIGTERM, st.Errors, st.Sent, at, ms(st.P99), countsText(st.Reinits))
		}
	}
	for _, m := range r.Modes {
		if len(m.ErrorTexts) > 0 {
			fmt.Fprintf(&b, "\nErrors, %s (status and the start of the answer):", m.label(runs))
			keys := slices.Sorted(maps.Keys(m.ErrorTexts))
			for _, k := range keys {
				fmt.Fprintf(&b, " `%s` ×%d;", strings.TrimSpace(strings.ReplaceAll(k, "\n", " ")), m.ErrorTexts[k])
			}
			b.WriteString("\n")
		}
	}
	for _, m := range r.Modes {
		for _, st := range m.Steps {
			if m.Mode == "proactive" && st.DrainingSeen == 0 {
				fmt.Fprintf(&b, "\n%s, %s: `/debug/endpoints` never showed it draining between the drain and SIGTERM.\n", m.label(runs), st.Pod)
			}
			if st.DrainingAfterUndo > 0 {
				fmt.Fprintf(&b, "\n%s, %s: `/debug/endpoints` still showed it draining in %d polls from 0.2 s after `DELETE /drain`.\n", m.label(runs), st.Pod, st.DrainingAfterUndo)
			}
		}
		if m.DrainDurCount > 0 {
			fmt.Fprintf(&b, "\n`tether_drain_duration_seconds`, %s: %.0f drains emptied, %.2f s on average.\n", m.label(runs), m.DrainDurCount, m.DrainDurSum/m.DrainDurCount)
		}
	}
	return b.String()
}

// rolloutTargets are the figures block's rows for the rolling update, over
// every proactive run.
func (r *rolloutResult) rolloutTargets(row func(target, measured string, met bool)) {
	var runs, errs, sent int
	var paid, drained float64
	var p99, steady time.Duration
	for _, m := range r.Modes {
		if m.Mode != "proactive" {
			continue
		}
		runs++
		errs += m.RolloutErrors
		sent += m.RolloutSent
		paid += m.PaidByClients
		drained += m.ByDrain
		p99, steady = max(p99, m.P99Rollout), max(steady, m.P99Steady)
	}
	if runs == 0 {
		return
	}
	row("rolling update with the proactive drain: 0 client errors, 0 re-initializations paid by clients",
		fmt.Sprintf("%d errors of %d requests, %.0f paid by clients, %.0f moved by the drain (%d rollouts); p99 %.2f ms during the rollout vs %.2f ms steady (worst run)", errs, sent, paid, drained, runs, ms(p99), ms(steady)),
		errs == 0 && paid == 0)
}

func rolloutChart(r *rolloutResult) *svg.Figure {
	fig := &svg.Figure{Title: "Rolling update: 3 backends replaced in turn under load behind tether", Cols: 3, PanelW: 420, PanelH: 260,
		Footnote: "Per 250 ms of request start times; sessions by tether's count every 50 ms. Dashed lines: pod N turns terminating (TN) and gets SIGTERM (KN). The first run of each mode."}
	charted := map[string]bool{}
	for _, m := range r.Modes {
		if charted[m.Mode] {
			continue
		}
		charted[m.Mode] = true
		var mk []svg.Marker
		for i, st := range m.Steps {
			mk = append(mk, svg.Marker{X: st.Start, Label: fmt.Sprintf("T%d", i)}, svg.Marker{X: st.SIGTERM, Label: fmt.Sprintf("K%d", i)})
		}
		title := "--drain=" + m.Mode
		fig.Add(&svg.LineChart{Title: title + ": requests/s", XLabel: "s", YLabel: "req/s", Markers: mk,
			Series: []svg.Series{{Name: "ok", X: m.T, Y: m.OK}, {Name: "errors", X: m.T, Y: m.Err}}})
		fig.Add(&svg.LineChart{Title: title + ": p99 latency", XLabel: "s", YLabel: "p99 ms", LogY: true, Markers: mk,
			Series: []svg.Series{{Name: "p99", X: m.T, Y: m.P99}}})
		var series []svg.Series
		for i, y := range m.Sess {
			series = append(series, svg.Series{Name: fmt.Sprintf("pod-%d", i), X: m.ST, Y: y})
		}
		fig.Add(&svg.LineChart{Title: title + ": sessions per pod (tether)", XLabel: "s", YLabel: "sessions", Markers: mk, Series: series})
	}
	return fig
}
