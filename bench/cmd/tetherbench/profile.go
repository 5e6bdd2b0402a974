package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// profiledTetherCommand is tether wired in-process the way cmd/tether's
// newServer wires it for `--backends` with the memory store (balancer,
// static discovery, memory store, Prometheus metrics, tracing off, the same
// http.Server settings), plus a CPU profile: cmd/tether exposes no pprof,
// and this package may not change it. It prints "ready", starts the profile
// on "start" (stdin) and prints "profiling", and writes the profile when
// stdin closes or on SIGTERM.
func profiledTetherCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tetherbench tether-profiled", flag.ContinueOnError)
	backends := fs.String("backends", "", "comma-separated backend URLs")
	listen := fs.String("listen", "127.0.0.1:0", "client listener")
	picker := fs.String("balancer", "p2c", "picker")
	out := fs.String("cpuprofile", "tether-cpu.pprof", "CPU profile output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pk, err := balancer.NewPicker(*picker, nil)
	if err != nil {
		return err
	}
	bal := balancer.New(balancer.Options{Picker: pk, Logger: log})
	metrics := telemetry.NewMetrics(telemetry.MetricsOptions{Endpoints: func() []telemetry.EndpointStat {
		var out []telemetry.EndpointStat
		for _, e := range bal.Endpoints() {
			out = append(out, telemetry.EndpointStat{ID: e.ID, URL: e.String(), State: e.State().String(), Sessions: e.Sessions(), Inflight: e.Inflight()})
		}
		return out
	}})
	var p *proxy.Proxy
	store := session.NewMemory(session.MemoryOptions{TTL: time.Hour, OnExpire: func(r *session.Record) { p.SessionExpired(r) }})
	defer store.Close()
	p = proxy.New(proxy.Config{
		Balancer: bal, Store: store, Transport: proxy.NewTransport(false), Logger: log, Metrics: metrics,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	})
	src, err := discovery.NewStatic(strings.Split(*backends, ","))
	if err != nil {
		return err
	}
	bgCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	synced := make(chan struct{})
	go src.Run(bgCtx, func(s discovery.Snapshot) {
		bal.Update(s)
		select {
		case <-synced:
		default:
			close(synced)
		}
	})
	<-synced
	go bal.Run(bgCtx)
	go p.RunLoadSync(bgCtx, time.Second)

	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: p, Protocols: &protos, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Println("ready", ln.Addr())

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
