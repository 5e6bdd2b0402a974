package podcost

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// watchBoth samples two writers every 100 ms (of fake time) until stop, and
// reports any instant at which both believed they held the Lease.
func watchBoth(t *testing.T, a, b *Writer) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if a.Holding() && b.Holding() {
				t.Errorf("at %s both %s and %s hold the lease", time.Now().Format(time.TimeOnly), a.Identity(), b.Identity())
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// Two replicas start together: exactly one holds the Lease and writes;
// when it stops it releases the Lease, and the other takes over within a
// renew period and writes on.
func TestLeaseOneHolderThenHandover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI("p0", "p1")
		c := newCounts(map[string]int64{"mcp/p0": 1, "mcp/p1": 2})
		a, stopA := start(t, Options{API: api.caller("a"), Identity: "a", Sessions: c.get})
		b, stopB := start(t, Options{API: api.caller("b"), Identity: "b", Sessions: c.get})
		stopA, stopB = sync.OnceFunc(stopA), sync.OnceFunc(stopB)
		defer stopA()
		defer stopB()
		stopWatch := watchBoth(t, a, b)
		defer stopWatch()

		time.Sleep(DefaultInterval + time.Second)
		holder, other, stopHolder := a, b, stopA
		if b.Holding() {
			holder, other, stopHolder = b, a, stopB
		}
		if !holder.Holding() || other.Holding() || api.holder() != holder.Identity() {
			t.Fatalf("holding: a %v, b %v; the Lease names %q", a.Holding(), b.Holding(), api.holder())
		}
		if d := cmp.Diff(api.annotations(), map[string]string{"p0": "1", "p1": "2"}); d != "" {
			t.Errorf("annotations (-got +want):\n%s", d)
		}
		for _, p := range api.patchLog() {
			if p.by != holder.Identity() {
				t.Errorf("%s patched %s without the lease", p.by, p.pod)
			}
		}

		stopHolder()
		if h := api.holder(); h != "" {
			t.Errorf("after the holder stopped the Lease names %q, want it released", h)
		}
		handedOver := time.Now()
		time.Sleep(DefaultRenewPeriod)
		if !other.Holding() || api.holder() != other.Identity() {
			t.Fatalf("a renew period after the release: %s holds %v, the Lease names %q", other.Identity(), other.Holding(), api.holder())
		}
		c.set("mcp/p0", 7)
		time.Sleep(DefaultInterval)
		if got := api.annotations()["p0"]; got != "7" {
			t.Errorf("p0 %q after the handover, want 7", got)
		}
		for _, p := range api.patchLog() {
			if p.at.After(handedOver) && p.by != other.Identity() {
				t.Errorf("%s patched %s after the handover", p.by, p.pod)
			}
		}
	})
}

// A holder cut off from the API server stops writing two thirds of the
// lease duration after its last renewal; the other replica takes over a
// whole duration after it saw that renewal, never while the first still
// believes it holds.
func TestLeaseExpiryTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI("p0")
		c := newCounts(map[string]int64{"mcp/p0": 1})
		ca := api.caller("a")
		a, stopA := start(t, Options{API: ca, Identity: "a", Sessions: c.get})
		defer stopA()
		time.Sleep(time.Second)
		b, stopB := start(t, Options{API: api.caller("b"), Identity: "b", Sessions: c.get})
		stopB = sync.OnceFunc(stopB)
		defer stopB()
		stopWatch := watchBoth(t, a, b)
		defer stopWatch()
		time.Sleep(DefaultInterval + time.Second)
		if !a.Holding() || b.Holding() {
			t.Fatalf("a holds %v, b holds %v; want a", a.Holding(), b.Holding())
		}

		ca.cut.Store(true)
		cut := time.Now()
		synctest.Wait()
		// a renews every 5 s: its last renewal was at most a renew period
		// before the cut, and its belief ends 10 s after that one.
		time.Sleep(renewDeadline(DefaultLeaseDuration))
		if a.Holding() {
			t.Errorf("a still believes it holds %s after it was cut off", time.Since(cut))
		}
		var tookOver time.Duration
		for range 40 {
			time.Sleep(500 * time.Millisecond)
			if b.Holding() {
				tookOver = time.Since(cut)
				break
			}
		}
		// b saw a's last renewal at most a renew period after it was made,
		// and then waits the duration; its rounds come every renew period.
		if tookOver < DefaultLeaseDuration-DefaultRenewPeriod || tookOver > DefaultLeaseDuration+2*DefaultRenewPeriod {
			t.Errorf("b took over %s after the cut, want about the lease duration (%s)", tookOver, DefaultLeaseDuration)
		}
		c.set("mcp/p0", 3)
		time.Sleep(DefaultInterval + time.Second)
		if got := api.annotations()["p0"]; got != "3" {
			t.Errorf("p0 %q, want 3 written by b", got)
		}

		// a reconnects, finds b holding and stays a standby.
		ca.cut.Store(false)
		time.Sleep(2 * DefaultRenewPeriod)
		if a.Holding() || !b.Holding() || api.holder() != "b" {
			t.Errorf("after a is back: a holds %v, b %v, the Lease names %q", a.Holding(), b.Holding(), api.holder())
		}

		// The count goes back to what a wrote before the cut, and b stops
		// before writing it: a, holding again, must not trust what it
		// wrote in its earlier holding (b wrote 3 since).
		c.set("mcp/p0", 1)
		stopB()
		time.Sleep(DefaultRenewPeriod + DefaultInterval + time.Second)
		if !a.Holding() {
			t.Fatal("a does not hold the released Lease")
		}
		if got := api.annotations()["p0"]; got != "1" {
			t.Errorf("p0 %q after a took the Lease back, want 1", got)
		}
	})
}

