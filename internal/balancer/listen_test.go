package balancer_test

import (
	"testing"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
)

// Listen streams are not requests in flight: by default they weigh nothing
// in Load; with a weight, each adds it (in thousandths, rounded down).
func TestListenStreamsWeighByTheirWeight(t *testing.T) {
	for _, tc := range []struct {
		weight  float64
		streams int
		want    int64
	}{
		{0, 5, 1},
		{0.1, 9, 1},
		{0.1, 10, 2},
		{1, 3, 4},
		{2.5, 2, 6},
	} {
		b := balancer.New(balancer.Options{Picker: mustPicker(t, "p2c", nil), ListenStreamWeight: tc.weight})
		b.Update(snapshot(ready("a")...))
		e := lookup(t, b, "a")
		e.Begin() // one request in flight
		for range tc.streams {
			e.BeginListen()
		}
		if got := e.Load(); got != tc.want || e.Inflight() != 1 || e.ListenStreams() != int64(tc.streams) {
			t.Errorf("weight %v, %d streams and 1 request: load %d, inflight %d, streams %d; want load %d",
				tc.weight, tc.streams, got, e.Inflight(), e.ListenStreams(), tc.want)
		}
		for range tc.streams {
			e.EndListen()
		}
		e.End()
		if e.Load() != 0 || e.ListenStreams() != 0 {
			t.Errorf("weight %v: load %d and %d streams after every end", tc.weight, e.Load(), e.ListenStreams())
		}
	}
}

// PickListen counts the streams in full whatever their weight, so a new
// stream goes to the endpoint holding fewer.
func TestPickListenPlacesByStreams(t *testing.T) {
	b := balancer.New(balancer.Options{Picker: mustPicker(t, "p2c", nil)})
	b.Update(snapshot(ready("a", "b")...))
	a, bb := lookup(t, b, "a"), lookup(t, b, "b")
	for range 3 {
		a.BeginListen()
	}
	for range 100 {
		got, err := b.PickListen(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got != bb {
			t.Fatalf("PickListen chose %s, holding 3 streams, over %s, holding none", got.ID, bb.ID)
		}
	}
	if got, err := b.PickListen(bb); err != nil || got != a {
		t.Errorf("PickListen excluding %s = %v, %v; want %s", bb.ID, got, err, a.ID)
	}
	if got, _ := b.Pick(nil); got == nil {
		t.Fatal("Pick found no endpoint")
	}
	b.Update(snapshot())
	if _, err := b.PickListen(nil); err != balancer.ErrNoEndpoints {
		t.Errorf("PickListen on an empty set: %v, want ErrNoEndpoints", err)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// An endpoint's departure channel closes when it leaves the set, stops
// being ready or is ejected, and not otherwise; a readmitted endpoint's
// new streams take a fresh one.
func TestDepartedClosesWhenTheEndpointStopsTakingWork(t *testing.T) {
	b := newBalancer(t, "p2c", nil)
	b.Update(snapshot(ready("a", "b", "c")...))
	a, bb, c := lookup(t, b, "a"), lookup(t, b, "b"), lookup(t, b, "c")
	da, db, dc := a.Departed(), bb.Departed(), c.Departed()

	b.Update(snapshot(ready("a", "b", "c")...)) // nothing changes
	if closed(da) || closed(db) || closed(dc) {
		t.Fatal("an update that changed nothing ended streams")
	}

	b.Update(snapshot(ep{id: "a"}, ep{id: "b", state: discovery.Fenced}))
	if !closed(db) {
		t.Error("b stopped being ready, its departure channel is open")
	}
	if !closed(dc) {
		t.Error("c left the set, its departure channel is open")
	}
	if closed(da) {
		t.Error("a stayed ready, its departure channel closed")
	}

	b.Eject(a, errDial)
	if !closed(da) {
		t.Error("a was ejected, its departure channel is open")
	}
	if closed(a.Departed()) {
		t.Error("the channel for a's later streams is already closed")
	}
	var hand balancer.Endpoint
	if hand.Departed() != nil {
		t.Error("an Endpoint built by hand has a departure channel")
	}
}
