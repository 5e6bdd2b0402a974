package discovery

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Static is a fixed list of backends, for standalone use (--backends).
// Liveness of static backends is judged passively by the balancer.
type Static struct {
	snapshot Snapshot
}

var _ Source = (*Static)(nil)

// NewStatic parses a list of base URLs such as "http://127.0.0.1:9001/mcp".
// Every URL must be absolute http(s) with a host; duplicates are an error.
func NewStatic(rawURLs []string) (*Static, error) {
	if len(rawURLs) == 0 {
		return nil, fmt.Errorf("static backends: the list is empty")
	}
	seen := make(map[string]bool, len(rawURLs))
	eps := make([]Endpoint, 0, len(rawURLs))
	for _, raw := range rawURLs {
		u, err := ParseBackendURL(raw)
		if err != nil {
			return nil, err
		}
		id := u.String()
		if seen[id] {
			return nil, fmt.Errorf("static backends: %q is listed twice", raw)
		}
		seen[id] = true
		eps = append(eps, Endpoint{ID: id, URL: u, State: Ready})
	}
	slices.SortFunc(eps, func(a, b Endpoint) int { return strings.Compare(a.ID, b.ID) })
	return &Static{snapshot: Snapshot{Endpoints: eps}}, nil
}

// ParseBackendURL validates one backend base URL.
func ParseBackendURL(raw string) (*url.URL, error) {
	raw = strings.TrimSpace(raw)
	if !strings.Contains(raw, "://") {
		return nil, fmt.Errorf("backend %q: want an absolute URL with a scheme, such as http://127.0.0.1:9001", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("backend %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("backend %q: scheme must be http or https", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("backend %q: missing host", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("backend %q: user info, query and fragment are not allowed", raw)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// Run publishes the static snapshot once and waits for ctx to end.
func (s *Static) Run(ctx context.Context, update func(Snapshot)) error {
	update(s.snapshot)
	<-ctx.Done()
	return nil
}
