//go:build !tether_sidecar

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"regexp"
	"strconv"
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

// The demo at MCP 2026-07-28 runs end to end with every balancer: it
// returns nil, which means no client error, every client at 2026-07-28
// without a session, tether counting every request as modern, and no call
// answered by the killed backend. Its tables show what the era is about:
// every backend answers calls, and a client's calls reach more than one
// backend.
func TestDemoModern(t *testing.T) {
	const clients, calls, backends = 9, 10, 3
	for _, name := range balancer.PickerNames {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := []string{"--era", "2026-07-28", "--sessions", strconv.Itoa(clients), "--backends", strconv.Itoa(backends),
				"--calls", strconv.Itoa(calls), "--balancer", name}
			if err := demoCommand(t.Context(), args, &stdout, &stderr); err != nil {
				t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
			}
			out := stdout.String()
			for _, want := range []string{
				"MCP 2026-07-28: 3 stateless in-process MCP backends (go-sdk), tether in front (balancer " + name + "), 9 clients without sessions",
				"1. start the backends and tether",
				"2. connect 9 clients at MCP 2026-07-28 through tether",
				"clients at 2026-07-28: 9 of 9; with a session id: 0; sessions in tether's store: 0",
				`0 era="legacy" (9 server/discover and 90 tools/call`,
				"3. kill backend-",
				"4. every client calls whoami 10 more times",
				"(killed)",
				"5. close 9 clients: 0 failed",
				"PASS: 0 client errors, no sessions",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if got := strings.Count(out, "   0 client errors\n"); got != 2 {
				t.Errorf(`"0 client errors" reported for %d phases, want 2:\n%s`, got, out)
			}

			// Phase 2: all backends live, every one answers calls.
			rows := demoRows(t, between(t, out, "2. connect", "3. kill"))
			if len(rows) != backends {
				t.Fatalf("phase 2 lists %d backends with calls, want %d:\n%s", len(rows), backends, out)
			}
			total := 0
			for b, r := range rows {
				if r.calls == 0 || r.clients == 0 {
					t.Errorf("phase 2: %s answered %d calls of %d clients, want some:\n%s", b, r.calls, r.clients, out)
				}
				total += r.calls
			}
			if total != clients*calls {
				t.Errorf("phase 2: %d calls in the table, want %d:\n%s", total, clients*calls, out)
			}
			// Each call its own pick: some client reached several backends.
			m := regexp.MustCompile(`each client's calls reached ([0-9.]+) backends on average`).FindStringSubmatch(between(t, out, "2. connect", "3. kill"))
			if m == nil {
				t.Fatalf("phase 2 gives no backends per client:\n%s", out)
			}
			if v, _ := strconv.ParseFloat(m[1], 64); v <= 1 {
				t.Errorf("phase 2: each client's calls reached %s backends on average, want more than 1:\n%s", m[1], out)
			}

			// Phase 4: the killed backend is listed as such, the others
			// answer every call.
			phase4 := between(t, out, "4. every client", "5. close")
			rows = demoRows(t, phase4)
			if len(rows) != backends-1 {
				t.Fatalf("phase 4 lists %d backends with calls, want %d:\n%s", len(rows), backends-1, out)
			}
			total = 0
			for b, r := range rows {
				if r.calls == 0 {
					t.Errorf("phase 4: surviving %s answered no call:\n%s", b, out)
				}
				total += r.calls
			}
			if total != clients*calls {
				t.Errorf("phase 4: %d calls in the table, want %d:\n%s", total, clients*calls, out)
			}
			if got := strings.Count(phase4, "(killed)"); got != 1 {
				t.Errorf("phase 4 lists %d killed backends, want 1:\n%s", got, out)
			}
			if t.Failed() || testing.Verbose() {
				t.Logf("stdout:\n%s\nstderr:\n%s", &stdout, &stderr)
			}
		})
	}
}

// --era both runs the legacy demo, then the 2026-07-28 one, each passing.
func TestDemoBothEras(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--era", "both", "--sessions", "6", "--calls", "2"}
	if err := demoCommand(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	out := stdout.String()
	legacy := strings.Index(out, "PASS: 0 client errors, every session on one backend per phase")
	modern := strings.Index(out, "PASS: 0 client errors, no sessions")
	if legacy < 0 || modern < legacy {
		t.Errorf("want the legacy demo's PASS, then the 2026-07-28 one's:\n%s", out)
	}
	if got := strings.Count(out, "1. start the backends and tether"); got != 2 {
		t.Errorf("%d demos started, want 2:\n%s", got, out)
	}
}

// demoRow is one row of a 2026-07-28 phase table.
type demoRow struct{ calls, clients int }

var demoRowRE = regexp.MustCompile(`(?m)^   (backend-\d+) +(\d+) +\d+% +(\d+)(?: |$)`)

// demoRows parses a 2026-07-28 phase table: the backends that answered, by
// name (a killed one's row has no figures and is left out).
func demoRows(t *testing.T, table string) map[string]demoRow {
	t.Helper()
	rows := map[string]demoRow{}
	for _, m := range demoRowRE.FindAllStringSubmatch(table, -1) {
		calls, _ := strconv.Atoi(m[2])
		clients, _ := strconv.Atoi(m[3])
		if _, dup := rows[m[1]]; dup {
			t.Fatalf("%s listed twice:\n%s", m[1], table)
		}
		rows[m[1]] = demoRow{calls, clients}
	}
	return rows
}

// between is the part of out from the line starting with from to the one
// starting with to.
func between(t *testing.T, out, from, to string) string {
	t.Helper()
	i := strings.Index(out, from)
	j := strings.Index(out, to)
	if i < 0 || j < i {
		t.Fatalf("output has no %q followed by %q:\n%s", from, to, out)
	}
	return out[i:j]
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
		{[]string{"--era", "modern"}, `--era "modern": want one of legacy, 2026-07-28, both`},
		{[]string{"--era", "2025-11-25"}, `--era "2025-11-25": want one of`},
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
