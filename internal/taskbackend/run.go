package taskbackend

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Backend is a Server listening on a loopback address, for tests that put
// tether in front of several of them.
type Backend struct {
	*Server
	Addr string // host:port it listens on

	mu  sync.Mutex
	srv *http.Server
}

// Start runs a server named name on addr ("127.0.0.1:0" for any port).
func Start(name, addr string, opts Options) (*Backend, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("task backend %s: %w", name, err)
	}
	b := &Backend{Server: New(name, opts), Addr: ln.Addr().String()}
	b.srv = &http.Server{Handler: b.Server, ReadHeaderTimeout: 10 * time.Second}
	go b.srv.Serve(ln)
	return b, nil
}

// URL is the backend's base URL (tether appends the client's path, which
// the server ignores).
func (b *Backend) URL() string { return "http://" + b.Addr }

// Kill stops the backend at once, as a lost pod: the listener and every
// connection close, and its tasks are gone with it (a later Start on the
// same address is a new server with none of them).
func (b *Backend) Kill() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}
