package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParseServeFlags(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	base := defaultConfig()
	base.Backends = []string{"http://127.0.0.1:9001"}
	with := func(f func(*config)) config { c := base; f(&c); return c }

	tests := []struct {
		name    string
		args    []string
		env     func(string) string
		want    config
		wantErr string
	}{
		{"defaults", []string{"--backends", "http://127.0.0.1:9001"}, env(), base, ""},
		{"env sets", nil, env("TETHER_BACKENDS", "http://127.0.0.1:9001", "TETHER_SESSION_TTL", "5m", "TETHER_BALANCER", "random"),
			with(func(c *config) { c.SessionTTL = 5 * time.Minute; c.Balancer = "random" }), ""},
		{"flag beats env", []string{"--balancer", "round-robin", "--max-body", "1024"},
			env("TETHER_BACKENDS", "http://127.0.0.1:9001", "TETHER_BALANCER", "random", "TETHER_MAX_BODY", "99"),
			with(func(c *config) { c.Balancer = "round-robin"; c.MaxBody = 1024 }), ""},
		{"list with spaces", []string{"--backends", " http://127.0.0.1:9001 , http://127.0.0.1:9002,"}, env(),
			with(func(c *config) { c.Backends = []string{"http://127.0.0.1:9001", "http://127.0.0.1:9002"} }), ""},
		{"all flags", []string{"--backends", "http://127.0.0.1:9001", "--listen", "0.0.0.0:8080", "--admin-listen", "127.0.0.1:0",
			"--shutdown-grace", "3s", "--backend-h2c", "--log-format", "json", "--log-level", "debug", "--memory-release-after", "0s"}, env(),
			with(func(c *config) {
				c.Listen, c.AdminListen, c.ShutdownGrace, c.BackendH2C, c.LogFormat, c.LogLevel = "0.0.0.0:8080", "127.0.0.1:0", 3*time.Second, true, "json", "debug"
				c.MemoryReleaseAfter = 0
			}), ""},

		{"redis", []string{"--backends", "http://127.0.0.1:9001", "--redis-url", "rediss://redis.example:6380/2", "--redis-prefix", "t1:",
			"--session-max-age", "24h", "--session-cache-size", "500", "--redis-timeout", "20ms"},
			env("TETHER_REDIS_PASSWORD", "s3cret"),
			with(func(c *config) {
				c.RedisURL, c.RedisPrefix, c.SessionMaxAge, c.MaxSessions, c.RedisTimeout = "rediss://redis.example:6380/2", "t1:", 24*time.Hour, 500, 20*time.Millisecond
				c.RedisPassword = "s3cret"
			}), ""},
		{"limits", []string{"--backends", "http://127.0.0.1:9001", "--max-inflight-body-bytes", "8388608", "--body-timeout", "5s",
			"--http2-max-concurrent-streams", "100", "--client-send-timeout", "30s"},
			env("TETHER_MAX_STREAMS", "500"),
			with(func(c *config) {
				c.MaxInflightBodyBytes, c.BodyTimeout, c.MaxStreams, c.HTTP2MaxConcurrentStreams = 8<<20, 5*time.Second, 500, 100
				c.ClientSendTimeout = 30 * time.Second
			}), ""},
		{"client send timeout from env", []string{"--backends", "http://127.0.0.1:9001"},
			env("TETHER_CLIENT_SEND_TIMEOUT", "2m"),
			with(func(c *config) { c.ClientSendTimeout = 2 * time.Minute }), ""},

		{"init body and principal", []string{"--backends", "http://127.0.0.1:9001", "--max-init-body", "8192",
			"--principal-headers", "Authorization, X-Auth-Request-User", "--principal-key-file", "/run/key"}, env(),
			with(func(c *config) {
				c.MaxInitBody, c.PrincipalKeyFile = 8192, "/run/key"
				c.PrincipalHeaders = []string{"Authorization", "X-Auth-Request-User"}
			}), ""},
		{"no principal headers", []string{"--backends", "http://127.0.0.1:9001", "--principal-headers", ""}, env("TETHER_PRINCIPAL_KEY", strings.Repeat("k", 32)),
			with(func(c *config) { c.PrincipalHeaders, c.PrincipalKey = []string{}, strings.Repeat("k", 32) }), ""},

		{"affinity", []string{"--backends", "http://127.0.0.1:9001", "--affinity-header", "Mcp-Param-Workspace", "--affinity-argument", "workspace", "--affinity-epsilon", "0.5"}, env(),
			with(func(c *config) {
				c.AffinityHeader, c.AffinityArgument, c.AffinityEpsilon = "Mcp-Param-Workspace", "workspace", 0.5
			}), ""},
		{"affinity in env", nil, env("TETHER_BACKENDS", "http://127.0.0.1:9001", "TETHER_AFFINITY_HEADER", "Mcp-Param-Workspace", "TETHER_AFFINITY_ARGUMENT", "workspace"),
			with(func(c *config) { c.AffinityHeader, c.AffinityArgument = "Mcp-Param-Workspace", "workspace" }), ""},
		{"affinity header without its argument", []string{"--backends", "http://127.0.0.1:9001", "--affinity-header", "Mcp-Param-Workspace"}, env(), config{}, "needs --affinity-argument"},
		{"affinity argument without a header", []string{"--backends", "http://127.0.0.1:9001", "--affinity-argument", "workspace"}, env(), config{}, "--affinity-argument is only meaningful with --affinity-header"},
		{"bad affinity header", []string{"--backends", "http://127.0.0.1:9001", "--affinity-header", "Mcp Param"}, env(), config{}, "--affinity-header"},
		{"hop-by-hop affinity header", []string{"--backends", "http://127.0.0.1:9001", "--affinity-header", "te"}, env(), config{}, "hop-by-hop"},
		{"listen stream weight", []string{"--backends", "http://127.0.0.1:9001", "--listen-stream-weight", "0.25"}, env(),
			with(func(c *config) { c.ListenStreamWeight = 0.25 }), ""},
		{"negative listen stream weight", []string{"--backends", "http://127.0.0.1:9001", "--listen-stream-weight", "-1"}, env(), config{}, "--listen-stream-weight: must be in [0, 1000]"},
		{"zero affinity epsilon", []string{"--backends", "http://127.0.0.1:9001", "--affinity-epsilon", "0"}, env(), config{}, "--affinity-epsilon: affinity epsilon must be in (0, 100]"},

		{"no backends", nil, env(), config{}, "no backends"},
		{"zero max init body", []string{"--backends", "http://127.0.0.1:9001", "--max-init-body", "0"}, env(), config{}, "--max-init-body"},
		{"hop-by-hop principal header", []string{"--backends", "http://127.0.0.1:9001", "--principal-headers", "proxy-authorization"}, env(), config{}, "hop-by-hop"},
		{"bad principal header", []string{"--backends", "http://127.0.0.1:9001", "--principal-headers", "Authorization,X User"}, env(), config{}, "--principal-headers"},
		{"short principal key", []string{"--backends", "http://127.0.0.1:9001"}, env("TETHER_PRINCIPAL_KEY", "short"), config{}, "at least 32 bytes"},
		{"two principal keys", []string{"--backends", "http://127.0.0.1:9001", "--principal-key-file", "/k"}, env("TETHER_PRINCIPAL_KEY", strings.Repeat("k", 32)), config{}, "mutually exclusive"},
		{"budget below max body", []string{"--backends", "http://127.0.0.1:9001", "--max-inflight-body-bytes", "1024"}, env(), config{}, "--max-inflight-body-bytes (1024) must be at least --max-body"},
		{"negative memory release", []string{"--backends", "http://127.0.0.1:9001", "--memory-release-after", "-1s"}, env(), config{}, "--memory-release-after"},
		{"zero body timeout", []string{"--backends", "http://127.0.0.1:9001", "--body-timeout", "0s"}, env(), config{}, "--body-timeout"},
		{"zero max streams", []string{"--backends", "http://127.0.0.1:9001", "--max-streams", "0"}, env(), config{}, "--max-streams"},
		{"zero client send timeout", []string{"--backends", "http://127.0.0.1:9001", "--client-send-timeout", "0s"}, env(), config{}, "--client-send-timeout"},
		{"zero h2 streams", []string{"--backends", "http://127.0.0.1:9001", "--http2-max-concurrent-streams", "0"}, env(), config{}, "--http2-max-concurrent-streams"},
		{"bad redis url", []string{"--backends", "http://127.0.0.1:9001", "--redis-url", "http://x"}, env(), config{}, "--redis-url"},
		{"redis ca without redis", []string{"--backends", "http://127.0.0.1:9001", "--redis-ca", "/ca.pem"}, env(), config{}, "--redis-ca needs --redis-url"},
		{"zero cache", []string{"--backends", "http://127.0.0.1:9001", "--session-cache-size", "0"}, env(), config{}, "session-cache-size"},
		{"session bounds", []string{"--backends", "http://127.0.0.1:9001", "--max-sessions", "1000", "--max-session-init-bytes", "1048576"}, env(),
			with(func(c *config) { c.MaxSessions, c.MaxSessionInitBytes = 1000, 1<<20 }), ""},
		{"deprecated cache size in env", nil, env("TETHER_BACKENDS", "http://127.0.0.1:9001", "TETHER_SESSION_CACHE_SIZE", "700"),
			with(func(c *config) { c.MaxSessions = 700 }), ""},
		{"cache size agreeing with max sessions", []string{"--backends", "http://127.0.0.1:9001", "--session-cache-size", "700", "--max-sessions", "700"}, env(),
			with(func(c *config) { c.MaxSessions = 700 }), ""},
		{"cache size contradicting max sessions", []string{"--backends", "http://127.0.0.1:9001", "--session-cache-size", "700", "--max-sessions", "800"}, env(), config{}, "contradicts --max-sessions"},
		{"zero max sessions", []string{"--backends", "http://127.0.0.1:9001", "--max-sessions", "0"}, env(), config{}, "--max-sessions"},
		{"zero init bytes", []string{"--backends", "http://127.0.0.1:9001", "--max-session-init-bytes", "0"}, env(), config{}, "--max-session-init-bytes"},
		{"negative max age", []string{"--backends", "http://127.0.0.1:9001", "--session-max-age", "-1h"}, env(), config{}, "--session-max-age"},
		{"both sources", []string{"--backends", "http://127.0.0.1:9001", "--k8s-service", "ns/svc"}, env(), config{}, "mutually exclusive"},
		{"unknown balancer", []string{"--backends", "http://127.0.0.1:9001", "--balancer", "fastest"}, env(), config{}, `--balancer "fastest"`},
		{"bad duration in env", nil, env("TETHER_BACKENDS", "http://127.0.0.1:9001", "TETHER_SESSION_TTL", "forever"), config{}, "TETHER_SESSION_TTL"},
		{"negative ttl", []string{"--backends", "http://127.0.0.1:9001", "--session-ttl", "-1s"}, env(), config{}, "--session-ttl"},
		{"zero max body", []string{"--backends", "http://127.0.0.1:9001", "--max-body", "0"}, env(), config{}, "--max-body"},
		{"bad backend scheme", []string{"--backends", "ftp://127.0.0.1:9001"}, env(), config{}, "scheme"},
		{"backend without host", []string{"--backends", "http://"}, env(), config{}, "missing host"},
		{"bad listen", []string{"--backends", "http://127.0.0.1:9001", "--listen", "7480"}, env(), config{}, "--listen"},
		{"bad log level", []string{"--backends", "http://127.0.0.1:9001", "--log-level", "loud"}, env(), config{}, "--log-level"},
		{"unknown flag", []string{"--nope"}, env(), config{}, "flag provided but not defined"},
		{"stray argument", []string{"--backends", "http://127.0.0.1:9001", "extra"}, env(), config{}, "unexpected argument"},
		{"k8s port without service", []string{"--backends", "http://127.0.0.1:9001", "--k8s-port", "http"}, env(), config{}, "need --k8s-service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseServeFlags(tt.args, tt.env, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, tt.want, cmpopts.IgnoreUnexported(config{})); diff != "" {
				t.Errorf("config (-got +want):\n%s", diff)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{"listen": "TETHER_LISTEN", "admin-listen": "TETHER_ADMIN_LISTEN", "k8s-service": "TETHER_K8S_SERVICE"} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}
