package balancer_test

import (
	"net/url"
	"testing"

	"github.com/tether-mcp/tether/internal/discovery"
)

// An endpoint carries its pod's name from discovery (the pod deletion cost
// writer maps endpoints to pods with it), and keeps it across updates.
func TestEndpointPod(t *testing.T) {
	b := newBalancer(t, "p2c", nil)
	u := &url.URL{Scheme: "http", Host: "10.0.0.1:8080"}
	b.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{
		{ID: "uid-a/10.0.0.1:8080", URL: u, Pod: "mcp/server-0"},
		{ID: "http://10.0.0.2:8080", URL: &url.URL{Scheme: "http", Host: "10.0.0.2:8080"}},
	}})
	a := lookup(t, b, "uid-a/10.0.0.1:8080")
	if a.Pod != "mcp/server-0" {
		t.Errorf("Pod %q, want mcp/server-0", a.Pod)
	}
	if s := lookup(t, b, "http://10.0.0.2:8080"); s.Pod != "" {
		t.Errorf("an endpoint without a pod: Pod %q", s.Pod)
	}
	b.Update(discovery.Snapshot{Endpoints: []discovery.Endpoint{{ID: "uid-a/10.0.0.1:8080", URL: u, State: discovery.Fenced, Pod: "mcp/server-0"}}})
	if again := lookup(t, b, "uid-a/10.0.0.1:8080"); again != a || again.Pod != "mcp/server-0" {
		t.Errorf("after an update: %p %q, want the same endpoint %p with its pod", again, again.Pod, a)
	}
}
