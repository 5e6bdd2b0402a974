// Command tetherbench measures tether against the seed bug it fixes and
// against the proxies people already run. It writes a report (a Markdown
// summary, one SVG chart per scenario, the raw figures as JSON) and, with
// -readme, replaces the figures block of bench/README.md.
//
//	tetherbench [report] [-full] [-out DIR] [-scenarios seed,overhead,failover,placement,rollout,streams]
//	tetherbench cpu [-tether A,B] [-rounds N]   proxy CPU per 1,000 follow-ups only, quickly
//
// The other commands are the roles it runs as separate processes:
//
//	tetherbench backends ...        go-sdk MCP backends (internal/mcpbackend) in their own process
//	tetherbench drive ...           a proxy pod's traffic: sessions plus a periodic health probe
//	tetherbench sse-backend ...     the open-streams scenario's backend: holds every GET open as an SSE stream
//	tetherbench tether-profiled ... tether wired in-process, with a CPU profile
//
// Everything it starts listens on 127.0.0.1, or on addresses inside network
// namespaces it creates and deletes itself; every load loop is bounded in
// count and time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd := "report"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd {
	case "report":
		err = reportCommand(ctx, args)
	case "backends":
		err = backendsCommand(ctx, args)
	case "drive":
		err = driveCommand(ctx, args)
	case "sse-backend":
		err = sseBackendCommand(ctx, args)
	case "tether-profiled":
		err = profiledTetherCommand(ctx, args)
	case "cpu":
		err = cpuCommand(ctx, args)
	default:
		err = fmt.Errorf("unknown command %q (want report, cpu, backends, drive, sse-backend or tether-profiled)", cmd)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "tetherbench:", err)
		return 1
	}
	return 0
}
