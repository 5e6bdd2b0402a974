// Command tether is a session-aware sidecar load balancer for MCP servers.
//
//	tether [serve] [flags]   route MCP traffic (the default command)
//	tether demo              three in-process MCP backends, tether, 30 clients, one backend killed
//	tether explain ID        how a session was placed and where it lives (asks the admin listener)
//	tether status            endpoints, live sessions and in-flight requests (asks the admin listener)
//	tether inject [FILE]...  add the tether sidecar to Kubernetes workloads (YAML in, YAML out)
//	tether webhook           mutating admission webhook that injects the sidecar into annotated Pods
//	tether version           print the version
//
// Built with -tags tether_sidecar (the image's binary), it has serve, explain,
// status and version only: demo, inject and webhook, and what they link (the
// admission and workload types, YAML, the MCP SDK), are left out of the
// process that sits on every request.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"syscall"
)

// command is a subcommand of the full build only.
type command struct {
	usage string // its lines in `tether help`
	run   func(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error
}

// fullCommands are registered by commands_full.go, which the tether_sidecar
// build tag leaves out; fullOnly names them all, in the order of `tether
// help`, so that the sidecar build can say what it lacks.
var (
	fullCommands = map[string]command{}
	fullOnly     = []string{"demo", "inject", "webhook"}
)

// version is stamped at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is the whole program; it returns the process exit code.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var err error
	switch cmd {
	case "serve":
		err = serveCommand(ctx, args, getenv, stderr)
	case "explain":
		err = explainCommand(ctx, args, getenv, stdout, stderr)
	case "status":
		err = statusCommand(ctx, args, getenv, stdout, stderr)
	case "drain":
		err = drainCommand(ctx, args, getenv, stdout, stderr)
	case "version":
		info, _ := debug.ReadBuildInfo()
		writeVersion(stdout, version, info, len(fullCommands) == 0)
	case "help":
		usage(stdout)
	default:
		c, ok := fullCommands[cmd]
		switch {
		case ok:
			err = c.run(ctx, args, getenv, os.Stdin, stdout, stderr)
		case slices.Contains(fullOnly, cmd):
			err = fmt.Errorf("%s is not in this build of tether (the sidecar build, -tags tether_sidecar, has serve, explain, status, drain and version; the full build has every command)", cmd)
		default:
			err = fmt.Errorf("unknown command %q (want serve, demo, explain, status, drain, inject, webhook, version or help)", cmd)
		}
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		// Errors name their flags' values; a URL's password is not shown.
		fmt.Fprintln(stderr, "tether:", redactURLs(err.Error()))
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `tether: a session-aware sidecar load balancer for MCP servers

  tether [serve] [flags]   route MCP traffic (tether serve -h lists the flags)
`)
	fmt.Fprint(w, fullCommands["demo"].usage)
	fmt.Fprint(w, `  tether explain SESSION_ID [--admin URL]
                           where a session lives, its record and backend, how it was placed
  tether status [--admin URL]
                           endpoints with state, live sessions and in-flight requests
  tether drain BACKEND [--undo] [--admin URL]
                           move a backend's sessions to the others, ahead of its exit
                           (BACKEND: its URL or endpoint id, as status shows them)
`)
	fmt.Fprint(w, fullCommands["inject"].usage)
	fmt.Fprint(w, fullCommands["webhook"].usage)
	fmt.Fprint(w, `  tether version           print the version, commit, Go version and build
`)
}

func serveCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(stderr, cfg.LogFormat, cfg.LogLevel)
	setMemoryLimit(log, getenv, "/")
	if cfg, err = sizeStreamsAndSessions(cfg, log, getenv); err != nil {
		return err
	}
	logProcs(log, getenv)
	startGCPacer(ctx, log, getenv)
	s, err := newServer(cfg, log)
	if err != nil {
		return err
	}
	startMemoryReleaser(ctx, log, cfg.MemoryReleaseAfter)
	return s.Run(ctx)
}
