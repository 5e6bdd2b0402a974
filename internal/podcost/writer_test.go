package podcost

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDesiredCosts(t *testing.T) {
	got := desiredCosts("mcp", []PodSessions{
		{Pod: "mcp/a", Sessions: 3},
		{Pod: "mcp/a", Sessions: 4}, // the pod's other address family
		{Pod: "mcp/b", Sessions: 0},
		{Pod: "mcp/c", Sessions: -2}, // a lagging count below zero
		{Pod: "mcp/d", Sessions: math.MaxInt32 + 10},
		{Pod: "other/e", Sessions: 1}, // another namespace: no Role there
		{Pod: "", Sessions: 5},        // no targetRef
		{Pod: "mcp/", Sessions: 5},
	})
	want := map[string]int32{"a": 7, "b": 0, "c": 0, "d": math.MaxInt32}
	if d := cmp.Diff(got, want); d != "" {
		t.Errorf("costs (-got +want):\n%s", d)
	}
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name          string
		want, written map[string]int32
		limit         int
		plan          []patch
	}{
		{
			name:    "unchanged pods are not patched",
			want:    map[string]int32{"a": 1, "b": 2},
			written: map[string]int32{"a": 1, "b": 2},
			limit:   50,
			plan:    []patch{},
		},
		{
			name:    "changed and never written",
			want:    map[string]int32{"a": 1, "b": 3, "c": 0},
			written: map[string]int32{"a": 1, "b": 2},
			limit:   50,
			plan:    []patch{{"c", 0}, {"b", 3}},
		},
		{
			name:    "bounded: the never written first, then the largest changes, then by name",
			want:    map[string]int32{"a": 10, "b": 0, "c": 5, "d": 7, "e": 1, "f": 9},
			written: map[string]int32{"a": 1, "b": 8, "c": 4, "d": 7, "f": 8},
			limit:   3,
			plan:    []patch{{"e", 1}, {"a", 10}, {"b", 0}},
		},
		{
			name:    "ties by name",
			want:    map[string]int32{"z": 2, "y": 2, "x": 0},
			written: map[string]int32{"z": 1, "y": 1, "x": 1},
			limit:   2,
			plan:    []patch{{"x", 0}, {"y", 2}},
		},
		{
			name:    "pods that left are not patched",
			want:    map[string]int32{},
			written: map[string]int32{"a": 1},
			limit:   50,
			plan:    []patch{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := cmp.Diff(plan(tt.want, tt.written, tt.limit), tt.plan); d != "" {
				t.Errorf("plan (-got +want):\n%s", d)
			}
		})
	}
}

// passes groups patches by the instant of their pass (in a synctest bubble
// a pass against the in-memory API takes no time).
func passes(log []patchEvent) [][]patchEvent {
	var out [][]patchEvent
	for i, p := range log {
		if i == 0 || !p.at.Equal(log[i-1].at) {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], p)
	}
	return out
}

