package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/testkit"
)

// fence republishes the harness's endpoints with those at the given URLs
// serving but terminating (discovery.Fenced), as an EndpointSlice says of
// a pod being deleted, and the others ready.
func (h *harness) fence(urls ...string) {
	h.t.Helper()
	var snap discovery.Snapshot
	for _, ep := range h.bal.Endpoints() {
		state := discovery.Ready
		for _, u := range urls {
			if ep.String() == u {
				state = discovery.Fenced
			}
		}
		snap.Endpoints = append(snap.Endpoints, discovery.Endpoint{ID: ep.ID, URL: ep.URL, State: state})
	}
	h.bal.Update(snap)
	h.proxy.EndpointsChanged()
}

func (h *harness) endpointAt(url string) *balancer.Endpoint {
	h.t.Helper()
	for _, ep := range h.bal.Endpoints() {
		if ep.String() == url {
			return ep
		}
	}
	h.t.Fatalf("no endpoint %s", url)
	return nil
}

// waitCall calls the wait tool (it answers after ms) and returns the name
// of the backend that answered.
func waitCall(ctx context.Context, cs *mcp.ClientSession, ms int) (string, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "wait", Arguments: mcpbackend.WaitInput{MS: ms}})
	if err != nil {
		return "", err
	}
	var out mcpbackend.WhoamiOutput
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil || out.Backend == "" {
		return "", fmt.Errorf("wait: unexpected result %s", b)
	}
	return out.Backend, nil
}

