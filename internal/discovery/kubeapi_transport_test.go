package discovery

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// bearerTransport stands in for client-go's transport: it authenticates
// every request itself.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// NewKubeAPI sends through the HTTP client it is given (the full build's
// client-go transport carries the credentials), below the server's path
// prefix, with tether's user agent.
func TestNewKubeAPIUsesTheGivenClient(t *testing.T) {
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(r.Context())
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"metadata":{"resourceVersion":"7"},"items":[]}`))
	}))
	defer srv.Close()
	api, err := NewKubeAPI(srv.URL+"/prefix", &http.Client{Transport: bearerTransport{"from-plugin"}}, "tether/test")
	if err != nil {
		t.Fatal(err)
	}
	list, err := api.ListEndpointSlices(t.Context(), "mcp", "a=b")
	if err != nil || list.Metadata.ResourceVersion != "7" {
		t.Fatalf("list: %+v (err %v)", list, err)
	}
	if got.URL.Path != "/prefix/apis/discovery.k8s.io/v1/namespaces/mcp/endpointslices" ||
		got.Header.Get("Authorization") != "Bearer from-plugin" || got.Header.Get("User-Agent") != "tether/test" {
		t.Errorf("request %s %v, want the prefix, the transport's credentials and tether's user agent", got.URL.Path, got.Header)
	}

	if _, err := NewKubeAPI("127.0.0.1:6443", http.DefaultClient, "tether/test"); err == nil || !strings.Contains(err.Error(), "want an http or https URL") {
		t.Errorf("a server without a scheme: error %v", err)
	}
}
