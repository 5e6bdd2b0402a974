package poll

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// The poller: one epoll instance and one goroutine for the process, both
// made by the first NewWait. The epoll instance is itself waited on by the
// runtime's network poller (an epoll descriptor is readable while events
// are ready), so the goroutine waits as a read of a socket does, and a
// process whose streams are all idle does not wake at all. It does not
// block in epoll_wait: a goroutine that enters a blocking system call
// wakes the runtime's sysmon thread, which then polls every 20 µs for a
// millisecond and more (golang/go#18236), after every event: four times
// the CPU of the event itself, measured. For the same reason every
// epoll_ctl and epoll_wait here is a raw system call (none blocks: the
// wait's timeout is 0), as h1's RawIO reads and writes are.
//
// Every connection is registered with EPOLLONESHOT: an event disables its
// registration until the next Arm modifies it (EPOLL_CTL_MOD), which is
// also when the kernel checks readiness again, so readiness is
// level-triggered at Arm and an Arm yields at most one event per
// connection. The watch is the exception: it is armed once and stays
// armed across Arms until its event (a hang-up is for good), which then
// ends whichever Arm is current, or makes the next Arm arm it again. Every epoll_ctl runs inside RawConn.Control, which holds
// the descriptor open: a Close of the connection in the meantime cannot
// make its number name another file under us.
//
// An event's data cannot be a pointer to its Wait (the garbage collector
// does not see the kernel's copy), so it is the Wait's slot in a table,
// a bit for source or watch, and the generation of the Arm that armed the
// registration. Generations come from one
// counter for the process, so an event left from an earlier Arm of the
// Wait, or from a closed Wait whose slot another now holds, carries a
// generation that is not the Wait's current one, and is dropped.
//
// A Wait's state is one atomic word: its generation, its phase and, while
// arming, the events seen meanwhile. The phases:
//
//	disarmed --Arm--> arming --(registrations modified)--> armed
//	armed --(poller or Wake wins the CAS)--> fired --(fire starts)--> disarmed
//	any --Close--> closed
//
// While arming, nothing fires: the poller adds what it sees to the state,
// and Arm, its registrations modified, fires with that, or with Woken, or
// else moves to armed. So Arm's modifications never race those of the
// next Arm, which only a fire can call. Of the parties racing to end an
// armed wait (the poller for the source, the poller for the watch, Wake),
// the one whose CAS from armed to fired succeeds starts the fire's
// fire; the others' events are dropped (their registrations stay armed
// until the next Arm modifies them, whose generation they do not carry).
// Arm moves to armed and then checks the woken flag; Wake sets the flag
// and then tries the CAS: a Wake racing an Arm is never lost. The fire
// moves fired to disarmed before calling fire, and Close moves any phase
// to closed: a fire that has not started when Close returns never does.
//
// Fires on the poller's goroutine (Inline): a fire on a goroutine of its
// own costs more than the relay it makes. Starting the goroutine wakes
// another thread, which finds nothing to do and sleeps again: with
// 5,000 streams pinging, a fire took 168 µs of CPU, against 87 µs with
// one thread (GOMAXPROCS=1), which never wakes another. So the poller
// runs the fires of a small batch (maxInline) itself, one after the
// other, for the Waits that allow it (SetInline). A fire that would wait
// (a read finding no bytes, a write finding the socket full) must first
// call Handoff: the poller's part goes on on a new goroutine (a runner),
// with the rest of the batch, and the fire keeps the old one, to wait
// as any goroutine does. A larger batch is a burst, whose fires run on
// goroutines of their own, so that every thread relays it.

const (
	phaseDisarmed = iota
	phaseArming
	phaseArmed
	phaseFired
	phaseClosed
)

// maxEvents is how many events one epoll_wait returns at most.
const maxEvents = 128

// maxInline is the most fires of one batch the poller runs on its own
// goroutine; a larger batch's run on goroutines of their own.
const maxInline = 8

// watchBit marks, in an event's slot, the watch's registration.
const watchBit = 1 << 31

// pack makes a state word: the generation in the high 32 bits, the
// events seen while arming in bits 8-15, the phase in the low byte.
func pack(gen uint32, seen Event, phase uint8) uint64 {
	return uint64(gen)<<32 | uint64(seen)<<8 | uint64(phase)
}

func genOf(s uint64) uint32              { return uint32(s >> 32) }
func seenOf(s uint64) Event              { return Event(s >> 8) }
func phaseOf(s uint64) uint8             { return uint8(s) }
func withSeen(s uint64, ev Event) uint64 { return s | uint64(ev)<<8 }

