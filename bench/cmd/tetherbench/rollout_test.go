package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReinitSeries(t *testing.T) {
	for line, want := range map[string]struct {
		key string
		v   float64
		ok  bool
	}{
		`tether_reinitializations_total{reason="drain",result="ok"} 20`:                {"drain/ok", 20, true},
		`tether_reinitializations_total{result="failed",reason="session_lost"} 3`:      {"session_lost/failed", 3, true},
		`tether_reinitializations_total 4`:                                             {},
		`# HELP tether_reinitializations_total Transparent session re-initializations`: {},
		`tether_requests_total{route="new"} 1`:                                         {},
	} {
		k, v, ok := reinitSeries(line)
		if k != want.key || v != want.v || ok != want.ok {
			t.Errorf("%s: got %q %v %v, want %q %v %v", line, k, v, ok, want.key, want.v, want.ok)
		}
	}
	got := diffCounts(map[string]float64{"drain/ok": 25, "dial_failed/ok": 2}, map[string]float64{"drain/ok": 5, "dial_failed/ok": 2})
	if diff := cmp.Diff(got, map[string]float64{"drain/ok": 20}); diff != "" {
		t.Errorf("diffCounts (-got +want):\n%s", diff)
	}
}

// TestRolloutFigures checks what one rollout's figures are made of: the
// windows of the latencies, the re-initializations paid by clients, when a
// pod was empty by tether's count and by the clients', and the traffic it
// still answered after tether counted it empty.
func TestRolloutFigures(t *testing.T) {
	s := func(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }
	began := time.Unix(1000, 0)
	r := attackResult{Started: began}
	// Steady state: 1 ms; during the rollout: 10 ms, one error.
	for i := range 100 {
		r.Samples = append(r.Samples, sample{at: s(float64(i) * 0.05), latency: time.Millisecond, ok: true, code: 200})
	}
	for i := range 100 {
		r.Samples = append(r.Samples, sample{at: s(5 + float64(i)*0.05), latency: 10 * time.Millisecond, ok: i != 50, code: 200})
	}
	r.Samples[150].code, r.Samples[150].err = 502, "bad gateway"
	m := &rolloutMode{Mode: "proactive", Codes: map[string]int{}, ErrorTexts: map[string]int{},
		Steps: []rolloutStepResult{{Pod: "pod-0", URL: "http://a", Start: 5, SIGTERM: 7, Exited: 7.1, Undrained: 7.2}}}
	answers := []rolloutAnswer{
		// session 0 on pod-0, moves at 5.4 s (the answer ends then); session 1
		// on pod-0, moves at 5.9 s; session 2 on pod-1 throughout.
		{start: s(4), end: s(4.001), session: 0, backend: "pod-0"},
		{start: s(4.1), end: s(4.101), session: 1, backend: "pod-0"},
		{start: s(4.2), end: s(4.201), session: 2, backend: "pod-1"},
		{start: s(5.399), end: s(5.4), session: 0, backend: "pod-1"},
		{start: s(5.5), end: s(5.501), session: 1, backend: "pod-0"}, // tether counts it empty at 5.45 s: traffic it should not get
		{start: s(5.85), end: s(5.9), session: 1, backend: "pod-2"},
		{start: s(6), end: s(6.001), session: 2, backend: "pod-1"},
	}
	poll := func(at float64, n int64, draining bool) endpointPoll {
		return endpointPoll{at: began.Add(s(at)), sessions: map[string]int64{"http://a": n}, draining: map[string]bool{"http://a": draining}}
	}
	// The drain still shows at 7.5 s, 0.3 s after DELETE /drain.
	polls := []endpointPoll{poll(4.95, 2, false), poll(5.2, 1, true), poll(5.45, 0, true), poll(7.3, 0, true), poll(7.5, 0, true)}
	reinits := []map[string]float64{{"dial_failed/ok": 1}, {"dial_failed/ok": 1, "drain/ok": 2, "session_lost/ok": 1}}
	m.rolloutFigures(r, began, answers, polls, reinits, []string{"http://a"})

	if m.SteadySent != 100 || m.RolloutSent != 100 || m.RolloutErrors != 1 || m.Codes["502"] != 1 {
		t.Errorf("counts: steady %d, rollout %d, errors %d, codes %v", m.SteadySent, m.RolloutSent, m.RolloutErrors, m.Codes)
	}
	if m.P99Steady != time.Millisecond || m.P99Rollout != 10*time.Millisecond {
		t.Errorf("p99 steady %v, rollout %v", m.P99Steady, m.P99Rollout)
	}
	if m.ByDrain != 2 || m.PaidByClients != 1 {
		t.Errorf("by the drain %v, paid by clients %v (%v)", m.ByDrain, m.PaidByClients, m.Reinits)
	}
	st := m.Steps[0]
	if st.DrainingSeen != 2 || st.DrainingAfterUndo != 1 {
		t.Errorf("draining seen in %d polls, after the undo in %d", st.DrainingSeen, st.DrainingAfterUndo)
	}
	if st.ClientsOnOld != 2 || !near(st.ClientsMoved, 0.9) || !near(st.TetherEmpty, 0.45) || st.OldAnswersAfterEmpty != 1 {
		t.Errorf("step: clients on old %d, moved after %v, tether empty after %v, old answers after empty %d",
			st.ClientsOnOld, st.ClientsMoved, st.TetherEmpty, st.OldAnswersAfterEmpty)
	}
	if m.FirstMovedP50 != time.Millisecond || m.FirstMovedMax != 50*time.Millisecond {
		t.Errorf("moved sessions' first answers elsewhere: median %v, max %v", m.FirstMovedP50, m.FirstMovedMax)
	}
	if m.P99AfterStart != 10*time.Millisecond || m.P99AfterSIGTERM != 10*time.Millisecond {
		t.Errorf("p99 after the drain %v, after SIGTERM %v", m.P99AfterStart, m.P99AfterSIGTERM)
	}
	if diff := cmp.Diff(m.SessionsAfter, map[string]int{"pod-1": 2, "pod-2": 1}); diff != "" {
		t.Errorf("sessions after (-got +want):\n%s", diff)
	}
	if !near(m.MaxMeanAfter, 2) {
		t.Errorf("max/mean after %v", m.MaxMeanAfter)
	}

	// A pod whose sessions never all move, and that tether never counts
	// empty while it runs: both times are -1 ("–").
	m2 := &rolloutMode{Codes: map[string]int{}, ErrorTexts: map[string]int{},
		Steps: []rolloutStepResult{{Pod: "pod-0", URL: "http://a", Start: 5, Exited: 5.3}}}
	m2.rolloutFigures(r, began, answers[:3], polls, reinits, []string{"http://a"})
	if st := m2.Steps[0]; st.ClientsMoved != -1 || st.TetherEmpty != -1 {
		t.Errorf("never moved: clients %v, tether %v", st.ClientsMoved, st.TetherEmpty)
	}
}

func TestRolloutSession(t *testing.T) {
	for id, want := range map[int]int{100: 0, 159: 59, 160: 0, 221: 1, 9: -1} {
		if got := rolloutSession(id, 60); got != want {
			t.Errorf("id %d: session %d, want %d", id, got, want)
		}
	}
}

func near(a, b float64) bool { return a > b-1e-6 && a < b+1e-6 }
