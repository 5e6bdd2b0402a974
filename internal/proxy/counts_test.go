package proxy_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// The endpoints' session counts, which placement reads, follow the session
// store's changes and nothing else: after sessions are created, moved
// (their backend killed), deleted, expired and evicted concurrently through
// the proxy, every endpoint counts exactly the live records that name it,
// with no fleet-wide sync to correct them.
func TestSessionCountsFollowTheStore(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		h := newHarness(t, harnessOptions{backends: 3})
		churn(t, h, 4, 6, false, func(cutoff time.Time) {
			// Expire every session last used before cutoff, while the
			// others are being moved, deleted and created.
			h.mem.Sweep(cutoff.Add(time.Hour))
		})
		waitCounts(t, h, memoryTruth(h.mem))
	})
	t.Run("memory evictions", func(t *testing.T) {
		h := newHarness(t, harnessOptions{backends: 3, maxSessions: 5})
		// A session evicted before its client's next request is lost to
		// it: connect errors are expected here.
		churn(t, h, 3, 6, true, nil)
		if n := h.mem.Len(); n > 5 {
			t.Errorf("%d records held, want at most 5", n)
		}
		waitCounts(t, h, memoryTruth(h.mem))
	})
	for name, maxSessions := range map[string]int{"redis": 0, "redis cache evictions": 3} {
		t.Run(name, func(t *testing.T) {
			rs := redistest.Start(t)
			// An evicted cache entry lives on in Redis: it stays counted.
			h := newHarness(t, harnessOptions{backends: 3, redis: rs, maxSessions: maxSessions})
			churn(t, h, 4, 6, false, nil)
			waitCounts(t, h, redisTruth(t, rs, h))
		})
	}
}

// churn runs workers, each creating perWorker sessions through the proxy
// (every third is closed at once); then kills the first backend and has
// every worker call its sessions again (those of the killed backend move),
// close every other one and create as many again, while expire, if set,
// runs once with the time the second round began, amid it. Connect errors
// fail the test unless lossy. The client sessions still open are closed
// when the test ends.
func churn(t *testing.T, h *harness, workers, perWorker int, lossy bool, expire func(cutoff time.Time)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "churn", Version: "1"}, nil)
	connect := func() (*mcp.ClientSession, error) {
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.endpoint(), HTTPClient: &http.Client{}}, nil)
		if err != nil {
			return nil, err
		}
		if _, err := mcpbackend.Whoami(ctx, cs); err != nil {
			cs.Close()
			return nil, err
		}
		return cs, nil
	}
	var mu sync.Mutex
	var open []*mcp.ClientSession
	t.Cleanup(func() {
		for _, cs := range open {
			cs.Close()
		}
	})
	errs := make(chan error, workers*perWorker*4)
	round := func(work func(w int)) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() { work(w) })
		}
		wg.Wait()
	}

	mine := make([][]*mcp.ClientSession, workers)
	round(func(w int) {
		for i := range perWorker {
			cs, err := connect()
			if err != nil {
				errs <- fmt.Errorf("worker %d: connect: %w", w, err)
				continue
			}
			if i%3 == 2 {
				cs.Close()
				continue
			}
			mine[w] = append(mine[w], cs)
		}
	})

	h.backends[0].Kill(0)
	cutoff := time.Now()
	// The expiry runs once the first worker has called its sessions again
	// (some have moved), while the others still move theirs.
	firstCalled := make(chan struct{})
	signal := sync.OnceFunc(func() { close(firstCalled) })
	var expired sync.WaitGroup
	if expire != nil {
		expired.Go(func() {
			<-firstCalled
			expire(cutoff)
		})
	}
	round(func(w int) {
		for i, cs := range mine[w] {
			// A session expired meanwhile answers an error: that is its
			// client's problem, not the count's.
			mcpbackend.Whoami(ctx, cs)
			if w == 0 && i == len(mine[w])-1 {
				signal()
			}
			if i%2 == 0 {
				cs.Close()
				continue
			}
			mu.Lock()
			open = append(open, cs)
			mu.Unlock()
		}
		for range perWorker {
			cs, err := connect()
			if err != nil {
				errs <- fmt.Errorf("worker %d: connect after the kill: %w", w, err)
				continue
			}
			mu.Lock()
			open = append(open, cs)
			mu.Unlock()
		}
	})
	signal() // in case the first worker had no session left
	expired.Wait()
	close(errs)
	for err := range errs {
		if !lossy {
			t.Error(err)
		}
	}
}

// memoryTruth counts the memory store's live records by backend.
func memoryTruth(m *session.Memory) func() map[string]int64 {
	return func() map[string]int64 {
		out := map[string]int64{}
		m.Range(func(r *session.Record) bool {
			out[r.BackendID]++
			return true
		})
		return out
	}
}

// redisTruth counts the sessions in Redis by backend.
func redisTruth(t *testing.T, rs *redistest.Server, h *harness) func() map[string]int64 {
	opt, err := redis.ParseURL(rs.URL())
	if err != nil {
		t.Fatal(err)
	}
	shared := session.NewRedis(session.RedisOptions{Client: session.NewRedisClient(opt, time.Second), Timeout: time.Second})
	t.Cleanup(func() { shared.Close() })
	return func() map[string]int64 {
		var ids []string
		for _, ep := range h.bal.Endpoints() {
			ids = append(ids, ep.ID)
		}
		counts, err := shared.BackendSessions(context.Background(), ids)
		if err != nil {
			return nil
		}
		for id, n := range counts {
			if n == 0 {
				delete(counts, id)
			}
		}
		return counts
	}
}

// waitCounts waits until the endpoints' session counts equal truth's.
// They settle once the clients' requests are done; a go-sdk client's
// background GET stream may still move a session of the killed backend
// for a moment after.
func waitCounts(t *testing.T, h *harness, truth func() map[string]int64) {
	t.Helper()
	var counted, want map[string]int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		counted = map[string]int64{}
		for _, ep := range h.bal.Endpoints() {
			if n := ep.Sessions(); n != 0 {
				counted[ep.ID] = n
			}
		}
		want = truth()
		if maps.Equal(counted, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint session counts %v, want the store's %v", counted, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var total int64
	for _, n := range want {
		total += n
	}
	if total == 0 {
		t.Fatal("no session left: the test proves nothing")
	}
}
