// Package inject adds tether as a sidecar to Kubernetes workloads. One piece
// of logic serves two callers: `tether inject`, which rewrites YAML streams
// (keeping comments, field order and every field it does not own), and
// `tether webhook`, a mutating admission webhook for Pods.
//
// tether owns exactly one container, named "tether": a native sidecar (an
// init container with restartPolicy: Always, Kubernetes ≥ 1.29) by default,
// or a classic one at the end of the containers. Injection rewrites that
// container to the desired spec and raises terminationGracePeriodSeconds
// when it is too short for tether's shutdown grace; nothing else changes.
// Applying it twice changes nothing the second time.
package inject

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/discovery"
)

// Names of the things tether owns in a pod.
const (
	// ContainerName is the injected container's name; a container of that
	// name is tether's and is rewritten on every injection.
	ContainerName = "tether"
	// ListenAddr is where the proxy in the pod reaches tether: its upstream
	// becomes http://127.0.0.1:7480.
	ListenAddr = "127.0.0.1:7480"
	// AdminPort serves /healthz, /readyz and /metrics. It listens on the pod
	// address because kubelet probes come from the node, not from loopback.
	AdminPort     = 7481
	adminPortName = "tether-admin"
	// namespaceEnv carries the pod's namespace (downward API) so that
	// --k8s-service can name a Service of the pod's own namespace.
	namespaceEnv = "POD_NAMESPACE"
)

// Annotations configure injection per object; they are read from the
// workload's metadata and then from its pod template's (the pod template
// wins). Every key under the tether.dev/ prefix must be one of these.
const (
	annotationPrefix = "tether.dev/"
	// annotationInject: "true" opts a Pod into the webhook; "false" makes
	// both the webhook and `tether inject` leave the object alone.
	annotationInject = "tether.dev/inject"
	// AnnotationService: NAME (a Service of the pod's namespace) or
	// NAMESPACE/NAME, whose EndpointSlices are tether's backends.
	AnnotationService = "tether.dev/service"
	// AnnotationPort: the Service port's NAME or NUMBER (--k8s-port).
	AnnotationPort = "tether.dev/port"
	// AnnotationRedisURLSecret: SECRET or SECRET/KEY (key "url" by
	// default) holding the redis:// or rediss:// URL of the shared store.
	AnnotationRedisURLSecret = "tether.dev/redis-url-secret"
	// AnnotationBalancer: p2c, least-loaded, round-robin or random.
	AnnotationBalancer = "tether.dev/balancer"
	// AnnotationImage: the tether image.
	AnnotationImage = "tether.dev/image"
	// AnnotationSessionTTL: idle TTL of a session record (a Go duration).
	AnnotationSessionTTL = "tether.dev/session-ttl"
	// AnnotationShutdownGrace: how long tether lets requests and SSE
	// streams run on after SIGTERM (a Go duration).
	AnnotationShutdownGrace = "tether.dev/shutdown-grace"
	// AnnotationLogLevel: debug, info, warn or error.
	AnnotationLogLevel = "tether.dev/log-level"
	// AnnotationCPURequest and AnnotationMemoryRequest: the container's
	// resource requests (Kubernetes quantities).
	AnnotationCPURequest    = "tether.dev/cpu-request"
	AnnotationMemoryRequest = "tether.dev/memory-request"
	// AnnotationCPULimit: the container's CPU limit (a Kubernetes
	// quantity), and its GOMAXPROCS with it (Config.CPULimit). Named as
	// the requests are; Linkerd's is config.linkerd.io/proxy-cpu-limit,
	// but in tether's pods "the proxy" is the user's container.
	AnnotationCPULimit = "tether.dev/cpu-limit"
)

// knownAnnotations lists every annotation injection reads.
var knownAnnotations = []string{
	annotationInject, AnnotationService, AnnotationPort, AnnotationRedisURLSecret,
	AnnotationBalancer, AnnotationImage, AnnotationSessionTTL, AnnotationShutdownGrace,
	AnnotationLogLevel, AnnotationCPURequest, AnnotationMemoryRequest, AnnotationCPULimit,
}

// Defaults of Config.
const (
	defaultImageRepo     = "ghcr.io/tether-mcp/tether"
	defaultShutdownGrace = 25 * time.Second
	defaultCPURequest    = "50m"
	defaultMemoryRequest = "64Mi"
	defaultRedisKey      = "url"
	// defaultPreStopSleep delays SIGTERM to a classic sidecar so that the
	// proxy beside it can drain through it first.
	defaultPreStopSleep = 10 * time.Second
	// proxyDrainBudget is the part of the pod's termination grace left to
	// the proxy's own drain before tether's shutdown grace starts.
	proxyDrainBudget = 20 * time.Second
)

