package main

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	// manyFiles is a container's usual open-file limit (Docker's, containerd's).
	manyFiles = 1 << 20
)

// The defaults follow from the memory limit. Figures depend on the
// measured costs, so the rows assert where each bound came from and what
// it must satisfy, not the costs of the day.
func TestDeriveLimits(t *testing.T) {
	streamCost := int64(streamMemCost * memHeadroom)
	sessionCost := int64(sessionMemCost * memHeadroom)
	inflight := int64(proxy.DefaultMaxInflightBodyBytes)
	for _, tc := range []struct {
		name                      string
		limit                     int64
		streamsFrom, sessionsFrom string
		warn                      string // "" = no warning
	}{
		{"none", noMemoryLimit, "default", "default", ""},
		{"0 (GOMEMLIMIT=0): the floors", 0, "floor", "floor", "is small"},
		{"64MiB: below the fixed costs, the floors", 64 * mib, "floor", "floor", "is small"},
		{"256MiB", 256 * mib, "memory", "memory", ""},
		{"1GiB", gib, "memory", "ceiling", ""},
		{"3GiB", 3 * gib, "memory", "ceiling", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deriveLimits(tc.limit, manyFiles, inflight, 0, 0)
			if d.StreamsFrom != tc.streamsFrom || d.SessionsFrom != tc.sessionsFrom {
				t.Fatalf("streams %d from %s, sessions %d from %s; want from %s and %s", d.Streams, d.StreamsFrom, d.Sessions, d.SessionsFrom, tc.streamsFrom, tc.sessionsFrom)
			}
			if got := strings.Join(d.Warnings, "; "); tc.warn == "" && got != "" || !strings.Contains(got, tc.warn) {
				t.Errorf("warnings %q, want %q", got, tc.warn)
			}
			switch tc.sessionsFrom {
			case "default", "ceiling":
				if d.Sessions != session.DefaultMaxSessions {
					t.Errorf("sessions %d, want %d", d.Sessions, session.DefaultMaxSessions)
				}
			case "floor":
				if d.Sessions != minDerivedSessions || d.Streams != minDerivedStreams {
					t.Errorf("streams %d, sessions %d, want the floors %d, %d", d.Streams, d.Sessions, minDerivedStreams, minDerivedSessions)
				}
			}
			if tc.streamsFrom == "default" && d.Streams != proxy.DefaultMaxStreams {
				t.Errorf("streams %d, want %d", d.Streams, proxy.DefaultMaxStreams)
			}
			if tc.streamsFrom != "memory" {
				return
			}
			// Derived from memory: sessions have at most half the budget,
			// streams the rest, and nothing a stream could use is left.
			budget := tc.limit - idleMemAllowance - inflight
			sessions := int64(d.Sessions) * sessionCost
			left := budget - sessions - int64(d.Streams)*streamCost
			if sessions > budget/2 || left < 0 || left >= streamCost {
				t.Errorf("%d streams and %d sessions leave %d of the %d bytes budget (sessions %d)", d.Streams, d.Sessions, left, budget, sessions)
			}
			if tc.limit >= gib && d.Streams <= proxy.DefaultMaxStreams {
				t.Errorf("%d streams at %d MiB, want more than the %d of a tether without a limit", d.Streams, tc.limit>>20, proxy.DefaultMaxStreams)
			}
		})
	}
}

// More memory never means fewer streams or sessions.
func TestDeriveLimitsMonotonic(t *testing.T) {
	var prev derivedLimits
	for limit := 32 * mib; limit <= 64*gib; limit += limit / 3 {
		d := deriveLimits(limit, manyFiles, proxy.DefaultMaxInflightBodyBytes, 0, 0)
		if d.Streams < prev.Streams || d.Sessions < prev.Sessions {
			t.Fatalf("at %d MiB: %d streams, %d sessions; less than %d, %d with less memory", limit>>20, d.Streams, d.Sessions, prev.Streams, prev.Sessions)
		}
		prev = d
	}
}

