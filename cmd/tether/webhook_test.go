//go:build !tether_sidecar

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-mcp/tether/internal/inject"
	"github.com/tether-mcp/tether/internal/testkit/testca"
)

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startWebhook runs serveWebhook on a loopback port until stop or the end
// of the test.
func startWebhook(t *testing.T, certs *certReloader, defaults inject.Config) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveWebhook(ctx, ln, certs, inject.Injector{Defaults: defaults}, defaultMaxConcurrentReviews, slog.New(slog.DiscardHandler))
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serveWebhook: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

func TestWebhookServesAndReloadsItsCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t)
	certFile, keyFile := ca.Issue(t, dir, 100)
	certs, err := newCertReloader(certFile, keyFile, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	certs.now = func() time.Time { return time.Unix(0, now.Load()) }
	addr, _ := startWebhook(t, certs, inject.DefaultConfig("v1.0.0"))

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	serial := func() int64 {
		t.Helper()
		resp, err := client.Get("https://" + addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("/healthz: %d", resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	if s := serial(); s != 100 {
		t.Fatalf("serial %d, want 100", s)
	}

	// Renewed on disk: served once the check interval has passed.
	ca.Issue(t, dir, 101)
	if s := serial(); s != 100 {
		t.Errorf("serial %d before the interval, want 100 still", s)
	}
	now.Add(int64(time.Minute))
	if s := serial(); s != 101 {
		t.Errorf("serial %d after the interval, want 101", s)
	}

	// A broken pair (key not written yet) keeps the last good one.
	writeFile(t, keyFile, []byte("not a key"))
	now.Add(int64(time.Minute))
	if s := serial(); s != 101 {
		t.Errorf("serial %d with a broken key, want 101", s)
	}

	// The admission endpoint answers over TLS.
	raw, _ := json.Marshal(&corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"tether.dev/inject": "true", "tether.dev/service": "mcp"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "proxy", Image: "x"}}},
	})
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
	resp, err := client.Post("https://"+addr+"/inject", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &review); err != nil || review.Response == nil || !review.Response.Allowed || !strings.Contains(string(review.Response.Patch), `"name":"tether"`) {
		t.Fatalf("status %d, review %s (err %v)", resp.StatusCode, b, err)
	}
}

func TestWebhookFlags(t *testing.T) {
	none := func(string) string { return "" }
	c, err := parseWebhookFlags(nil, none, io.Discard)
	if err != nil || c.Listen != ":8443" || c.CertFile != defaultWebhookCert || c.Inject.Service != "" || c.MaxConcurrentReviews != defaultMaxConcurrentReviews {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	env := func(k string) string {
		return map[string]string{"TETHER_REDIS_URL_SECRET": "redis/url", "TETHER_LISTEN": ":9443"}[k]
	}
	c, err = parseWebhookFlags([]string{"--listen=127.0.0.1:1"}, env, io.Discard)
	if err != nil || c.Listen != "127.0.0.1:1" || c.Inject.RedisURLSecret != "redis/url" {
		t.Fatalf("env and flags: %+v %v", c, err)
	}
	for _, args := range [][]string{{"--balancer=x"}, {"--listen=nope"}, {"extra"}, {"--image="}, {"--max-concurrent-reviews=0"}} {
		if _, err := parseWebhookFlags(args, none, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
