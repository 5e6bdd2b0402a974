package balancer

// White-box tests of passive health checking: probe rounds are driven one by
// one through probeOnce with a fake clock, so no test depends on timing.

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/discovery"
)

var errRefused = errors.New("connection refused")

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// recordingHandler keeps the message of every log record.
type recordingHandler struct {
	mu       sync.Mutex
	messages []string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.messages = append(h.messages, r.Message)
	return nil
}

func (h *recordingHandler) Messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.messages...)
}

const (
	logEjected    = "balancer: endpoint ejected"
	logReadmitted = "balancer: endpoint readmitted"
)

// testBalancer is a Balancer on a fake clock whose probe answers with
// whatever probeErr holds and records the clock time of every probe.
type testBalancer struct {
	*Balancer
	clock *fakeClock
	log   *recordingHandler
	start time.Time

	mu       sync.Mutex
	probeErr error
	probedAt []time.Duration // since start
}

func newTestBalancer(t *testing.T, opts Options, ids ...string) *testBalancer {
	t.Helper()
	tb := &testBalancer{clock: newFakeClock(), log: &recordingHandler{}}
	tb.start = tb.clock.Now()
	p, err := NewPicker("round-robin", nil)
	if err != nil {
		t.Fatal(err)
	}
	opts.Picker = p
	opts.Now = tb.clock.Now
	opts.Logger = slog.New(tb.log)
	opts.Probe = func(ctx context.Context, e *Endpoint) error {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		tb.probedAt = append(tb.probedAt, tb.clock.Now().Sub(tb.start))
		return tb.probeErr
	}
	tb.Balancer = New(opts)
	var s discovery.Snapshot
	for _, id := range ids {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{ID: id, URL: &url.URL{Scheme: "http", Host: id + ":80"}})
	}
	tb.Update(s)
	return tb
}

func (tb *testBalancer) setProbeErr(err error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.probeErr = err
}

func (tb *testBalancer) probes() []time.Duration {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]time.Duration(nil), tb.probedAt...)
}

func (tb *testBalancer) endpoint(t *testing.T, id string) *Endpoint {
	t.Helper()
	e, ok := tb.Lookup(id)
	if !ok {
		t.Fatalf("Lookup(%q) found nothing", id)
	}
	return e
}

// eligibleIDs is the set picks currently choose from.
func (tb *testBalancer) eligibleIDs() []string {
	var out []string
	for _, e := range tb.current.Load().eligible {
		out = append(out, e.ID)
	}
	return out
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		name      string
		base, max time.Duration
		want      []time.Duration // for ejections 1, 2, 3, ...
	}{
		{"doubles to the cap", time.Second, 8 * time.Second, []time.Duration{1, 2, 4, 8, 8, 8}},
		{"cap not a power of two", time.Second, 5 * time.Second, []time.Duration{1, 2, 4, 5, 5}},
		{"cap equals base", 3 * time.Second, 3 * time.Second, []time.Duration{3, 3, 3}},
		{"defaults", 0, 0, []time.Duration{1, 2, 4, 8, 16, 30, 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Options{Picker: &random{}, EjectBase: tt.base, EjectMax: tt.max})
			var got []time.Duration
			for n := range len(tt.want) {
				got = append(got, b.backoff(n+1)/time.Second)
			}
			if diff := cmp.Diff(got, tt.want); diff != "" {
				t.Errorf("backoff in seconds (-got +want):\n%s", diff)
			}
		})
	}
	t.Run("huge streak does not overflow", func(t *testing.T) {
		b := New(Options{Picker: &random{}, EjectBase: time.Second, EjectMax: 1<<62 + 1})
		if got := b.backoff(1000); got != 1<<62+1 {
			t.Errorf("backoff(1000) = %v, want the cap", got)
		}
	})
}

func TestProbeScheduleWhileProbesFail(t *testing.T) {
	tests := []struct {
		name      string
		base, max time.Duration
		want      []time.Duration // probe times after the ejection at 0
	}{
		{
			// Backoffs 1, 2, 4, 8, 8, 8: probes at 1, 3, 7, 15, 23, 31, 39.
			name: "capped at 8s", base: time.Second, max: 8 * time.Second,
			want: []time.Duration{1, 3, 7, 15, 23, 31, 39},
		},
		{
			// Backoffs 1, 2, 4, 8, 16: the next one (30s) ends after the test.
			name: "defaults", want: []time.Duration{1, 3, 7, 15, 31},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTestBalancer(t, Options{EjectBase: tt.base, EjectMax: tt.max}, "a", "b")
			tb.setProbeErr(errRefused)
			tb.Eject(tb.endpoint(t, "a"), errRefused)
			for range 80 { // 40s in ticks of 500ms
				tb.clock.Advance(500 * time.Millisecond)
				tb.probeOnce(t.Context())
			}
			var want []time.Duration
			for _, s := range tt.want {
				want = append(want, s*time.Second)
			}
			if diff := cmp.Diff(tb.probes(), want); diff != "" {
				t.Errorf("probe times (-got +want):\n%s", diff)
			}
			if diff := cmp.Diff(tb.eligibleIDs(), []string{"b"}); diff != "" {
				t.Errorf("eligible (-got +want):\n%s", diff)
			}
		})
	}
}