// Issue 32: 100,000 open streams are reachable on a pod given the memory
// for them (and the open files: two each).
func TestDeriveLimitsHundredThousandStreams(t *testing.T) {
	const want = 100_000
	streams := int64(want * streamMemCost * memHeadroom)
	sessions := int64(session.DefaultMaxSessions * sessionMemCost * memHeadroom)
	limit := idleMemAllowance + proxy.DefaultMaxInflightBodyBytes + sessions + streams
	d := deriveLimits(limit, 2*want+nofileReserve, proxy.DefaultMaxInflightBodyBytes, 0, 0)
	if d.Streams < want || d.StreamsFrom != "memory" {
		t.Errorf("%d streams (from %s) with a memory limit of %d MiB, want %d", d.Streams, d.StreamsFrom, limit>>20, want)
	}
}

// A flag, or its TETHER_ variable, is kept as given; when it exceeds what
// memory or the open files allow, the operator is warned, not refused.
func TestDeriveLimitsGiven(t *testing.T) {
	inflight := int64(proxy.DefaultMaxInflightBodyBytes)
	for _, tc := range []struct {
		name                      string
		limit                     int64
		nofile                    uint64
		streams, sessions         int
		wantStreams, wantSessions int // 0: derived (checked by the From)
		streamsFrom, sessionsFrom string
		warn                      string
	}{
		{"both, no limit", noMemoryLimit, manyFiles, 7, 9, 7, 9, "flag", "flag", ""},
		{"both, within the limit", gib, manyFiles, 1000, 2000, 1000, 2000, "flag", "flag", ""},
		{"streams past the memory", 256 * mib, manyFiles, 50_000, 0, 50_000, minDerivedSessions, "flag", "floor", "more than"},
		{"sessions past the memory", 256 * mib, manyFiles, 0, 250_000, 0, 250_000, "floor", "flag", "more than"},
		{"streams given, sessions share what is left", 1 * gib, manyFiles, 150_000, 0, 150_000, 0, "flag", "memory", ""},
		{"sessions given, streams take the rest", 1 * gib, manyFiles, 0, 1000, 0, 1000, "memory", "flag", ""},
		{"any int: no overflow", gib, manyFiles, math.MaxInt, 0, math.MaxInt, minDerivedSessions, "flag", "floor", "more than"},
		{"streams past the open files", noMemoryLimit, 20_000, 50_000, 0, 50_000, session.DefaultMaxSessions, "flag", "default", "open-file limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deriveLimits(tc.limit, tc.nofile, inflight, tc.streams, tc.sessions)
			if d.StreamsFrom != tc.streamsFrom || d.SessionsFrom != tc.sessionsFrom ||
				tc.wantStreams != 0 && d.Streams != tc.wantStreams || tc.wantSessions != 0 && d.Sessions != tc.wantSessions {
				t.Errorf("streams %d from %s, sessions %d from %s; want %d from %s, %d from %s", d.Streams, d.StreamsFrom, d.Sessions, d.SessionsFrom, tc.wantStreams, tc.streamsFrom, tc.wantSessions, tc.sessionsFrom)
			}
			if got := strings.Join(d.Warnings, "; "); tc.warn == "" && got != "" || !strings.Contains(got, tc.warn) {
				t.Errorf("warnings %q, want %q", got, tc.warn)
			}
			if tc.limit != noMemoryLimit && tc.warn == "" {
				budget := tc.limit - idleMemAllowance - inflight
				if used := int64(float64(d.Streams)*streamMemCost*memHeadroom + float64(d.Sessions)*sessionMemCost*memHeadroom); used > budget {
					t.Errorf("%d streams and %d sessions take %d bytes, over the budget %d", d.Streams, d.Sessions, used, budget)
				}
			}
		})
	}
}

