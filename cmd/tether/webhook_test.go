//go:build !tether_sidecar

package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
)

// testCA issues serving certificates for loopback.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tether-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a serving certificate for 127.0.0.1 with serial into
// dir/tls.crt and dir/tls.key.
func (ca *testCA) issue(t *testing.T, dir string, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "tether-webhook"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

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
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, dir, 100)
	certs, err := newCertReloader(certFile, keyFile, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	certs.now = func() time.Time { return time.Unix(0, now.Load()) }
	addr, _ := startWebhook(t, certs, inject.DefaultConfig("v1.0.0"))

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
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
	ca.issue(t, dir, 101)
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
