//go:build unix

package main

import "syscall"

// openFileLimit is RLIMIT_NOFILE, soft and hard (0: unknown). The Go
// runtime has raised the soft limit to the hard one at start.
func openFileLimit() (soft, hard uint64) {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) != nil {
		return 0, 0
	}
	return uint64(rl.Cur), uint64(rl.Max)
}