// Each stream holds two open files; the open-file limit caps the derived
// streams, with a warning, down to the floor.
func TestDeriveLimitsOpenFiles(t *testing.T) {
	inflight := int64(proxy.DefaultMaxInflightBodyBytes)
	for _, tc := range []struct {
		name   string
		limit  int64
		nofile uint64
		want   int
		from   string
	}{
		{"no memory limit, 20,000 files", noMemoryLimit, 20_000, (20_000 - nofileReserve) / 2, "nofile"},
		{"4GiB, 20,000 files", 4 * gib, 20_000, (20_000 - nofileReserve) / 2, "nofile"},
		{"4GiB, 1,024 files: the floor", 4 * gib, 1024, minDerivedStreams, "nofile"},
		{"no memory limit, the open-file limit unknown", noMemoryLimit, 0, proxy.DefaultMaxStreams, "default"},
		{"no memory limit, plenty of files", noMemoryLimit, manyFiles, proxy.DefaultMaxStreams, "default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deriveLimits(tc.limit, tc.nofile, inflight, 0, 0)
			if d.Streams != tc.want || d.StreamsFrom != tc.from {
				t.Errorf("streams %d from %s, want %d from %s", d.Streams, d.StreamsFrom, tc.want, tc.from)
			}
			if warned := strings.Contains(strings.Join(d.Warnings, "; "), "open-file limit"); warned != (tc.from == "nofile") {
				t.Errorf("warnings %q: want one about the open-file limit: %v", d.Warnings, tc.from == "nofile")
			}
		})
	}
}

