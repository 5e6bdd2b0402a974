package proxy

import "testing"

// TestModernProtocol: only versions of the session-less era (2026-07-28 on)
// have their affinity header routed on.
func TestModernProtocol(t *testing.T) {
	for v, want := range map[string]bool{
		"2026-07-28": true, "2027-01-01": true,
		"2025-11-25": false, "2025-06-18": false, "": false, "2026-07-2": false, "2026-07-28x": false, "latest": false,
	} {
		if got := modernProtocol(v); got != want {
			t.Errorf("modernProtocol(%q) = %v, want %v", v, got, want)
		}
	}
}
