package balancer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
)

var errDial = errors.New("dial tcp: connection refused")

// ep describes one endpoint of a test snapshot; host defaults to the ID.
type ep struct {
	id    string
	state discovery.State
	host  string
}

func snapshot(eps ...ep) discovery.Snapshot {
	var s discovery.Snapshot
	for _, e := range eps {
		host := e.host
		if host == "" {
			host = e.id
		}
		u := &url.URL{Scheme: "http", Host: host + ":8080"}
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{ID: e.id, URL: u, State: e.state})
	}
	return s
}

func ready(ids ...string) []ep {
	var eps []ep
	for _, id := range ids {
		eps = append(eps, ep{id: id})
	}
	return eps
}

func newBalancer(t testing.TB, picker string, rnd func(int) int) *balancer.Balancer {
	t.Helper()
	return balancer.New(balancer.Options{Picker: mustPicker(t, picker, rnd)})
}

func lookup(t testing.TB, b *balancer.Balancer, id string) *balancer.Endpoint {
	t.Helper()
	e, ok := b.Lookup(id)
	if !ok {
		t.Fatalf("Lookup(%q) found nothing", id)
	}
	return e
}

func ids(eps []*balancer.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.ID)
	}
	return out
}

// pickedIDs picks n times and returns the sorted set of IDs picked, or the
// first error.
func pickedIDs(b *balancer.Balancer, exclude *balancer.Endpoint, n int) ([]string, error) {
	seen := make(map[string]bool)
	for range n {
		e, err := b.Pick(exclude)
		if err != nil {
			return nil, err
		}
		seen[e.ID] = true
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

func TestNotReadyBeforeFirstUpdate(t *testing.T) {
	b := newBalancer(t, "p2c", nil)
	if b.Ready() {
		t.Error("Ready() = true before any Update")
	}
	if _, err := b.Pick(nil); !errors.Is(err, balancer.ErrNoEndpoints) {
		t.Errorf("Pick before Update: err = %v, want ErrNoEndpoints", err)
	}
	if eps := b.Endpoints(); len(eps) != 0 {
		t.Errorf("Endpoints() = %v, want none", eps)
	}

	b.Update(discovery.Snapshot{})
	if !b.Ready() {
		t.Error("Ready() = false after an Update with an empty set; discovery has spoken")
	}
	if _, err := b.Pick(nil); !errors.Is(err, balancer.ErrNoEndpoints) {
		t.Errorf("Pick from an empty set: err = %v, want ErrNoEndpoints", err)
	}
}

func TestUpdateCarriesCountersByID(t *testing.T) {
	b := newBalancer(t, "p2c", nil)
	b.Update(snapshot(ready("b", "a", "c")...)) // unsorted on purpose

	a := lookup(t, b, "a")
	a.Begin()
	a.AddSessions(2)
	c := lookup(t, b, "c")
	c.AddSessions(5)

	// a turns Fenced, b goes away, c stays, d arrives.
	b.Update(snapshot(ep{id: "a", state: discovery.Fenced}, ep{id: "c"}, ep{id: "d"}))

	if diff := cmp.Diff(ids(b.Endpoints()), []string{"a", "c", "d"}); diff != "" {
		t.Errorf("Endpoints() IDs (-got +want):\n%s", diff)
	}
	if _, ok := b.Lookup("b"); ok {
		t.Error("Lookup(b) found an endpoint that left the set")
	}

	type view struct {
		Same               bool
		State              discovery.State
		Inflight, Sessions int64
	}
	got := map[string]view{}
	for id, before := range map[string]*balancer.Endpoint{"a": a, "c": c} {
		now := lookup(t, b, id)
		got[id] = view{now == before, now.State(), now.Inflight(), now.Sessions()}
	}
	want := map[string]view{
		"a": {Same: true, State: discovery.Fenced, Inflight: 1, Sessions: 2},
		"c": {Same: true, State: discovery.Ready, Inflight: 0, Sessions: 5},
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("endpoints kept across Update (-got +want):\n%s", diff)
	}

	// A request begun before the rebuild still ends on the same counter.
	a.End()
	if n := lookup(t, b, "a").Inflight(); n != 0 {
		t.Errorf("a.Inflight() = %d after End, want 0", n)
	}
}

func TestUpdateReplacesEndpointWhoseURLChanged(t *testing.T) {
	b := newBalancer(t, "p2c", nil)
	b.Update(snapshot(ep{id: "a", host: "10.0.0.1"}))
	old := lookup(t, b, "a")
	old.AddSessions(3)

	b.Update(snapshot(ep{id: "a", host: "10.0.0.2"}))
	now := lookup(t, b, "a")
	if now == old {
		t.Fatal("same *Endpoint kept although its URL changed")
	}
	if got, want := now.String(), "http://10.0.0.2:8080"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if now.Sessions() != 0 {
		t.Errorf("Sessions() = %d on the new target, want 0", now.Sessions())
	}
}

func TestFencedIsLookedUpButNeverPicked(t *testing.T) {
	for _, name := range balancer.PickerNames {
		t.Run(name, func(t *testing.T) {
			b := newBalancer(t, name, seededRand(5))
			b.Update(snapshot(ep{id: "a", state: discovery.Fenced}, ep{id: "b"}, ep{id: "c", state: discovery.Fenced}))
			// Fenced endpoints are idle, so load-aware pickers would love them.
			lookup(t, b, "b").AddSessions(100)

			got, err := pickedIDs(b, nil, 300)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, []string{"b"}); diff != "" {
				t.Errorf("picked IDs (-got +want):\n%s", diff)
			}
			if s := lookup(t, b, "a").State(); s != discovery.Fenced {
				t.Errorf("a.State() = %v, want fenced", s)
			}

			b.Update(snapshot(ep{id: "a", state: discovery.Fenced}))
			if _, err := b.Pick(nil); !errors.Is(err, balancer.ErrNoEndpoints) {
				t.Errorf("Pick with only fenced endpoints: err = %v, want ErrNoEndpoints", err)
			}
		})
	}
}

func TestPickExclude(t *testing.T) {
	stranger := &balancer.Endpoint{ID: "a"} // same ID, but not this balancer's endpoint
	tests := []struct {
		name    string
		set     []ep
		eject   []string
		exclude string // "" = nil, "stranger" = an endpoint from elsewhere
		want    []string
		wantErr error
	}{
		{name: "no exclusion", set: ready("a", "b", "c"), want: []string{"a", "b", "c"}},
		{name: "exclude first", set: ready("a", "b", "c"), exclude: "a", want: []string{"b", "c"}},
		{name: "exclude middle", set: ready("a", "b", "c"), exclude: "b", want: []string{"a", "c"}},
		{name: "exclude last", set: ready("a", "b", "c"), exclude: "c", want: []string{"a", "b"}},
		{name: "exclude one of two", set: ready("a", "b"), exclude: "b", want: []string{"a"}},
		{name: "only eligible excluded", set: ready("a"), exclude: "a", wantErr: balancer.ErrNoEndpoints},
		{
			name: "only eligible excluded, others fenced",
			set:  []ep{{id: "a"}, {id: "b", state: discovery.Fenced}}, exclude: "a",
			wantErr: balancer.ErrNoEndpoints,
		},
		{
			name: "exclude a fenced endpoint",
			set:  []ep{{id: "a"}, {id: "b"}, {id: "c", state: discovery.Fenced}}, exclude: "c",
			want: []string{"a", "b"},
		},
		{name: "exclude an ejected endpoint", set: ready("a", "b", "c"), eject: []string{"b"}, exclude: "b", want: []string{"a", "c"}},
		{name: "exclude among the non-ejected", set: ready("a", "b", "c"), eject: []string{"b"}, exclude: "a", want: []string{"c"}},
		{name: "all ejected", set: ready("a", "b"), eject: []string{"a", "b"}, wantErr: balancer.ErrNoEndpoints},
		{name: "exclude a stranger", set: ready("a", "b"), exclude: "stranger", want: []string{"a", "b"}},
	}
	for _, name := range balancer.PickerNames {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				b := newBalancer(t, name, seededRand(9))
				b.Update(snapshot(tt.set...))
				for _, id := range tt.eject {
					b.Eject(lookup(t, b, id), errDial)
				}
				var exclude *balancer.Endpoint
				switch tt.exclude {
				case "":
				case "stranger":
					exclude = stranger
				default:
					exclude = lookup(t, b, tt.exclude)
				}

				got, err := pickedIDs(b, exclude, 300)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Pick: err = %v, want %v", err, tt.wantErr)
				}
				if diff := cmp.Diff(got, tt.want); diff != "" {
					t.Errorf("picked IDs (-got +want):\n%s", diff)
				}
			})
		}
	}
}