// GOMEMLIMIT is read as the runtime reads it. The rows marked runtime are
// checked against it too: the test binary is run again with the value, and
// the limit its runtime set (or its refusal to start) is compared.
func TestParseMemoryLimit(t *testing.T) {
	const bad = -1
	for _, tc := range []struct {
		s       string
		want    int64 // bad: refused
		runtime bool
	}{
		{"off", noMemoryLimit, false},
		{"0", 0, false},
		{"1024", 1024, false},
		{"+1024", 1024, true},
		{"-0", 0, true},
		{"1B", 1, false},
		{"3KiB", 3 << 10, false},
		{"64MiB", 64 << 20, false},
		{"4GiB", 4 << 30, true},
		{"1TiB", 1 << 40, false},
		{"9223372036854775807", math.MaxInt64, false},
		{"8589934591GiB", 8589934591 << 30, false},
		{"8589934592GiB", bad, true},
		{"9223372036854775808", bad, false},
		{"-1", bad, false},
		{"1.5GiB", bad, false},
		{"5 MiB", bad, false},
		{"5mib", bad, false},
		{"5MB", bad, false},
		{"5iB", bad, true},
		{"KiB", bad, false},
		{"B", bad, false},
		{"GiB5", bad, false},
		{"0x10", bad, false},
		{"1_000", bad, false},
	} {
		got, err := parseMemoryLimit(tc.s)
		if tc.want == bad && err == nil || tc.want != bad && (err != nil || got != tc.want) {
			t.Errorf("GOMEMLIMIT=%q: %d, %v; want %d (-1: an error)", tc.s, got, err, tc.want)
		}
		if !tc.runtime {
			continue
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryLimitChild$")
		cmd.Env = append(os.Environ(), "GOMEMLIMIT="+tc.s, "TETHER_TEST_PRINT_MEMORY_LIMIT=1")
		out, runErr := cmd.Output()
		line, _, _ := strings.Cut(string(out), "\n")
		switch {
		case tc.want == bad && runErr == nil:
			t.Errorf("GOMEMLIMIT=%q: the runtime took it: %s", tc.s, line)
		case tc.want != bad && runErr != nil:
			t.Errorf("GOMEMLIMIT=%q: the runtime refused it: %v", tc.s, runErr)
		case tc.want != bad && line != strconv.FormatInt(tc.want, 10):
			t.Errorf("GOMEMLIMIT=%q: the runtime set %q, want %d", tc.s, line, tc.want)
		}
	}
}

// TestMemoryLimitChild prints the runtime's memory limit, for
// TestParseMemoryLimit; run alone it does nothing.
func TestMemoryLimitChild(t *testing.T) {
	if os.Getenv("TETHER_TEST_PRINT_MEMORY_LIMIT") == "" {
		return
	}
	fmt.Println(debug.SetMemoryLimit(-1))
}

// Through the flags: a flag or its TETHER_ variable is kept, the other
// bound is derived from GOMEMLIMIT (or the limit from the cgroup), and one
// line says what and why.
func TestSizeStreamsAndSessions(t *testing.T) {
	nofile, _ := openFileLimit()
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })

	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		runtime  int64 // the runtime's limit, as setMemoryLimit leaves it
		streams  int   // 0: derived
		sessions int
		log      []string
	}{
		{
			name: "derived from GOMEMLIMIT",
			env:  map[string]string{"GOMEMLIMIT": "1GiB"},
			log:  []string{"memory_limit=1073741824", "memory_limit_from=GOMEMLIMIT", "max_sessions_from=ceiling", fmt.Sprint("stream_bytes=", streamMemCost), fmt.Sprint("session_bytes=", sessionMemCost), fmt.Sprint("nofile=", nofile)},
		},
		{
			name:    "derived from the cgroup's limit",
			runtime: 256 << 20,
			log:     []string{"memory_limit=268435456", "memory_limit_from=cgroup", "max_sessions_from=memory"},
		},
		{
			name:    "TETHER_MAX_STREAMS is given too",
			env:     map[string]string{"GOMEMLIMIT": "256MiB", "TETHER_MAX_STREAMS": "300"},
			streams: 300,
			log:     []string{"max_streams=300", "max_streams_from=flag", "max_sessions_from=memory"},
		},
		{
			name:     "flags win over the environment and memory",
			args:     []string{"--max-streams", "500", "--max-sessions", "7000"},
			env:      map[string]string{"GOMEMLIMIT": "256MiB", "TETHER_MAX_STREAMS": "300"},
			streams:  500,
			sessions: 7000,
			log:      []string{"max_streams=500", "max_streams_from=flag", "max_sessions=7000", "max_sessions_from=flag"},
		},
		{
			name:     "the deprecated --session-cache-size is given too",
			args:     []string{"--session-cache-size", "5000"},
			env:      map[string]string{"GOMEMLIMIT": "256MiB"},
			sessions: 5000,
			log:      []string{"max_sessions=5000", "max_sessions_from=flag"},
		},
		{
			name: "no limit: today's defaults",
			env:  map[string]string{"GOMEMLIMIT": "off"},
			log:  []string{"max_sessions=250000", "max_sessions_from=default"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(cmp.Or(tc.runtime, noMemoryLimit))
			getenv := func(k string) string { return tc.env[k] }
			cfg, err := parseServeFlags(append([]string{"--backends", "http://127.0.0.1:9"}, tc.args...), getenv, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			cfg, err = sizeStreamsAndSessions(cfg, slog.New(slog.NewTextHandler(&logs, nil)), getenv)
			if err != nil {
				t.Fatal(err)
			}
			if tc.streams != 0 && cfg.MaxStreams != tc.streams || tc.sessions != 0 && cfg.MaxSessions != tc.sessions {
				t.Errorf("max streams %d, sessions %d; want %d, %d (0: derived)", cfg.MaxStreams, cfg.MaxSessions, tc.streams, tc.sessions)
			}
			line := ""
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, "streams and sessions bounded") {
					line = l
				}
			}
			want := append([]string{fmt.Sprint("max_streams=", cfg.MaxStreams), fmt.Sprint("max_sessions=", cfg.MaxSessions)}, tc.log...)
			for _, w := range want {
				if !strings.Contains(line, w) {
					t.Errorf("log line %q: want %s", line, w)
				}
			}
		})
	}
}

// The process as started: the runtime applies GOMEMLIMIT, serve derives
// what is not given from it before the server starts, and logs it.
func TestServeLogsDerivedLimits(t *testing.T) {
	backend := httptest.NewServer(http.NotFoundHandler())
	defer backend.Close()
	logged := serveUntilSIGTERM(t, []string{"GOMEMLIMIT=256MiB", "TETHER_MAX_STREAMS=300", "TETHER_MAX_SESSIONS="}, "--backends", backend.URL)

	nofile, _ := openFileLimit()
	want := deriveLimits(256<<20, nofile, proxy.DefaultMaxInflightBodyBytes, 300, 0)
	for _, w := range []string{
		`msg="streams and sessions bounded" max_streams=300 max_streams_from=flag`,
		fmt.Sprintf("max_sessions=%d max_sessions_from=%s", want.Sessions, want.SessionsFrom),
		"memory_limit=268435456 memory_limit_from=GOMEMLIMIT",
	} {
		if !strings.Contains(logged, w) {
			t.Errorf("log %q: want %s", logged, w)
		}
	}
}
