//go:build !tether_sidecar

package main

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tether-mcp/tether/internal/inject"
)

// The sidecar that `tether inject` writes is read by `tether serve`: its
// arguments and environment, as the kubelet hands them over, must parse
// with serve's own flag parser into the configuration the injection meant.
// The inject package writes serve's flags as strings; this is the test that
// the two agree.
func TestInjectedSidecarParsesWithServe(t *testing.T) {
	const namespace, redisURL = "proxies", "redis://redis.shared:6379/0"
	tests := []struct {
		name string
		args []string
		want func(*config)
	}{{
		name: "defaults",
		args: []string{"--service=mcp-fetch"},
		want: func(c *config) {
			c.K8sService = namespace + "/mcp-fetch"
			c.ShutdownGrace = inject.DefaultConfig("").ShutdownGrace
		},
	}, {
		name: "every option that reaches serve",
		args: []string{"--service=mcp/everything", "--port=http", "--balancer=least-loaded",
			"--session-ttl=30m", "--shutdown-grace=1m30s", "--log-level=debug",
			"--redis-url-secret=tether-redis/address"},
		want: func(c *config) {
			c.K8sService = "mcp/everything"
			c.K8sPort = "http"
			c.Balancer = "least-loaded"
			c.SessionTTL = 30 * time.Minute
			c.ShutdownGrace = 90 * time.Second
			c.LogLevel = "debug"
			c.RedisURL = redisURL
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := runInject(t, cliDeployment, nil, append(tt.args, "--quiet", "-")...)
			if code != 0 {
				t.Fatalf("inject: %s", errs)
			}
			ctr := injectedContainer(t, out)
			if len(ctr.Args) == 0 || ctr.Args[0] != "serve" {
				t.Fatalf("args %q, want the serve subcommand first", ctr.Args)
			}

			// What the kubelet does: resolve the environment (the downward
			// API's namespace, the Secret's URL), then expand $(VAR) in
			// the arguments.
			env := map[string]string{}
			for _, e := range ctr.Env {
				switch {
				case e.ValueFrom == nil:
					env[e.Name] = e.Value
				case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
					env[e.Name] = namespace
				case e.ValueFrom.SecretKeyRef != nil:
					if ref := e.ValueFrom.SecretKeyRef; ref.Name != "tether-redis" || ref.Key != "address" {
						t.Fatalf("env %s from Secret %s key %s, want tether-redis key address", e.Name, ref.Name, ref.Key)
					}
					env[e.Name] = redisURL
				default:
					t.Fatalf("env %s: a source this test does not resolve: %+v", e.Name, e.ValueFrom)
				}
			}
			args := make([]string, len(ctr.Args)-1)
			for i, a := range ctr.Args[1:] {
				for name, v := range env {
					a = strings.ReplaceAll(a, "$("+name+")", v)
				}
				args[i] = a
			}

			got, err := parseServeFlags(args, func(name string) string { return env[name] }, io.Discard)
			if err != nil {
				t.Fatalf("serve %q: %v", args, err)
			}
			want := defaultConfig()
			want.Listen = inject.ListenAddr
			want.AdminListen = fmt.Sprintf(":%d", inject.AdminPort)
			want.LogFormat = "json"
			tt.want(&want)
			got.getenv, want.getenv = nil, nil
			if diff := cmp.Diff(got, want, cmp.AllowUnexported(config{})); diff != "" {
				t.Errorf("serve's configuration (-got +want):\n%s", diff)
			}
		})
	}
}

// injectedContainer finds the tether container in the YAML of one
// Deployment.
func injectedContainer(t *testing.T, doc string) corev1.Container {
	t.Helper()
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
		t.Fatalf("injected YAML: %v\n%s", err, doc)
	}
	spec := d.Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Name == inject.ContainerName {
			return c
		}
	}
	t.Fatalf("no %s container in\n%s", inject.ContainerName, doc)
	return corev1.Container{}
}
