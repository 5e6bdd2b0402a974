package session

import (
	"testing"
	"time"
	"unsafe"
)

func TestShardPadding(t *testing.T) {
	for name, got := range map[string]uintptr{
		"memory": unsafe.Sizeof(tableShard[memEntry]{}),
		"cache":  unsafe.Sizeof(tableShard[cacheEntry]{}),
	} {
		if got%cacheLine != 0 {
			t.Errorf("%s shard is %d bytes, not a multiple of %d", name, got, cacheLine)
		}
	}
}

func TestMemoryDefaults(t *testing.T) {
	tests := []struct {
		name              string
		opts              MemoryOptions
		ttl, touch, sweep time.Duration
	}{
		{"zero", MemoryOptions{}, time.Hour, 6 * time.Minute, time.Minute},
		{"short TTL sweeps at least every second", MemoryOptions{TTL: 5 * time.Second}, 5 * time.Second, 500 * time.Millisecond, time.Second},
		{"TTL/10 in range", MemoryOptions{TTL: time.Minute}, time.Minute, 6 * time.Second, 6 * time.Second},
		{"explicit sweep interval", MemoryOptions{TTL: time.Minute, SweepInterval: time.Millisecond}, time.Minute, 6 * time.Second, time.Millisecond},
		{"negative TTL", MemoryOptions{TTL: -1}, time.Hour, 6 * time.Minute, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMemory(tt.opts)
			defer m.Close()
			if m.ttl != tt.ttl || m.touchEvery != tt.touch || m.sweepEvery != tt.sweep {
				t.Errorf("ttl %v touch %v sweep %v, want %v %v %v",
					m.ttl, m.touchEvery, m.sweepEvery, tt.ttl, tt.touch, tt.sweep)
			}
		})
	}
}

// Close returns only after the sweeper goroutine has returned.
func TestMemoryCloseWaitsForSweeper(t *testing.T) {
	m := NewMemory(MemoryOptions{SweepInterval: time.Millisecond})
	m.Close()
	select {
	case <-m.done:
	default:
		t.Fatal("Close returned while the sweeper was still running")
	}
}