// A count that changes every second is written at most once per interval,
// and counts that do not change are written once.
func TestWriterChangedOnlyRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI("p0", "p1", "p2")
		c := newCounts(map[string]int64{"mcp/p0": 0, "mcp/p1": 5, "mcp/p2": 9})
		began := time.Now()
		_, stop := start(t, Options{API: api.caller("a"), Identity: "a", Sessions: c.get})
		for i := range 60 {
			time.Sleep(time.Second)
			c.set("mcp/p0", int64(i+1))
		}
		time.Sleep(40 * time.Second) // quiet: nothing left to write
		stop()

		log := api.patchLog()
		ps := passes(log)
		if len(ps) == 0 {
			t.Fatal("no patches")
		}
		if first := ps[0][0].at.Sub(began); first < DefaultInterval {
			t.Errorf("first pass %s after the start, want an interval (%s): the counts settle first", first, DefaultInterval)
		}
		for i := 1; i < len(ps); i++ {
			if gap := ps[i][0].at.Sub(ps[i-1][0].at); gap < DefaultInterval {
				t.Errorf("passes %d and %d are %s apart, want at least %s", i-1, i, gap, DefaultInterval)
			}
		}
		// 60 s of changes: at most one patch of p0 per interval.
		var p0 []string
		per := map[string]int{}
		for _, p := range log {
			per[p.pod]++
			if p.pod == "p0" {
				p0 = append(p0, p.cost)
			}
		}
		if per["p1"] != 1 || per["p2"] != 1 {
			t.Errorf("patches per pod %v: p1 and p2 never changed, want one patch each", per)
		}
		if max := int(60*time.Second/DefaultInterval) + 1; len(p0) > max {
			t.Errorf("p0 patched %d times in 60 s, want at most %d", len(p0), max)
		}
		for i := 1; i < len(p0); i++ {
			if p0[i] == p0[i-1] {
				t.Errorf("p0 patched with the same value twice in a row: %q", p0)
			}
		}
		for _, pass := range ps {
			seen := map[string]bool{}
			for _, p := range pass {
				if seen[p.pod] {
					t.Errorf("pass at %s patched %s twice", p.at.Sub(began), p.pod)
				}
				seen[p.pod] = true
			}
		}
		if d := cmp.Diff(api.annotations(), map[string]string{"p0": "60", "p1": "5", "p2": "9"}); d != "" {
			t.Errorf("annotations (-got +want):\n%s", d)
		}
	})
}

// At most MaxPatchesPerPass pods per pass; the rest follow in the next
// passes.
func TestWriterBoundsPatchesPerPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var names []string
		m := map[string]int64{}
		for i := range 120 {
			n := fmt.Sprintf("p%03d", i)
			names = append(names, n)
			m["mcp/"+n] = int64(i)
		}
		api := newFakeAPI(names...)
		_, stop := start(t, Options{API: api.caller("a"), Identity: "a", Sessions: newCounts(m).get})
		time.Sleep(5 * DefaultInterval)
		stop()
		var sizes []int
		for _, p := range passes(api.patchLog()) {
			sizes = append(sizes, len(p))
		}
		if !slices.Equal(sizes, []int{50, 50, 20}) {
			t.Errorf("patches per pass %v, want [50 50 20]", sizes)
		}
		for i, n := range names {
			if got := api.annotations()[n]; got != strconv.Itoa(i) {
				t.Errorf("%s: %q, want %d", n, got, i)
			}
		}
	})
}

// A pod that is gone (404) is skipped without a word and not retried until
// its value changes; a 403 is logged once, with the RBAC hint, however many
// passes meet it.
func TestWriterGoneAndForbidden(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI("p0")
		c := newCounts(map[string]int64{"mcp/p0": 1, "mcp/gone": 2})
		var logs logBuffer
		_, stop := start(t, Options{API: api.caller("a"), Identity: "a", Sessions: c.get, Logger: logs.logger()})
		defer stop()
		time.Sleep(DefaultInterval + time.Second)
		if got := api.annotations(); got["p0"] != "1" {
			t.Errorf("annotations %v, want p0: 1", got)
		}
		if l := logs.lines("level=WARN"); len(l) != 0 {
			t.Errorf("warnings for a pod that is gone: %q", l)
		}
		time.Sleep(2 * DefaultInterval)
		if n := api.missedPatches("gone"); n != 1 {
			t.Errorf("the pod that is gone was patched %d times over three passes, want once", n)
		}

		api.mu.Lock()
		api.forbidPods = true
		api.mu.Unlock()
		for i := range 5 {
			c.set("mcp/p0", int64(10+i))
			time.Sleep(DefaultInterval)
		}
		if l := logs.lines("forbids patching pods"); len(l) != 1 || !strings.Contains(l[0], "grant patch on pods in namespace mcp") || !strings.Contains(l[0], "level=ERROR") {
			t.Errorf("403 logged %d times: %q; want once, an error with the RBAC hint", len(l), l)
		}
		api.mu.Lock()
		api.forbidPods = false
		api.mu.Unlock()
		time.Sleep(DefaultInterval)
		if got := api.annotations(); got["p0"] != "14" {
			t.Errorf("annotations %v once allowed again, want p0: 14", got)
		}
	})
}
