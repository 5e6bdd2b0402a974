package balancer

import "testing"

func TestPickExplained(t *testing.T) {
	eps := []*Endpoint{
		{ID: "a"}, {ID: "b"}, {ID: "c"},
	}
	eps[0].AddSessions(5)
	eps[1].AddSessions(1)
	eps[2].AddSessions(3)
	for _, tt := range []struct {
		picker  string
		weighed int
	}{{"p2c", 2}, {"least-loaded", 3}, {"round-robin", 1}, {"random", 1}} {
		p, err := NewPicker(tt.picker, nil)
		if err != nil {
			t.Fatal(err)
		}
		b := New(Options{Picker: p})
		b.current.Store(b.newGeneration(eps))
		for range 50 {
			got, weighed, err := b.PickExplained(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(weighed) != tt.weighed {
				t.Fatalf("%s weighed %d candidates, want %d", tt.picker, len(weighed), tt.weighed)
			}
			found := false
			for _, c := range weighed {
				if c.Load != c.Endpoint.Load() {
					t.Errorf("%s reported load %d for %s, which has %d", tt.picker, c.Load, c.Endpoint.ID, c.Endpoint.Load())
				}
				if c.Endpoint == got {
					found = true
				}
				// The choice is never more loaded than another weighed candidate
				// for the load-aware pickers.
				if tt.picker != "round-robin" && tt.picker != "random" && c.Load < got.Load() {
					t.Errorf("%s chose %s (load %d) over %s (load %d)", tt.picker, got.ID, got.Load(), c.Endpoint.ID, c.Load)
				}
			}
			if !found {
				t.Errorf("%s: the choice is not among the weighed candidates", tt.picker)
			}
		}
	}
}