// Of two replicas that both find the Lease expired, only the one whose
// update carries the version it read wins: here a renews between b's read
// and b's write, and b's write is refused.
func TestLeaseUpdateIsConditional(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI()
		newLease := func(who string, c *caller) *lease {
			return &lease{api: c, namespace: "mcp", name: LeaseName(everything), identity: who,
				duration: DefaultLeaseDuration, renewPeriod: DefaultRenewPeriod, log: slog.New(slog.DiscardHandler)}
		}
		ca, cb := api.caller("a"), api.caller("b")
		la, lb := newLease("a", ca), newLease("b", cb)
		ctx := context.Background()
		la.tryAcquireOrRenew(ctx)
		lb.tryAcquireOrRenew(ctx)
		if held, _ := la.held(time.Now()); !held || api.holder() != "a" {
			t.Fatalf("a does not hold the new Lease (it names %q)", api.holder())
		}
		time.Sleep(DefaultLeaseDuration + time.Second) // a renews nothing: expired for b

		cb.afterGet = func() { la.tryAcquireOrRenew(ctx) }
		lb.tryAcquireOrRenew(ctx)
		cb.afterGet = nil
		heldA, _ := la.held(time.Now())
		heldB, _ := lb.held(time.Now())
		if !heldA || heldB || api.holder() != "a" {
			t.Errorf("a holds %v, b holds %v, the Lease names %q; want a alone", heldA, heldB, api.holder())
		}

		// b first sees a's renewal now: it waits a whole duration from
		// here, and then takes the expired Lease, counting a transition.
		lb.tryAcquireOrRenew(ctx)
		time.Sleep(DefaultLeaseDuration - time.Second)
		lb.tryAcquireOrRenew(ctx)
		if held, _ := lb.held(time.Now()); held {
			t.Errorf("b took the Lease %s after it saw it renewed", DefaultLeaseDuration-time.Second)
		}
		time.Sleep(2 * time.Second)
		lb.tryAcquireOrRenew(ctx)
		if held, _ := lb.held(time.Now()); !held || api.holder() != "b" {
			t.Errorf("b does not hold the expired Lease (it names %q)", api.holder())
		}
		api.mu.Lock()
		spec, _ := json.Marshal(api.lease["spec"])
		api.mu.Unlock()
		if !strings.Contains(string(spec), `"leaseTransitions":1`) || !strings.Contains(string(spec), `"leaseDurationSeconds":15`) {
			t.Errorf("Lease spec %s: want one transition and a duration of 15 s", spec)
		}
	})
}

// A replica the API server refuses never holds, and says why once.
func TestLeaseForbidden(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI("p0")
		c := api.caller("a")
		c.forbidden = true
		var logs logBuffer
		w, stop := start(t, Options{API: c, Identity: "a", Sessions: newCounts(map[string]int64{"mcp/p0": 1}).get, Logger: logs.logger()})
		time.Sleep(10 * DefaultRenewPeriod)
		if w.Holding() {
			t.Error("holds the lease it may not read")
		}
		stop()
		if n := c.calls.Load(); n < 10 {
			t.Errorf("%d calls in 10 renew periods: want a try each", n)
		}
		l := logs.lines("forbids the Lease")
		if len(l) != 1 || !strings.Contains(l[0], "grant get, create and update on leases (coordination.k8s.io) in namespace mcp") {
			t.Errorf("logged %q, want the RBAC hint once", l)
		}
		if got := api.annotations()["p0"]; got != "" {
			t.Errorf("p0 annotated %q without the lease", got)
		}
	})
}

// Bad timings are refused: the holder must renew well within its belief.
func TestNewChecksTimings(t *testing.T) {
	base := Options{API: newFakeAPI().caller("a"), Service: everything, Sessions: func() []PodSessions { return nil }}
	for _, o := range []func(*Options){
		func(o *Options) { o.RenewPeriod = 10 * time.Second },
		func(o *Options) { o.LeaseDuration = time.Second },
		func(o *Options) { o.Interval = -time.Second },
		func(o *Options) { o.Sessions = nil },
	} {
		opts := base
		o(&opts)
		if _, err := New(opts); err == nil {
			t.Errorf("New(%+v) accepted", opts)
		}
	}
	if _, err := New(base); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