func TestProbeReadmitsAndResetsStreak(t *testing.T) {
	type step struct {
		at           time.Duration // clock since start when the step runs
		eject        bool          // Eject(a) before the probe round
		probeErr     error
		wantProbed   bool
		wantEjected  bool
		wantEligible []string
	}
	steps := []step{
		{at: 0, eject: true, wantEjected: true, wantEligible: []string{"b"}},
		{at: 999 * time.Millisecond, wantEjected: true, wantEligible: []string{"b"}}, // backoff 1s not over
		{at: 1 * time.Second, probeErr: errRefused, wantProbed: true, wantEjected: true, wantEligible: []string{"b"}},
		{at: 2 * time.Second, wantEjected: true, wantEligible: []string{"b"}}, // backoff now 2s: until 3s
		{at: 3 * time.Second, wantProbed: true, wantEligible: []string{"a", "b"}},
		// The streak was forgotten: the next ejection is back to 1s, not 4s.
		{at: 3 * time.Second, eject: true, wantEjected: true, wantEligible: []string{"b"}},
		{at: 4 * time.Second, wantProbed: true, wantEligible: []string{"a", "b"}},
	}
	tb := newTestBalancer(t, Options{EjectBase: time.Second, EjectMax: 30 * time.Second}, "a", "b")
	a := tb.endpoint(t, "a")
	for i, s := range steps {
		tb.clock.Advance(s.at - tb.clock.Now().Sub(tb.start))
		if s.eject {
			tb.Eject(a, errRefused)
		}
		tb.setProbeErr(s.probeErr)
		before := len(tb.probes())
		tb.probeOnce(t.Context())

		type state struct {
			Probed, Ejected bool
			Eligible        []string
		}
		got := state{len(tb.probes()) > before, a.Ejected(), tb.eligibleIDs()}
		want := state{s.wantProbed, s.wantEjected, s.wantEligible}
		if diff := cmp.Diff(got, want); diff != "" {
			t.Fatalf("step %d at %v (-got +want):\n%s", i, s.at, diff)
		}
	}
	wantLog := []string{logEjected, logEjected, logReadmitted, logEjected, logReadmitted}
	if diff := cmp.Diff(tb.log.Messages(), wantLog); diff != "" {
		t.Errorf("log lines (-got +want):\n%s", diff)
	}
}

func TestEjectIsIdempotent(t *testing.T) {
	tb := newTestBalancer(t, Options{EjectBase: time.Second}, "a", "b")
	a := tb.endpoint(t, "a")
	tb.Eject(a, errRefused)
	tb.clock.Advance(500 * time.Millisecond)
	tb.Eject(a, errRefused) // a second failed request to the same dead endpoint

	tb.Balancer.mu.Lock() // the fields Eject writes are guarded by the Balancer's mu
	streak, until := a.ejections, a.ejectedUntil.Sub(tb.start)
	tb.Balancer.mu.Unlock()
	if streak != 1 || until != time.Second {
		t.Errorf("after two Ejects: streak %d, ejected until %v; want 1, 1s", streak, until)
	}
	if diff := cmp.Diff(tb.log.Messages(), []string{logEjected}); diff != "" {
		t.Errorf("log lines (-got +want):\n%s", diff)
	}
}

func TestEjectIgnoresEndpointsOutsideTheSet(t *testing.T) {
	tb := newTestBalancer(t, Options{}, "a", "b")
	a := tb.endpoint(t, "a")
	tb.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{{ID: "b", URL: &url.URL{Scheme: "http", Host: "b:80"}}}})

	tb.Eject(a, errRefused) // a request that was still running on a removed endpoint
	tb.Eject(nil, errRefused)
	tb.Eject(&Endpoint{ID: "b"}, errRefused) // same ID, different endpoint

	if a.Ejected() {
		t.Error("a removed endpoint was ejected")
	}
	if diff := cmp.Diff(tb.eligibleIDs(), []string{"b"}); diff != "" {
		t.Errorf("eligible (-got +want):\n%s", diff)
	}
	if msgs := tb.log.Messages(); len(msgs) != 0 {
		t.Errorf("log lines %q, want none", msgs)
	}
}