// defaultImage is the image of tether version v ("dev" or empty: latest).
func defaultImage(v string) string {
	if v == "" || v == "dev" {
		return defaultImageRepo + ":latest"
	}
	return defaultImageRepo + ":" + v
}

// Config is what one injection writes. Flags give the defaults; an object's
// annotations override them field by field (Config.With).
type Config struct {
	// Image of the tether container. Required.
	Image string
	// Service is NAME (in the pod's namespace) or NAMESPACE/NAME. Required.
	Service string
	// Port is the Service port's name or number; empty: the only port.
	Port string
	// RedisURLSecret is SECRET or SECRET/KEY; empty: the in-memory store
	// (fine for one proxy replica; several need Redis to share sessions).
	RedisURLSecret string
	// Balancer, SessionTTL and LogLevel are passed on when set.
	Balancer   string
	SessionTTL string
	LogLevel   string
	// ShutdownGrace is tether's --shutdown-grace; the pod's
	// terminationGracePeriodSeconds is raised to at least ShutdownGrace
	// plus 20 s for the proxy's own drain.
	ShutdownGrace time.Duration
	// CPURequest and MemoryRequest are the container's requests.
	CPURequest, MemoryRequest string
	// CPULimit is the container's CPU limit; empty: none. With it the
	// container's GOMAXPROCS is the limit in whole CPUs, rounded up
	// (gomaxprocsFor), as Linkerd's proxy-cpu-limit sets the proxy's
	// worker threads. Without it tether runs on the Go runtime's default
	// (every CPU of the node when the container has no limit).
	CPULimit string
	// Legacy injects a classic sidecar (the last of the containers) for
	// clusters without native sidecars (Kubernetes < 1.29).
	Legacy bool
	// PreStopSleep (classic sidecar only) delays tether's SIGTERM so the
	// proxy can drain through it; it uses the sleep action (Kubernetes ≥
	// 1.30). 0: no preStop hook.
	PreStopSleep time.Duration
}

// DefaultConfig is the configuration without flags or annotations (the
// Service is still required).
func DefaultConfig(version string) Config {
	return Config{
		Image:         defaultImage(version),
		ShutdownGrace: defaultShutdownGrace,
		CPURequest:    defaultCPURequest,
		MemoryRequest: defaultMemoryRequest,
		PreStopSleep:  defaultPreStopSleep,
	}
}

// With returns c overridden by the tether.dev/ annotations in ann. Unknown
// tether.dev/ keys and malformed values are errors.
func (c Config) With(ann map[string]string) (Config, error) {
	var unknown []string
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		if strings.HasPrefix(k, annotationPrefix) && !slices.Contains(knownAnnotations, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		return c, fmt.Errorf("unknown annotation %s (known: %s)", strings.Join(unknown, ", "), strings.Join(knownAnnotations, ", "))
	}
	set := func(key string, field *string) {
		if v, ok := ann[key]; ok {
			*field = strings.TrimSpace(v)
		}
	}
	set(AnnotationImage, &c.Image)
	set(AnnotationService, &c.Service)
	set(AnnotationPort, &c.Port)
	set(AnnotationRedisURLSecret, &c.RedisURLSecret)
	set(AnnotationBalancer, &c.Balancer)
	set(AnnotationSessionTTL, &c.SessionTTL)
	set(AnnotationLogLevel, &c.LogLevel)
	set(AnnotationCPURequest, &c.CPURequest)
	set(AnnotationMemoryRequest, &c.MemoryRequest)
	set(AnnotationCPULimit, &c.CPULimit)
	if v, ok := ann[AnnotationShutdownGrace]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return c, fmt.Errorf("annotation %s=%q: %v", AnnotationShutdownGrace, v, err)
		}
		c.ShutdownGrace = d
	}
	return c, nil
}

// Errors of an injection that its caller may complete with how its own
// options set the value (a flag, say); this package names the annotations.
var (
	ErrNoImage   = errors.New("no image (annotation " + AnnotationImage + ")")
	ErrNoService = errors.New("no backend Service (annotation " + AnnotationService + ": NAME or NAMESPACE/NAME)")
	// ErrLegacyFinite: Config.Legacy for pods that run to completion.
	ErrLegacyFinite = errors.New("a classic sidecar never exits, so these pods would never complete: use the native sidecar (Kubernetes ≥ 1.29)")
)