// lastGen numbers the Arms of the process; 0 is no Arm's (it is the
// generation of a Wait's first, disarmed registration).
var lastGen atomic.Uint32

func nextGen() uint32 {
	for {
		if g := lastGen.Add(1); g != 0 {
			return g
		}
	}
}

var errArmed = errors.New("poll: Arm of a wait already armed")

type sys struct {
	fire  func(Event)
	slot  uint32
	state atomic.Uint64
	woken atomic.Bool
	// inlineOK is SetInline's; running is the runner whose goroutine
	// runs the fire now (Handoff's to find), nil when none does: set
	// before an inline fire, cleared by the fire's Arm once it has
	// modified the registrations (no later fire runs before that).
	inlineOK atomic.Bool
	running  atomic.Pointer[runner]
	// The watch is armed once, not at every Arm (see modify): watchGen is
	// the generation its registration carries (0: not armed yet), and
	// watchFired says an event of it came, which disabled it (one-shot):
	// the next Arm arms it again, and the kernel, level-triggered, reports
	// the hang-up again.
	watchGen   atomic.Uint32
	watchFired atomic.Bool
	// mu makes Arm's and Close's epoll_ctl calls one at a time, so that
	// no Arm modifies a registration after Close removed it (the
	// connection may be in a new Wait by then).
	mu         sync.Mutex
	src, watch reg // watch.rc is nil without a watch
	// hasWatch says watch is registered: what collect reads, which
	// SetWatch may race (w.mu guards watch itself).
	hasWatch atomic.Bool
}

// reg is a connection's registration.
type reg struct {
	rc  syscall.RawConn
	op  int
	ev  syscall.EpollEvent
	err error
	// ctl is Control's function, bound once: a closure per call would
	// allocate.
	ctl func(fd uintptr)
}

func (r *reg) init(rc syscall.RawConn, epfd int) {
	r.rc = rc
	r.ctl = func(fd uintptr) {
		r.err = epollCtl(epfd, r.op, int(fd), &r.ev)
	}
}

// epollCtl is syscall.EpollCtl as a raw system call (see the top).
func epollCtl(epfd, op, fd int, ev *syscall.EpollEvent) error {
	_, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// epollWaitNow is epoll_wait with a timeout of 0 as a raw system call:
// it returns the events ready, without waiting (epoll_pwait with no
// signal mask is epoll_wait, and exists on every architecture).
func epollWaitNow(epfd int, evs []syscall.EpollEvent) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
	return int(n), e
}

// do makes an epoll_ctl of op for r, with events and the data of slot
// and gen (watch: r is the watch's).
func (r *reg) do(op int, events uint32, slot, gen uint32, watch bool) error {
	if watch {
		slot |= watchBit
	}
	// The data is the 64 bits from Fd on, whatever the architecture pads
	// before them (arm64 and others align them to 8 bytes); the kernel
	// hands them back as they were set.
	r.op, r.ev.Events, r.ev.Fd, r.ev.Pad = op, events, int32(slot), int32(gen)
	r.err = nil
	if err := r.rc.Control(r.ctl); err != nil {
		return fmt.Errorf("poll: %w", err)
	}
	if r.err != nil {
		return fmt.Errorf("poll: %w", os.NewSyscallError("epoll_ctl", r.err))
	}
	return nil
}

const (
	srcEvents   = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT
	watchEvents = syscall.EPOLLRDHUP | syscall.EPOLLONESHOT
	// A registration is added disarmed: an event for a hang-up or an error
	// (which the kernel reports whatever the mask) is then dropped, and
	// disables it until Arm.
	addEvents = syscall.EPOLLONESHOT
)

func newWait(source, watch syscall.Conn, fire func(Event)) (*Wait, error) {
	p, err := getPoller()
	if err != nil {
		return nil, err
	}
	w := &Wait{}
	w.fire = fire
	rc, err := source.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("poll: %w", err)
	}
	w.src.init(rc, p.epfd)
	if watch != nil {
		rc, err := watch.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("poll: %w", err)
		}
		w.watch.init(rc, p.epfd)
	}
	w.slot = p.alloc(w)
	if err := w.src.do(syscall.EPOLL_CTL_ADD, addEvents, w.slot, 0, false); err != nil {
		p.release(w.slot)
		return nil, err
	}
	if w.watch.rc != nil {
		if err := w.watch.do(syscall.EPOLL_CTL_ADD, addEvents, w.slot, 0, true); err != nil {
			w.src.do(syscall.EPOLL_CTL_DEL, 0, 0, 0, false)
			p.release(w.slot)
			return nil, err
		}
		w.hasWatch.Store(true)
	}
	return w, nil
}