func TestPickExcludeKeepsPolicy(t *testing.T) {
	// Exclusion narrows the candidates; the picker still applies its policy
	// to the rest: least-loaded must take the lightest remaining endpoint.
	b := newBalancer(t, "least-loaded", seededRand(2))
	b.Update(snapshot(ready("a", "b", "c", "d")...))
	for id, load := range map[string]int64{"a": 1, "b": 4, "c": 2, "d": 3} {
		lookup(t, b, id).AddSessions(load)
	}
	got, err := pickedIDs(b, lookup(t, b, "a"), 50)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, []string{"c"}); diff != "" {
		t.Errorf("picked IDs excluding the lightest (-got +want):\n%s", diff)
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	for _, name := range balancer.PickerNames {
		t.Run(name, func(t *testing.T) {
			b := newBalancer(t, name, nil)
			b.Update(snapshot(ready("a", "b", "c", "d", "e")...))
			exclude := lookup(t, b, "c")
			allocs := testing.AllocsPerRun(1000, func() {
				e, _ := b.Pick(nil)
				e.Begin()
				e.End()
				_, _ = b.Pick(exclude)
			})
			if allocs != 0 {
				t.Errorf("Pick allocates %v times per run, want 0", allocs)
			}
		})
	}
}

func TestEjectedStaysEjectedAcrossUpdate(t *testing.T) {
	b := newBalancer(t, "round-robin", nil)
	b.Update(snapshot(ready("a", "b")...))
	b.Eject(lookup(t, b, "a"), errDial)
	b.Update(snapshot(ready("a", "b", "c")...))

	if !lookup(t, b, "a").Ejected() {
		t.Error("a is no longer ejected after an Update that kept it")
	}
	got, err := pickedIDs(b, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, []string{"b", "c"}); diff != "" {
		t.Errorf("picked IDs (-got +want):\n%s", diff)
	}
}

