package main

import (
	"context"
	"log/slog"
	"runtime"
	"testing"
	"time"
)

// After a burst of allocation, a process gone quiet gives its free memory
// back to the OS; collections with nothing to give back (the runtime's
// periodic one) release nothing, and neither does anything once the
// releaser's context has ended.
func TestMemoryReleasedAfterBurst(t *testing.T) {
	const after = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := startMemoryReleaser(ctx, slog.New(slog.DiscardHandler), after)
	releases := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.releases
	}
	burst := func() uint64 {
		// 64 MiB live at once, then dropped.
		var sink [][]byte
		for range 1024 {
			sink = append(sink, make([]byte, 64<<10))
		}
		peak := retainedBytes()
		runtime.KeepAlive(sink)
		// A load's last collection comes near its end; this burst is too
		// short to be sure of one after its last allocation.
		sink = nil
		runtime.GC()
		return peak
	}
	// settle waits until the memory retained is back under peak-32 MiB
	// and no release runs. (A collection during the burst may have armed
	// a release that came before its end; the one after its end gives the
	// memory back.)
	settle := func(peak uint64) {
		t.Helper()
		releasing := func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.releasing
		}
		for deadline := time.Now().Add(20 * time.Second); retainedBytes() > peak-32<<20 || releasing(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("retained %d MiB, %d MiB at the burst's peak; %d releases", retainedBytes()>>20, peak>>20, releases())
			}
		}
	}
	quiet := func() {
		for range 3 {
			runtime.GC()
			time.Sleep(5 * after) // a release would come after one quiet spell
		}
	}

	settle(burst())
	n := releases()
	quiet()
	if got := releases(); got != n {
		t.Fatalf("%d releases after collections with nothing to give back, want %d", got, n)
	}
	settle(burst())
	n = releases()
	cancel()
	burst()
	quiet()
	if got := releases(); got != n {
		t.Fatalf("%d releases after the context ended, want %d", got, n)
	}
}
