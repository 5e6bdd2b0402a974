package balancer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"
)

// probeTimeout bounds every probe, the default dial and injected probes
// alike: a probe round waits for all its probes, so one hung probe would
// otherwise hold back the readmission of every other endpoint.
const probeTimeout = time.Second

// Eject takes e out of picks after the routing layer failed to dial it
// (passive health checking: real traffic is the check, so a dead endpoint is
// noticed on its first failed request rather than on the next active probe).
//
// The endpoint stays ejected for a backoff of EjectBase doubled per
// consecutive ejection, capped at EjectMax; then Run probes it and either
// readmits it or ejects it again for the next, longer backoff. Eject is
// idempotent while e is ejected, so a burst of failed requests to the same
// dead endpoint counts once. An e that is no longer in the current set is
// ignored. cause is logged.
func (b *Balancer) Eject(e *Endpoint, cause error) {
	if e == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.Ejected() || !b.inSetLocked(e) {
		return
	}
	b.ejectLocked(e, cause)
	g := b.current.Load()
	if _, eligible := g.eligibleIndex[e]; eligible {
		b.publishLocked(g.all)
	}
}

// ejectLocked marks e ejected for its next backoff. It does not republish;
// the caller does when e was eligible.
func (b *Balancer) ejectLocked(e *Endpoint, cause error) {
	e.ejections++
	backoff := b.backoff(e.ejections)
	e.ejectedUntil = b.now().Add(backoff)
	e.ejected.Store(true)
	e.departLocked() // a failed dial: its streams re-open elsewhere
	select {
	case b.ejections <- struct{}{}:
	default: // a wake-up is already pending
	}
	b.logger.Info("balancer: endpoint ejected",
		"endpoint", e.ID, "url", e.String(),
		"consecutive", e.ejections, "backoff", backoff, "err", cause)
}

// backoff is the ejection length after the n-th consecutive ejection (n >= 1):
// ejectBase * 2^(n-1), capped at ejectMax.
func (b *Balancer) backoff(n int) time.Duration {
	d := b.ejectBase
	for i := 1; i < n && d < b.ejectMax; i++ {
		if d > b.ejectMax/2 {
			d = b.ejectMax // doubling would pass the cap (or overflow)
		} else {
			d *= 2
		}
	}
	return min(d, b.ejectMax)
}

// Run is the readmission loop: every ProbeInterval it probes the ejected
// endpoints whose backoff has expired. While no endpoint is ejected it
// rests until one is: a sidecar is idle most of its life, and a ticker
// that finds nothing to do still wakes a thread and the runtime's sysmon
// every ProbeInterval. Call it once, in its own goroutine; it returns when
// ctx ends, after every probe it started has returned.
func (b *Balancer) Run(ctx context.Context) {
	ticker := time.NewTicker(b.probeInterval)
	defer ticker.Stop()
	for {
		if !b.anyEjected() {
			// An ejection after this look has left a wake-up in
			// b.ejections; one from before it is seen by the look.
			ticker.Stop()
			select {
			case <-ctx.Done():
				return
			case <-b.ejections:
			}
			ticker.Reset(b.probeInterval)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			b.probeOnce(ctx)
		}
	}
}

// anyEjected reports whether an endpoint of the current set is ejected.
func (b *Balancer) anyEjected() bool {
	for _, e := range b.current.Load().all {
		if e.Ejected() {
			return true
		}
	}
	return false
}

// probeOnce probes, concurrently, every ejected endpoint whose backoff has
// expired at b.now(), applies the results, and returns when all are applied.
// Run calls it on each tick; tests call it directly with a fake clock.
func (b *Balancer) probeOnce(ctx context.Context) {
	var wg sync.WaitGroup
	for _, e := range b.claimDueProbes() {
		wg.Go(func() {
			probeCtx, cancel := context.WithTimeout(ctx, probeTimeout)
			err := b.probe(probeCtx, e)
			cancel()
			b.settleProbe(ctx, e, err)
		})
	}
	wg.Wait()
}

// claimDueProbes returns the ejected endpoints whose backoff has expired and
// marks them as being probed, so that an overlapping round skips them.
func (b *Balancer) claimDueProbes() []*Endpoint {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	var due []*Endpoint
	for _, e := range b.current.Load().all {
		if e.Ejected() && !e.probing && !now.Before(e.ejectedUntil) {
			e.probing = true
			due = append(due, e)
		}
	}
	return due
}

// settleProbe applies one probe result: success readmits e and forgets its
// failure streak; failure ejects it again for a doubled backoff.
func (b *Balancer) settleProbe(ctx context.Context, e *Endpoint, probeErr error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e.probing = false
	switch {
	case ctx.Err() != nil:
		// Shutting down: a probe cut short says nothing about the endpoint.
		return
	case !b.inSetLocked(e) || !e.Ejected():
		// Dropped from the set while the probe ran.
		return
	case probeErr != nil:
		b.ejectLocked(e, fmt.Errorf("probe: %w", probeErr))
		return // still ejected: the published generation is already right
	}
	e.ejected.Store(false)
	streak := e.ejections
	e.ejections = 0
	b.publishLocked(b.current.Load().all)
	b.logger.Info("balancer: endpoint readmitted",
		"endpoint", e.ID, "url", e.String(), "after_ejections", streak)
}

// dialProbe is the default probe: can a TCP connection to the endpoint be
// opened? That is exactly what failed when the endpoint was ejected.
func dialProbe(ctx context.Context, e *Endpoint) error {
	addr, err := dialAddress(e.URL)
	if err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// dialAddress is host:port of u, with the scheme's default port when u names
// none.
func dialAddress(u *url.URL) (string, error) {
	if u == nil {
		return "", errors.New("balancer: endpoint has no URL")
	}
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		default:
			return "", fmt.Errorf("balancer: %q has no port and scheme %q has no default", u.Redacted(), u.Scheme)
		}
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}
