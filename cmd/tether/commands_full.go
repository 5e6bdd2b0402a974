//go:build !tether_sidecar

package main

import (
	"context"
	"io"
)

// The commands of the full build: the sidecar build (-tags tether_sidecar)
// leaves this file out, and with it demo.go, inject.go and webhook.go and
// everything only they link.
func init() {
	fullCommands["demo"] = command{
		usage: "  tether demo              run a self-contained demonstration\n",
		run: func(ctx context.Context, args []string, _ func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
			return demoCommand(ctx, args, stdout, stderr)
		},
	}
	fullCommands["inject"] = command{
		usage: "  tether inject [flags] [FILE|-]...\n" +
			"                           add the tether sidecar to Kubernetes workloads (YAML to stdout)\n",
		run: func(_ context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
			return injectCommand(args, getenv, stdin, stdout, stderr)
		},
	}
	fullCommands["webhook"] = command{
		usage: "  tether webhook [flags]   admission webhook: the sidecar for Pods annotated tether.dev/inject: \"true\"\n",
		run: func(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, _, stderr io.Writer) error {
			return webhookCommand(ctx, args, getenv, stderr)
		},
	}
}
