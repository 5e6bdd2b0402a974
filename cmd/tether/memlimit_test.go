package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// writeFiles writes name → content under root.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCgroupMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		file  string // where the limit came from, under root
	}{
		{
			name: "v2 in a cgroup namespace: the mount is the container's cgroup",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"sys/fs/cgroup/memory.max": "134217728\n",
			},
			want: 134217728, file: "sys/fs/cgroup/memory.max",
		},
		{
			name: "v2 without a limit",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"sys/fs/cgroup/memory.max": "max\n",
			},
		},
		{
			name: "v2 root cgroup: no memory.max at all",
			files: map[string]string{
				"proc/self/cgroup":             "0::/\n",
				"sys/fs/cgroup/cgroup.procs":   "1\n",
				"sys/fs/cgroup/memory.current": "1000\n",
			},
		},
		{
			name: "v2 host path: the smallest limit on the way up counts",
			files: map[string]string{
				"proc/self/cgroup":                           "0::/kubepods/pod1/ctr\n",
				"sys/fs/cgroup/kubepods/memory.max":          "1073741824\n",
				"sys/fs/cgroup/kubepods/pod1/memory.max":     "268435456\n",
				"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n",
			},
			want: 268435456, file: "sys/fs/cgroup/kubepods/pod1/memory.max",
		},
		{
			name: "v1 container: its cgroup mounted at the controller's root",
			files: map[string]string{
				"proc/self/cgroup":                           "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "67108864\n",
			},
			want: 67108864, file: "sys/fs/cgroup/memory/memory.limit_in_bytes",
		},
		{
			name: "v1 host path",
			files: map[string]string{
				"proc/self/cgroup":                                      "4:memory:/docker/abc\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes":            "9223372036854771712\n",
				"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "536870912\n",
			},
			want: 536870912, file: "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
		},
		{
			name: "v1 unlimited",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			},
		},
		{
			name:  "no cgroup file: not in a cgroup hierarchy",
			files: map[string]string{"etc/hostname": "x\n"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, tc.files)
			got, file, err := cgroupMemoryLimit(root)
			if err != nil {
				t.Fatal(err)
			}
			wantFile := ""
			if tc.file != "" {
				wantFile = filepath.Join(root, filepath.FromSlash(tc.file))
			}
			if got != tc.want || file != wantFile {
				t.Errorf("limit %d from %q, want %d from %q", got, file, tc.want, wantFile)
			}
		})
	}
}

func TestCgroupMemoryLimitGarbage(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"proc/self/cgroup":         "0::/\n",
		"sys/fs/cgroup/memory.max": "lots\n",
	})
	if _, _, err := cgroupMemoryLimit(root); err == nil || !strings.Contains(err.Error(), "memory.max") {
		t.Errorf("error %v, want one naming memory.max", err)
	}
}

// The soft limit is 90% of the cgroup's; GOMEMLIMIT, when set, is left to
// the runtime. The process's limit is restored afterwards.
func TestSetMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"proc/self/cgroup":         "0::/\n",
		"sys/fs/cgroup/memory.max": "100000000\n",
	})
	noEnv := func(string) string { return "" }

	var logs bytes.Buffer
	setMemoryLimit(slog.New(slog.NewTextHandler(&logs, nil)), noEnv, root)
	if got := debug.SetMemoryLimit(-1); got != 90000000 {
		t.Errorf("memory limit %d, want 90000000 (90%% of the cgroup's)", got)
	}
	if !strings.Contains(logs.String(), "GOMEMLIMIT=90000000") {
		t.Errorf("log %q: want the limit", logs.String())
	}

	debug.SetMemoryLimit(before)
	logs.Reset()
	setMemoryLimit(slog.New(slog.NewTextHandler(&logs, nil)), func(k string) string {
		if k == "GOMEMLIMIT" {
			return "200MiB"
		}
		return ""
	}, root)
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("memory limit %d with GOMEMLIMIT set, want it untouched (%d)", got, before)
	}
	if !strings.Contains(logs.String(), "GOMEMLIMIT=200MiB") {
		t.Errorf("log %q: want GOMEMLIMIT's value", logs.String())
	}
}
