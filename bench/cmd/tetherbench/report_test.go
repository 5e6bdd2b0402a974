package main

import (
	"strings"
	"testing"
	"time"
)

// TestSidecarTargets checks that each of the sidecar's goals is judged
// against the right figure of the same run.
func TestSidecarTargets(t *testing.T) {
	o := &overheadResult{
		ManySessions: 100000, ManyRSS: 120, OwnAllocs: 9, AllAllocs: 20,
		Targets: []*overheadTarget{
			{Name: "direct", MaxRate: 3000},
			{Name: "tether (memory)", MaxRate: 2900, ProxyCPU: 110 * time.Millisecond, Requests: 1000,
				IdleRSS: 17 << 10, ProxyRSS: 41 << 10, AddedP99: time.Millisecond, Syscalls: 9},
			{Name: "nginx", MaxRate: 2950, ProxyCPU: 100 * time.Millisecond, Requests: 1000, Syscalls: 8, AddedP99: 2 * time.Millisecond},
			{Name: "HAProxy", MaxRate: 2800, ProxyCPU: 120 * time.Millisecond, Requests: 1000, Syscalls: 7, AddedP99: 3 * time.Millisecond},
		},
	}
	met := map[string]bool{}
	o.sidecarTargets(func(target, _ string, ok bool) { met[target] = ok })
	want := map[string]bool{
		"proxy CPU per 1k follow-ups ≤ nginx's":  false, // 0.110 > 0.100
		"idle RSS ≤ 20 MiB":                      true,
		"RSS after the overhead rounds ≤ 40 MiB": false, // 41
		"RSS with 100,000 live sessions":         true,
		"max sustainable follow-up rate":         true, // 2900 ≥ 2800 and ≥ 2700
		"p99 added ≤ HAProxy's":                  true,
		"syscalls per follow-up":                 true, // 9 ≤ 8 + 4
		"allocations per follow-up":              true,
	}
	for prefix, w := range want {
		found := false
		for target, ok := range met {
			if strings.HasPrefix(target, prefix) {
				found = true
				if ok != w {
					t.Errorf("%q: met %v, want %v", target, ok, w)
				}
			}
		}
		if !found {
			t.Errorf("no row for %q (rows: %v)", prefix, met)
		}
	}

	// A figure the run did not measure is not met.
	o.ManyRSS, o.AllAllocs = 0, 0
	o.Targets[1].Syscalls = 0
	o.sidecarTargets(func(target, _ string, ok bool) { met[target] = ok })
	for target, ok := range met {
		for _, prefix := range []string{"RSS with", "syscalls", "allocations"} {
			if strings.HasPrefix(target, prefix) && ok {
				t.Errorf("%q met without a figure", target)
			}
		}
	}
}
