package testkit

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records Fatalf and stops the caller with a panic the test
// recovers, on the test goroutine: what FailNow does, observably.
type fatalTB struct {
	testing.TB
	msg string
}

type stopped struct{}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(stopped{})
}

// run calls fn with a fatalTB and returns what it failed with ("" when it
// returned).
func run(t *testing.T, fn func(tb testing.TB)) (msg string) {
	tb := &fatalTB{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopped); !ok {
				panic(r)
			}
			msg = tb.msg
		}
	}()
	fn(tb)
	return ""
}

func TestEventually(t *testing.T) {
	var polls atomic.Int32
	msg := run(t, func(tb testing.TB) {
		Eventually(tb, time.Minute, func() bool { return polls.Add(1) == 3 }, "the third poll")
	})
	if msg != "" || polls.Load() != 3 {
		t.Errorf("a condition true at the third poll: failed with %q after %d polls", msg, polls.Load())
	}

	msg = run(t, func(tb testing.TB) {
		Eventually(tb, 30*time.Millisecond, func() bool { return false }, "%s %d", "nothing", 7)
	})
	if !strings.Contains(msg, "timed out after 30ms waiting for nothing 7") {
		t.Errorf("a condition never true: failed with %q", msg)
	}
}

func TestEventuallyNoError(t *testing.T) {
	msg := run(t, func(tb testing.TB) {
		EventuallyNoError(tb, 30*time.Millisecond, func() error { return fmt.Errorf("still 4") }, "five")
	})
	if !strings.Contains(msg, "waiting for five") || !strings.Contains(msg, "still 4") {
		t.Errorf("failed with %q, want what was awaited and the last error", msg)
	}
	n := 0
	if msg := run(t, func(tb testing.TB) {
		EventuallyNoError(tb, time.Minute, func() error {
			if n++; n < 2 {
				return fmt.Errorf("not yet")
			}
			return nil
		}, "the second check")
	}); msg != "" {
		t.Errorf("a check passing the second time: failed with %q", msg)
	}
}

func TestFreeAddrCanBeListenedOn(t *testing.T) {
	addr := FreeAddr(t)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("FreeAddr = %q, want a loopback address", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on the free address: %v", err)
	}
	ln.Close()
	if port := FreePort(t); port <= 0 {
		t.Errorf("FreePort = %d", port)
	}
}

// StartBackends' backends answer during the test and are closed after it.
func TestStartBackends(t *testing.T) {
	var urls []string
	t.Run("during", func(t *testing.T) {
		backends := StartBackends(t, 2)
		urls = URLs(backends)
		if len(backends) != 2 || backends[0].Name != "backend-0" || backends[1].Name != "backend-1" {
			t.Fatalf("backends %v, want backend-0 and backend-1", backends)
		}
		if urls[0] == urls[1] || urls[0] != backends[0].URL() {
			t.Errorf("URLs %v", urls)
		}
		for _, u := range urls {
			resp, err := http.Get(u + "/mcp")
			if err != nil {
				t.Errorf("backend %s: %v", u, err)
				continue
			}
			resp.Body.Close()
		}
	})
	for _, u := range urls {
		if _, err := http.Get(u + "/mcp"); err == nil {
			t.Errorf("backend %s still answers after its test", u)
		}
	}
}

// StartServer's server answers on loopback during the test and is closed
// after it.
func TestStartServer(t *testing.T) {
	var url string
	t.Run("during", func(t *testing.T) {
		srv := StartServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
		url = srv.URL
		if !strings.HasPrefix(url, "http://127.0.0.1:") {
			t.Errorf("URL %q, want loopback", url)
		}
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello" {
			t.Errorf("body %q", body)
		}
	})
	if _, err := http.Get(url); err == nil {
		t.Errorf("%s still answers after its test", url)
	}
}
