package poll

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	// waitFire bounds the wait for a fire that must come.
	waitFire = 10 * time.Second
	// quiet is how long nothing must fire, where a test checks that
	// nothing does: a window, not a synchronisation.
	quiet = 200 * time.Millisecond
)

// pairs makes TCP connection pairs on a loopback listener that the test
// closes.
type pairs struct {
	ln *net.TCPListener
}

func newPairs(t *testing.T) *pairs {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &pairs{ln: ln}
}

// pair returns the two ends of a new connection; the test closes them.
func (p *pairs) pair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	a, err := net.DialTCP("tcp", nil, p.ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.ln.AcceptTCP()
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// testWait makes a wait whose fires go to the channel it returns; the
// test closes it.
func testWait(t *testing.T, source, watch syscall.Conn) (*Wait, <-chan Event) {
	t.Helper()
	fired := make(chan Event, 16)
	w, err := NewWait(source, watch, func(ev Event) { fired <- ev })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w, fired
}

func arm(t *testing.T, w *Wait) {
	t.Helper()
	if err := w.Arm(); err != nil {
		t.Fatal(err)
	}
}

// expectFire waits for a fire and checks its events.
func expectFire(t *testing.T, fired <-chan Event, want Event) {
	t.Helper()
	select {
	case ev := <-fired:
		if ev != want {
			t.Fatalf("fired with %v, want %v", ev, want)
		}
	case <-time.After(waitFire):
		t.Fatalf("no fire in %v, want one with %v", waitFire, want)
	}
}

// expectNone checks that nothing fires for the quiet window.
func expectNone(t *testing.T, fired <-chan Event, why string) {
	t.Helper()
	select {
	case ev := <-fired:
		t.Fatalf("fired with %v; %s", ev, why)
	case <-time.After(quiet):
	}
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

func readN(t *testing.T, c net.Conn, want string) {
	t.Helper()
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != want {
		t.Fatalf("read %q, want %q", buf, want)
	}
}

// settle waits until the process runs at most n goroutines: the fires
// started so far have returned.
func settle(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(waitFire)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after %v, want at most %d", runtime.NumGoroutine(), waitFire, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// startPoller starts the poller's goroutine, so that a test may count
// the goroutines without it.
func startPoller(t *testing.T) {
	t.Helper()
	if _, err := getPoller(); err != nil {
		t.Fatal(err)
	}
}

func TestReadable(t *testing.T) {
	p := newPairs(t)
	a, b := p.pair(t)
	w, fired := testWait(t, a, nil)

	arm(t, w)
	write(t, b, "a")
	expectFire(t, fired, Readable)
	// One fire per Arm: bytes that come before the next Arm fire nothing.
	write(t, b, "b")
	expectNone(t, fired, "not armed again")
	readN(t, a, "ab")

	// Everything read: Arm waits for more.
	arm(t, w)
	expectNone(t, fired, "nothing to read")
	write(t, b, "c")
	expectFire(t, fired, Readable)

	// "c" is left unread: the next Arm fires at once.
	arm(t, w)
	expectFire(t, fired, Readable)
	readN(t, a, "c")
}

func TestSourceEnd(t *testing.T) {
	p := newPairs(t)
	t.Run("close", func(t *testing.T) {
		a, b := p.pair(t)
		w, fired := testWait(t, a, nil)
		arm(t, w)
		write(t, b, "last")
		b.Close()
		expectFire(t, fired, Readable)
		readN(t, a, "last")
		if n, err := a.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("read after the peer's close: %d, %v; want EOF", n, err)
		}
		// The end is level too.
		arm(t, w)
		expectFire(t, fired, Readable)
	})
	t.Run("reset", func(t *testing.T) {
		a, b := p.pair(t)
		w, fired := testWait(t, a, nil)
		arm(t, w)
		b.SetLinger(0)
		b.Close()
		expectFire(t, fired, Readable)
		if _, err := a.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read after the peer's reset: %v; want ECONNRESET", err)
		}
	})
}

func TestWatchHangup(t *testing.T) {
	p := newPairs(t)
	for _, tc := range []struct {
		name  string
		reset bool
	}{{"close", false}, {"reset", true}} {
		t.Run(tc.name, func(t *testing.T) {
			src, _ := p.pair(t)
			client, peer := p.pair(t)
			w, fired := testWait(t, src, client)
			arm(t, w)
			if !tc.reset {
				// A client's pipelined bytes are not a hang-up.
				write(t, peer, "GET / HTTP/1.1\r\n\r\n")
				expectNone(t, fired, "the watch's peer only sent bytes")
			}
			if tc.reset {
				peer.SetLinger(0)
			}
			peer.Close()
			expectFire(t, fired, Hangup)
			// Level: still hung up at the next Arm.
			arm(t, w)
			expectFire(t, fired, Hangup)
		})
	}
}

// The watch is armed once, not at every Arm: a hang-up that comes while
// no Arm waits (a fire runs) is seen at the next Arm, which arms the watch
// again.
func TestHangupBetweenArms(t *testing.T) {
	p := newPairs(t)
	src, srcPeer := p.pair(t)
	client, peer := p.pair(t)
	w, fired := testWait(t, src, client)
	for range 3 {
		arm(t, w)
		write(t, srcPeer, "x")
		expectFire(t, fired, Readable)
		readN(t, src, "x")
	}
	// Disarmed, as while a fire runs: the hang-up's event finds no Arm.
	peer.Close()
	for deadline := time.Now().Add(waitFire); !w.watchFired.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no event for the watch's hang-up in %v", waitFire)
		}
	}
	arm(t, w)
	expectFire(t, fired, Hangup)
}

