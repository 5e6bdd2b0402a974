//go:build !unix

package main

// openFileLimit is unknown here: no open-file limit caps the streams.
func openFileLimit() (soft, hard uint64) { return 0, 0 }
