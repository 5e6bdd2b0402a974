//go:build !race

package balancer_test

import (
	"testing"
)

// TestPickByKeyDoesNotAllocate pins PickByKey at zero allocations, with and
// without exclusion and with loads that make the walk pass full endpoints.
// (Not under the race detector, whose counts are its own.)
func TestPickByKeyDoesNotAllocate(t *testing.T) {
	b := newKeyBalancer(t, 0)
	b.Update(snapshot(ready(endpointIDs(10)...)...))
	for i, e := range b.Endpoints() {
		for range i % 3 * 4 {
			e.Begin()
		}
	}
	keys := handleKeys(64)
	exclude := lookup(t, b, "ep-04")
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		e, _ := b.PickByKey(keys[i%len(keys)], nil)
		e.Begin()
		e.End()
		_, _ = b.PickByKey(keys[i%len(keys)], exclude)
		i++
	})
	if allocs != 0 {
		t.Errorf("PickByKey allocates %v times per run, want 0", allocs)
	}
}
