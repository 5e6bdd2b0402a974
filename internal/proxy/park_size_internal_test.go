package proxy

import (
	"testing"
	"unsafe"
)

// An open stream keeps its eventStream for its life: with thousands open,
// each allocator size class it grows into is kilobytes more per MiB of
// streams (issue 32). 384 is the class it fits in on 64-bit systems.
func TestEventStreamSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are for 64-bit systems")
	}
	if n := unsafe.Sizeof(eventStream{}); n > 384 {
		t.Errorf("eventStream is %d bytes, past the 384-byte size class", n)
	}
}