func (w *Wait) setWatch(watch syscall.Conn) error {
	rc, err := watch.SyscallConn()
	if err != nil {
		return fmt.Errorf("poll: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if phaseOf(w.state.Load()) == phaseClosed {
		return ErrClosed
	}
	if w.watch.rc != nil {
		return errors.New("poll: SetWatch of a wait that has a watch")
	}
	w.watch.init(rc, thePoller.epfd)
	if err := w.watch.do(syscall.EPOLL_CTL_ADD, addEvents, w.slot, 0, true); err != nil {
		w.watch = reg{}
		return err
	}
	w.hasWatch.Store(true)
	return nil
}

func (w *Wait) arm() error {
	g := nextGen()
	for {
		s := w.state.Load()
		switch phaseOf(s) {
		case phaseClosed:
			return ErrClosed
		case phaseDisarmed:
		default:
			return errArmed
		}
		if w.state.CompareAndSwap(s, pack(g, 0, phaseArming)) {
			break
		}
	}
	// Woken already: the fire is due whatever the connections say.
	if !w.woken.Load() {
		if err := w.modify(g); err != nil {
			for {
				s := w.state.Load()
				if phaseOf(s) == phaseClosed {
					return ErrClosed
				}
				if w.state.CompareAndSwap(s, pack(g, 0, phaseDisarmed)) {
					return err
				}
			}
		}
	}
	// The fire that armed is done with the connections: a Handoff from
	// now on is some later fire's, on a goroutine of its own.
	w.running.Store(nil)
	for {
		s := w.state.Load()
		if phaseOf(s) == phaseClosed {
			return ErrClosed
		}
		if ev := seenOf(s); ev != 0 {
			if w.woken.Load() {
				ev |= Woken
			}
			if w.state.CompareAndSwap(s, pack(g, 0, phaseFired)) {
				go w.run(g, ev)
				return nil
			}
			continue
		}
		if w.state.CompareAndSwap(s, pack(g, 0, phaseArmed)) {
			break
		}
	}
	// Armed, then the flag: a Wake that saw arming left the fire to us.
	if w.woken.Load() {
		w.end(g, Woken)
	}
	return nil
}

// modify arms the registrations for the Arm of generation g.
func (w *Wait) modify(g uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if phaseOf(w.state.Load()) == phaseClosed {
		return ErrClosed
	}
	if err := w.src.do(syscall.EPOLL_CTL_MOD, srcEvents, w.slot, g, false); err != nil {
		return err
	}
	// The watch stays armed from one Arm to the next until its event: a
	// hang-up is for good, so its event ends whichever Arm is current when
	// it comes (collect), and one that comes while no Arm waits is seen
	// again when this re-arms it. One epoll_ctl per Arm instead of two.
	if w.watch.rc != nil && (w.watchGen.Load() == 0 || w.watchFired.Swap(false)) {
		wg := nextGen()
		w.watchGen.Store(wg)
		if err := w.watch.do(syscall.EPOLL_CTL_MOD, watchEvents, w.slot, wg, true); err != nil {
			w.watchGen.Store(0)
			return err
		}
	}
	return nil
}

// end ends the Arm of generation g with ev: it fires, on a goroutine of
// its own, if armed, or adds ev to what Arm fires with if arming. It
// reports whether it fired.
func (w *Wait) end(g uint32, ev Event) bool {
	ev, ok := w.take(g, ev)
	if ok {
		go w.run(g, ev)
	}
	return ok
}

// take is end without the fire: it reports whether the caller is to run
// it, with the events returned.
func (w *Wait) take(g uint32, ev Event) (Event, bool) {
	for {
		s := w.state.Load()
		if genOf(s) != g {
			return 0, false
		}
		switch phaseOf(s) {
		case phaseArmed:
			if w.woken.Load() {
				ev |= Woken
			}
			if w.state.CompareAndSwap(s, pack(g, 0, phaseFired)) {
				return ev, true
			}
		case phaseArming:
			if w.state.CompareAndSwap(s, withSeen(s, ev)) {
				return 0, false
			}
		default:
			return 0, false
		}
	}
}

// run runs a fire the caller took (take).
func (w *Wait) run(g uint32, ev Event) {
	if w.state.CompareAndSwap(pack(g, 0, phaseFired), pack(g, 0, phaseDisarmed)) {
		w.fire(ev)
	}
}

// runInline runs a fire the runner r took on r's goroutine.
func (w *Wait) runInline(r *runner, g uint32, ev Event) {
	if w.state.CompareAndSwap(pack(g, 0, phaseFired), pack(g, 0, phaseDisarmed)) {
		w.running.Store(r)
		w.fire(ev | Inline)
		w.running.CompareAndSwap(r, nil) // if the fire did not Arm
	}
}

func (w *Wait) setInline() { w.inlineOK.Store(true) }

func (w *Wait) handoff() {
	if r := w.running.Swap(nil); r != nil {
		r.handoff()
	}
}

func (w *Wait) wake() bool {
	w.woken.Store(true)
	s := w.state.Load()
	if phaseOf(s) != phaseArmed {
		return false
	}
	return w.end(genOf(s), Woken)
}

func (w *Wait) close() {
	for {
		s := w.state.Load()
		if phaseOf(s) == phaseClosed {
			return
		}
		if w.state.CompareAndSwap(s, pack(0, 0, phaseClosed)) {
			break
		}
	}
	w.mu.Lock()
	// Errors are for connections closed already, whose registrations the
	// kernel dropped.
	w.src.do(syscall.EPOLL_CTL_DEL, 0, 0, 0, false)
	if w.watch.rc != nil {
		w.watch.do(syscall.EPOLL_CTL_DEL, 0, 0, 0, true)
	}
	w.mu.Unlock()
	thePoller.release(w.slot)
}

type poller struct {
	epfd int
	// file and rc are the epoll instance as the runtime's poller knows it;
	// file is kept so that its finalizer never closes the descriptor.
	file  *os.File
	rc    syscall.RawConn
	mu    sync.Mutex
	slots []*Wait
	free  []uint32
	// spare is a runner whose goroutine has ended, for the next handoff:
	// a stream's end hands off (its last writes may wait), and a runner
	// with its buffers is some 3.6 KB, which each end would otherwise
	// allocate anew. One is enough: a handoff happens on the goroutine of
	// the one runner taking events.
	spare *runner
}

var (
	pollerOnce sync.Once
	thePoller  *poller
	pollerErr  error
)

func getPoller() (*poller, error) {
	pollerOnce.Do(func() {
		fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			pollerErr = fmt.Errorf("poll: %w", os.NewSyscallError("epoll_create1", err))
			return
		}
		// Non-blocking, an *os.File registers the descriptor with the
		// runtime's network poller.
		if err := syscall.SetNonblock(fd, true); err != nil {
			syscall.Close(fd)
			pollerErr = fmt.Errorf("poll: %w", os.NewSyscallError("setnonblock", err))
			return
		}
		f := os.NewFile(uintptr(fd), "poll")
		rc, err := f.SyscallConn()
		if err != nil {
			f.Close()
			pollerErr = fmt.Errorf("poll: %w", err)
			return
		}
		p := &poller{epfd: fd, file: f, rc: rc}
		thePoller = p
		go newRunner(p).loop(nil)
	})
	return thePoller, pollerErr
}

