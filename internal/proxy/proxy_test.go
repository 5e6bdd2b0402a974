package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Every session stays on one backend, and sessions spread evenly.
func TestSessionsStickAndSpread(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 3})
	ctx := testContext(t)
	const sessions, calls = 60, 10

	perBackend := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, sessions*calls)
	sem := make(chan struct{}, 12)
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cs, err := h.tryConnect(ctx)
			if err != nil {
				errs <- fmt.Errorf("session %d: %w", i, err)
				return
			}
			defer cs.Close()
			first := ""
			for c := range calls {
				got, err := whoami(ctx, cs)
				if err != nil {
					errs <- fmt.Errorf("session %d call %d: %w", i, c, err)
					return
				}
				if first == "" {
					first = got
				} else if got != first {
					errs <- fmt.Errorf("session %d moved from %s to %s", i, first, got)
				}
			}
			mu.Lock()
			perBackend[first]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	most := 0
	for _, n := range perBackend {
		most = max(most, n)
	}
	mean := float64(sessions) / float64(len(h.backends))
	t.Logf("sessions per backend: %v (max/mean %.2f)", perBackend, float64(most)/mean)
	if len(perBackend) != 3 || float64(most)/mean > 1.25 {
		t.Errorf("sessions per backend %v: max/mean %.2f, want <= 1.25", perBackend, float64(most)/mean)
	}
	// Each backend answered one initialize per session it holds: no
	// initialize was sent twice.
	for _, b := range h.backends {
		if got, want := b.Initializes.Load(), int64(perBackend[b.Name]); got != want {
			t.Errorf("%s saw %d initialize requests, want %d", b.Name, got, want)
		}
	}
}

// A backend killed mid-run: its sessions continue elsewhere, and no client
// call fails.
func TestBackendKilledMidRun(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 3})
	ctx := testContext(t)
	const sessions, calls = 30, 12

	victim := h.backends[0]
	var killOnce sync.Once
	started := make(chan struct{}, sessions)
	kill := make(chan struct{})
	go func() {
		for range sessions {
			<-started
		}
		killOnce.Do(func() { victim.Kill(200 * time.Millisecond); close(kill) })
	}()

	var wg sync.WaitGroup
	var mu sync.Mutex
	moved, onVictim := 0, 0
	errs := make(chan error, sessions*calls)
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs, err := h.tryConnect(ctx)
			if err != nil {
				errs <- fmt.Errorf("session %d: %w", i, err)
				started <- struct{}{} // the kill waits for every session
				return
			}
			defer cs.Close()
			first, last := "", ""
			for c := range calls {
				if c == calls/2 {
					started <- struct{}{}
					<-kill // the second half of every session runs after the kill
				}
				got, err := whoami(ctx, cs)
				if err != nil {
					errs <- fmt.Errorf("session %d call %d: %w", i, c, err)
					return
				}
				if first == "" {
					first = got
				}
				last = got
			}
			mu.Lock()
			defer mu.Unlock()
			if first == victim.Name {
				onVictim++
				if last != victim.Name {
					moved++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if onVictim == 0 {
		t.Fatal("no session was placed on the killed backend")
	}
	if moved != onVictim {
		t.Errorf("%d of %d sessions of the killed backend moved", moved, onVictim)
	}
	t.Logf("%d sessions moved off the killed backend", moved)
}

// A backend restarted in place answers 404 for its old sessions; tether
// re-initializes them there, notifications/initialized included.
func TestBackendRestartedInPlace(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 1})
	ctx := testContext(t)
	b := h.backends[0]
	var sessions []*mcp.ClientSession
	for range 5 {
		cs := h.connect(ctx)
		t.Cleanup(func() { cs.Close() })
		if _, err := whoami(ctx, cs); err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, cs)
	}
	if err := b.Restart(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for i, cs := range sessions {
		if _, err := whoami(ctx, cs); err != nil {
			t.Fatalf("session %d after restart: %v", i, err)
		}
	}
	if got := b.Initializes.Load(); got != 10 {
		t.Errorf("backend saw %d initialize requests, want 10 (5 sessions, each replayed once)", got)
	}
	if got := b.Initialized.Load(); got < 10 {
		t.Errorf("backend saw %d notifications/initialized, want at least 10 (5 from clients, 5 from re-initialization)", got)
	}
}

// Twenty concurrent requests of a session whose backend died share one
// re-initialization.
func TestConcurrentRequestsShareOneReinit(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 3})
	ctx := testContext(t)
	cs := h.connect(ctx)
	defer cs.Close()
	home, err := whoami(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	before := int64(0)
	for _, b := range h.backends {
		before += b.Initializes.Load()
	}
	h.backend(home).Kill(100 * time.Millisecond)

	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := whoami(ctx, cs)
			switch {
			case err != nil:
				errs <- err
			case got == home:
				errs <- fmt.Errorf("answered by the dead backend %s", home)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	after := int64(0)
	for _, b := range h.backends {
		after += b.Initializes.Load()
	}
	if after-before != 1 {
		t.Errorf("%d re-initializations, want exactly 1", after-before)
	}
	rec, err := h.store.Get(ctx, cs.ID())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Reinits != 1 {
		t.Errorf("record says %d re-initializations, want 1", rec.Reinits)
	}
}

var _ = http.StatusOK

// The go-sdk client reconnects its GET stream 1–2 s after it breaks, and
// any non-2xx answer to that GET ends its session for good: failover must
// work when that GET is the first request after the backend died.
func TestStreamReconnectIsFirstRequestAfterBackendDies(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 2})
	ctx := testContext(t)
	cs := h.connect(ctx)
	defer cs.Close()
	home, err := whoami(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	h.backend(home).Kill(50 * time.Millisecond)

	// No call is made: only the client's own stream reconnect reaches tether.
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := h.store.Get(ctx, cs.ID())
		if err != nil {
			t.Fatalf("record gone: %v", err)
		}
		if rec.Reinits == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the client's stream reconnect did not re-initialize the session")
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, err := whoami(ctx, cs)
	if err != nil {
		t.Fatalf("call after the stream moved: %v", err)
	}
	if got == home {
		t.Errorf("answered by the dead backend %s", got)
	}
}
