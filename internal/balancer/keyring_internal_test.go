package balancer

import (
	"hash/fnv"
	"testing"
)

// TestHashKeyIsFNV1a: the ring's hash is FNV-1a 64 as hash/fnv specifies
// it, then mix64; the value of one key is pinned so that a change of
// either is deliberate (replicas of two versions must agree).
func TestHashKeyIsFNV1a(t *testing.T) {
	for _, s := range []string{"", "a", "ws-1", "workspace-42", "\x00\xff\u00e9"} {
		h := fnv.New64a()
		h.Write([]byte(s))
		if got, want := fnv1a(s), h.Sum64(); got != want {
			t.Errorf("fnv1a(%q) = %#x, hash/fnv says %#x", s, got, want)
		}
	}
	if got, want := hashKey("workspace-42"), uint64(0x8fceaa46d550679c); got != want {
		t.Errorf("hashKey(workspace-42) = %#x, want %#x", got, want)
	}
}

// TestCapacityFactor: 1+ε is rounded down, so the capacity never exceeds
// the paper's ceil((1+ε) × mean).
func TestCapacityFactor(t *testing.T) {
	for _, tt := range []struct {
		eps  float64
		want int64
	}{{0.25, 5 * capScale / 4}, {1, 2 * capScale}, {0.1, 72089}} {
		if got := capacityFactor(tt.eps); got != tt.want {
			t.Errorf("capacityFactor(%v) = %d, want %d", tt.eps, got, tt.want)
		}
	}
}