// TestConcurrentPicksDuringUpdates is for -race: pickers, counters and
// lookups run while another goroutine rebuilds the set and ejects.
func TestConcurrentPicksDuringUpdates(t *testing.T) {
	for _, name := range balancer.PickerNames {
		t.Run(name, func(t *testing.T) {
			b := newBalancer(t, name, nil)
			sets := []discovery.Snapshot{
				snapshot(ep{id: "a"}, ep{id: "b"}, ep{id: "c"}, ep{id: "never", state: discovery.Fenced}),
				snapshot(ep{id: "a", state: discovery.Fenced}, ep{id: "b"}, ep{id: "never", state: discovery.Fenced}),
				snapshot(ep{id: "b"}, ep{id: "c"}, ep{id: "d"}, ep{id: "never", state: discovery.Fenced}),
				snapshot(ep{id: "a"}, ep{id: "never", state: discovery.Fenced}),
			}
			b.Update(sets[0])

			ctx, cancel := context.WithCancel(t.Context())
			var updater sync.WaitGroup
			updater.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					b.Update(sets[i%len(sets)])
					if e, ok := b.Lookup("b"); ok && i%3 == 0 {
						b.Eject(e, errDial)
					}
				}
			})

			// Each goroutine runs until it has made 1000 successful picks:
			// some generations have no eligible endpoint (b ejected, a fenced),
			// and a goroutine may run entirely inside one of them, but the
			// updater keeps cycling back to sets with eligible endpoints.
			var pickers sync.WaitGroup
			for g := range 8 {
				pickers.Go(func() {
					var prev *balancer.Endpoint
					for picked := 0; picked < 1000; {
						e, err := b.Pick(prev)
						if err != nil {
							runtime.Gosched() // let the updater move on
							continue
						}
						if e == prev {
							t.Errorf("goroutine %d: Pick returned the excluded endpoint %s", g, e)
						}
						if e.ID == "never" {
							t.Errorf("goroutine %d: Pick returned a fenced endpoint", g)
						}
						e.Begin()
						if picked%4 == 0 {
							e.AddSessions(1)
							e.AddSessions(-1)
						}
						_, _ = b.Lookup(e.ID)
						_ = b.Endpoints()
						e.End()
						prev = e
						picked++
					}
				})
			}
			pickers.Wait()
			cancel()
			updater.Wait()

			for _, e := range b.Endpoints() {
				if e.Inflight() != 0 || e.Sessions() != 0 {
					t.Errorf("%s: inflight %d, sessions %d after all requests ended, want 0, 0", e.ID, e.Inflight(), e.Sessions())
				}
			}
		})
	}
}

