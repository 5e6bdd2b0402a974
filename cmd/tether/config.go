package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/podcost"
	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// config is the serve command's configuration (docs/design.md#contracts).
// Every flag can also be set as TETHER_<UPPER_SNAKE>; a flag on the command
// line wins.
type config struct {
	Listen        string
	AdminListen   string
	Backends      []string
	K8sService    string
	K8sPort       string
	Kubeconfig    string
	KubeContext   string // full build only (kubeconfig_full.go)
	RedisURL      string
	RedisPrefix   string
	RedisTimeout  time.Duration
	RedisCA       string
	SessionMaxAge time.Duration
	// MaxSessions bounds the session records held in this process (the
	// memory store's, or the Redis cache's entries); MaxSessionInitBytes
	// the bytes of the distinct initialize bodies they hold.
	MaxSessions         int
	MaxSessionInitBytes int64
	// cacheSizeAlias is --session-cache-size, the deprecated name of
	// --max-sessions (0: not given).
	cacheSizeAlias int
	// maxStreamsGiven and maxSessionsGiven: set by a flag or its TETHER_
	// variable; otherwise sizeStreamsAndSessions derives them from memory.
	maxStreamsGiven, maxSessionsGiven bool
	// RedisPassword comes from TETHER_REDIS_PASSWORD only: a secret on the
	// command line is visible to every process on the host.
	RedisPassword string
	// getenv reads the OTEL_* variables for the trace exporter.
	getenv        func(string) string
	SessionTTL    time.Duration
	Balancer      string
	MaxBody       int64
	ShutdownGrace time.Duration
	// MemoryReleaseAfter is how long after its last garbage collection a
	// process gone quiet gives free memory back to the OS (0: never;
	// see memoryReleaser).
	MemoryReleaseAfter time.Duration
	BackendH2C         bool
	TraceStdout        bool
	LogFormat          string
	LogLevel           string

	// MaxInitBody bounds initialize bodies, which are stored with the
	// session. PrincipalHeaders are the credential headers whose keyed
	// digest binds a session to its creator; the key comes from
	// PrincipalKey (TETHER_PRINCIPAL_KEY only, like the Redis password) or
	// PrincipalKeyFile (see principalKey).
	MaxInitBody      int64
	PrincipalHeaders []string
	PrincipalKeyFile string
	PrincipalKey     string
	// Client limits (docs/design.md#limits).
	MaxInflightBodyBytes      int64
	BodyTimeout               time.Duration
	MaxStreams                int
	HTTP2MaxConcurrentStreams int
	ClientSendTimeout         time.Duration

	// AffinityHeader names the request header whose value is a handle key
	// for consistent hashing with bounded loads (balancer.PickByKey);
	// "" is off. AffinityEpsilon is that picker's ε.
	AffinityHeader  string
	AffinityEpsilon float64
	// AffinityArgument is the tools/call argument (params.arguments.NAME)
	// the affinity header carries; tether checks the header against it.
	AffinityArgument string
	// ListenStreamWeight is what one subscriptions/listen stream adds to
	// its backend's load (balancer.Options.ListenStreamWeight).
	ListenStreamWeight float64
	// Drain is what happens to a terminating backend's sessions
	// (proxy.DrainModes), and DrainRate how many move per second off each.
	Drain     string
	DrainRate float64

	// PodDeletionCost turns on the pod deletion cost writer
	// (internal/podcost; needs K8sService); PodDeletionCostInterval is the
	// least time between two of its passes.
	PodDeletionCost         bool
	PodDeletionCostInterval time.Duration
}

