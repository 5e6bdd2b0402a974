package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sseBackendCommand runs the open-streams scenario's backend: every GET is
// answered with an SSE stream (text/event-stream, headers flushed at once)
// held open until the client goes. It prints "backend ADDR", then "ready",
// and obeys commands on stdin, one per line, each answered with one line:
//
//	ping DURATION   every stream sends a ping event every DURATION, each at a
//	                phase of its own so that the events are spread evenly;
//	                0 stops them ("ok")
//	mark            every open stream sends one "mark" event now ("ok")
//	count           "count N": the streams open
//
// It exits when stdin closes or on SIGTERM.
func sseBackendCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tetherbench sse-backend", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b := newSSEBackend()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Printf("backend %s\nready\n", ln.Addr())

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for {
		var line string
		select {
		case <-ctx.Done():
			return nil
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			line = l
		}
		fmt.Println(b.command(line))
	}
}

// sseBackend holds the streams. What they send is one state for all,
// replaced as a whole on each command; a stream waits on the state it
// last saw, whose changed channel closes when the next one replaces it.
type sseBackend struct {
	mu    sync.Mutex // serializes replacements of state
	state atomic.Pointer[sseState]
	open  atomic.Int64
}

type sseState struct {
	every   time.Duration // between two pings of a stream; 0: none
	marks   int           // mark events asked for so far
	changed chan struct{} // closed when the next state replaces this one
}

func newSSEBackend() *sseBackend {
	b := &sseBackend{}
	b.state.Store(&sseState{changed: make(chan struct{})})
	return b
}

// command runs one stdin command and returns its answer.
func (b *sseBackend) command(line string) string {
	f := strings.Fields(line)
	switch {
	case len(f) == 2 && f[0] == "ping":
		every, err := time.ParseDuration(f[1])
		if err != nil || every < 0 {
			return "error bad duration " + strconv.Quote(f[1])
		}
		b.update(func(s *sseState) { s.every = every })
		return "ok"
	case len(f) == 1 && f[0] == "mark":
		b.update(func(s *sseState) { s.marks++ })
		return "ok"
	case len(f) == 1 && f[0] == "count":
		return fmt.Sprintf("count %d", b.open.Load())
	}
	return "error unknown command " + strconv.Quote(line)
}

func (b *sseBackend) update(change func(*sseState)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.state.Load()
	next := &sseState{every: old.every, marks: old.marks, changed: make(chan struct{})}
	change(next)
	b.state.Store(next)
	close(old.changed)
}

const (
	ssePing = "event: ping\ndata: {}\n\n"
	sseMark = "event: mark\ndata: {}\n\n"
)

func (b *sseBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "GET streams only", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	b.open.Add(1)
	defer b.open.Add(-1)
	st := b.state.Load()
	marks := st.marks // a stream gets the marks asked for after it opened
	var (
		every time.Duration
		timer *time.Timer
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if st.every != every {
			every = st.every
			if timer != nil {
				timer.Stop()
				timer = nil
			}
			if every > 0 {
				timer = time.NewTimer(rand.N(every)) // the stream's own phase
			}
		}
		var tick <-chan time.Time
		if timer != nil {
			tick = timer.C
		}
		var out string
		select {
		case <-r.Context().Done():
			return
		case <-tick:
			out = ssePing
			timer.Reset(every)
		case <-st.changed:
			st = b.state.Load()
			for ; marks < st.marks; marks++ {
				out += sseMark
			}
		}
		if out == "" {
			continue
		}
		if _, err := io.WriteString(w, out); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}
