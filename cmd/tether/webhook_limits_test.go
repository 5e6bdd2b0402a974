//go:build !tether_sidecar

package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/inject"
	"github.com/tether-mcp/tether/internal/testkit/testca"
)

// The webhook refuses a review over the API server's own 3 MiB cap with
// 413, without parsing it (old main read up to 8 MiB: 8.8 s of CPU and
// 536 MB for one 7.9 MB review).
func TestWebhookBodyLimit(t *testing.T) {
	if inject.MaxReviewBytes > 3<<20 {
		t.Fatalf("MaxReviewBytes %d, want at most 3 MiB", inject.MaxReviewBytes)
	}
	ca := testca.New(t)
	certFile, keyFile := ca.Issue(t, t.TempDir(), 1)
	certs, err := newCertReloader(certFile, keyFile, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startWebhook(t, certs, inject.DefaultConfig("v1.0.0"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()

	resp, err := client.Post("https://"+addr+"/inject", "application/json", bytes.NewReader(bytes.Repeat([]byte(" "), 3<<20+1)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a review of 3 MiB + 1 byte: %d, want 413", resp.StatusCode)
	}
}

// At most slots reviews run at once; the next waits for a slot, and is
// answered 503 with Retry-After if none frees in time.
func TestWebhookConcurrencyLimit(t *testing.T) {
	const slots = 2
	// post sends a review; its response comes on the channel (nil: no answer).
	post := func(url string) <-chan *http.Response {
		ch := make(chan *http.Response, 1)
		go func() {
			resp, err := http.Post(url, "application/json", nil)
			if err != nil {
				ch <- nil
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ch <- resp
		}()
		return ch
	}
	within := func(what string, ch <-chan *http.Response) *http.Response {
		t.Helper()
		select {
		case resp := <-ch:
			if resp == nil {
				t.Fatalf("%s: no answer", what)
			}
			return resp
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no answer in 30 s", what)
			return nil
		}
	}
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{
		{"refused when no slot frees", 50 * time.Millisecond},
		{"queued until a slot frees", time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entered, release := make(chan struct{}, slots+1), make(chan struct{})
			var running, most atomic.Int64
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := running.Add(1)
				defer running.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				entered <- struct{}{}
				<-release
			})
			srv := httptest.NewServer(limitConcurrency(slow, slots, tc.wait))
			defer srv.Close()
			var held []<-chan *http.Response
			for range slots {
				held = append(held, post(srv.URL))
				<-entered // the handler never returns before release
			}
			next := post(srv.URL)
			if tc.wait < time.Second {
				resp := within("with every slot taken", next)
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
					t.Errorf("with every slot taken: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
				}
				close(release)
			} else {
				release <- struct{}{} // one held review ends
				<-entered             // and the waiting one takes its slot
				close(release)
				if resp := within("the queued review", next); resp.StatusCode != http.StatusOK {
					t.Errorf("the queued review: %d, want 200", resp.StatusCode)
				}
			}
			for i, ch := range held {
				if resp := within("a held review", ch); resp.StatusCode != http.StatusOK {
					t.Errorf("held review %d: %d", i, resp.StatusCode)
				}
			}
			if got := most.Load(); got > slots {
				t.Errorf("%d reviews ran at once, want at most %d", got, slots)
			}
		})
	}
}
