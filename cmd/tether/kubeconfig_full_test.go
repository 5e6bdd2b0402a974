//go:build !tether_sidecar

package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tether-mcp/tether/internal/discovery"
	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/testkit"
)

// The full build loads kubeconfigs with client-go's clientcmd (issue 31):
// what the sidecar's lean loader refuses, an exec credential plugin, is
// taken; $KUBECONFIG's files merge as kubectl merges them; the service
// account still comes before $KUBECONFIG.
func TestFullKubeconfigLoading(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a cluster
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		writeKubeconfigFile(t, path, content)
		return path
	}

	t.Run("exec plugin", func(t *testing.T) {
		kc := write("exec", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: aws, args: [eks, get-token], interactiveMode: Never}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
		// The plugin runs at the first request, not here.
		if _, err := newKubeAPI(kc, "", "tether/test"); err != nil {
			t.Fatalf("exec plugin kubeconfig: %v", err)
		}
	})

	t.Run("KUBECONFIG merge", func(t *testing.T) {
		// kubectl's rules: the first file to set the current context wins,
		// and it may name a context, cluster and user of another file.
		first := write("first", `apiVersion: v1
kind: Config
current-context: b
contexts: [{name: a, context: {cluster: ca, user: u}}]
clusters: [{name: ca, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: first}}]
`)
		second := write("second", `apiVersion: v1
kind: Config
current-context: a
contexts: [{name: b, context: {cluster: cb, user: u}}]
clusters: [{name: cb, cluster: {server: "https://127.0.0.2:2/prefix"}}]
users: [{name: u, user: {token: second}}]
`)
		t.Setenv("KUBECONFIG", first+string(os.PathListSeparator)+second)
		cfg, err := restConfig("", "")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Host != "https://127.0.0.2:2/prefix" || cfg.BearerToken != "first" {
			t.Errorf("host %q token %q, want the second file's cluster (its context b is current) and the first file's user u", cfg.Host, cfg.BearerToken)
		}
		// --kube-context picks another context of the merged files.
		cfg, err = restConfig("", "a")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Host != "https://127.0.0.1:1" {
			t.Errorf("--kube-context a: host %q, want context a's cluster", cfg.Host)
		}
		if _, err := restConfig("", "nope"); err == nil || !strings.Contains(err.Error(), `context "nope" does not exist`) {
			t.Errorf("--kube-context nope: error %v, want one naming the context", err)
		}
		// And of an explicit --kubeconfig.
		if cfg, err = restConfig(second, "b"); err != nil || cfg.Host != "https://127.0.0.2:2/prefix" {
			t.Errorf("--kubeconfig second --kube-context b: host %v (err %v)", cfg, err)
		}
	})

	t.Run("kube-context flag", func(t *testing.T) {
		cfg, err := parseServeFlags([]string{"--k8s-service", "mcp/x"}, func(k string) string { return map[string]string{"TETHER_KUBE_CONTEXT": "prod"}[k] }, io.Discard)
		if err != nil || cfg.KubeContext != "prod" {
			t.Errorf("TETHER_KUBE_CONTEXT=prod: context %q (err %v)", cfg.KubeContext, err)
		}
		_, err = parseServeFlags([]string{"--backends", "http://127.0.0.1:9001", "--kube-context", "prod"}, func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--kube-context needs --k8s-service") {
			t.Errorf("--kube-context without --k8s-service: error %v", err)
		}
	})

	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name, kubeconfig, env, want string
		}{
			{"missing file", filepath.Join(dir, "missing"), "", "kubeconfig " + filepath.Join(dir, "missing")},
			{"no current context", write("nocontext", "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n"), "", "kubeconfig " + filepath.Join(dir, "nocontext") + ": no current-context"},
			{"KUBECONFIG files missing", "", filepath.Join(dir, "missing"), "not running in a cluster, and no usable kubeconfig ($KUBECONFIG): no kubeconfig file found"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Setenv("KUBECONFIG", tt.env)
				_, err := newKubeAPI(tt.kubeconfig, "", "tether/test")
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %v, want one containing %q", err, tt.want)
				}
			})
		}
	})

	t.Run("in-cluster first", func(t *testing.T) {
		// In a pod (KUBERNETES_SERVICE_HOST set) the service account is
		// tried before $KUBECONFIG, as in the sidecar build: its error
		// comes first when both fail.
		if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
			t.Skip("this machine has a service account token: the in-cluster config would work")
		}
		t.Setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
		t.Setenv("KUBERNETES_SERVICE_PORT", "1")
		t.Setenv("KUBECONFIG", filepath.Join(dir, "missing"))
		_, err := newKubeAPI("", "", "tether/test")
		if err == nil || !strings.Contains(err.Error(), "in-cluster kubernetes config: ") || !strings.Contains(err.Error(), "kubeconfig ($KUBECONFIG): no kubeconfig file found") {
			t.Fatalf("error %v, want the in-cluster error, then $KUBECONFIG's", err)
		}
	})
}

