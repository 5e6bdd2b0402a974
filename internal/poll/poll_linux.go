package poll

import (
	"errors"
	"fmt"
	"os"
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
// connection. Every epoll_ctl runs inside RawConn.Control, which holds
// the descriptor open: a Close of the connection in the meantime cannot
// make its number name another file under us.
//
// An event's data cannot be a pointer to its Wait (the garbage collector
// does not see the kernel's copy), so it is the Wait's slot in a table,
// a bit for source or watch, and the generation of the Arm that armed the
// registration. Generations come from one counter for the process, so an
// event left from an earlier Arm of the Wait, or from a closed Wait whose
// slot another now holds, carries a generation that is not the Wait's
// current one, and is dropped.
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
// goroutine; the others' events are dropped (their registrations stay
// armed until the next Arm modifies them, whose generation they do not
// carry). Arm moves to armed and then checks the woken flag; Wake sets
// the flag and then tries the CAS: a Wake racing an Arm is never lost.
// The fire's goroutine moves fired to disarmed before calling fire, and
// Close moves any phase to closed: a fire that has not started when Close
// returns never does.

const (
	phaseDisarmed = iota
	phaseArming
	phaseArmed
	phaseFired
	phaseClosed
)

// maxEvents is how many events one epoll_wait returns at most.
const maxEvents = 128

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
	// mu makes Arm's and Close's epoll_ctl calls one at a time, so that
	// no Arm modifies a registration after Close removed it (the
	// connection may be in a new Wait by then).
	mu         sync.Mutex
	src, watch reg // watch.rc is nil without a watch
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
	}
	return w, nil
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
	if w.watch.rc != nil {
		return w.watch.do(syscall.EPOLL_CTL_MOD, watchEvents, w.slot, g, true)
	}
	return nil
}

// end ends the Arm of generation g with ev: it fires if armed, or adds
// ev to what Arm fires with if arming. It reports whether it fired.
func (w *Wait) end(g uint32, ev Event) bool {
	for {
		s := w.state.Load()
		if genOf(s) != g {
			return false
		}
		switch phaseOf(s) {
		case phaseArmed:
			if w.woken.Load() {
				ev |= Woken
			}
			if w.state.CompareAndSwap(s, pack(g, 0, phaseFired)) {
				go w.run(g, ev)
				return true
			}
		case phaseArming:
			if w.state.CompareAndSwap(s, withSeen(s, ev)) {
				return false
			}
		default:
			return false
		}
	}
}

// run is a fire's goroutine.
func (w *Wait) run(g uint32, ev Event) {
	if w.state.CompareAndSwap(pack(g, 0, phaseFired), pack(g, 0, phaseDisarmed)) {
		w.fire(ev)
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
	file      *os.File
	rc        syscall.RawConn
	harvestFD func(fd uintptr) bool // harvest, bound once
	evs       []syscall.EpollEvent
	ends      []ending
	mu        sync.Mutex
	slots     []*Wait
	free      []uint32
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
		p := &poller{epfd: fd, file: f, rc: rc, evs: make([]syscall.EpollEvent, maxEvents), ends: make([]ending, 0, maxEvents)}
		p.harvestFD = p.harvest
		thePoller = p
		go p.loop()
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

// loop takes the events as they come: the runtime's poller wakes it when
// the epoll instance has some (Read calls harvest, and waits while it
// returns false).
func (p *poller) loop() {
	for {
		if err := p.rc.Read(p.harvestFD); err != nil {
			// The descriptor is the poller's own and never closed: only a
			// bug gets here, and every parked stream would hang.
			panic(fmt.Sprintf("poll: waiting on the epoll instance: %v", err))
		}
	}
}

// harvest takes the events ready and ends the Arms they are for; it
// reports false when it took them all (the runtime's poller then waits
// for the next). The runtime's registration is edge-triggered: a full
// batch, which may have left events behind, returns true, and Read calls
// it again.
func (p *poller) harvest(fd uintptr) bool {
	n, e := epollWaitNow(int(fd), p.evs)
	if e == syscall.EINTR {
		return true
	}
	if e != 0 {
		panic(os.NewSyscallError("epoll_wait", e))
	}
	if n <= 0 {
		return false
	}
	p.ends = p.dispatch(p.evs[:n], p.ends)
	// A batch short of full took every event ready: one that comes later
	// is a new edge for the runtime's poller.
	return n == len(p.evs)
}

// ending is the events of a batch for one Arm of a wait.
type ending struct {
	w   *Wait
	gen uint32
	ev  Event
}

// dispatch ends the Arms that evs are events of, ends being a buffer for
// it (returned for the next batch); a wait whose source and watch both
// have an event in evs fires once, with both.
func (p *poller) dispatch(evs []syscall.EpollEvent, ends []ending) []ending {
	p.mu.Lock()
	for i := range evs {
		slot, gen := uint32(evs[i].Fd), uint32(evs[i].Pad)
		ev := Readable
		if slot&watchBit != 0 {
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
		merged := false
		if w.watch.rc != nil {
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
	p.mu.Unlock()
	for i := range ends {
		ends[i].w.end(ends[i].gen, ends[i].ev)
		ends[i] = ending{}
	}
	return ends[:0]
}
