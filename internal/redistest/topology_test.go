package redistest_test

import (
	"testing"

	"github.com/tether-mcp/tether/internal/redistest"
)

// The Sentinel deployment fails over when its primary dies, and the
// killed server comes back as a replica of the new primary.
func TestSentinelFailover(t *testing.T) {
	d := redistest.StartSentinel(t)
	old := d.CurrentPrimary()
	if old != d.Primary {
		t.Fatalf("sentinels name %s as primary, want %s", old.Addr(), d.Primary.Addr())
	}
	old.Kill()
	if now := d.WaitFailover(old); now != d.Replica {
		t.Fatalf("new primary %s, want the replica %s", now.Addr(), d.Replica.Addr())
	}
}

// The cluster moves a dead primary's slots to its replica.
func TestClusterFailover(t *testing.T) {
	c := redistest.StartCluster(t)
	old := c.PrimaryFor("k")
	old.Kill()
	if now := c.WaitFailover(old, "k"); now == old {
		t.Fatal("no failover")
	}
}
