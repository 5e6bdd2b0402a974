package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
)

// What one open stream and one session record cost, as measured; the
// defaults of --max-streams and --max-sessions follow from them and the
// memory limit (deriveLimits). When a change moves a cost, measure again and
// update the number here (docs/operations.md, "Memory", says the same).
const (
	// streamMemCost: RSS per open GET stream, 4.6 KB, parked between
	// events: the most the bench's streams scenario read per stream at
	// 5,000 and 9,900 streams on 2026-12-05, after a parked stream's
	// sockets went to sleep as bare descriptors (h1.Sleep): 3.8–4.2 KiB
	// idle, 3.9–4.3 once events flowed (`make bench`; `cd bench && go
	// run ./cmd/tetherbench -scenarios streams -streams-sizes 5000`); the
	// growth from 1,000 to 9,900 streams was 3.3 KiB a stream. Of it, Go
	// heap ~3 KiB (`go run ./hack/streammem -tether BIN -n 3000 -detail`).
	// At 1,000 streams the figure reads 8.4 KiB: the collector's headroom
	// and metadata, some 4 MiB once, which idleMemAllowance covers. (6.7 KB
	// before the sockets slept; 43 KB of heap and stacks before streams
	// parked.)
	streamMemCost = 4_600
	// sessionMemCost: RSS per session record of the memory store, its
	// initialize body shared: (124.8 − 18.2) MiB for 100,000 sessions,
	// `go run ./hack/sessionmem -tether BIN -sessions 100000` with the
	// sidecar build, 2026-12-04.
	sessionMemCost = 1_120
	// memHeadroom multiplies both costs: the bounds are set so that, all
	// taken, the live heap is at most 80% of the budget and the collector
	// still has room for the garbage between two collections.
	memHeadroom = 1.25
	// idleMemAllowance is kept for the process itself (idle RSS 17–18 MiB,
	// most of it the binary's pages, which the Go limit does not count).
	idleMemAllowance = 24 << 20
)

// The derived bounds stay within these: a tiny memory limit still serves
// (and is warned about), and a huge one does not make a bound limitless.
// The most sessions derived is session.DefaultMaxSessions, the default
// without a memory limit; streams may go well past 100,000, which one pod
// must be able to hold given the memory (issue 32).
const (
	minDerivedStreams  = 100
	minDerivedSessions = 1_000
	maxDerivedStreams  = 1_000_000
)

// nofileReserve is the part of the open-file limit (RLIMIT_NOFILE) not
// given to streams, each of which holds two descriptors (the client's
// connection and the backend's): the backends' idle connections (up to
// 1,024) and as many again for listeners, requests in flight, idle client
// connections, Redis and the API server.
const nofileReserve = 2048

// noMemoryLimit is what debug.SetMemoryLimit reports when there is none.
const noMemoryLimit = math.MaxInt64

// derivedLimits are --max-streams and --max-sessions in force, with where
// each came from ("flag", "default", "memory", or the bound that clamped
// the memory's figure: "floor", "ceiling", "nofile") and what the operator
// should hear about.
type derivedLimits struct {
	Streams, Sessions         int
	StreamsFrom, SessionsFrom string
	Warnings                  []string
}

// deriveLimits sets --max-streams and --max-sessions from the memory limit
// (bytes; noMemoryLimit: none) and the open-file limit (0: unknown), unless
// given (streams, sessions > 0: set by flag or TETHER_ variable, kept as
// they are). Without a memory limit the defaults are proxy.DefaultMaxStreams
// and session.DefaultMaxSessions. With one, the budget is the limit less
// the idle process and the request bodies in flight (inflightBody, the
// --max-inflight-body-bytes bound); sessions take at most half of it (up
// to their default), streams the rest, each at its cost with headroom.
// Streams are never more than the open-file limit can hold.
func deriveLimits(limit int64, nofile uint64, inflightBody int64, streams, sessions int) derivedLimits {
	d := derivedLimits{Streams: streams, Sessions: sessions, StreamsFrom: "flag", SessionsFrom: "flag"}
	streamCost := int64(streamMemCost * memHeadroom)
	sessionCost := int64(sessionMemCost * memHeadroom)
	fileCap := streamsForFiles(nofile)

	if limit < 0 || limit >= noMemoryLimit {
		if sessions == 0 {
			d.Sessions, d.SessionsFrom = session.DefaultMaxSessions, "default"
		}
		if streams == 0 {
			d.Streams, d.StreamsFrom = proxy.DefaultMaxStreams, "default"
		}
	} else {
		budget := max(limit-idleMemAllowance-inflightBody, 0)
		if sessions == 0 {
			share := budget / 2
			if streams > 0 {
				share = min(share, max(budget-memFor(streams, streamCost), 0))
			}
			d.Sessions, d.SessionsFrom = clamp(share/sessionCost, minDerivedSessions, session.DefaultMaxSessions)
		}
		if streams == 0 {
			rest := max(budget-memFor(d.Sessions, sessionCost), 0)
			d.Streams, d.StreamsFrom = clamp(rest/streamCost, minDerivedStreams, maxDerivedStreams)
		}
		switch need := memFor(d.Streams, streamCost) + memFor(d.Sessions, sessionCost); {
		case need <= budget:
		case streams > 0 || sessions > 0:
			d.Warnings = append(d.Warnings, fmt.Sprintf("%d streams and %d sessions (--max-streams, --max-sessions) may take %d MiB, more than the %d MiB the memory limit leaves them: expect an OOM kill before they are reached", d.Streams, d.Sessions, need>>20, budget>>20))
		default:
			d.Warnings = append(d.Warnings, fmt.Sprintf("the memory limit (%d MiB) is small: the least tether sets, %d streams and %d sessions, may take more than it leaves them (%d MiB); set a larger limit", limit>>20, d.Streams, d.Sessions, budget>>20))
		}
	}

	switch {
	case streams == 0 && d.Streams > fileCap:
		d.Streams, d.StreamsFrom = max(fileCap, minDerivedStreams), "nofile"
		d.Warnings = append(d.Warnings, fmt.Sprintf("--max-streams lowered to %d by the open-file limit (%d; 2 per stream, %d kept): raise the container's nofile limit for more", d.Streams, nofile, nofileReserve))
	case streams > fileCap:
		d.Warnings = append(d.Warnings, fmt.Sprintf("--max-streams %d needs more files open than the open-file limit (%d; 2 per stream, %d kept) allows: streams past %d will fail", streams, nofile, nofileReserve, fileCap))
	}
	return d
}