// alloc gives w a slot.
func (p *poller) alloc(w *Wait) uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		i := p.free[n-1]
		p.free = p.free[:n-1]
		p.slots[i] = w
		return i
	}
	if uint64(len(p.slots)) >= watchBit {
		// Two billion waits need as many descriptors, which no system
		// grants.
		panic("poll: too many waits")
	}
	p.slots = append(p.slots, w)
	return uint32(len(p.slots) - 1)
}

func (p *poller) release(i uint32) {
	p.mu.Lock()
	p.slots[i] = nil
	p.free = append(p.free, i)
	p.mu.Unlock()
}

// runner is the goroutine that takes the events, one at a time: the
// first, made by getPoller, until a fire it runs hands off (Handoff),
// then the one that fire made, and so on.
type runner struct {
	p         *poller
	harvestFD func(fd uintptr) bool // harvest, bound once
	evs       []syscall.EpollEvent
	n         int // events in evs, from the last harvest
	ends      []ending
	// batch is the batch being fired and next the index of its first
	// fire not yet run: a handoff gives batch[next:] to the next runner.
	batch []ending
	next  int
	gone  bool // handed off: the runner ends once its fire returns
}

func newRunner(p *poller) *runner {
	r := &runner{p: p, evs: make([]syscall.EpollEvent, maxEvents), ends: make([]ending, 0, maxEvents)}
	r.harvestFD = r.harvest
	return r
}

