package discovery

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// Do sends what it is given, with the client's credentials, below the
// server's path prefix; a Status answer becomes an *APIError, an object
// over its limit ErrMalformed.
func TestRequesterDo(t *testing.T) {
	var got *http.Request
	var gotBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		switch r.URL.Path {
		case "/prefix/api/v1/namespaces/mcp/pods/p0":
			w.Write([]byte(`{"kind":"Pod"}`))
		case "/prefix/conflict":
			writeStatus(w, http.StatusConflict, "Conflict", "the object has been modified")
		case "/prefix/huge":
			w.Write([]byte(strings.Repeat(" ", maxObjectBytes+1)))
		}
	}))
	t.Cleanup(srv.Close)
	c, err := newKubeClient(writeKubeconfig(t, srv.URL+"/prefix"), "tether/test", testEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	body, err := c.Do(ctx, Request{Method: http.MethodPatch, Path: "/api/v1/namespaces/mcp/pods/p0",
		Query: url.Values{"fieldManager": {"x"}}, ContentType: "application/merge-patch+json", Body: []byte(`{"a":1}`)})
	if err != nil || string(body) != `{"kind":"Pod"}` {
		t.Fatalf("Do: %q, %v", body, err)
	}
	if got.Method != http.MethodPatch || got.URL.Query().Get("fieldManager") != "x" || gotBody != `{"a":1}` ||
		got.Header.Get("Content-Type") != "application/merge-patch+json" || got.Header.Get("Authorization") != "Bearer secret" ||
		got.Header.Get("User-Agent") != "tether/test" {
		t.Errorf("request %s %s %v body %q", got.Method, got.URL, got.Header, gotBody)
	}

	_, err = c.Do(ctx, Request{Method: http.MethodPut, Path: "/conflict", ContentType: "application/json", Body: []byte(`{}`)})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusConflict || ae.Reason != "Conflict" {
		t.Errorf("conflict: %v, want an APIError 409 Conflict", err)
	}
	if _, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/huge"}); !errors.Is(err, ErrMalformed) {
		t.Errorf("an object over the limit: %v, want ErrMalformed", err)
	}
	if got.Header.Get("Content-Type") != "" {
		t.Errorf("a GET without a body sent Content-Type %q", got.Header.Get("Content-Type"))
	}
}
