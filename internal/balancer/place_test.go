package balancer_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/balancer"
)

// loads returns each endpoint's Load by ID.
func loads(b *balancer.Balancer) map[string]int64 {
	out := map[string]int64{}
	for _, e := range b.Endpoints() {
		out[e.ID] = e.Load()
	}
	return out
}

// placeBurst makes n placements at once, each from its own goroutine,
// and returns them unreleased, as the moves of a burst hold them while
// their replayed initializes are in flight.
func placeBurst(t *testing.T, b *balancer.Balancer, n int, exclude, lostBy *balancer.Endpoint) []balancer.Placement {
	t.Helper()
	placed := make([]balancer.Placement, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			placed[i], _, errs[i] = b.Place(exclude, lostBy, make([]balancer.Candidate, 0, 3))
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return placed
}

func countPlaced(placed []balancer.Placement) map[string]int {
	out := map[string]int{}
	for _, pl := range placed {
		out[pl.Endpoint.ID]++
	}
	return out
}

// A killed endpoint's sessions are all placed at once, over the two that
// are left with equal loads: every placement sees those made before it,
// so they split evenly. (Picks read the same loads throughout such a
// burst, as no session count changes until a move is recorded: p2c over
// two endpoints then chose the same one for every move.)
func TestPlaceConcurrentBurstSpreads(t *testing.T) {
	for _, picker := range []string{"p2c", "least-loaded"} {
		t.Run(picker, func(t *testing.T) {
			for round := range 200 {
				b := newBalancer(t, picker, nil)
				b.Update(snapshot(ready("a", "b", "c")...))
				for _, id := range []string{"a", "b", "c"} {
					lookup(t, b, id).AddSessions(10)
				}
				b.Eject(lookup(t, b, "c"), errDial)

				placed := placeBurst(t, b, 10, nil, nil)
				if diff := cmp.Diff(countPlaced(placed), map[string]int{"a": 5, "b": 5}); diff != "" {
					t.Fatalf("round %d: placements (-got +want):\n%s", round, diff)
				}
				// What the moves' recorded Swaps and then releases do.
				for _, pl := range placed {
					lookup(t, b, "c").AddSessions(-1)
					pl.Endpoint.AddSessions(1)
					pl.Release()
				}
				if diff := cmp.Diff(loads(b), map[string]int64{"a": 15, "b": 15, "c": 0}); diff != "" {
					t.Fatalf("round %d: loads once the moves are counted (-got +want):\n%s", round, diff)
				}
			}
		})
	}
}

// A restarted endpoint answers 404 for its sessions, and they are all
// placed at once: each one's loss is taken off its count, and it is one
// of p2c's choices, so it takes them all back. (Before, its count held
// them while they were placed: it took a third of them at best.)
func TestPlaceLostSessionsGoBack(t *testing.T) {
	for _, picker := range []string{"p2c", "least-loaded"} {
		t.Run(picker, func(t *testing.T) {
			for round := range 200 {
				b := newBalancer(t, picker, nil)
				b.Update(snapshot(ready("a", "b", "c")...))
				for _, id := range []string{"a", "b", "c"} {
					lookup(t, b, id).AddSessions(10)
				}
				c := lookup(t, b, "c")

				placed := placeBurst(t, b, 10, nil, c)
				if diff := cmp.Diff(countPlaced(placed), map[string]int{"c": 10}); diff != "" {
					t.Fatalf("round %d: placements (-got +want):\n%s", round, diff)
				}
				for _, pl := range placed {
					pl.Release() // a move from c to c leaves the count as it is
				}
				if diff := cmp.Diff(loads(b), map[string]int64{"a": 10, "b": 10, "c": 10}); diff != "" {
					t.Fatalf("round %d: loads once the moves are counted (-got +want):\n%s", round, diff)
				}
			}
		})
	}
}

// lowestPicker takes the least loaded candidate, the first on a tie, and
// runs during its first pick, after reading the loads, whatever
// meanwhile is set to: another placement, which then happens between
// this pick's reading of the loads and its reservation.
type lowestPicker struct{ meanwhile func() }

func (p *lowestPicker) Pick(cands []*balancer.Endpoint) *balancer.Endpoint {
	best := cands[0]
	for _, e := range cands[1:] {
		if e.Load() < best.Load() {
			best = e
		}
	}
	if f := p.meanwhile; f != nil {
		p.meanwhile = nil
		f()
	}
	return best
}

// A placement reserved while another one picks makes that one pick again:
// without it both would go to the endpoint both saw least loaded.
func TestPlacePicksAgainAfterAConcurrentReservation(t *testing.T) {
	picker := &lowestPicker{}
	b := balancer.New(balancer.Options{Picker: picker})
	b.Update(snapshot(ready("a", "b")...))
	var inner balancer.Placement
	picker.meanwhile = func() {
		var err error
		if inner, _, err = b.Place(nil, nil, nil); err != nil {
			t.Error(err)
		}
	}
	outer, _, err := b.Place(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if inner.Endpoint == nil || inner.Endpoint.ID != "a" || outer.Endpoint.ID != "b" {
		t.Errorf("placed the inner placement on %v and the outer one on %v, want a and b", inner.Endpoint, outer.Endpoint)
	}
	if diff := cmp.Diff(loads(b), map[string]int64{"a": 1, "b": 1}); diff != "" {
		t.Errorf("loads while both are held (-got +want):\n%s", diff)
	}
	inner.Release()
	outer.Release()
	outer.Release() // again: nothing
	if diff := cmp.Diff(loads(b), map[string]int64{"a": 0, "b": 0}); diff != "" {
		t.Errorf("loads once released (-got +want):\n%s", diff)
	}
}

// The endpoint that lost the session is weighed beside p2c's two samples
// of the others, never in place of one, and exclude is never chosen nor
// weighed, with any number of endpoints.
func TestPlaceLostByChoices(t *testing.T) {
	for _, n := range []int{2, 3, 4, 6} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := newBalancer(t, "p2c", seededRand(uint64(n)))
			var eps []ep
			for i := range n {
				eps = append(eps, ep{id: string(rune('a' + i))})
			}
			b.Update(snapshot(eps...))
			all := b.Endpoints()
			for i, e := range all {
				e.AddSessions(int64(10 + i))
			}
			for _, exclude := range []*balancer.Endpoint{nil, all[1], all[n-1]} {
				for _, lostBy := range all {
					for range 20 {
						pl, weighed, err := b.Place(exclude, lostBy, nil)
						if lostBy == exclude {
							if err != nil && n > 1 {
								t.Fatal(err)
							}
							pl.Release()
							continue
						}
						if err != nil {
							if n == 2 && exclude != nil {
								continue // lostBy alone is left
							}
							t.Fatal(err)
						}
						others := n - 1
						if exclude != nil {
							others--
						}
						want := 1 + min(others, 2)
						if others == 0 {
							want = 1
						}
						if len(weighed) != want || weighed[0].Endpoint != lostBy {
							t.Fatalf("exclude %v, lost by %s: weighed %v, want %s and %d others", exclude, lostBy.ID, weighed, lostBy.ID, want-1)
						}
						seen := map[*balancer.Endpoint]bool{}
						for _, c := range weighed {
							if c.Endpoint == exclude || seen[c.Endpoint] {
								t.Fatalf("exclude %v, lost by %s: weighed %v", exclude, lostBy.ID, weighed)
							}
							seen[c.Endpoint] = true
							if c.Load < weighed[0].Load && pl.Endpoint == lostBy {
								t.Fatalf("chose %s over the less loaded %s", lostBy.ID, c.Endpoint.ID)
							}
						}
						pl.Release()
					}
				}
			}
			for _, e := range all {
				if e.Placing() != 0 || e.LostInFlight() != 0 {
					t.Errorf("%s: %d placements and %d losses left after every release", e.ID, e.Placing(), e.LostInFlight())
				}
			}
		})
	}
}

