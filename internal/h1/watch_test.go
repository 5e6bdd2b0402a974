package h1

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// noneWaiting reports whether no connection of s has a request the watch
// waits on: the requests whose answers were read may still be ending.
func noneWaiting(s *Server) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.mu.Lock()
		w := c.watch
		c.mu.Unlock()
		if w == watchWaiting {
			return false
		}
	}
	return true
}

// TestWatchTimerIsTheServers: quick requests on several connections arm
// the server's one watch timer once, not once per request or per
// connection; a tick that finds no request running lets it rest, and the
// next request arms it again. The timer's delay is an hour: the test
// makes the ticks.
func TestWatchTimerIsTheServers(t *testing.T) {
	addr, s := startH1(t, http.HandlerFunc(echo), func(_ *http.Server, s *Server) {
		s.watchDelay = time.Hour
	})
	conns := make([]net.Conn, 4)
	readers := make([]*bufio.Reader, len(conns))
	for i := range conns {
		conns[i] = dial(t, addr)
		readers[i] = bufio.NewReader(conns[i])
	}
	for range 25 {
		for i, c := range conns {
			quickRequests(t, c, readers[i], 1)
		}
	}
	if n := s.watchArms.Load(); n != 1 {
		t.Errorf("100 requests on 4 connections set the watch timer %d times, want once", n)
	}
	if !s.watchArmed.Load() {
		t.Error("the watch timer is not armed after requests")
	}

	waitFor(func() bool { return noneWaiting(s) })
	s.watchTick()
	if s.watchArmed.Load() {
		t.Error("a tick with no request running left the watch timer armed")
	}
	if n := s.watchArms.Load(); n != 1 {
		t.Errorf("the watch timer was set %d times, want once: a resting timer is not set again", n)
	}

	quickRequests(t, conns[0], readers[0], 1)
	if !s.watchArmed.Load() || s.watchArms.Load() != 2 {
		t.Errorf("after a request on a resting server: armed %v, set %d times; want armed, set twice", s.watchArmed.Load(), s.watchArms.Load())
	}
}

// TestWatchAfterTwoTicks: a request is watched at the second tick that
// sees it running (or, its body still unread then, once the body is
// read), and its client leaving then cancels it; with only watched
// requests running the timer rests.
func TestWatchAfterTwoTicks(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan struct{})
	addr, s := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			echo(w, r)
			return
		}
		io.ReadAll(r.Body)
		w.(http.Flusher).Flush()
		started <- struct{}{}
		<-r.Context().Done()
		cancelled <- struct{}{}
	}), func(_ *http.Server, s *Server) {
		s.watchDelay = time.Hour
	})
	watchOf := func(c *conn) watchState {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.watch
	}
	// connOf is the server's connection that has served n requests.
	connOf := func(t *testing.T, n uint64) *conn {
		var found *conn
		waitFor(func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			for c := range s.conns {
				c.mu.Lock()
				seq := c.reqSeq
				c.mu.Unlock()
				if seq == n {
					found = c
					return true
				}
			}
			return false
		})
		if found == nil {
			t.Fatalf("no connection has served %d requests", n)
		}
		return found
	}
	leave := func(t *testing.T, client net.Conn) {
		t.Helper()
		client.Close()
		select {
		case <-cancelled:
		case <-time.After(20 * time.Second):
			t.Fatal("the request's context was not cancelled when its client left")
		}
	}

	for _, tc := range []struct {
		name string
		body bool
	}{{"no body", false}, {"body read after the ticks", true}} {
		t.Run(tc.name, func(t *testing.T) {
			// The connection of the case before is gone.
			waitFor(func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.conns) == 0 })
			client := dial(t, addr)
			br := bufio.NewReader(client)
			// The quick request arms the timer: the stream is not the
			// request that armed it, which counts as seen already.
			quickRequests(t, client, br, 1)
			if tc.body {
				io.WriteString(client, "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
			} else {
				io.WriteString(client, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
				<-started
			}
			c := connOf(t, 2)
			if tc.body {
				waitFor(func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.socketRead })
			}
			s.watchTick()
			if w := watchOf(c); w != watchWaiting {
				t.Fatalf("after the first tick that saw the request: watch state %d, want it still waiting", w)
			}
			if !s.watchArmed.Load() {
				t.Fatal("the timer rests while a request waits for its second tick")
			}
			s.watchTick()
			if tc.body {
				if w := watchOf(c); w != watchAfterBody {
					t.Fatalf("after the second tick, the body unread: watch state %d, want it to start after the body", w)
				}
				io.WriteString(client, "cd")
				<-started
			}
			if w := watchOf(c); w != watchReading {
				t.Fatalf("after the second tick: watch state %d, want the connection watched", w)
			}
			if s.watchArmed.Load() {
				t.Error("the timer is armed with only a watched request running")
			}
			leave(t, client)
		})
	}
}

// TestIdleServerWatchRests: once requests stop, the watch timer stops
// ticking (here with a delay of a millisecond).
func TestIdleServerWatchRests(t *testing.T) {
	addr, s := startH1(t, http.HandlerFunc(echo), func(_ *http.Server, s *Server) {
		s.watchDelay = time.Millisecond
	})
	for i := range 4 {
		c := dial(t, addr)
		quickRequests(t, c, bufio.NewReader(c), 10)
		fmt.Fprintf(c, "GET /last/%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", i)
		io.ReadAll(c)
	}
	waitFor(func() bool { return !s.watchArmed.Load() })
	if s.watchArmed.Load() {
		t.Fatal("the watch timer still ticks on an idle server")
	}
}