// loop fires what a handoff passed on, then takes the events as they
// come: the runtime's poller wakes it when the epoll instance has some
// (Read calls harvest, and waits while it returns false). The fires run
// outside Read, which holds the epoll file's read lock: the next runner
// must be able to take it while a fire that handed off waits.
func (r *runner) loop(passed []ending) {
	r.fire(passed)
	for !r.gone {
		if err := r.p.rc.Read(r.harvestFD); err != nil {
			// The descriptor is the poller's own and never closed: only a
			// bug gets here, and every parked stream would hang.
			panic(fmt.Sprintf("poll: waiting on the epoll instance: %v", err))
		}
		r.ends = r.p.collect(r.evs[:r.n], r.ends[:0])
		r.fire(r.ends)
	}
	// Handed off, and the fire that did it has returned: nothing refers
	// to r any more (a wait's running is cleared before its fire returns).
	r.p.putSpare(r)
}

// putSpare keeps r, whose goroutine is ending, for the next handoff.
func (p *poller) putSpare(r *runner) {
	clear(r.ends[:cap(r.ends)]) // the waits of the batch it handed off
	r.ends, r.n, r.batch, r.next, r.gone = r.ends[:0], 0, nil, 0, false
	p.mu.Lock()
	p.spare = r
	p.mu.Unlock()
}

// takeRunner returns the spare runner, or a new one.
func (p *poller) takeRunner() *runner {
	p.mu.Lock()
	r := p.spare
	p.spare = nil
	p.mu.Unlock()
	if r == nil {
		r = newRunner(p)
	}
	return r
}

// harvest takes the events ready into evs; it reports false when there
// were none (the runtime's poller then waits for the next: its
// registration is edge-triggered, and any event that comes later is a
// new edge). Read calls it first without waiting, so events left from a
// full batch are taken by the next loop. That first call is needed even
// after a batch that took every event ready: Read begins by resetting the
// descriptor's readiness in the runtime (prepareRead), which forgets an
// edge that came while the last batch fired (TestEventDuringFire).
func (r *runner) harvest(fd uintptr) bool {
	n, e := epollWaitNow(int(fd), r.evs)
	for e == syscall.EINTR {
		// Not a wait: events ready now may make no edge again.
		n, e = epollWaitNow(int(fd), r.evs)
	}
	if e != 0 {
		panic(os.NewSyscallError("epoll_wait", e))
	}
	r.n = max(n, 0)
	return n > 0
}

// ending is the events of a batch for one Arm of a wait.
type ending struct {
	w   *Wait
	gen uint32
	ev  Event
}

// collect appends to ends the Arms that evs are events of; a wait whose
// source and watch both have an event in evs fires once, with both.
func (p *poller) collect(evs []syscall.EpollEvent, ends []ending) []ending {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range evs {
		slot, gen := uint32(evs[i].Fd), uint32(evs[i].Pad)
		ev := Readable
		watch := slot&watchBit != 0
		if watch {
			slot &^= watchBit
			ev = Hangup
		}
		if slot >= uint32(len(p.slots)) {
			continue
		}
		w := p.slots[slot]
		if w == nil {
			continue
		}
		if watch {
			// Armed across Arms (modify): its generation is its own, and
			// its event is for the Arm current now. The flag first: an
			// Arm that begins after this load re-arms the watch.
			if gen == 0 || gen != w.watchGen.Load() {
				continue
			}
			w.watchFired.Store(true)
			gen = genOf(w.state.Load())
		}
		merged := false
		if w.hasWatch.Load() {
			for j := range ends {
				if ends[j].w == w && ends[j].gen == gen {
					ends[j].ev |= ev
					merged = true
					break
				}
			}
		}
		if !merged {
			ends = append(ends, ending{w, gen, ev})
		}
	}
	return ends
}

// fire ends the Arms of a batch: on this goroutine, one after the other,
// for a small batch's waits that allow it; on goroutines of their own
// otherwise.
func (r *runner) fire(batch []ending) {
	inline := len(batch) <= maxInline
	r.batch = batch
	for r.next = 0; r.next < len(r.batch); {
		e := r.batch[r.next]
		r.batch[r.next] = ending{}
		r.next++
		ev, ok := e.w.take(e.gen, e.ev)
		switch {
		case !ok:
		case inline && e.w.inlineOK.Load():
			e.w.runInline(r, e.gen, ev)
			if r.gone {
				return // the rest is the next runner's
			}
		default:
			go e.w.run(e.gen, ev)
		}
	}
	r.batch = nil
}

// handoff starts the next runner (the spare, or a new one) with what is
// left of the batch: the fire running on r's goroutine is about to wait.
func (r *runner) handoff() {
	r.gone = true
	passed := slices.Clone(r.batch[r.next:])
	r.batch = nil
	go r.p.takeRunner().loop(passed)
}