// memFor is what n units take at cost each (n capped where the product
// could overflow: a flag may be given any int).
func memFor(n int, cost int64) int64 {
	return int64(min(n, math.MaxInt32)) * cost
}

// clamp bounds n to [lo, hi] and says which bound, if any, it took.
func clamp(n int64, lo, hi int) (int, string) {
	switch {
	case n < int64(lo):
		return lo, "floor"
	case n > int64(hi):
		return hi, "ceiling"
	}
	return int(n), "memory"
}

// streamsForFiles is the most streams nofile open files hold.
func streamsForFiles(nofile uint64) int {
	switch {
	case nofile == 0 || nofile > 2*maxDerivedStreams+nofileReserve:
		return math.MaxInt
	case nofile <= nofileReserve:
		return 0
	}
	return int(nofile-nofileReserve) / 2
}

// sizeStreamsAndSessions applies deriveLimits to cfg with the memory limit
// in force (after setMemoryLimit) and the open-file limit, and logs the
// outcome in one line.
func sizeStreamsAndSessions(cfg config, log *slog.Logger, getenv func(string) string) (config, error) {
	limit, source, err := memoryLimit(getenv)
	if err != nil {
		return cfg, err
	}
	nofile, _ := openFileLimit()
	var streams, sessions int
	if cfg.maxStreamsGiven {
		streams = cfg.MaxStreams
	}
	if cfg.maxSessionsGiven {
		sessions = cfg.MaxSessions
	}
	d := deriveLimits(limit, nofile, cfg.MaxInflightBodyBytes, streams, sessions)
	cfg.MaxStreams, cfg.MaxSessions = d.Streams, d.Sessions
	for _, w := range d.Warnings {
		log.Warn(w)
	}
	attrs := []any{"max_streams", d.Streams, "max_streams_from", d.StreamsFrom,
		"max_sessions", d.Sessions, "max_sessions_from", d.SessionsFrom}
	if limit != noMemoryLimit {
		attrs = append(attrs, "memory_limit", limit, "memory_limit_from", source,
			"stream_bytes", streamMemCost, "session_bytes", sessionMemCost, "headroom", memHeadroom,
			"reserved_bytes", idleMemAllowance+cfg.MaxInflightBodyBytes)
	}
	attrs = append(attrs, "nofile", nofile)
	log.Info("streams and sessions bounded", attrs...)
	return cfg, nil
}

// memoryLimit is the Go runtime's memory limit (noMemoryLimit: none) and
// where it came from: GOMEMLIMIT, which the runtime read at start (parsed
// again here, so that the getenv given is the one followed), else what
// setMemoryLimit derived from the cgroup's.
func memoryLimit(getenv func(string) string) (int64, string, error) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		n, err := parseMemoryLimit(v)
		if err != nil {
			return 0, "", fmt.Errorf("GOMEMLIMIT=%q: %w", v, err)
		}
		return n, "GOMEMLIMIT", nil
	}
	if n := debug.SetMemoryLimit(-1); n != noMemoryLimit {
		return n, "cgroup", nil
	}
	return noMemoryLimit, "", nil
}

// parseMemoryLimit reads GOMEMLIMIT as the runtime does (runtime's
// parseByteCount): "off", or a non-negative number of bytes with an
// optional unit B, KiB, MiB, GiB or TiB.
func parseMemoryLimit(s string) (int64, error) {
	if s == "off" {
		return noMemoryLimit, nil
	}
	num, shift := s, 0
	for i, unit := range []string{"TiB", "GiB", "MiB", "KiB", "B"} {
		if rest, ok := strings.CutSuffix(s, unit); ok {
			num, shift = rest, 10*(4-i)
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("want off, or a number of bytes with an optional unit B, KiB, MiB, GiB or TiB")
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("more than %d bytes", int64(math.MaxInt64))
	}
	return n << shift, nil
}
