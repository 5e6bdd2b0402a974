package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestWriteVersion(t *testing.T) {
	built := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/tether-mcp/tether", Version: "v0.9.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "50f09c4e"},
			{Key: "vcs.time", Value: "2026-12-03T21:14:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, c := range []struct {
		name, stamped string
		info          *debug.BuildInfo
		sidecar       bool
		want          []string
	}{
		{"stamped at build", "v1.2.3", built, false, []string{
			"tether v1.2.3\n",
			"  module  github.com/tether-mcp/tether v0.9.0\n",
			"  commit  50f09c4e (2026-12-03T21:14:00Z), with uncommitted changes\n",
			"  go      go1.26.8 " + platform + "\n",
			"  build   full\n",
		}},
		{"go install module@version", "dev", built, true, []string{
			"tether v0.9.0\n",
			"  build   sidecar (-tags tether_sidecar)\n",
		}},
		{"no version control", "dev", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/tether-mcp/tether", Version: "(devel)"}}, false, []string{
			"tether dev\n",
			"  commit  unknown (built without version control information)\n",
		}},
		{"no build information", "dev", nil, false, []string{
			"tether dev\n",
			"  go      " + runtime.Version() + " " + platform + "\n",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			writeVersion(&b, c.stamped, c.info, c.sidecar)
			for _, line := range c.want {
				if !strings.Contains(b.String(), line) {
					t.Errorf("missing %q in:\n%s", line, b.String())
				}
			}
		})
	}
}