func TestProbeResultForDroppedEndpointIsIgnored(t *testing.T) {
	tb := newTestBalancer(t, Options{}, "a", "b")
	a := tb.endpoint(t, "a")
	tb.Eject(a, errRefused)
	onlyB := discovery.Snapshot{Endpoints: []discovery.Endpoint{{ID: "b", URL: &url.URL{Scheme: "http", Host: "b:80"}}}}
	tb.probe = func(ctx context.Context, e *Endpoint) error {
		tb.Update(onlyB) // discovery drops a while its probe runs
		return nil
	}
	tb.clock.Advance(time.Second)
	tb.probeOnce(t.Context())

	if _, ok := tb.Lookup("a"); ok {
		t.Error("a is back in the set")
	}
	if diff := cmp.Diff(tb.log.Messages(), []string{logEjected}); diff != "" {
		t.Errorf("log lines (-got +want):\n%s", diff)
	}
}

func TestHungProbeTimesOutAsFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(Options{
			Picker:    &random{},
			EjectBase: time.Second,
			Probe: func(ctx context.Context, e *Endpoint) error {
				<-ctx.Done() // a probe that never answers on its own
				return ctx.Err()
			},
		})
		b.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{{ID: "a", URL: &url.URL{Scheme: "http", Host: "a:80"}}}})
		a, _ := b.Lookup("a")
		b.Eject(a, errRefused)
		time.Sleep(time.Second)

		start := time.Now()
		b.probeOnce(t.Context())
		if took := time.Since(start); took != probeTimeout {
			t.Errorf("probe round took %v, want probeTimeout (%v)", took, probeTimeout)
		}
		b.mu.Lock()
		streak := a.ejections
		b.mu.Unlock()
		if !a.Ejected() || streak != 2 {
			t.Errorf("after a timed-out probe: ejected %v, streak %d; want true, 2", a.Ejected(), streak)
		}
	})
}

func TestRunStopsWhileProbeHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		probing := make(chan struct{})
		b := New(Options{
			Picker:        &random{},
			ProbeInterval: 100 * time.Millisecond,
			Probe: func(ctx context.Context, e *Endpoint) error {
				close(probing)
				<-ctx.Done()
				return ctx.Err()
			},
		})
		b.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{{ID: "a", URL: &url.URL{Scheme: "http", Host: "a:80"}}}})
		a, _ := b.Lookup("a")
		b.Eject(a, errRefused)

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			b.Run(ctx)
			close(done)
		}()
		<-probing
		cancel()
		<-done // synctest.Test also fails if the probe goroutine outlived Run

		// A probe cut short by shutdown says nothing about the endpoint: it
		// must neither readmit it nor lengthen its backoff.
		b.mu.Lock()
		streak, stillProbing := a.ejections, a.probing
		b.mu.Unlock()
		if !a.Ejected() || streak != 1 || stillProbing {
			t.Errorf("after shutdown mid-probe: ejected %v, streak %d, probing %v; want true, 1, false", a.Ejected(), streak, stillProbing)
		}
	})
}

func TestDialAddress(t *testing.T) {
	tests := []struct {
		raw     string
		want    string
		wantErr bool
	}{
		{raw: "http://10.0.0.1:8080/mcp", want: "10.0.0.1:8080"},
		{raw: "http://backend", want: "backend:80"},
		{raw: "https://backend/mcp", want: "backend:443"},
		{raw: "http://[fd00::7]:9000", want: "[fd00::7]:9000"},
		{raw: "https://[fd00::7]", want: "[fd00::7]:443"},
		{raw: "ftp://backend", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			u, err := url.Parse(tt.raw)
			if err != nil {
				t.Fatal(err)
			}
			got, err := dialAddress(u)
			if (err != nil) != tt.wantErr {
				t.Fatalf("dialAddress(%s) error = %v, want error %v", tt.raw, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("dialAddress(%s) = %q, want %q", tt.raw, got, tt.want)
			}
		})
	}
	if _, err := dialAddress(nil); err == nil {
		t.Error("dialAddress(nil) succeeded, want an error")
	}
}

func TestDialProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	listening := &Endpoint{URL: &url.URL{Scheme: "http", Host: ln.Addr().String()}}
	if err := dialProbe(t.Context(), listening); err != nil {
		t.Errorf("probe of a listening port: %v", err)
	}

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	refused := &Endpoint{URL: &url.URL{Scheme: "http", Host: closedAddr}}
	if err := dialProbe(t.Context(), refused); err == nil {
		t.Error("probe of a closed port succeeded, want an error")
	}
}
