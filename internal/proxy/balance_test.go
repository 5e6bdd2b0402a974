package proxy_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// Balance after a failover (issue 30, item 5): the sessions a failover or a
// restart moves must spread so that max/mean over the live backends stays
// within maxBalanceRatio. A proxy in front of tether moves them all at
// once: it has one request per session ready when the backend goes, so
// the moves' placements are made concurrently, each before any other's
// session is counted.
const (
	balanceBackends = 3
	balanceSessions = 30
	maxBalanceRatio = 1.15
	// balanceRounds repeats each scenario on a fresh fleet, so that a lucky
	// interleaving cannot pass: before the fix, 7 of 8 rounds of the kill
	// scenario ended above the bound, and every round of the restart.
	balanceRounds = 8
)

// balanceFleet is tether in front of three go-sdk backends with 30
// sessions placed on them.
type balanceFleet struct {
	h        *harness
	sessions []*mcp.ClientSession
	placed   []string // the backend each session is on, by whoami
}

func newBalanceFleet(t *testing.T, ctx context.Context, o harnessOptions) *balanceFleet {
	t.Helper()
	o.backends = balanceBackends
	f := &balanceFleet{h: newHarness(t, o)}
	for range balanceSessions {
		cs := f.h.connect(ctx)
		t.Cleanup(func() { cs.Close() })
		f.sessions = append(f.sessions, cs)
	}
	placed, failed := f.callAll(ctx)
	if len(failed) > 0 {
		t.Fatalf("before the failure: %d calls failed: %s", len(failed), strings.Join(failed, "; "))
	}
	f.placed = placed
	return f
}

// callAll calls whoami on every session at once, as a proxy with one
// request per session in hand sends them, and returns where each call
// landed and the calls that failed.
func (f *balanceFleet) callAll(ctx context.Context) (placed []string, failed []string) {
	placed = make([]string, len(f.sessions))
	errs := make([]error, len(f.sessions))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, cs := range f.sessions {
		wg.Go(func() {
			<-start
			placed[i], errs[i] = whoami(ctx, cs)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Sprintf("session %d: %v", i, err))
		}
	}
	return placed, failed
}

// perBackend counts placements by backend name, over names (zero for a
// backend that holds none).
func perBackend(placed []string, names []string) map[string]int {
	n := make(map[string]int, len(names))
	for _, name := range names {
		n[name] = 0
	}
	for _, name := range placed {
		if name != "" {
			n[name]++
		}
	}
	return n
}

// maxOverMean is the busiest backend's sessions over the mean of counts.
func maxOverMean(counts map[string]int) float64 {
	most, total := 0, 0
	for _, n := range counts {
		most, total = max(most, n), total+n
	}
	if total == 0 {
		return 0
	}
	return float64(most) * float64(len(counts)) / float64(total)
}

func busiest(counts map[string]int) string {
	names := slices.Sorted(maps.Keys(counts))
	best := names[0]
	for _, name := range names {
		if counts[name] > counts[best] {
			best = name
		}
	}
	return best
}

func backendNames(bs []*mcpbackend.Backend) []string {
	names := make([]string, len(bs))
	for i, b := range bs {
		names[i] = b.Name
	}
	return names
}

// waitCountsSettled waits until tether's load of each live backend is
// exactly the sessions the calls found on it: no placement reservation and
// no mark of a lost session outlives its move, and nothing is in flight.
func waitCountsSettled(t *testing.T, h *harness, want map[string]int) {
	t.Helper()
	testkit.EventuallyNoError(t, 10*time.Second, func() error {
		var diffs []string
		for _, ep := range h.bal.Endpoints() {
			name := ""
			for _, b := range h.backends {
				if b.URL() == ep.String() {
					name = b.Name
				}
			}
			n, live := want[name]
			if !live {
				continue // the killed backend: its count is nobody's load
			}
			if ep.Load() != int64(n) || ep.Sessions() != int64(n) {
				diffs = append(diffs, fmt.Sprintf("%s: load %d, sessions %d, holds %d", name, ep.Load(), ep.Sessions(), n))
			}
		}
		if len(diffs) > 0 {
			return fmt.Errorf("%s", strings.Join(diffs, "; "))
		}
		return nil
	}, "tether's counts to match the placements")
}

// The busiest backend is killed (its listener and connections closed at
// once), then every session calls at once: every call is answered, and
// the killed backend's sessions spread over the two live ones within
// maxBalanceRatio. Before the fix, concurrent moves read one load
// snapshot and herded: max/mean 1.13–1.33 over 8 rounds, every move to
// the same backend in some (20/10).
func TestBalanceAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("many fleets of real MCP backends")
	}
	testBalanceAfterKill(t, func(*testing.T) harnessOptions { return harnessOptions{} })
}