func TestBothInOneFire(t *testing.T) {
	p := newPairs(t)
	src, _ := p.pair(t)
	client, _ := p.pair(t)
	w, fired := testWait(t, src, client)
	arm(t, w)
	// Events of the source and the watch in one batch make one fire. The
	// batch is made up, with the generation of the Arm, as the kernel
	// would return it.
	g := genOf(w.state.Load())
	evs := []syscall.EpollEvent{
		{Fd: int32(w.slot), Pad: int32(g)},
		{Fd: int32(w.slot | watchBit), Pad: int32(w.watchGen.Load())},
	}
	dispatch(evs)
	expectFire(t, fired, Readable|Hangup)
}

func TestWake(t *testing.T) {
	p := newPairs(t)
	t.Run("armed", func(t *testing.T) {
		a, _ := p.pair(t)
		w, fired := testWait(t, a, nil)
		arm(t, w)
		made := 0
		for range 10 {
			if w.Wake() {
				made++
			}
		}
		if made != 1 {
			t.Fatalf("%d Wakes of an armed wait made it fire, want 1", made)
		}
		expectFire(t, fired, Woken)
		// Sticky: every later Arm fires at once.
		arm(t, w)
		expectFire(t, fired, Woken)
		if w.Wake() {
			t.Fatal("Wake of a disarmed wait reported a fire")
		}
	})
	t.Run("disarmed", func(t *testing.T) {
		a, _ := p.pair(t)
		w, fired := testWait(t, a, nil)
		if w.Wake() {
			t.Fatal("Wake before Arm reported a fire")
		}
		expectNone(t, fired, "woken before Arm")
		arm(t, w)
		expectFire(t, fired, Woken)
	})
	t.Run("with bytes", func(t *testing.T) {
		a, b := p.pair(t)
		w, fired := testWait(t, a, nil)
		w.Wake()
		write(t, b, "x")
		arm(t, w)
		// The fire is at once, with Woken; Readable may or may not be
		// among its events, as the byte may not have been seen yet.
		select {
		case ev := <-fired:
			if ev&Woken == 0 {
				t.Fatalf("fired with %v, want Woken among them", ev)
			}
		case <-time.After(waitFire):
			t.Fatal("no fire")
		}
	})
}

