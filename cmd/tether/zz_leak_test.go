package main

import (
	"bytes"
	"io"
	"runtime"
	"testing"
	"time"
)

func TestZZLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	var out bytes.Buffer
	if err := demoCommand(t.Context(), []string{"--sessions", "20", "--calls", "2"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if runtime.NumGoroutine() <= before {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	t.Logf("goroutines %d -> %d; streamableServerConn.Read: %d\n%s", before, runtime.NumGoroutine(), bytes.Count(buf[:n], []byte("streamableServerConn).Read(")), out.Bytes()[bytes.Index(out.Bytes(), []byte("3. kill")):][:60])
}
