package discovery

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// This file opens tether's API client to requests beyond EndpointSlices:
// the pod deletion cost writer (internal/podcost) reads and writes a Lease
// and patches pods with it. It is the same client (configuration,
// credentials, token rotation, limits) with one generic call, so that no
// second Kubernetes client, and no client-go, enters the sidecar.

// Request is one call to the API server.
type Request struct {
	// Method is the HTTP method: GET, POST, PUT, PATCH.
	Method string
	// Path is below the server's URL (and its path prefix, if any), e.g.
	// /api/v1/namespaces/NS/pods/NAME.
	Path  string
	Query url.Values
	// ContentType is the body's media type: application/json, or a patch
	// type (application/merge-patch+json); "" without a body.
	ContentType string
	Body        []byte
}

// Requester sends requests to the API server. KubeRequester returns the
// real one.
type Requester interface {
	// Do sends r and returns the body of a 2xx answer (at most
	// maxObjectBytes), or an *APIError carrying the API's Status for any
	// other answer (404 NotFound, 403 Forbidden, 409 Conflict, ...), or
	// the error of a request that got no answer.
	Do(ctx context.Context, r Request) ([]byte, error)
}

var _ Requester = (*apiClient)(nil)

// maxObjectBytes caps the answer to one Request: a single object, which
// etcd limits to 1.5 MB by default.
const maxObjectBytes = 4 << 20

// KubeRequester builds a client by KubeClient's rules (the same flags, the
// same in-cluster identity) for the API calls beyond EndpointSlices.
func KubeRequester(kubeconfig, userAgent string) (Requester, error) {
	return newKubeClient(kubeconfig, userAgent, hostEnv())
}

func (c *apiClient) Do(ctx context.Context, r Request) ([]byte, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + r.Path
	u.RawPath = ""
	u.RawQuery = r.Query.Encode()
	var body io.Reader
	if r.Body != nil {
		body = bytes.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if r.ContentType != "" {
		req.Header.Set("Content-Type", r.ContentType)
	}
	if c.auth != nil {
		if err := c.auth(req); err != nil {
			return nil, err
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, statusError(resp)
	}
	limit := &limitedReader{r: resp.Body, max: maxObjectBytes}
	b, err := io.ReadAll(limit)
	if err != nil {
		if limit.over {
			return nil, fmt.Errorf("%s %s: %w: an object over %d bytes", r.Method, r.Path, ErrMalformed, maxObjectBytes)
		}
		return nil, fmt.Errorf("%s %s: %w", r.Method, r.Path, err)
	}
	return b, nil
}