// TestWakeRacesArm races Wakes from several goroutines with an Arm, on a
// new wait each round (being woken is sticky): the wait fires once per
// round, with Woken, and at most one Wake reports having fired it.
func TestWakeRacesArm(t *testing.T) {
	const rounds, block, wakers = 1000, 100, 3
	startPoller(t)
	for first := 0; first < rounds; first += block {
		base := runtime.NumGoroutine()
		var (
			fires  [block]atomic.Int32
			events [block]atomic.Uint32
			made   [block]atomic.Int32
			waits  [block]*Wait
			files  []*os.File
		)
		fired := make(chan int, block)
		for i := range block {
			r, wr, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, r, wr)
			waits[i], err = NewWait(r, nil, func(ev Event) {
				fires[i].Add(1)
				events[i].Store(uint32(ev))
				fired <- i
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		for i := range block {
			w := waits[i]
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range wakers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if w.Wake() {
						made[i].Add(1)
					}
				}()
			}
			close(start)
			if err := w.Arm(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
		}
		for range block {
			select {
			case <-fired:
			case <-time.After(waitFire):
				t.Fatalf("rounds from %d: a wake was lost", first)
			}
		}
		// Every fire started has returned: a second one would be counted.
		settle(t, base)
		for i := range block {
			if n := fires[i].Load(); n != 1 {
				t.Errorf("round %d: %d fires, want 1", first+i, n)
			}
			if ev := Event(events[i].Load()); ev != Woken {
				t.Errorf("round %d: fired with %v, want Woken", first+i, ev)
			}
			if n := made[i].Load(); n > 1 {
				t.Errorf("round %d: %d Wakes reported the fire", first+i, n)
			}
		}
		for i := range block {
			waits[i].Close()
		}
		for _, f := range files {
			f.Close()
		}
		if t.Failed() {
			return
		}
	}
}

func TestClose(t *testing.T) {
	p := newPairs(t)
	t.Run("armed", func(t *testing.T) {
		a, b := p.pair(t)
		w, fired := testWait(t, a, nil)
		arm(t, w)
		w.Close()
		w.Close()
		write(t, b, "x")
		expectNone(t, fired, "closed")
		if err := w.Arm(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Arm after Close: %v, want ErrClosed", err)
		}
		if w.Wake() {
			t.Fatal("Wake after Close reported a fire")
		}
	})
	t.Run("connection closed", func(t *testing.T) {
		a, _ := p.pair(t)
		w, fired := testWait(t, a, nil)
		a.Close()
		if err := w.Arm(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Arm after the source's close: %v, want net.ErrClosed", err)
		}
		w.Close()
		select {
		case ev := <-fired:
			t.Fatalf("fired with %v", ev)
		default:
		}
		if _, err := NewWait(a, nil, func(Event) {}); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("NewWait of a closed connection: %v, want net.ErrClosed", err)
		}
	})
	t.Run("watch closed", func(t *testing.T) {
		a, _ := p.pair(t)
		c, _ := p.pair(t)
		w, _ := testWait(t, a, c)
		c.Close()
		if err := w.Arm(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Arm after the watch's close: %v, want net.ErrClosed", err)
		}
		// The Arm that failed left the wait disarmed: Wake does not fire.
		if w.Wake() {
			t.Fatal("Wake after a failed Arm reported a fire")
		}
	})
	t.Run("closed while armed", func(t *testing.T) {
		// The kernel drops the registration of a closed connection: a new
		// connection on the same descriptor number goes into a new wait.
		a, _ := p.pair(t)
		w, _ := testWait(t, a, nil)
		arm(t, w)
		a.Close()
		w.Close()
		for range 10 {
			c, _ := p.pair(t)
			w, _ := testWait(t, c, nil)
			arm(t, w)
		}
	})
	t.Run("in use", func(t *testing.T) {
		a, _ := p.pair(t)
		testWait(t, a, nil)
		if _, err := NewWait(a, nil, func(Event) {}); err == nil {
			t.Fatal("NewWait of a connection in another wait succeeded")
		}
	})
	t.Run("races", func(t *testing.T) {
		// Close racing a fire: none starts once Close has returned.
		var late atomic.Int32
		startPoller(t)
		base := runtime.NumGoroutine()
		for range 200 {
			a, b := p.pair(t)
			var closed atomic.Bool
			w, err := NewWait(a, nil, func(Event) {
				if closed.Load() {
					late.Add(1)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			arm(t, w)
			write(t, b, "x")
			w.Close()
			closed.Store(true)
			a.Close()
			b.Close()
		}
		settle(t, base)
		if n := late.Load(); n != 0 {
			t.Fatalf("%d fires started after Close returned", n)
		}
	})
}

// TestCloseRacesArm closes waits while they arm, with bytes waiting so
// that each Arm would fire at once: an Arm that fails fires nothing, and
// nothing fires once Close has returned.
func TestCloseRacesArm(t *testing.T) {
	p := newPairs(t)
	startPoller(t)
	base := runtime.NumGoroutine()
	var late, afterError atomic.Int32
	for range 200 {
		a, b := p.pair(t)
		write(t, b, "x")
		var closed, failed atomic.Bool
		w, err := NewWait(a, nil, func(Event) {
			if closed.Load() {
				late.Add(1)
			}
			if failed.Load() {
				afterError.Add(1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		armed := make(chan error, 1)
		go func() { armed <- w.Arm() }()
		w.Close()
		closed.Store(true)
		if err := <-armed; err != nil {
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("Arm racing Close: %v, want nil or ErrClosed", err)
			}
			failed.Store(true)
		}
		a.Close()
		b.Close()
	}
	settle(t, base)
	if n := late.Load(); n != 0 {
		t.Errorf("%d fires started after Close returned", n)
	}
	if n := afterError.Load(); n != 0 {
		t.Errorf("%d fires of Arms that failed", n)
	}
}

func TestArmTwice(t *testing.T) {
	p := newPairs(t)
	a, _ := p.pair(t)
	w, _ := testWait(t, a, nil)
	arm(t, w)
	if err := w.Arm(); err == nil {
		t.Fatal("Arm of an armed wait succeeded")
	}
}

// TestManyWaits parks 2,000 connections: they hold no goroutine, and
// each fires once when its peer writes.
func TestManyWaits(t *testing.T) {
	const conns = 2000
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur < conns+500 {
		t.Skipf("RLIMIT_NOFILE is %d, want %d", rl.Cur, conns+500)
	}
	p := newPairs(t)
	var ends []*net.TCPConn
	for range conns / 2 {
		a, b := p.pair(t)
		ends = append(ends, a, b)
	}
	startPoller(t)
	base := runtime.NumGoroutine()
	var fires [conns]atomic.Int32
	var wrong atomic.Int32
	fired := make(chan int, conns)
	for i, c := range ends {
		w, err := NewWait(c, nil, func(ev Event) {
			if ev != Readable {
				wrong.Add(1)
			}
			fires[i].Add(1)
			fired <- i
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		arm(t, w)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Fatalf("%d goroutines with %d armed waits, %d before", n, conns, base)
	}
	// Each end's peer is the other end of its pair.
	for i := range ends {
		write(t, ends[i^1], "x")
	}
	for n := range conns {
		select {
		case <-fired:
		case <-time.After(waitFire):
			t.Fatalf("%d fires of %d", n, conns)
		}
	}
	settle(t, base)
	if n := wrong.Load(); n != 0 {
		t.Errorf("%d fires had other events than Readable", n)
	}
	for i := range fires {
		if n := fires[i].Load(); n != 1 {
			t.Errorf("wait %d fired %d times", i, n)
		}
	}
}

// TestSlotReuse closes waits and makes new ones in their slots: an event
// of a closed wait, or of an earlier Arm, is not delivered.
func TestSlotReuse(t *testing.T) {
	p := newPairs(t)

	t.Run("stale generation", func(t *testing.T) {
		a, _ := p.pair(t)
		old, _ := testWait(t, a, nil)
		arm(t, old)
		slot, oldGen := old.slot, genOf(old.state.Load())
		old.Close()

		b, peer := p.pair(t)
		w, fired := testWait(t, b, nil)
		if w.slot != slot {
			t.Logf("new wait in slot %d, not the closed one's %d", w.slot, slot)
		}
		arm(t, w)
		gen := genOf(w.state.Load())
		// Events as the kernel would return them for the new wait's slot,
		// with the generations of the closed wait's Arm and of the
		// registration before any Arm.
		dispatch([]syscall.EpollEvent{
			{Fd: int32(w.slot), Pad: int32(oldGen)},
			{Fd: int32(w.slot), Pad: 0},
		})
		if s := w.state.Load(); phaseOf(s) != phaseArmed || genOf(s) != gen {
			t.Fatalf("stale events ended the Arm: phase %d, generation %d (armed: %d)", phaseOf(s), genOf(s), gen)
		}
		write(t, peer, "x")
		expectFire(t, fired, Readable)
		readN(t, b, "x")

		// An event of the previous Arm of the same wait is stale too.
		arm(t, w)
		dispatch([]syscall.EpollEvent{{Fd: int32(w.slot), Pad: int32(gen)}})
		expectNone(t, fired, "an event of the previous Arm")
	})

	t.Run("closed with events in flight", func(t *testing.T) {
		const rounds = 200
		var late atomic.Int32
		fired := make(chan int, rounds)
		var quietWaits []*Wait
		var quietPeers []*net.TCPConn
		for i := range rounds {
			a, b := p.pair(t)
			var closed atomic.Bool
			old, err := NewWait(a, nil, func(Event) {
				if closed.Load() {
					late.Add(1)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			arm(t, old)
			write(t, b, "x")
			old.Close()
			closed.Store(true)

			c, peer := p.pair(t)
			w, err := NewWait(c, nil, func(Event) { fired <- i })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Close)
			arm(t, w)
			quietWaits = append(quietWaits, w)
			quietPeers = append(quietPeers, peer)
		}
		select {
		case i := <-fired:
			t.Fatalf("wait %d fired with nothing to read", i)
		case <-time.After(quiet):
		}
		if n := late.Load(); n != 0 {
			t.Fatalf("%d fires started after Close returned", n)
		}
		// The new waits still work.
		for _, peer := range quietPeers {
			write(t, peer, "x")
		}
		seen := make(map[int]bool)
		for range quietWaits {
			select {
			case i := <-fired:
				if seen[i] {
					t.Fatalf("wait %d fired twice", i)
				}
				seen[i] = true
			case <-time.After(waitFire):
				t.Fatalf("%d fires of %d", len(seen), rounds)
			}
		}
	})
}

// dispatch ends the Arms that evs, a batch made up as the kernel would
// return it, are events of, as the poller would: each fire on a goroutine
// of its own.
func dispatch(evs []syscall.EpollEvent) {
	for _, e := range thePoller.collect(evs, nil) {
		e.w.end(e.gen, e.ev)
	}
}

// A fire on the poller's goroutine that hands it off may wait: the next
// runner fires the other waits meanwhile.
func TestHandoff(t *testing.T) {
	p := newPairs(t)
	a, aPeer := p.pair(t)
	b, bPeer := p.pair(t)

	release := make(chan struct{})
	firedA := make(chan Event, 4)
	var wa *Wait
	wa, err := NewWait(a, nil, func(ev Event) {
		wa.Handoff()
		wa.Handoff() // a second does nothing
		firedA <- ev
		<-release // waits, as a read finding no bytes would
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wa.Close)
	wa.SetInline()
	wb, firedB := testWait(t, b, nil)
	wb.SetInline()
	arm(t, wa)
	arm(t, wb)

	write(t, aPeer, "a")
	expectFire(t, firedA, Readable|Inline)
	write(t, bPeer, "b")
	expectFire(t, firedB, Readable|Inline)
	close(release)
	readN(t, a, "a")
	readN(t, b, "b")

	// The poller goes on with the runner the handoff made.
	arm(t, wb)
	write(t, bPeer, "c")
	expectFire(t, firedB, Readable|Inline)
}

// A runner whose fire handed off is kept for the next handoff: a
// stream's end hands off, and would otherwise allocate a runner (some
// 3.6 KB with its buffers) each time.
func TestHandoffReusesRunner(t *testing.T) {
	p := newPairs(t)
	a, aPeer := p.pair(t)
	fired := make(chan Event, 1)
	var w *Wait
	w, err := NewWait(a, nil, func(ev Event) {
		w.Handoff()
		fired <- ev
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	w.SetInline()
	one, buf := []byte("x"), make([]byte, 1)
	// spared waits until the runner that handed off has ended, and is
	// the spare.
	spared := func() *runner {
		deadline := time.Now().Add(waitFire)
		for {
			thePoller.mu.Lock()
			r := thePoller.spare
			thePoller.mu.Unlock()
			if r != nil {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatal("no spare runner after a handoff")
			}
			time.Sleep(time.Millisecond)
		}
	}
	handoff := func() {
		arm(t, w)
		if _, err := aPeer.Write(one); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-fired:
			if ev != Readable|Inline {
				t.Fatalf("fired with %v, want %v", ev, Readable|Inline)
			}
		case <-time.After(waitFire):
			t.Fatal("no fire")
		}
		if _, err := io.ReadFull(a, buf); err != nil {
			t.Fatal(err)
		}
	}
	handoff()
	first := spared()
	handoff()
	if second := spared(); second == first {
		t.Fatal("the spare is the runner that took over, not the one that handed off")
	}

	// In a steady run of handoffs, no runner is made.
	const rounds = 100
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range rounds {
		handoff()
		spared()
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / rounds; per >= 1024 {
		t.Fatalf("%d bytes allocated per handoff, want less than 1 KiB (a runner is %d)", per, 12*maxEvents+16*maxEvents)
	}
}

// Without SetInline, or in a burst, fires run on goroutines of their own
// (no Inline); a small batch's run on the runner's goroutine.
func TestInlineOnlyWhereAllowed(t *testing.T) {
	p := newPairs(t)
	a, aPeer := p.pair(t)
	w, fired := testWait(t, a, nil)
	arm(t, w)
	write(t, aPeer, "a")
	expectFire(t, fired, Readable)
	readN(t, a, "a")

	// A made-up batch, fired by a runner of the test's own: inline for a
	// few waits, not for a burst of more than maxInline.
	for _, size := range []int{2, maxInline + 1} {
		ends := make([]ending, size)
		chans := make([]<-chan Event, size)
		for i := range ends {
			c, _ := p.pair(t)
			w, fired := testWait(t, c, nil)
			w.SetInline()
			arm(t, w)
			ends[i] = ending{w, genOf(w.state.Load()), Readable}
			chans[i] = fired
		}
		r := newRunner(thePoller)
		r.fire(ends)
		want := Readable | Inline
		if size > maxInline {
			want = Readable
		}
		for _, fired := range chans {
			expectFire(t, fired, want)
		}
		if r.gone {
			t.Fatal("a runner whose fires did not hand off is gone")
		}
	}
}

// A watch registered after the Wait was made (SetWatch) is watched as one
// given to NewWait: its peer's hang-up fires, its bytes do not.
func TestSetWatch(t *testing.T) {
	p := newPairs(t)
	src, srcPeer := p.pair(t)
	client, peer := p.pair(t)
	w, fired := testWait(t, src, nil)
	if err := w.SetWatch(client); err != nil {
		t.Fatal(err)
	}
	if err := w.SetWatch(client); err == nil {
		t.Error("a second SetWatch: no error")
	}
	arm(t, w)
	write(t, peer, "GET / HTTP/1.1\r\n\r\n")
	expectNone(t, fired, "the watch's peer only sent bytes")
	write(t, srcPeer, "x")
	expectFire(t, fired, Readable)
	readN(t, src, "x")
	arm(t, w)
	peer.Close()
	expectFire(t, fired, Hangup)
	w.Close()
	if err := w.SetWatch(client); !errors.Is(err, ErrClosed) {
		t.Errorf("SetWatch of a closed wait: %v", err)
	}
}

// An event that comes while the runner fires, after its harvest took
// every event ready, fires: the runtime forgets the edge it made when the
// next Read begins (prepareRead), so that Read must look before it waits.
// Here a's inline fire makes b readable.
func TestEventDuringFire(t *testing.T) {
	p := newPairs(t)
	a, aPeer := p.pair(t)
	b, bPeer := p.pair(t)
	wb, firedB := testWait(t, b, nil)
	wb.SetInline()
	firedA := make(chan Event, 4)
	writeErr := make(chan error, 4)
	wa, err := NewWait(a, nil, func(ev Event) {
		_, err := bPeer.Write([]byte("b")) // not write: off the test's goroutine
		writeErr <- err
		firedA <- ev
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wa.Close)
	wa.SetInline()
	for i := range 20 {
		arm(t, wa)
		arm(t, wb)
		write(t, aPeer, "a")
		expectFire(t, firedA, Readable|Inline)
		if err := <-writeErr; err != nil {
			t.Fatal(err)
		}
		expectFire(t, firedB, Readable|Inline)
		readN(t, a, "a")
		readN(t, b, "b")
		if t.Failed() {
			t.Fatalf("round %d", i)
		}
	}
}