func defaultConfig() config {
	return config{
		Listen:             "127.0.0.1:7480",
		AdminListen:        "127.0.0.1:7481",
		SessionTTL:         time.Hour,
		Balancer:           "p2c",
		MaxBody:            proxy.DefaultMaxBody,
		ShutdownGrace:      25 * time.Second,
		MemoryReleaseAfter: defaultMemoryReleaseAfter,
		LogFormat:          "text",
		LogLevel:           "info",
		RedisPrefix:        "tether:",
		RedisTimeout:       50 * time.Millisecond,
		getenv:             func(string) string { return "" },

		MaxInitBody:               proxy.DefaultMaxInitBody,
		PrincipalHeaders:          append([]string(nil), proxy.DefaultPrincipalHeaders...),
		MaxInflightBodyBytes:      proxy.DefaultMaxInflightBodyBytes,
		BodyTimeout:               proxy.DefaultBodyTimeout,
		MaxStreams:                proxy.DefaultMaxStreams,
		HTTP2MaxConcurrentStreams: server.DefaultHTTP2MaxConcurrentStreams,
		ClientSendTimeout:         server.DefaultClientSendTimeout,
		AffinityEpsilon:           balancer.DefaultAffinityEpsilon,
		// Why these bounds: see session.DefaultMaxSessions and
		// session.DefaultMaxInitBytes.
		MaxSessions:         session.DefaultMaxSessions,
		MaxSessionInitBytes: session.DefaultMaxInitBytes,
		Drain:               proxy.DrainModes[0],
		DrainRate:           proxy.DefaultDrainRate,

		// Why: see podcost.DefaultInterval.
		PodDeletionCostInterval: podcost.DefaultInterval,
	}
}

