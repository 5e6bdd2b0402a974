//go:build !tether_sidecar

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/tether-mcp/tether/internal/inject"
)

// tether webhook: the mutating admission webhook that adds the sidecar to
// Pods annotated tether.dev/inject: "true" (deploy/webhook).

// Defaults of the webhook's own flags; the certificate paths are where
// deploy/webhook mounts its Secret.
const (
	defaultWebhookListen = ":8443"
	defaultWebhookCert   = "/etc/tether-webhook/tls/tls.crt"
	defaultWebhookKey    = "/etc/tether-webhook/tls/tls.key"
	// certCheckInterval: how often, at most, a TLS handshake re-reads the
	// certificate files (a renewed Secret reaches the volume within about
	// a minute; cert-manager renews well before expiry).
	certCheckInterval = 10 * time.Second
	// webhookDrain bounds the shutdown: reviews take milliseconds, and
	// the API server's timeout is at most 30 s.
	webhookDrain = 10 * time.Second

	// defaultMaxConcurrentReviews (--max-concurrent-reviews) bounds the
	// reviews read and parsed at once. An ordinary Pod takes about a
	// millisecond, so four slots serve thousands of creations a second; a
	// Pod near the 3 MiB bound can take seconds of CPU and hundreds of MB
	// of allocations, and four of them are what the webhook holds at once.
	defaultMaxConcurrentReviews = 4
	// reviewQueueWait is how long a review waits for a slot before it is
	// answered 503: short of the API server's timeoutSeconds
	// (deploy/webhook: 5 s), whose failurePolicy then decides.
	reviewQueueWait = 2 * time.Second

	// The listener's timeouts: the API server sends a review at once and
	// gives up on it after timeoutSeconds (at most 30 s), so a request
	// still arriving after webhookReadTimeout is of no use to anyone, and
	// holds a review slot while it trickles in.
	webhookHeaderTimeout  = 5 * time.Second
	webhookReadTimeout    = 10 * time.Second
	webhookWriteTimeout   = 15 * time.Second // queue wait + review + reply
	webhookIdleTimeout    = 90 * time.Second
	webhookMaxHeaderBytes = 64 << 10
)

// webhookConfig is the webhook command's configuration.
type webhookConfig struct {
	Listen               string
	CertFile, KeyFile    string
	MaxConcurrentReviews int
	Inject               inject.Config
}

func parseWebhookFlags(args []string, getenv func(string) string, stderr io.Writer) (webhookConfig, error) {
	c := webhookConfig{
		Listen:   defaultWebhookListen,
		CertFile: defaultWebhookCert,
		KeyFile:  defaultWebhookKey,
		Inject:   inject.DefaultConfig(version),

		MaxConcurrentReviews: defaultMaxConcurrentReviews,
	}
	fs := newFlagSet("tether webhook")
	const synopsis = `usage: tether webhook [flags]

A mutating admission webhook (HTTPS, POST /inject) that adds the tether
sidecar to Pods annotated tether.dev/inject: "true", configured by
these flags and then by the Pod's annotations. The certificate and key are
re-read when they change. GET /healthz answers 200.
`
	fs.StringVar(&c.Listen, "listen", c.Listen, "HTTPS listener address")
	fs.StringVar(&c.CertFile, "tls-cert", c.CertFile, "PEM certificate (chain) the webhook serves; re-read when it changes")
	fs.StringVar(&c.KeyFile, "tls-key", c.KeyFile, "PEM private key of the certificate")
	fs.IntVar(&c.MaxConcurrentReviews, "max-concurrent-reviews", c.MaxConcurrentReviews, "admission reviews read and parsed at once (more wait briefly, then 503)")
	injectFlags(fs, &c.Inject)
	if err := envDefaults(fs, getenv); err != nil {
		return c, err
	}
	if err := parseFlags(fs, args, synopsis, stderr); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return c, fmt.Errorf("--listen %q: %v", c.Listen, err)
	}
	if c.MaxConcurrentReviews <= 0 {
		return c, fmt.Errorf("--max-concurrent-reviews must be positive, got %d", c.MaxConcurrentReviews)
	}
	// The Service may come from each Pod's annotation; check the rest.
	check := c.Inject
	if check.Service == "" {
		check.Service = "placeholder"
	}
	if err := check.Validate(); err != nil {
		return c, withInjectFlag(err)
	}
	return c, nil
}

func webhookCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	c, err := parseWebhookFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(stderr, "json", "info")
	certs, err := newCertReloader(c.CertFile, c.KeyFile, certCheckInterval, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return err
	}
	return serveWebhook(ctx, ln, certs, inject.Injector{Defaults: c.Inject}, c.MaxConcurrentReviews, log)
}

// serveWebhook serves the webhook on ln until ctx ends, then drains. At
// most maxReviews admission reviews are read and parsed at once.
func serveWebhook(ctx context.Context, ln net.Listener, certs *certReloader, inj inject.Injector, maxReviews int, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("/inject", limitConcurrency(inj.AdmissionHandler(log), maxReviews, reviewQueueWait))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		ReadHeaderTimeout: webhookHeaderTimeout,
		ReadTimeout:       webhookReadTimeout,
		WriteTimeout:      webhookWriteTimeout,
		IdleTimeout:       webhookIdleTimeout,
		MaxHeaderBytes:    webhookMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	log.Info("webhook listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), webhookDrain)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// limitConcurrency lets at most slots requests into h at once. A request
// that finds them taken waits up to wait for one, then is answered 503 with
// Retry-After: parsing is CPU and memory, and a burst must queue rather
// than multiply them.
func limitConcurrency(h http.Handler, slots int, wait time.Duration) http.Handler {
	sem := make(chan struct{}, slots)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case sem <- struct{}{}:
		default:
			timer := time.NewTimer(wait)
			defer timer.Stop()
			select {
			case sem <- struct{}{}:
			case <-timer.C:
				w.Header().Set("Retry-After", "1")
				http.Error(w, "too many admission reviews at once; retry later", http.StatusServiceUnavailable)
				return
			case <-r.Context().Done():
				return
			}
		}
		defer func() { <-sem }()
		h.ServeHTTP(w, r)
	})
}

// certReloader serves a certificate from files and re-reads them, at most
// once per interval, on a TLS handshake: a renewed Secret takes effect
// without a restart. A pair that does not load (say, the certificate
// written and the key not yet) keeps the previous one in service.
type certReloader struct {
	certFile, keyFile string
	interval          time.Duration
	now               func() time.Time
	log               *slog.Logger

	mu              sync.Mutex
	checked         time.Time
	certPEM, keyPEM []byte
	cert            *tls.Certificate
}

// newCertReloader loads the pair once; failing that is an error.
func newCertReloader(certFile, keyFile string, interval time.Duration, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, interval: interval, now: time.Now, log: log}
	if err := r.loadLocked(); err != nil {
		return nil, err
	}
	r.checked = r.now()
	return r, nil
}

// GetCertificate is tls.Config.GetCertificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.checked) >= r.interval {
		r.checked = now
		if err := r.loadLocked(); err != nil {
			r.log.Warn("webhook certificate not reloaded; serving the previous one", "err", err)
		}
	}
	return r.cert, nil
}

// loadLocked reads both files and swaps the certificate when they changed.
// Caller must hold mu (or own r exclusively).
func (r *certReloader) loadLocked() error {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return fmt.Errorf("webhook certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return fmt.Errorf("webhook key: %w", err)
	}
	if r.cert != nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("webhook certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	if r.cert != nil {
		r.log.Info("webhook certificate reloaded", "cert", r.certFile)
	}
	r.cert, r.certPEM, r.keyPEM = &cert, certPEM, keyPEM
	return nil
}
