package discovery

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	content := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + server + `"}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: mcp}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRESTConfigOrder(t *testing.T) {
	// Not in a cluster, and no ~/.kube/config.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	t.Setenv("HOME", t.TempDir())
	env := writeKubeconfig(t, "https://from-env.example:6443")
	flag := writeKubeconfig(t, "https://from-flag.example:6443")

	t.Run("explicit flag wins over $KUBECONFIG", func(t *testing.T) {
		t.Setenv("KUBECONFIG", env)
		cfg, err := restConfig(flag)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Host != "https://from-flag.example:6443" || cfg.BearerToken != "secret" {
			t.Errorf("host %q token %q, want the flag's file", cfg.Host, cfg.BearerToken)
		}
	})
	t.Run("$KUBECONFIG outside a cluster", func(t *testing.T) {
		t.Setenv("KUBECONFIG", env)
		cfg, err := restConfig("")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Host != "https://from-env.example:6443" {
			t.Errorf("host %q, want $KUBECONFIG's", cfg.Host)
		}
	})
	t.Run("nothing at all", func(t *testing.T) {
		t.Setenv("KUBECONFIG", "")
		_, err := restConfig("")
		if err == nil || !strings.Contains(err.Error(), "not running in a cluster") {
			t.Errorf("error %v, want one saying there is no configuration", err)
		}
	})
	t.Run("in a cluster without a token falls back to $KUBECONFIG", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
		t.Setenv("KUBERNETES_SERVICE_PORT", "443")
		t.Setenv("KUBECONFIG", env)
		if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
			t.Skip("this machine has a service account token")
		}
		cfg, err := restConfig("")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Host != "https://from-env.example:6443" {
			t.Errorf("host %q, want $KUBECONFIG's", cfg.Host)
		}
	})
	t.Run("missing explicit file", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope")
		_, err := restConfig(missing)
		if err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("error %v, want one naming %s", err, missing)
		}
	})
}

// The client asks for the namespace's EndpointSlices the way client-go's
// generated client does: its path, the list options as query parameters,
// protobuf preferred, tether's user agent; and it
// decodes the answer with its discovery/v1-only scheme.
func TestKubeClientRequests(t *testing.T) {
	type seen struct{ path, query, accept, agent string }
	reqs := make(chan seen, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs <- seen{r.URL.Path, r.URL.RawQuery, r.Header.Get("Accept"), r.Header.Get("User-Agent")}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"42"},`+
			`"items":[{"metadata":{"name":"everything-abc","namespace":"mcp"},"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.7"]}]}]}`)
	}))
	defer srv.Close()
	c, err := KubeClient(writeKubeconfig(t, srv.URL), "tether/test")
	if err != nil {
		t.Fatal(err)
	}
	list, err := c.ListEndpointSlices(context.Background(), "mcp", metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=everything"})
	if err != nil {
		t.Fatal(err)
	}
	if list.ResourceVersion != "42" || len(list.Items) != 1 || list.Items[0].Name != "everything-abc" || list.Items[0].Endpoints[0].Addresses[0] != "10.0.0.7" {
		t.Errorf("decoded %+v", list)
	}
	got := <-reqs
	want := seen{
		path:   "/apis/discovery.k8s.io/v1/namespaces/mcp/endpointslices",
		query:  "labelSelector=kubernetes.io%2Fservice-name%3Deverything",
		accept: "application/vnd.kubernetes.protobuf,application/json",
		agent:  "tether/test",
	}
	if got != want {
		t.Errorf("request %+v, want %+v", got, want)
	}
}