// End to end against the real API server: tether's discovery and the pod
// deletion cost's requests authenticate with a token from an exec
// credential plugin (as EKS, GKE and AKS kubeconfigs do), and a failing
// plugin is a clear error in the log.
func TestExecPluginAgainstAPIServer(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a cluster
	user := kubetest.ServiceAccountUser("mcp", "tether")
	env := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{user}})
	admin := env.AdminClient()
	ctx := t.Context()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mcp"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.GrantEndpointSliceReader("mcp", "tether")
	api := admin.DiscoveryV1().EndpointSlices("mcp")
	if _, err := api.Create(ctx, execTestSlice("everything-1", "10.244.0.11"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	marker := filepath.Join(dir, "plugin-runs")
	base, err := clientcmd.LoadFromFile(env.Kubeconfig(user.Name))
	if err != nil {
		t.Fatal(err)
	}
	token := base.AuthInfos[user.Name].Token
	// An ExecCredential of client.authentication.k8s.io/v1 on stdout; each
	// run leaves a line in the marker file.
	good := writePlugin(t, dir, "good-plugin", `echo run >> '`+marker+`'
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}\n' '`+token+`'
`)
	bad := writePlugin(t, dir, "bad-plugin", "exit 3\n")

	kubeconfig := func(name, plugin string) string {
		cfg := base.DeepCopy()
		cfg.AuthInfos[user.Name] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
			APIVersion:      "client.authentication.k8s.io/v1",
			Command:         plugin,
			InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
		}}
		path := filepath.Join(dir, name)
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			t.Fatal(err)
		}
		return path
	}

	t.Run("discovery", func(t *testing.T) {
		snaps, _ := runFullSource(t, "--kubeconfig", kubeconfig("good", good))
		waitEndpoints(t, snaps, "http://10.244.0.11:8080")
		// The watch runs over the plugin's credentials too.
		if _, err := api.Create(ctx, execTestSlice("everything-2", "10.244.0.12"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitEndpoints(t, snaps, "http://10.244.0.11:8080", "http://10.244.0.12:8080")
		runs, err := os.ReadFile(marker)
		if err != nil || !strings.HasPrefix(string(runs), "run\n") {
			t.Fatalf("the plugin's marker file: %q (err %v), want a line per run", runs, err)
		}
	})

	t.Run("KUBECONFIG and --kube-context", func(t *testing.T) {
		// The first file's current context is a dead cluster; the context
		// asked for is the second file's.
		dead := filepath.Join(dir, "dead")
		writeKubeconfigFile(t, dead, `apiVersion: v1
kind: Config
clusters: [{name: dead, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: dead, user: {token: dead}}]
contexts: [{name: dead, context: {cluster: dead, user: dead}}]
current-context: dead
`)
		t.Setenv("KUBECONFIG", dead+string(os.PathListSeparator)+kubeconfig("good", good))
		snaps, _ := runFullSource(t, "--kube-context", base.CurrentContext)
		waitEndpoints(t, snaps, "http://10.244.0.11:8080", "http://10.244.0.12:8080")
	})

	t.Run("pod deletion cost", func(t *testing.T) {
		cfg, err := parseServeFlags([]string{"--k8s-service", "mcp/everything", "--kubeconfig", kubeconfig("good", good), "--pod-deletion-cost"}, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		opts, err := podCostOptions(cfg)
		if err != nil {
			t.Fatal(err)
		}
		body, err := opts.API.Do(ctx, discovery.Request{Method: http.MethodGet, Path: "/apis/discovery.k8s.io/v1/namespaces/mcp/endpointslices"})
		if err != nil || !bytes.Contains(body, []byte("everything-1")) {
			t.Fatalf("GET endpointslices: %.200s (err %v), want the list", body, err)
		}
	})

	t.Run("failing plugin", func(t *testing.T) {
		snaps, logs := runFullSource(t, "--kubeconfig", kubeconfig("bad", bad))
		want := "getting credentials: exec: executable " + bad + " failed with exit code 3"
		testkit.Eventually(t, 30*time.Second, func() bool { return strings.Contains(logs.String(), want) }, "a log line with %q", want)
		select {
		case s := <-snaps:
			t.Fatalf("published %v without credentials", s.Endpoints)
		default:
		}
	})
}

// execTestSlice is a slice of the Service everything with one ready pod
// (the API server refuses loopback addresses).
func execTestSlice(name, ip string) *discoveryv1.EndpointSlice {
	port, proto, ready := int32(8080), corev1.ProtocolTCP, true
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "everything"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
}

func writePlugin(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o700); err != nil {
		t.Fatal(err)
	}
	return path
}

// runFullSource runs the source tether serve builds for --k8s-service
// mcp/everything and flags until the test ends.
func runFullSource(t *testing.T, flags ...string) (<-chan discovery.Snapshot, *testkit.LockedBuffer) {
	t.Helper()
	cfg, err := parseServeFlags(append([]string{"--k8s-service", "mcp/everything"}, flags...), func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.LockedBuffer{}
	src, err := newSource(cfg, newLogger(logs, "text", "info"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	snaps := make(chan discovery.Snapshot, 100)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(s discovery.Snapshot) { snaps <- s }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the source did not stop within 10s of its context's end")
		}
	})
	return snaps, logs
}

// waitEndpoints waits for a snapshot of exactly the endpoint URLs want.
func waitEndpoints(t *testing.T, snaps <-chan discovery.Snapshot, want ...string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	var last []string
	for {
		select {
		case s := <-snaps:
			last = last[:0]
			for _, e := range s.Endpoints {
				last = append(last, e.URL.String())
			}
			slices.Sort(last)
			if slices.Equal(last, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no snapshot of %q within 30s; last %q", want, last)
		}
	}
}
