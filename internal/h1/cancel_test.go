package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// keptByConn reports whether ctx's connection keeps an f for AfterCancel,
// rather than the context.
func keptByConn(ctx context.Context) bool {
	c, ok := ctx.Value(connKey{}).(*conn)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.onCancel != nil
}

// TestAfterCancel: f runs, after the request's context is cancelled, when
// the client leaves and when the request ends; stop before that keeps it
// from running, and reports it; a context already cancelled runs it at
// once; contexts that are not a fast request's own get context.AfterFunc.
func TestAfterCancel(t *testing.T) {
	type result struct {
		kept    bool  // by the connection, not the context
		err     error // the context's when f ran
		stopped bool  // stop's answer after f ran, or stop's first
		again   bool  // stop's second answer
	}
	results := make(chan result, 1)
	// ran gets the context's error when f runs.
	ran := make(chan error, 2)
	errBase := errors.New("base gone")
	base, cancelBase := context.WithCancelCause(context.Background())
	defer cancelBase(nil)
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var res result
		switch r.URL.Path {
		case "/leave", "/end", "/cancelled":
			stop := AfterCancel(ctx, func() { ran <- ctx.Err() })
			res.kept = keptByConn(ctx)
			if r.URL.Path == "/end" {
				results <- res
				return // f runs as the request ends
			}
			w.(http.Flusher).Flush()
			<-ctx.Done()
			select {
			case res.err = <-ran:
			case <-time.After(20 * time.Second):
			}
			res.stopped = stop()
		case "/stop":
			stop := AfterCancel(ctx, func() { ran <- ctx.Err() })
			res.kept = keptByConn(ctx)
			res.stopped, res.again = stop(), stop()
			res.kept = res.kept && !keptByConn(ctx)
		case "/derived":
			type key struct{}
			derived := context.WithValue(ctx, key{}, 1)
			AfterCancel(derived, func() { ran <- derived.Err() })
			res.kept = keptByConn(ctx)
			results <- res
			return
		case "/twice":
			AfterCancel(ctx, func() { ran <- ctx.Err() })
			AfterCancel(ctx, func() { ran <- ctx.Err() })
			res.kept = keptByConn(ctx)
			results <- res
			return
		}
		results <- res
	}), func(std *http.Server, s *Server) {
		std.BaseContext = func(net.Listener) context.Context { return base }
		s.watchDelay = time.Millisecond
	})
	get := func(t *testing.T, path string) (net.Conn, *bufio.Reader) {
		t.Helper()
		c := dial(t, addr)
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		return c, bufio.NewReader(c)
	}
	answer := func(t *testing.T, br *bufio.Reader) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
	}
	fRan := func(t *testing.T) error {
		t.Helper()
		select {
		case err := <-ran:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("f did not run")
			return nil
		}
	}

	t.Run("client leaves", func(t *testing.T) {
		c, br := get(t, "/leave")
		// The head is flushed once f is registered.
		if _, err := http.ReadResponse(br, nil); err != nil {
			t.Fatal(err)
		}
		c.Close()
		res := <-results
		if !res.kept || res.err == nil || res.stopped {
			t.Errorf("kept by the connection %v, context's error when f ran %v, stop %v; want true, an error, false", res.kept, res.err, res.stopped)
		}
	})
	t.Run("request ends", func(t *testing.T) {
		_, br := get(t, "/end")
		answer(t, br)
		res := <-results
		if err := fRan(t); !res.kept || err == nil {
			t.Errorf("kept by the connection %v, context's error when f ran %v; want true and an error", res.kept, err)
		}
	})
	t.Run("stopped", func(t *testing.T) {
		_, br := get(t, "/stop")
		answer(t, br)
		if res := <-results; !res.kept || !res.stopped || res.again {
			t.Errorf("kept then dropped by the connection %v, stop %v then %v; want true, true, false", res.kept, res.stopped, res.again)
		}
	})
	t.Run("derived context", func(t *testing.T) {
		_, br := get(t, "/derived")
		answer(t, br)
		res := <-results
		if err := fRan(t); res.kept || err == nil {
			t.Errorf("kept by the connection %v, context's error when f ran %v; want context.AfterFunc, and an error", res.kept, err)
		}
	})
	t.Run("twice", func(t *testing.T) {
		_, br := get(t, "/twice")
		answer(t, br)
		res := <-results
		if err1, err2 := fRan(t), fRan(t); !res.kept || err1 == nil || err2 == nil {
			t.Errorf("kept by the connection %v, contexts' errors when the fs ran %v, %v; want true and errors", res.kept, err1, err2)
		}
	})
	t.Run("already cancelled", func(t *testing.T) {
		cancelBase(errBase)
		_, br := get(t, "/cancelled")
		res := <-results
		answer(t, br)
		if res.kept || res.err == nil || res.stopped {
			t.Errorf("kept by the connection %v, context's error when f ran %v, stop %v; want false, an error, false", res.kept, res.err, res.stopped)
		}
	})
}

// TestAfterCancelStopRacesCancel: stop races the client leaving; f runs
// exactly when stop reports it did not stop it.
func TestAfterCancelStopRacesCancel(t *testing.T) {
	type result struct {
		stopped bool
		ran     chan struct{}
	}
	results := make(chan result, 1)
	watched, stopNow := make(chan struct{}), make(chan struct{})
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran := make(chan struct{})
		stop := AfterCancel(r.Context(), func() { close(ran) })
		c := r.Context().Value(connKey{}).(*conn)
		waitFor(func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.watch == watchReading })
		watched <- struct{}{}
		<-stopNow
		results <- result{stop(), ran}
	}), func(_ *http.Server, s *Server) { s.watchDelay = time.Millisecond })
	var all []result
	stops := 0
	for range 50 {
		c := dial(t, addr)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		<-watched
		go c.Close()
		stopNow <- struct{}{}
		res := <-results
		all = append(all, res)
		if res.stopped {
			stops++
			continue
		}
		select {
		case <-res.ran:
		case <-time.After(20 * time.Second):
			t.Fatal("stop reported f not stopped, and f did not run")
		}
	}
	for _, res := range all {
		select {
		case <-res.ran:
			if res.stopped {
				t.Error("stop reported f stopped, and f ran")
			}
		default:
		}
	}
	t.Logf("stop won %d races of %d", stops, len(all))
}

// TestAfterCancelAllocates: for a fast request's context, AfterCancel and
// its stop allocate nothing.
func TestAfterCancelAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	allocs := make(chan float64, 1)
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		f := func() {}
		allocs <- testing.AllocsPerRun(100, func() {
			AfterCancel(ctx, f)()
		})
	}))
	c := dial(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if n := <-allocs; n != 0 {
		t.Errorf("AfterCancel and its stop allocate %v times, want none", n)
	}
}
