//go:build !tether_sidecar

package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tether-mcp/tether/internal/inject"
)

// tether inject [flags] [FILE|-]...: adds the tether sidecar to the
// workloads of Kubernetes YAML and writes the result to stdout.

// injectFlags registers the flags that configure an injection (shared by
// inject and webhook) on fs, with c's values as defaults.
func injectFlags(fs *flag.FlagSet, c *inject.Config) {
	fs.StringVar(&c.Image, "image", c.Image, "tether image (annotation "+inject.AnnotationImage+")")
	fs.StringVar(&c.Service, "service", c.Service, "backend Service: NAME (the pod's namespace) or NAMESPACE/NAME (annotation "+inject.AnnotationService+")")
	fs.StringVar(&c.Port, "port", c.Port, "the Service port's NAME or NUMBER; default: its only port (annotation "+inject.AnnotationPort+")")
	fs.StringVar(&c.RedisURLSecret, "redis-url-secret", c.RedisURLSecret, "SECRET or SECRET/KEY (key default \"url\") holding the Redis URL; default: in-memory store (annotation "+inject.AnnotationRedisURLSecret+")")
	fs.StringVar(&c.Balancer, "balancer", c.Balancer, "p2c | least-loaded | round-robin | random; default: tether's (annotation "+inject.AnnotationBalancer+")")
	fs.StringVar(&c.SessionTTL, "session-ttl", c.SessionTTL, "idle TTL of a session record; default: tether's (annotation "+inject.AnnotationSessionTTL+")")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", c.ShutdownGrace, "tether's --shutdown-grace; the pod's terminationGracePeriodSeconds is raised to at least this + 20s (annotation "+inject.AnnotationShutdownGrace+")")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "tether's log level; default: info (annotation "+inject.AnnotationLogLevel+")")
	fs.StringVar(&c.CPURequest, "cpu-request", c.CPURequest, "CPU request of the sidecar (annotation "+inject.AnnotationCPURequest+")")
	fs.StringVar(&c.CPULimit, "cpu-limit", c.CPULimit, "CPU limit of the sidecar, and its GOMAXPROCS: the limit in whole CPUs, rounded up (annotation "+inject.AnnotationCPULimit+"; default: none, the runtime follows the node's CPUs)")
	fs.StringVar(&c.MemoryRequest, "memory-request", c.MemoryRequest, "memory request of the sidecar (annotation "+inject.AnnotationMemoryRequest+")")
	fs.BoolVar(&c.Legacy, "legacy-sidecar", c.Legacy, "a classic sidecar (last of the containers) instead of a native one, for Kubernetes < 1.29")
	fs.DurationVar(&c.PreStopSleep, "prestop-sleep", c.PreStopSleep, "classic sidecar only: preStop sleep that keeps tether up while the proxy drains (sleep action: Kubernetes >= 1.30; 0 disables)")
}

// withInjectFlag adds to an injection error the flag that settles it: the
// inject package names only the annotations.
func withInjectFlag(err error) error {
	switch {
	case errors.Is(err, inject.ErrNoImage):
		return fmt.Errorf("%w; --image sets one for every object", err)
	case errors.Is(err, inject.ErrNoService):
		return fmt.Errorf("%w; --service sets one for every object", err)
	case errors.Is(err, inject.ErrLegacyFinite):
		return fmt.Errorf("%w; drop --legacy-sidecar", err)
	}
	return err
}

func injectCommand(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	cfg := inject.DefaultConfig(version)
	fs := newFlagSet("tether inject")
	const synopsis = `usage: tether inject [flags] [FILE|-]...

Adds tether as a sidecar to the Pods, Deployments, StatefulSets, DaemonSets,
ReplicaSets, ReplicationControllers, Jobs and CronJobs of Kubernetes YAML
(files, or stdin) and writes the YAML to stdout; other objects pass through.
Annotations on an object (tether.dev/...) override the flags.
Running it again changes nothing.

  tether inject --service mcp-fetch proxy.yaml | kubectl apply -f -
`
	injectFlags(fs, &cfg)
	quiet := fs.Bool("quiet", false, "do not report each object on stderr")
	if err := envDefaults(fs, getenv); err != nil {
		return err
	}
	if err := parseFlags(fs, args, synopsis, stderr); err != nil {
		return err
	}
	inj := inject.Injector{Defaults: cfg}

	files := fs.Args()
	if len(files) == 0 {
		files = []string{"-"}
	}
	var out bytes.Buffer
	var results []inject.Result
	for _, name := range files {
		var src []byte
		var err error
		if name == "-" {
			src, err = io.ReadAll(stdin)
		} else {
			src, err = os.ReadFile(name)
		}
		if err != nil {
			return err
		}
		b, rs, err := inj.Stream(src)
		if err != nil {
			err = withInjectFlag(err)
			if name != "-" {
				return fmt.Errorf("%s: %w", name, err)
			}
			return err
		}
		// Files are documents of one stream.
		if out.Len() > 0 {
			if !bytes.HasSuffix(out.Bytes(), []byte("\n")) {
				out.WriteByte('\n')
			}
			if len(b) > 0 && !bytes.HasPrefix(b, []byte("---")) {
				out.WriteString("---\n")
			}
		}
		out.Write(b)
		results = append(results, rs...)
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		return err
	}
	if !*quiet {
		for _, r := range results {
			line := r.Object + " " + string(r.Action)
			if r.Detail != "" {
				line += " (" + r.Detail + ")"
			}
			fmt.Fprintln(stderr, strings.TrimSpace(line))
		}
	}
	return nil
}
