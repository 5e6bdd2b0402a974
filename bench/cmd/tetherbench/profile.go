package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/server"
)

// profiledTetherCommand is tether as cmd/tether serves `--backends` with
// the memory store (server.New: the same wiring, listeners and metrics;
// tracing off), plus a CPU profile: cmd/tether exposes no pprof. It prints
// "ready", starts the profile on "start" (stdin) and prints "profiling",
// and writes the profile when stdin closes or on SIGTERM.
func profiledTetherCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tetherbench tether-profiled", flag.ContinueOnError)
	backends := fs.String("backends", "", "comma-separated backend URLs")
	listen := fs.String("listen", "127.0.0.1:0", "client listener")
	picker := fs.String("balancer", "p2c", "picker")
	out := fs.String("cpuprofile", "tether-cpu.pprof", "CPU profile output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	src, err := discovery.NewStatic(strings.Split(*backends, ","))
	if err != nil {
		return err
	}
	s, err := server.New(server.Config{
		Listen:      *listen,
		AdminListen: "127.0.0.1:0",
		Source:      src,
		Balancer:    *picker,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(runCtx) }()
	defer func() { stop(); <-runErr }()
	select {
	case <-s.Synced():
	case err := <-runErr:
		runErr <- nil // for the deferred wait
		return err
	}
	fmt.Println("ready", s.ClientAddr())

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var f *os.File
	defer func() {
		if f != nil {
			pprof.StopCPUProfile()
			f.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			if l == "start" && f == nil {
				if f, err = os.Create(*out); err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				fmt.Println("profiling")
			}
		}
	}
}
