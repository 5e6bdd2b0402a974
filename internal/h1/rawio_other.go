//go:build !linux

package h1

import "net"

// RawIO returns c: raw system calls are made on Linux only.
func RawIO(c net.Conn) net.Conn { return c }

// OnWait sets nothing: without RawIO, no wait can be seen.
func OnWait(c net.Conn, f func()) bool { return false }
