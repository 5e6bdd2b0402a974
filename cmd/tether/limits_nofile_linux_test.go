package main

import (
	"math"
	"syscall"
	"testing"
)

// The Go runtime raises the soft open-file limit to the hard one at start
// (Go 1.19+ on Linux; to Max-1, to tell its own raise from prlimit's), so
// tether reads the soft limit and raises nothing itself.
func TestOpenFileLimitRaisedByRuntime(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Max != math.MaxUint64 && rl.Cur+1 < rl.Max { // MaxUint64: RLIM_INFINITY
		t.Errorf("open-file limit: soft %d, hard %d: the runtime did not raise the soft one", rl.Cur, rl.Max)
	}
}
