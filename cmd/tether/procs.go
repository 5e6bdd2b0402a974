package main

import (
	"log/slog"
	"runtime"
)

// logProcs logs, at info, how many threads run Go code in serve and where
// that number comes from. It sets nothing: GOMAXPROCS is the Go runtime's
// own default unless the environment sets it. Since Go 1.25 that default
// follows the container's CPU limit (the cgroup's quota, rounded up, at
// least 2, at most the CPUs the process may run on) and the runtime
// re-reads the limit while it runs; without a limit it is every CPU the
// process may run on. The value in force is the metric
// go_sched_gomaxprocs_threads (the Go collector's, read at each scrape, so
// it follows the runtime's updates).
//
// Why not one thread, as serve set before (issue 29): one P was measured
// cheapest for a sidecar's own traffic on a 2-core machine (0.178–0.187 s
// of CPU per 1,000 follow-ups against 0.204–0.213 s with 2), but it holds
// at one core whatever the pod was given: a pod with a 4-CPU limit under
// heavy load ran its Redis calls, trace export, 4 MiB body scans and TLS
// on one thread. A sidecar that should run on fewer threads than its node
// has CPUs gets a CPU limit: the injector's tether.dev/cpu-limit
// annotation sets the container's limit and GOMAXPROCS with it (one
// thread for a limit of a core or less, where the runtime would take 2),
// or GOMAXPROCS is set in the environment.
func logProcs(log *slog.Logger, getenv func(string) string) {
	from := "the Go runtime's default: the container's CPU limit, else the CPUs"
	if getenv("GOMAXPROCS") != "" {
		from = "the environment"
	}
	log.Info("GOMAXPROCS", "GOMAXPROCS", runtime.GOMAXPROCS(0), "from", from, "cpus", runtime.NumCPU())
}
