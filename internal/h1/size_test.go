package h1

import (
	"testing"
	"unsafe"
)

// An open stream keeps its backend answer, both connections' RawIO and
// its client connection for its life: with thousands open, each allocator
// size class one of them grows into is kilobytes more per MiB of streams
// (issue 32). The limits are the classes they fit in on 64-bit systems.
func TestParkedStreamStructSizes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are for 64-bit systems")
	}
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"answer", unsafe.Sizeof(answer{}), 288},
		{"answerWithFields", unsafe.Sizeof(answerWithFields{}), 512},
		{"conn", unsafe.Sizeof(conn{}), 640},
		{"servedRequest", unsafe.Sizeof(servedRequest{}), 480},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, past the %d-byte size class", c.name, c.size, c.max)
		}
	}
}