// A terminating backend's sessions move to the others ahead of its exit:
// the idle ones at once, the one with a call in flight once the call,
// answered by the old backend, is over; the moves spread over the
// survivors; and no request of any session fails.
func TestDrainMovesSessions(t *testing.T) {
	h := newHarness(t, harnessOptions{drainRate: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const n = 30
	sessions := make([]*mcp.ClientSession, n)
	on := make([]string, n)
	for i := range sessions {
		sessions[i] = h.connect(ctx)
		defer sessions[i].Close()
		name, err := whoami(ctx, sessions[i])
		if err != nil {
			t.Fatal(err)
		}
		on[i] = name
	}
	tally := map[string]int{}
	for _, name := range on {
		tally[name]++
	}
	victim := h.backends[0]
	for _, b := range h.backends {
		if tally[b.Name] > tally[victim.Name] {
			victim = b
		}
	}
	busy := -1
	for i, name := range on {
		if name == victim.Name {
			busy = i
			break
		}
	}

	// A call of one of its sessions is in flight when it turns terminating.
	before := victim.Calls.Load()
	type answer struct {
		backend string
		err     error
	}
	inflight := make(chan answer, 1)
	go func() {
		name, err := waitCall(ctx, sessions[busy], 1500)
		inflight <- answer{name, err}
	}()
	testkit.Eventually(t, 10*time.Second, func() bool { return victim.Calls.Load() > before },
		"the wait call did not reach %s", victim.Name)
	h.fence(victim.URL())
	ep := h.endpointAt(victim.URL())

	// While it drains, every session keeps working.
	var wg sync.WaitGroup
	errs := make(chan error, n*20)
	stop := make(chan struct{})
	for i, cs := range sessions {
		if i == busy {
			continue
		}
		wg.Go(func() {
			for range 20 {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := whoami(ctx, cs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	testkit.Eventually(t, 20*time.Second, func() bool { return ep.Sessions() == 0 },
		"%s still holds %d sessions", victim.Name, ep.Sessions())
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("request failed during the drain: %v", err)
	}

	a := <-inflight
	if a.err != nil || a.backend != victim.Name {
		t.Errorf("the call in flight at the start of the drain: answered by %q (err %v), want %s", a.backend, a.err, victim.Name)
	}
	final := map[string]int{}
	for i, cs := range sessions {
		name, err := whoami(ctx, cs)
		if err != nil {
			t.Fatalf("session %d after the drain: %v", i, err)
		}
		if name == victim.Name {
			t.Errorf("session %d still served by the drained %s", i, name)
		}
		final[name]++
	}
	live := map[string]int{}
	for _, b := range h.backends {
		if b != victim {
			live[b.Name] = final[b.Name]
		}
	}
	if r := maxOverMean(live); r > 1.15 {
		t.Errorf("moved sessions spread %v over the survivors: max/mean %.2f, want <= 1.15", final, r)
	}
	st, ok := h.proxy.Drain(ep.ID)
	if !ok || st.Reason != "terminating" || st.Moved != int64(tally[victim.Name]) || st.EmptiedAfter <= 0 {
		t.Errorf("drain state %+v (running %v), want reason terminating, %d moved, emptied", st, ok, tally[victim.Name])
	}
	t.Logf("placed %v; %s drained in %v; after: %v", tally, victim.Name, st.EmptiedAfter, final)
}

// openSession initializes a session through tether with raw requests (and
// the extra header pairs) and returns its id.
func (h *harness) openSession(hdr ...string) string {
	h.t.Helper()
	resp := h.post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, hdr...)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		h.t.Fatalf("initialize: %d, session %q", resp.StatusCode, sid)
	}
	resp = h.post(sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr...)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return sid
}

// rawWhoami calls whoami in session sid and returns the backend's name.
func (h *harness) rawWhoami(sid string, hdr ...string) (string, error) {
	resp, err := h.tryPost(sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`, hdr...)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("whoami: %d %s", resp.StatusCode, body)
	}
	for _, b := range h.backends {
		if strings.Contains(string(body), `"backend":"`+b.Name+`"`) {
			return b.Name, nil
		}
	}
	return "", fmt.Errorf("whoami: no backend named in %s", body)
}

// openStream opens session sid's GET stream through tether (with the extra
// header pairs) and reads it to its end in the background: the channel
// gets the read's error when the stream ends. It is closed when the test
// ends.
func (h *harness) openStream(sid string, hdr ...string) <-chan error {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.endpoint(), nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("GET stream: %d", resp.StatusCode)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, bufio.NewReader(resp.Body))
		ended <- err
	}()
	return ended
}

// A session's GET stream through tether ends once a drain has moved the
// session, so that its client opens it again, on the new backend.
func TestDrainEndsStreamAfterMove(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 2, drainRate: 1000})
	sid := h.openSession()
	name, err := h.rawWhoami(sid)
	if err != nil {
		t.Fatal(err)
	}
	ended := h.openStream(sid)
	h.fence(h.backend(name).URL())
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("the stream ended with %v, want a clean end", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the GET stream is still open after its session moved")
	}
	now, err := h.rawWhoami(sid)
	if err != nil || now == name {
		t.Errorf("after the move the session is served by %q (err %v), want the other backend", now, err)
	}
}

// A session bound to credentials moves only with its creator's: the drain
// waits for a request of the session that shows them, and a request with
// other credentials does not lend them.
func TestDrainWaitsForCreatorCredentials(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 2, drainRate: 1000})
	a, b := h.backends[0], h.backends[1]
	// Both sessions are placed on a: b takes no new session meanwhile.
	h.fence(b.URL())
	alice := h.openSession("Authorization", "Bearer alice")
	anon := h.openSession()
	h.fence(a.URL())
	ep := h.endpointAt(a.URL())

	testkit.Eventually(t, 20*time.Second, func() bool { return ep.Sessions() == 1 },
		"the session without credentials did not move (%d left)", ep.Sessions())
	if name, err := h.rawWhoami(anon); err != nil || name != b.Name {
		t.Errorf("the moved session is served by %q (err %v), want %s", name, err, b.Name)
	}
	if name, err := h.rawWhoami(alice, "Authorization", "Bearer mallory"); err != nil || name != a.Name {
		t.Fatalf("a request with other credentials: served by %q (err %v), want %s (the session stays)", name, err, a.Name)
	}
	initsBefore := b.Initializes.Load()
	if name, err := h.rawWhoami(alice, "Authorization", "Bearer alice"); err != nil || name != a.Name {
		t.Fatalf("the creator's request: served by %q (err %v), want %s (it moves after)", name, err, a.Name)
	}
	testkit.Eventually(t, 20*time.Second, func() bool { return ep.Sessions() == 0 },
		"the creator's session did not move after its request")
	if name, err := h.rawWhoami(alice, "Authorization", "Bearer alice"); err != nil || name != b.Name {
		t.Errorf("after the move: served by %q (err %v), want %s", name, err, b.Name)
	}
	if got := b.Initializes.Load() - initsBefore; got != 1 {
		t.Errorf("%d initializes replayed on %s, want 1", got, b.Name)
	}
}

// With two replicas on one Redis, each sees the backend terminate and
// drains it: every session moves exactly once (the store's
// compare-and-swap), and every session keeps working.
func TestDrainTwoReplicasMoveEachSessionOnce(t *testing.T) {
	f := newFleet(t, 2, 3, harnessOptions{drainRate: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 30
	sids := make([]string, n)
	on := map[string]int{}
	placed := make([]string, n)
	for i := range sids {
		h := f.replicas[i%2]
		sids[i] = h.openSession()
		name, err := h.rawWhoami(sids[i])
		if err != nil {
			t.Fatal(err)
		}
		on[name]++
		placed[i] = name
	}
	victim := f.backends[0]
	for _, b := range f.backends {
		if on[b.Name] > on[victim.Name] {
			victim = b
		}
	}
	inits := map[string]int64{}
	for _, b := range f.backends {
		inits[b.Name] = b.Initializes.Load()
	}
	for _, h := range f.replicas {
		h.fence(victim.URL())
	}
	h0 := f.replicas[0]
	testkit.EventuallyNoError(t, 30*time.Second, func() error {
		left := 0
		for _, sid := range sids {
			rec, err := h0.store.Reload(ctx, sid)
			if err != nil {
				return err
			}
			if rec.BackendURL == victim.URL() {
				left++
			}
		}
		if left > 0 {
			return fmt.Errorf("%d sessions still on %s", left, victim.Name)
		}
		return nil
	}, "drain of %s", victim.Name)
	var replays int64
	for _, b := range f.backends {
		replays += b.Initializes.Load() - inits[b.Name]
	}
	for i, sid := range sids {
		rec, err := h0.store.Reload(ctx, sid)
		if err != nil {
			t.Fatal(err)
		}
		want := uint32(0)
		if placed[i] == victim.Name {
			want = 1
		}
		if rec.Reinits != want {
			t.Errorf("session %d (placed on %s) re-initialized %d times, want %d", i, placed[i], rec.Reinits, want)
		}
		for _, h := range f.replicas {
			if name, err := h.rawWhoami(sid); err != nil || name == victim.Name {
				t.Errorf("session %d after the drain: served by %q (err %v)", i, name, err)
			}
		}
	}
	var moved int64
	for _, h := range f.replicas {
		if st, ok := h.proxy.Drain(h.endpointAt(victim.URL()).ID); ok {
			moved += st.Moved
		}
	}
	if moved != int64(on[victim.Name]) {
		t.Errorf("the replicas moved %d sessions between them, want %d (each exactly once)", moved, on[victim.Name])
	}
	t.Logf("%d sessions on %s moved; %d initializes replayed (%d by a replica that lost the swap)", on[victim.Name], victim.Name, replays, replays-moved)
}

// A session keeps the Host and path of its initialize, for a drain's
// replay: one too long to keep is refused before it reaches a backend.
func TestInitializeAddressTooLong(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 1})
	before := h.backends[0].Initializes.Load()
	req, _ := http.NewRequest(http.MethodPost, h.front.URL+"/"+strings.Repeat("p", 9000),
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "longer than 8 KiB") {
		t.Errorf("initialize at a 9,000-byte path: %d %s, want 400 naming the bound", resp.StatusCode, body)
	}
	if n := h.backends[0].Initializes.Load() - before; n != 0 {
		t.Errorf("%d initializes reached the backend, want 0", n)
	}
}

// A session that always has a call in flight still moves: the drain holds
// its new calls back (a second at most each) until those in flight end.
func TestDrainMovesASessionNeverQuiet(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 2, drainRate: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs := h.connect(ctx)
	defer cs.Close()
	name, err := whoami(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	victim := h.backend(name)
	ep := h.endpointAt(victim.URL())

	// Three callers, each with one 300 ms call after another, each
	// starting once the calls before it are in flight: some call of the
	// session is (almost) always in flight. Without the drain's gate it
	// took 20 s to find a quiet moment between two such callers.
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	done := make(chan struct{})
	caller := func() {
		for range 100 {
			select {
			case <-done:
				return
			default:
			}
			if _, err := waitCall(ctx, cs, 300); err != nil {
				errs <- err
				return
			}
		}
	}
	before := victim.Calls.Load()
	wg.Go(caller)
	testkit.Eventually(t, 10*time.Second, func() bool { return victim.Calls.Load() > before }, "no call in flight")
	wg.Go(caller)
	testkit.Eventually(t, 10*time.Second, func() bool { return victim.Calls.Load() > before+1 }, "no second call in flight")
	wg.Go(caller)
	testkit.Eventually(t, 10*time.Second, func() bool { return victim.Calls.Load() > before+2 }, "no third call in flight")

	h.fence(victim.URL())
	// Two passes find it busy (the second sets the gate), the third finds
	// it quiet: a few seconds, given a loaded machine.
	testkit.Eventually(t, 10*time.Second, func() bool { return ep.Sessions() == 0 },
		"the busy session did not move off %s", name)
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("call failed during the drain: %v", err)
	}
	if now, err := whoami(ctx, cs); err != nil || now == name {
		t.Errorf("after the drain: served by %q (err %v), want the other backend", now, err)
	}
}

// A legacy client's session is idle but for its GET stream: the stream's
// credentials, the creator's, are what the drain moves it with.
func TestDrainMovesWithStreamCredentials(t *testing.T) {
	h := newHarness(t, harnessOptions{backends: 2, drainRate: 1000})
	a, b := h.backends[0], h.backends[1]
	h.fence(b.URL())
	alice := h.openSession("Authorization", "Bearer alice")
	ended := h.openStream(alice, "Authorization", "Bearer alice")
	h.fence(a.URL())
	select {
	case <-ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not move (its GET stream is still open)")
	}
	if name, err := h.rawWhoami(alice, "Authorization", "Bearer alice"); err != nil || name != b.Name {
		t.Errorf("after the move: served by %q (err %v), want %s", name, err, b.Name)
	}
}
