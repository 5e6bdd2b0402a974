//go:build !linux

package h1

import "net"

// RawIO returns c: raw system calls are made on Linux only.
func RawIO(c net.Conn) net.Conn { return c }

// OnWait sets nothing: without RawIO, no wait can be seen.
func OnWait(c net.Conn, f func()) bool { return false }

// Sleep returns c: sleeping connections are made on Linux only.
func Sleep(c net.Conn) (net.Conn, bool) { return c, false }

// Asleep reports false: no connection sleeps but on Linux.
func Asleep(c net.Conn) bool { return false }

// awaken is never called: no connection sleeps but on Linux.
func awaken(c net.Conn) (rwc, io net.Conn, err error) { return c, c, nil }