// Validate reports the first problem of c, naming the setting by the
// suffix of its annotation (which the commands' flags share).
func (c Config) Validate() error {
	if c.Image == "" {
		return ErrNoImage
	}
	if c.Service == "" {
		return ErrNoService
	}
	ref := c.Service
	if !strings.Contains(ref, "/") {
		ref = "ns/" + ref // the namespace comes from the pod at run time
	}
	if _, err := discovery.ParseServiceRef(ref); err != nil {
		return fmt.Errorf("service %q: want NAME or NAMESPACE/NAME, both DNS labels", c.Service)
	}
	if _, err := discovery.ParsePortSelector(c.Port); err != nil {
		return fmt.Errorf("port %q: want a Service port name or number", c.Port)
	}
	if c.RedisURLSecret != "" {
		name, key := c.redisSecret()
		if len(validation.IsDNS1123Subdomain(name)) > 0 || len(validation.IsConfigMapKey(key)) > 0 || strings.Count(c.RedisURLSecret, "/") > 1 {
			return fmt.Errorf("redis-url-secret %q: want SECRET or SECRET/KEY", c.RedisURLSecret)
		}
	}
	if c.Balancer != "" && !slices.Contains(balancer.PickerNames, c.Balancer) {
		return fmt.Errorf("balancer %q: want one of %s", c.Balancer, strings.Join(balancer.PickerNames, ", "))
	}
	if c.SessionTTL != "" {
		if d, err := time.ParseDuration(c.SessionTTL); err != nil || d <= 0 {
			return fmt.Errorf("session-ttl %q: want a positive duration such as 1h", c.SessionTTL)
		}
	}
	if c.LogLevel != "" && !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		return fmt.Errorf("log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.ShutdownGrace < 0 {
		return fmt.Errorf("shutdown-grace %s: must not be negative", c.ShutdownGrace)
	}
	if c.PreStopSleep < 0 {
		return fmt.Errorf("prestop-sleep %s: must not be negative", c.PreStopSleep)
	}
	for _, q := range []struct{ name, v string }{{"cpu-request", c.CPURequest}, {"memory-request", c.MemoryRequest}, {"cpu-limit", c.CPULimit}} {
		if q.v == "" {
			continue
		}
		if _, err := resource.ParseQuantity(q.v); err != nil {
			return fmt.Errorf("%s %q: not a Kubernetes quantity", q.name, q.v)
		}
	}
	return c.validateCPULimit()
}

// validateCPULimit reports a CPU limit the API server would refuse (not
// above zero, or below the request), here, where the annotation is named,
// rather than as the Pod's creation failing. The quantities parse.
func (c Config) validateCPULimit() error {
	if c.CPULimit == "" {
		return nil
	}
	limit := resource.MustParse(c.CPULimit)
	if limit.Sign() <= 0 {
		return fmt.Errorf("cpu-limit %q: want more than 0 (such as 500m or 2)", c.CPULimit)
	}
	if c.CPURequest == "" {
		return nil
	}
	if request := resource.MustParse(c.CPURequest); request.Cmp(limit) > 0 {
		return fmt.Errorf("cpu-limit %q: below the cpu-request %q (Kubernetes refuses a request above its limit)", c.CPULimit, c.CPURequest)
	}
	return nil
}

// gomaxprocsFor is the GOMAXPROCS for a CPU limit: the limit in whole
// CPUs, rounded up, as Linkerd sets its proxy's cores from
// proxy-cpu-limit (ToWholeCPUCores). For a limit of a core or less that is
// 1, where the Go runtime's own default under a limit is never below 2:
// a sidecar given at most a core is one proxy's traffic, and one thread
// ran it for 0.178–0.187 s of CPU per 1,000 follow-ups against
// 0.204–0.213 s with 2 (docs/runtime.md, "Memory and CPU"). limit is valid and
// above zero.
func gomaxprocsFor(limit string) int64 {
	q := resource.MustParse(limit)
	return (q.MilliValue() + 999) / 1000
}

// redisSecret splits RedisURLSecret into the Secret's name and key.
func (c Config) redisSecret() (name, key string) {
	name, key, ok := strings.Cut(c.RedisURLSecret, "/")
	if !ok {
		key = defaultRedisKey
	}
	return name, key
}

// serviceArg is --k8s-service: a bare NAME is qualified with the pod's
// namespace at run time by the kubelet's $(VAR) expansion.
func (c Config) serviceArg() string {
	if strings.Contains(c.Service, "/") {
		return c.Service
	}
	return "$(" + namespaceEnv + ")/" + c.Service
}

// terminationGrace is the least terminationGracePeriodSeconds that leaves
// the proxy its drain and tether its shutdown grace.
func (c Config) terminationGrace() int64 {
	return int64((c.ShutdownGrace + proxyDrainBudget + time.Second - 1) / time.Second)
}

// formatDuration prints d as Go parses it, without trailing zero units
// ("25s", "1m30s", "1h").
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
