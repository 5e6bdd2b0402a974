//go:build !tether_sidecar

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const cliDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: proxy
spec:
  selector:
    matchLabels: {app: proxy}
  template:
    metadata:
      labels: {app: proxy}
    spec:
      containers:
      - name: proxy
        image: example/proxy:1
`

func runInject(t *testing.T, stdin string, getenv func(string) string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var out, errb bytes.Buffer
	err := injectCommand(args, getenv, strings.NewReader(stdin), &out, &errb)
	if err != nil {
		errb.WriteString("tether: " + err.Error() + "\n")
		return 1, out.String(), errb.String()
	}
	return 0, out.String(), errb.String()
}

func TestInjectCommand(t *testing.T) {
	// stdin, flags.
	code, out, errs := runInject(t, cliDeployment, nil, "--service", "mcp-fetch", "--image", "tether:test")
	if code != 0 || !strings.Contains(out, "- name: tether\n        image: tether:test\n") || !strings.Contains(out, "--k8s-service=$(POD_NAMESPACE)/mcp-fetch") {
		t.Fatalf("code %d\n%s\n%s", code, out, errs)
	}
	if errs != "deployment/proxy injected\n" {
		t.Errorf("stderr %q", errs)
	}

	// Files, as one stream; a second run through stdin changes nothing.
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	os.WriteFile(a, []byte(cliDeployment), 0o644)
	os.WriteFile(b, []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: s"), 0o644)
	code, out, errs = runInject(t, "", nil, "--service=mcp-fetch", a, b)
	if code != 0 || strings.Count(out, "\n---\n") != 1 || !strings.HasSuffix(out, "name: s") {
		t.Fatalf("code %d\n%s\n%s", code, out, errs)
	}
	code, again, errs := runInject(t, out, nil, "--service=mcp-fetch", "--quiet", "-")
	if code != 0 || again != out || errs != "" {
		t.Errorf("second run: code %d, stderr %q, changed: %v", code, errs, again != out)
	}

	// Environment defaults, the command line wins.
	env := func(k string) string {
		return map[string]string{"TETHER_SERVICE": "from-env", "TETHER_BALANCER": "random"}[k]
	}
	_, out, _ = runInject(t, cliDeployment, env, "--balancer=round-robin")
	if !strings.Contains(out, "/from-env") || !strings.Contains(out, "--balancer=round-robin") {
		t.Errorf("env defaults:\n%s", out)
	}

	// --cpu-limit: the sidecar's limit, and its GOMAXPROCS.
	_, out, _ = runInject(t, cliDeployment, nil, "--service=s", "--cpu-limit=1500m")
	if !strings.Contains(out, "cpu: 1500m") || !strings.Contains(out, "- name: GOMAXPROCS\n          value: \"2\"") {
		t.Errorf("--cpu-limit:\n%s", out)
	}

	// Errors: one line, nothing on stdout.
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		// The inject package names the annotation; the command adds its flag.
		{cliDeployment, nil, "no backend Service (annotation tether.dev/service: NAME or NAMESPACE/NAME); --service sets one for every object"},
		{"apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: i}]}}}\n",
			[]string{"--service=s", "--legacy-sidecar"}, "drop --legacy-sidecar"},
		{cliDeployment, []string{"--service=s", "--balancer=x"}, `balancer "x"`},
		{"kind: [", []string{"--service=s"}, "document 1 (line 1)"},
		{"", []string{"--service=s", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{cliDeployment, []string{"--nope"}, "flag provided but not defined"},
	} {
		code, out, errs := runInject(t, tc.stdin, nil, tc.args...)
		if code != 1 || out != "" || !strings.Contains(errs, tc.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%q: code %d stdout %q stderr %q, want %q", tc.args, code, out, errs, tc.want)
		}
	}
}

func TestInjectDispatch(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"inject", "-h"}, func(string) string { return "" }, &out, &errb); code != 0 || !strings.Contains(errb.String(), "usage: tether inject") {
		t.Errorf("inject -h: %d %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"webhook", "--tls-cert", "/nonexistent"}, func(string) string { return "" }, &out, &errb); code != 1 || !strings.Contains(errb.String(), "webhook certificate") {
		t.Errorf("webhook without a certificate: %d %q", code, errb.String())
	}
}