// parseServeFlags parses args (after the subcommand) with environment
// defaults. Errors are one line, suitable for "tether: <err>".
func parseServeFlags(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := newFlagSet("tether serve")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "client listener address (HTTP/1.1 and h2c)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin listener address: /healthz /readyz")
	fs.Func("backends", "comma-separated static backend base URLs (standalone mode)", func(s string) error {
		cfg.Backends = splitList(s)
		return nil
	})
	fs.StringVar(&cfg.K8sService, "k8s-service", "", "NAMESPACE/NAME of the Service whose EndpointSlices are the backends")
	fs.StringVar(&cfg.K8sPort, "k8s-port", "", "port NAME or NUMBER of the EndpointSlices (default: the only one)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig path (default: in-cluster, then $KUBECONFIG)")
	kubeContextFlag(fs, &cfg)
	fs.BoolVar(&cfg.PodDeletionCost, "pod-deletion-cost", false, "annotate the backend pods with controller.kubernetes.io/pod-deletion-cost = their live sessions, so that a ReplicaSet scaling down deletes the emptiest first (one replica at a time, by a Lease; needs --k8s-service and RBAC: deploy/components/pod-deletion-cost)")
	fs.DurationVar(&cfg.PodDeletionCostInterval, "pod-deletion-cost-interval", cfg.PodDeletionCostInterval, "least time between two passes of --pod-deletion-cost (each changed pod is one patch, a write to etcd)")
	fs.StringVar(&cfg.RedisURL, "redis-url", "", "URL of the shared session store: redis://, rediss://, redis+sentinel://, redis+cluster:// (see README; default: in-memory)")
	fs.StringVar(&cfg.RedisPrefix, "redis-prefix", cfg.RedisPrefix, "prefix of tether's Redis keys")
	fs.DurationVar(&cfg.RedisTimeout, "redis-timeout", cfg.RedisTimeout, "budget of one Redis call; a slower Redis counts as down")
	fs.StringVar(&cfg.RedisCA, "redis-ca", "", "PEM file of the CA that signed the Redis server's certificate (rediss://)")
	fs.DurationVar(&cfg.SessionTTL, "session-ttl", cfg.SessionTTL, "idle TTL of a session record")
	fs.DurationVar(&cfg.SessionMaxAge, "session-max-age", 0, "absolute cap on a session record's life (0: none)")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", cfg.MaxSessions, "session records held in this process (the memory store's sessions; with Redis, the local cache's entries): beyond it the least recently used are evicted")
	fs.Int64Var(&cfg.MaxSessionInitBytes, "max-session-init-bytes", cfg.MaxSessionInitBytes, "bytes of initialize bodies held in this process, identical bodies counted once: beyond it the least recently used sessions are evicted")
	fs.Func("session-cache-size", "deprecated: --max-sessions", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("parse error")
		}
		if n <= 0 {
			return fmt.Errorf("must be positive, got %d", n)
		}
		cfg.cacheSizeAlias = n
		return nil
	})
	fs.StringVar(&cfg.Balancer, "balancer", cfg.Balancer, "new-session placement: "+strings.Join(balancer.PickerNames, " | "))
	fs.Int64Var(&cfg.MaxBody, "max-body", cfg.MaxBody, "largest accepted POST body in bytes (larger: 413)")
	fs.Int64Var(&cfg.MaxInitBody, "max-init-body", cfg.MaxInitBody, "largest accepted initialize body in bytes, stored with the session (larger: 413)")
	fs.Func("principal-headers", "comma-separated credential headers whose keyed digest binds a session to its creator for re-initialization (default Authorization; empty: no binding)", func(s string) error {
		cfg.PrincipalHeaders = append([]string{}, splitList(s)...)
		return nil
	})
	fs.StringVar(&cfg.PrincipalKeyFile, "principal-key-file", "", "file holding the key (32 bytes or more) of the session principal digests, shared by all replicas (default: TETHER_PRINCIPAL_KEY, else a key kept in Redis, else a random one)")
	fs.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", cfg.ShutdownGrace, "on SIGTERM, how long in-flight requests and SSE streams may run on")
	fs.DurationVar(&cfg.MemoryReleaseAfter, "memory-release-after", cfg.MemoryReleaseAfter, "after a burst, how long after its last garbage collection a quiet tether gives back to the OS the memory its heap holds past twice its working set (0: left to the Go runtime)")
	fs.BoolVar(&cfg.BackendH2C, "backend-h2c", false, "speak HTTP/2 without TLS (prior knowledge) to backends")
	fs.BoolVar(&cfg.TraceStdout, "trace-stdout", false, "write trace spans to stdout as JSON (local runs; OTLP is configured with the OTEL_* variables)")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "log format: text | json")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log level: debug | info | warn | error")
	fs.Int64Var(&cfg.MaxInflightBodyBytes, "max-inflight-body-bytes", cfg.MaxInflightBodyBytes, "request-body bytes held at once by all requests (more: 503)")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "time a request body may take to arrive, whole (slower: 408, connection closed)")
	fs.IntVar(&cfg.MaxStreams, "max-streams", cfg.MaxStreams, "GET (SSE) streams open at once (more: 503)")
	fs.IntVar(&cfg.HTTP2MaxConcurrentStreams, "http2-max-concurrent-streams", cfg.HTTP2MaxConcurrentStreams, "concurrent requests per h2c client connection")
	fs.DurationVar(&cfg.ClientSendTimeout, "client-send-timeout", cfg.ClientSendTimeout, "time a client may take nothing of an answer being written to it before the write fails, the request is cancelled and the connection closed (nginx's send_timeout)")
	fs.StringVar(&cfg.AffinityHeader, "affinity-header", "", "header (e.g. Mcp-Param-Workspace) whose value keys session-less MCP 2026-07-28 requests to one backend by consistent hashing with bounded loads (default: none)")
	fs.StringVar(&cfg.Drain, "drain", cfg.Drain, "what happens to the sessions of a terminating backend: proactive (moved to others ahead of its exit, each at its first quiet moment) or on-failure (moved when a request finds it gone)")
	fs.Float64Var(&cfg.DrainRate, "drain-rate", cfg.DrainRate, "sessions moved per second off each draining backend")
	fs.Float64Var(&cfg.ListenStreamWeight, "listen-stream-weight", cfg.ListenStreamWeight, "what one open subscriptions/listen stream adds to its backend's load, next to 1 per request in flight (0: streams are placed by load but weigh nothing)")
	fs.StringVar(&cfg.AffinityArgument, "affinity-argument", "", "the tools/call argument --affinity-header carries (e.g. workspace): tether checks the header against params.arguments.NAME and refuses a mismatch (required with --affinity-header)")
	fs.Float64Var(&cfg.AffinityEpsilon, "affinity-epsilon", cfg.AffinityEpsilon, "ε of --affinity-header: no backend takes a keyed request while above (1+ε) × the mean in-flight load")

	// Environment first, so that the command line overrides it.
	if err := envDefaults(fs, getenv); err != nil {
		return cfg, err
	}
	if err := parseFlags(fs, args, "usage: tether serve [flags]", stderr); err != nil {
		return cfg, err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "max-streams":
			cfg.maxStreamsGiven = true
		case "max-sessions", "session-cache-size":
			cfg.maxSessionsGiven = true
		}
	})
	if cfg.cacheSizeAlias != 0 {
		maxSet := false
		fs.Visit(func(f *flag.Flag) { maxSet = maxSet || f.Name == "max-sessions" })
		if maxSet && cfg.MaxSessions != cfg.cacheSizeAlias {
			return cfg, fmt.Errorf("--session-cache-size %d (deprecated) contradicts --max-sessions %d: set --max-sessions only", cfg.cacheSizeAlias, cfg.MaxSessions)
		}
		cfg.MaxSessions = cfg.cacheSizeAlias
	}
	cfg.RedisPassword = getenv("TETHER_REDIS_PASSWORD")
	cfg.PrincipalKey = getenv("TETHER_PRINCIPAL_KEY")
	cfg.getenv = getenv
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", redactURL(fs.Arg(0)))
	}
	return cfg, cfg.validate()
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// validate rejects bad or contradictory settings with one-line errors.
func (c config) validate() error {
	switch {
	case len(c.Backends) > 0 && c.K8sService != "":
		return errors.New("--backends and --k8s-service are mutually exclusive")
	case len(c.Backends) == 0 && c.K8sService == "":
		return errors.New("no backends: set --backends (standalone) or --k8s-service (Kubernetes)")
	case c.K8sService == "" && (c.K8sPort != "" || c.Kubeconfig != ""):
		return errors.New("--k8s-port and --kubeconfig need --k8s-service")
	case c.K8sService == "" && c.KubeContext != "":
		return errors.New("--kube-context needs --k8s-service")
	case c.PodDeletionCost && c.K8sService == "":
		return errors.New("--pod-deletion-cost needs --k8s-service: it annotates the pods behind that Service")
	case c.PodDeletionCostInterval < time.Second:
		return fmt.Errorf("--pod-deletion-cost-interval must be at least 1s, got %s", c.PodDeletionCostInterval)
	case c.RedisURL == "" && c.RedisCA != "":
		return errors.New("--redis-ca needs --redis-url")
	case c.RedisTimeout <= 0:
		return fmt.Errorf("--redis-timeout must be positive, got %s", c.RedisTimeout)
	case c.SessionMaxAge < 0:
		return fmt.Errorf("--session-max-age must not be negative, got %s", c.SessionMaxAge)
	case c.MaxSessions <= 0:
		return fmt.Errorf("--max-sessions must be positive, got %d", c.MaxSessions)
	case c.MaxSessionInitBytes <= 0:
		return fmt.Errorf("--max-session-init-bytes must be positive, got %d", c.MaxSessionInitBytes)
	case c.SessionTTL <= 0:
		return fmt.Errorf("--session-ttl must be positive, got %s", c.SessionTTL)
	case c.MaxBody <= 0:
		return fmt.Errorf("--max-body must be positive, got %d", c.MaxBody)
	case c.MaxInitBody <= 0:
		return fmt.Errorf("--max-init-body must be positive, got %d", c.MaxInitBody)
	case c.PrincipalKey != "" && c.PrincipalKeyFile != "":
		return errors.New("TETHER_PRINCIPAL_KEY and --principal-key-file are mutually exclusive")
	case c.PrincipalKey != "" && len(c.PrincipalKey) < minPrincipalKey:
		return fmt.Errorf("TETHER_PRINCIPAL_KEY must be at least %d bytes", minPrincipalKey)
	case c.MaxInflightBodyBytes < c.MaxBody:
		return fmt.Errorf("--max-inflight-body-bytes (%d) must be at least --max-body (%d)", c.MaxInflightBodyBytes, c.MaxBody)
	case c.BodyTimeout <= 0:
		return fmt.Errorf("--body-timeout must be positive, got %s", c.BodyTimeout)
	case c.MaxStreams <= 0:
		return fmt.Errorf("--max-streams must be positive, got %d", c.MaxStreams)
	case c.HTTP2MaxConcurrentStreams <= 0:
		return fmt.Errorf("--http2-max-concurrent-streams must be positive, got %d", c.HTTP2MaxConcurrentStreams)
	case c.ClientSendTimeout <= 0:
		return fmt.Errorf("--client-send-timeout must be positive, got %s", c.ClientSendTimeout)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("--shutdown-grace must not be negative, got %s", c.ShutdownGrace)
	case c.MemoryReleaseAfter < 0:
		return fmt.Errorf("--memory-release-after must not be negative, got %s", c.MemoryReleaseAfter)
	case !slices.Contains(balancer.PickerNames, c.Balancer):
		return fmt.Errorf("--balancer %q: want one of %s", c.Balancer, strings.Join(balancer.PickerNames, ", "))
	case c.LogFormat != "text" && c.LogFormat != "json":
		return fmt.Errorf("--log-format %q: want text or json", c.LogFormat)
	case c.AffinityHeader != "" && !validHeaderName(c.AffinityHeader):
		return fmt.Errorf("--affinity-header: %q is not a header name", c.AffinityHeader)
	case hopByHop[textproto.CanonicalMIMEHeaderKey(c.AffinityHeader)]:
		return fmt.Errorf("--affinity-header: %s is a hop-by-hop header", c.AffinityHeader)
	case c.AffinityHeader != "" && c.AffinityArgument == "":
		return fmt.Errorf("--affinity-header %s needs --affinity-argument: the tools/call argument it carries, which tether checks it against", c.AffinityHeader)
	case c.AffinityHeader == "" && c.AffinityArgument != "":
		return errors.New("--affinity-argument is only meaningful with --affinity-header")
	}
	if _, ok := proxy.ParseDrainMode(c.Drain); !ok {
		return fmt.Errorf("--drain: want %s, got %q", strings.Join(proxy.DrainModes, " or "), c.Drain)
	}
	if !(c.DrainRate > 0 && c.DrainRate <= 100000) { // NaN too
		return fmt.Errorf("--drain-rate: must be in (0, 100000] sessions per second, got %v", c.DrainRate)
	}
	if !(c.ListenStreamWeight >= 0 && c.ListenStreamWeight <= 1000) { // NaN too
		return fmt.Errorf("--listen-stream-weight: must be in [0, 1000], got %v", c.ListenStreamWeight)
	}
	if err := balancer.CheckAffinityEpsilon(c.AffinityEpsilon); err != nil {
		return fmt.Errorf("--affinity-epsilon: %w", err)
	}
	if _, err := telemetry.ParseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("--log-level %w", err)
	}
	for _, addr := range []struct{ flag, value string }{{"--listen", c.Listen}, {"--admin-listen", c.AdminListen}} {
		if _, _, err := net.SplitHostPort(addr.value); err != nil {
			return fmt.Errorf("%s %q: %v", addr.flag, addr.value, err)
		}
	}
	if c.K8sService != "" {
		if _, err := discovery.ParseServiceRef(c.K8sService); err != nil {
			return fmt.Errorf("--k8s-service %w", err)
		}
		if _, err := discovery.ParsePortSelector(c.K8sPort); err != nil {
			return fmt.Errorf("--k8s-port %w", err)
		}
	}
	if c.RedisURL != "" {
		if _, err := session.ParseRedisURL(c.RedisURL); err != nil {
			return urlError("--redis-url", c.RedisURL, err)
		}
	}
	for _, h := range c.PrincipalHeaders {
		if !validHeaderName(h) {
			return fmt.Errorf("--principal-headers: %q is not a header name", h)
		}
		if hopByHop[textproto.CanonicalMIMEHeaderKey(h)] {
			return fmt.Errorf("--principal-headers: %s is a hop-by-hop header: it never reaches the backend", h)
		}
	}
	for _, b := range c.Backends {
		if _, err := discovery.ParseBackendURL(b); err != nil {
			return fmt.Errorf("--backends: %w", err)
		}
	}
	return nil
}

// hopByHop are the headers a proxy removes (RFC 9110 §7.6.1), which
// therefore never reach a backend.
var hopByHop = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// validHeaderName reports whether h is an HTTP field name (an RFC 9110 token).
func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