// TestBalanceAfterKillFleetCounts is the kill with the Redis store, whose
// fleet-wide counts re-base every endpoint's count (RunLoadSync) many
// times during the moves: the re-base must not forget the picks in flight.
func TestBalanceAfterKillFleetCounts(t *testing.T) {
	if testing.Short() {
		t.Skip("many fleets of real MCP backends")
	}
	testBalanceAfterKill(t, func(t *testing.T) harnessOptions {
		return harnessOptions{redis: redistest.Start(t), loadSync: time.Millisecond}
	})
}

func testBalanceAfterKill(t *testing.T, opts func(*testing.T) harnessOptions) {
	worst := 0.0
	for round := range balanceRounds {
		t.Run(fmt.Sprintf("round-%d", round), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			f := newBalanceFleet(t, ctx, opts(t))
			names := backendNames(f.h.backends)
			before := perBackend(f.placed, names)
			victim := busiest(before)
			f.h.backend(victim).Kill(0)

			placed, failed := f.callAll(ctx)
			if len(failed) > 0 {
				t.Fatalf("%d of %d calls failed after %s was killed: %s", len(failed), len(placed), victim, strings.Join(failed, "; "))
			}
			after := perBackend(placed, names)
			if after[victim] != 0 {
				t.Fatalf("%d calls answered by the killed %s", after[victim], victim)
			}
			delete(after, victim)
			ratio := maxOverMean(after)
			worst = max(worst, ratio)
			t.Logf("before %v; %s killed; after %v: max/mean %.2f", before, victim, after, ratio)
			if ratio > maxBalanceRatio {
				t.Errorf("after the kill of %s: %v, max/mean %.2f over the live backends, want <= %.2f", victim, after, ratio, maxBalanceRatio)
			}
			waitCountsSettled(t, f.h, after)
		})
	}
	t.Logf("worst max/mean over %d rounds: %.2f", balanceRounds, worst)
}

// One backend restarts on its address with none of its sessions, then
// every session calls at once: every call is answered, the restarted
// backend takes its sessions back (within 15% of the mean), and the fleet
// stays within maxBalanceRatio. Before the fix the restarted backend
// still counted the sessions it had lost while their moves were placed,
// so most of them went to the others: it kept 1–7 of about 10, max/mean
// 1.20–1.90 over 8 rounds.
func TestBalanceAfterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("many fleets of real MCP backends")
	}
	testBalanceAfterRestart(t, func(*testing.T) harnessOptions { return harnessOptions{} })
}

// TestBalanceAfterRestartFleetCounts is the restart with the Redis store,
// whose fleet-wide counts re-base every endpoint's count (RunLoadSync) many
// times during the moves: the re-base must not undo what placement knows
// of lost sessions and picks in flight.
func TestBalanceAfterRestartFleetCounts(t *testing.T) {
	if testing.Short() {
		t.Skip("many fleets of real MCP backends")
	}
	testBalanceAfterRestart(t, func(t *testing.T) harnessOptions {
		return harnessOptions{redis: redistest.Start(t), loadSync: time.Millisecond}
	})
}

func testBalanceAfterRestart(t *testing.T, opts func(*testing.T) harnessOptions) {
	worst := 0.0
	for round := range balanceRounds {
		t.Run(fmt.Sprintf("round-%d", round), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			f := newBalanceFleet(t, ctx, opts(t))
			names := backendNames(f.h.backends)
			before := perBackend(f.placed, names)
			// Each backend in turn, the busiest first.
			victim := busiest(before)
			if round%balanceBackends != 0 {
				victim = names[round%balanceBackends]
			}
			if err := f.h.backend(victim).Restart(0); err != nil {
				t.Fatal(err)
			}

			placed, failed := f.callAll(ctx)
			if len(failed) > 0 {
				t.Fatalf("%d of %d calls failed after %s restarted: %s", len(failed), len(placed), victim, strings.Join(failed, "; "))
			}
			after := perBackend(placed, names)
			ratio := maxOverMean(after)
			worst = max(worst, ratio)
			t.Logf("before %v; %s restarted; after %v: max/mean %.2f", before, victim, after, ratio)
			if ratio > maxBalanceRatio {
				t.Errorf("after %s restarted: %v, max/mean %.2f, want <= %.2f", victim, after, ratio, maxBalanceRatio)
			}
			// About a third: within 15% of the mean, or what it held before
			// if that was less (the placement of 30 sessions by p2c is not
			// always 10/10/10).
			least := min(int(math.Ceil(balanceSessions/balanceBackends*(2-maxBalanceRatio))), before[victim])
			if after[victim] < least {
				t.Errorf("the restarted %s holds %d sessions, want about a third (at least %d; it held %d)", victim, after[victim], least, before[victim])
			}
			waitCountsSettled(t, f.h, after)
		})
	}
	t.Logf("worst max/mean over %d rounds: %.2f", balanceRounds, worst)
}
