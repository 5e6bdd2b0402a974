package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// writeVersion is `tether version`: the release on the first line (the
// version stamped at build time, else the module's, else "dev"), then
// what the binary says of its own build, so that a bug report names the
// exact code: the module, the commit, the Go toolchain and the build
// (full, or the sidecar's -tags tether_sidecar).
func writeVersion(w io.Writer, stamped string, info *debug.BuildInfo, sidecar bool) {
	release := stamped
	if release == "dev" && info != nil && info.Main.Version != "" && info.Main.Version != "(devel)" {
		release = info.Main.Version // go install module@version
	}
	fmt.Fprintln(w, "tether", release)
	build := "full"
	if sidecar {
		build = "sidecar (-tags tether_sidecar)"
	}
	goVersion := runtime.Version()
	if info == nil {
		fmt.Fprintf(w, "  go      %s %s/%s\n  build   %s\n", goVersion, runtime.GOOS, runtime.GOARCH, build)
		return
	}
	module := info.Main.Path
	if v := info.Main.Version; v != "" {
		module += " " + v
	}
	commit := "unknown (built without version control information)"
	var rev, at, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" {
		commit = rev
		if at != "" {
			commit += " (" + at + ")"
		}
		if modified == "true" {
			commit += ", with uncommitted changes"
		}
	}
	fmt.Fprintf(w, "  module  %s\n  commit  %s\n  go      %s %s/%s\n  build   %s\n",
		module, commit, info.GoVersion, runtime.GOOS, runtime.GOARCH, build)
}