// TestRunRestsWithNothingEjected: Run does nothing, not even a look at the
// clock, while no endpoint is ejected; an ejection wakes it, and once the
// endpoint is readmitted it rests again.
func TestRunRestsWithNothingEjected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clockReads atomic.Int64
		b := balancer.New(balancer.Options{
			Picker:        mustPicker(t, "p2c", nil),
			ProbeInterval: 100 * time.Millisecond,
			EjectBase:     time.Second,
			Now: func() time.Time {
				clockReads.Add(1) // every probe round reads it
				return time.Now()
			},
			Probe: func(context.Context, *balancer.Endpoint) error { return nil },
		})
		b.Update(snapshot(ready("a", "b")...))
		a := lookup(t, b, "a")

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			b.Run(ctx)
			close(done)
		}()
		defer func() { // also after a t.Fatal: the bubble ends with Run
			cancel()
			<-done
		}()
		resting := func(when string) {
			t.Helper()
			before := clockReads.Load()
			time.Sleep(10 * time.Second)
			synctest.Wait()
			if n := clockReads.Load() - before; n != 0 {
				t.Errorf("%s: Run read the clock %d times in 10 s with nothing ejected; want it resting", when, n)
			}
		}
		resting("from the start")

		b.Eject(a, errDial)
		time.Sleep(1500 * time.Millisecond) // the backoff, then a probe round
		synctest.Wait()
		if a.Ejected() {
			t.Fatal("a still ejected: Run did not wake for the ejection")
		}
		resting("after the readmission")
	})
}

// TestRunProbesAndReadmits drives the real Run loop on synctest's fake clock,
// so the test depends on no real timing.
func TestRunProbesAndReadmits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var healthy atomic.Bool
		var probes atomic.Int64
		b := balancer.New(balancer.Options{
			Picker:        mustPicker(t, "p2c", nil),
			ProbeInterval: 100 * time.Millisecond,
			EjectBase:     time.Second,
			Probe: func(ctx context.Context, e *balancer.Endpoint) error {
				probes.Add(1)
				if healthy.Load() {
					return nil
				}
				return fmt.Errorf("probe %s: %w", e, errDial)
			},
		})
		b.Update(snapshot(ready("a", "b")...))
		a := lookup(t, b, "a")
		b.Eject(a, errDial)

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			b.Run(ctx)
			close(done)
		}()

		// Probe at 1s fails; the backoff doubles to 2s, so nothing until 3s.
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		if got := probes.Load(); got != 1 {
			t.Errorf("probes by 2.5s = %d, want 1", got)
		}
		if !a.Ejected() {
			t.Fatal("a readmitted although its probe failed")
		}

		healthy.Store(true)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := probes.Load(); got != 2 {
			t.Errorf("probes by 3.5s = %d, want 2", got)
		}
		if a.Ejected() {
			t.Fatal("a still ejected after a successful probe")
		}
		if got, err := pickedIDs(b, nil, 50); err != nil || !slices.Contains(got, "a") {
			t.Errorf("picks after readmission = %v, %v; want a among them", got, err)
		}

		cancel()
		<-done
	})
}

// BenchmarkPick measures Balancer.Pick, the real hot path (generation load,
// optional exclusion, picker), with uneven loads so that load-aware pickers
// compare for real. Target: <= 50 ns/op and 0 allocs/op.
//
//	go test -run x -bench Pick -benchmem ./balancer/
func BenchmarkPick(b *testing.B) {
	for _, name := range balancer.PickerNames {
		for _, n := range []int{3, 10} {
			bal := newBalancer(b, name, nil)
			var eps []ep
			for i := range n {
				eps = append(eps, ep{id: fmt.Sprintf("ep-%02d", i)})
			}
			bal.Update(snapshot(eps...))
			all := bal.Endpoints()
			for i, e := range all {
				e.AddSessions(int64(i * 7 % 5))
			}
			exclude := all[n/2]

			b.Run(fmt.Sprintf("%s/n=%d/serial", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bal.Pick(nil); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/n=%d/exclude", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bal.Pick(exclude); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/n=%d/parallel", name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := bal.Pick(nil); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
			// What a request really does: pick, count it, finish. The counter
			// writes contend with other goroutines' load reads.
			b.Run(fmt.Sprintf("%s/n=%d/parallel-begin-end", name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						e, err := bal.Pick(nil)
						if err != nil {
							b.Error(err)
							return
						}
						e.Begin()
						e.End()
					}
				})
			})
		}
	}
}
