//go:build !tether_sidecar

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/balancer"
)

// The demo runs end to end with every balancer: it returns nil, which means
// no client error and no session on two backends, and prints every step.
func TestDemo(t *testing.T) {
	for _, name := range balancer.PickerNames {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := []string{"--sessions", "9", "--backends", "3", "--calls", "2", "--balancer", name}
			if err := demoCommand(t.Context(), args, &stdout, &stderr); err != nil {
				t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
			}
			out := stdout.String()
			for _, want := range []string{
				"(balancer " + name + "), 9 client sessions",
				"1. start the backends and tether",
				"2. connect 9 sessions through tether; each calls whoami 2 times",
				"3. kill backend-",
				"4. every session calls whoami 2 more times",
				"(killed)",
				"re-initialized by tether: ",
				"5. close 9 sessions (DELETE): 0 failed, 0 left in tether's session store",
				"PASS: 0 client errors",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if got := strings.Count(out, "   0 client errors\n"); got != 2 {
				t.Errorf(`"0 client errors" reported for %d phases, want 2:\n%s`, got, out)
			}
			if got := strings.Count(out, "every session stayed on one backend"); got != 2 {
				t.Errorf("one backend per session reported for %d phases, want 2:\n%s", got, out)
			}
			if t.Failed() || testing.Verbose() {
				t.Logf("stdout:\n%s\nstderr:\n%s", &stdout, &stderr)
			}
		})
	}
}

// A demo whose context has already ended starts nothing and says so.
func TestDemoCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := demoCommand(ctx, []string{"--sessions", "3", "--calls", "1"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("demo with a cancelled context: %v, want an interrupted error", err)
	}
}

func TestDemoFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"--sessions", "0"}, "--sessions must be 1 to 200, got 0"},
		{[]string{"--sessions", "201"}, "--sessions must be 1 to 200"},
		{[]string{"--backends", "1"}, "--backends must be 2 to 20"},
		{[]string{"--backends", "21"}, "--backends must be 2 to 20"},
		{[]string{"--calls", "0"}, "--calls must be 1 to 20"},
		{[]string{"--calls", "-3"}, "--calls must be 1 to 20"},
		{[]string{"--balancer", "fastest"}, `--balancer "fastest": want one of p2c,`},
		{[]string{"--sessions", "many"}, "invalid value"},
		{[]string{"--verbose"}, "not defined"},
		{[]string{"now"}, `unexpected argument "now"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout bytes.Buffer
			err := demoCommand(t.Context(), tc.args, &stdout, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("demo %v: error %v, want one containing %q", tc.args, err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
			if stdout.Len() > 0 {
				t.Errorf("demo printed before rejecting its flags:\n%s", &stdout)
			}
		})
	}
	if err := demoCommand(t.Context(), []string{"-h"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("demo -h: %v, want flag.ErrHelp", err)
	}
}