// A failed placement holds nothing: the loss mark it made is undone.
func TestPlaceWithoutEndpointsHoldsNothing(t *testing.T) {
	b := newBalancer(t, "p2c", nil)
	b.Update(snapshot(ready("a")...))
	a := lookup(t, b, "a")
	a.AddSessions(3)
	pl, _, err := b.Place(a, a, nil)
	if err == nil || pl.Endpoint != nil {
		t.Fatalf("Place excluding the only endpoint = %v, %v; want ErrNoEndpoints", pl.Endpoint, err)
	}
	if a.Load() != 3 || a.LostInFlight() != 0 || a.Placing() != 0 {
		t.Errorf("after a failed placement: load %d, lost %d, placing %d; want 3, 0, 0", a.Load(), a.LostInFlight(), a.Placing())
	}
}

// A loss mark whose session another replica moved first (the fleet count
// no longer holds it) leaves the load at zero, not below.
func TestLoadNeverCountsLostSessionsBelowZero(t *testing.T) {
	b := newBalancer(t, "p2c", nil)
	b.Update(snapshot(ready("a", "b")...))
	a := lookup(t, b, "a")
	a.AddSessions(1)
	pl, _, err := b.Place(nil, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.AddSessions(-1) // the re-base on the fleet count
	if want := pl.Endpoint.Placing(); a.Load() != want {
		t.Errorf("load %d, want %d", a.Load(), want)
	}
	pl.Release()
}

func TestPlaceDoesNotAllocate(t *testing.T) {
	for _, name := range balancer.PickerNames {
		t.Run(name, func(t *testing.T) {
			b := newBalancer(t, name, nil)
			b.Update(snapshot(ready("a", "b", "c", "d", "e")...))
			exclude, lostBy := lookup(t, b, "c"), lookup(t, b, "d")
			weighed := make([]balancer.Candidate, 0, 5)
			allocs := testing.AllocsPerRun(1000, func() {
				pl, w, _ := b.Place(nil, nil, weighed[:0])
				pl.Release()
				pl, w, _ = b.Place(exclude, lostBy, w[:0])
				pl.Release()
				weighed = w
			})
			if allocs != 0 {
				t.Errorf("Place allocates %v times per run, want 0", allocs)
			}
		})
	}
}

// BenchmarkPlace measures Place and Release: the placement of a session,
// new or moved. Serial, and with every goroutine placing at once, where
// the placements' counter is contended and placements pick again.
//
//	go test -run x -bench Place -benchmem ./internal/balancer/
func BenchmarkPlace(b *testing.B) {
	for _, name := range []string{"p2c", "least-loaded"} {
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
			lostBy := all[n/2]
			b.Run(fmt.Sprintf("%s/n=%d/serial", name, n), func(b *testing.B) {
				b.ReportAllocs()
				weighed := make([]balancer.Candidate, 0, n)
				for b.Loop() {
					pl, w, err := bal.Place(nil, nil, weighed[:0])
					if err != nil {
						b.Fatal(err)
					}
					pl.Release()
					weighed = w
				}
			})
			b.Run(fmt.Sprintf("%s/n=%d/lost", name, n), func(b *testing.B) {
				b.ReportAllocs()
				weighed := make([]balancer.Candidate, 0, n)
				for b.Loop() {
					pl, w, err := bal.Place(nil, lostBy, weighed[:0])
					if err != nil {
						b.Fatal(err)
					}
					pl.Release()
					weighed = w
				}
			})
			b.Run(fmt.Sprintf("%s/n=%d/parallel", name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					weighed := make([]balancer.Candidate, 0, n)
					for pb.Next() {
						pl, w, err := bal.Place(nil, nil, weighed[:0])
						if err != nil {
							b.Error(err)
							return
						}
						pl.Release()
						weighed = w
					}
				})
			})
		}
	}
}
