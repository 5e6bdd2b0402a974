package discovery

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// envWith is testEnv with variables set and a home directory.
func envWith(t *testing.T, home string, vars map[string]string) configEnv {
	env := testEnv(t)
	env.home = home
	env.getenv = func(k string) string { return vars[k] }
	return env
}

// writeServiceAccount fills env's service account directory.
func writeServiceAccount(t *testing.T, env configEnv, token string, ca []byte) {
	t.Helper()
	if err := os.MkdirAll(env.saDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"token": []byte(token), "ca.crt": ca} {
		if err := os.WriteFile(filepath.Join(env.saDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoadConfigOrder(t *testing.T) {
	envFile := writeKubeconfig(t, "https://from-env.example:6443")
	flagFile := writeKubeconfig(t, "https://from-flag.example:6443")
	homeDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(homeDir, ".kube"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(homeDir, ".kube", "config"), []byte(`
clusters: [{name: c, cluster: {server: "https://from-home.example"}}]
contexts: [{name: x, context: {cluster: c}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	inCluster := map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}

	tests := []struct {
		name       string
		kubeconfig string
		home       string
		vars       map[string]string
		sa         bool // a service account is mounted
		want       string
		wantErr    string
	}{
		{name: "explicit file wins over everything", kubeconfig: flagFile, home: homeDir, sa: true,
			vars: map[string]string{"KUBECONFIG": envFile, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
			want: "https://from-flag.example:6443"},
		{name: "in-cluster before $KUBECONFIG", vars: map[string]string{"KUBECONFIG": envFile, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
			sa: true, want: "https://10.0.0.1:443"},
		{name: "in-cluster IPv6", vars: map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
			sa: true, want: "https://[fd00::1]:443"},
		{name: "$KUBECONFIG outside a cluster", home: homeDir, vars: map[string]string{"KUBECONFIG": envFile}, want: "https://from-env.example:6443"},
		{name: "~/.kube/config without $KUBECONFIG", home: homeDir, want: "https://from-home.example"},
		{name: "in a cluster without a token falls back to $KUBECONFIG", vars: map[string]string{"KUBECONFIG": envFile, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
			want: "https://from-env.example:6443"},
		{name: "nothing at all", wantErr: "not running in a cluster, and no usable kubeconfig"},
		{name: "in a cluster without a token, nothing else", vars: inCluster, wantErr: "service account token"},
		{name: "missing explicit file", kubeconfig: filepath.Join(homeDir, "nope"), wantErr: filepath.Join(homeDir, "nope")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := envWith(t, tt.home, tt.vars)
			if tt.sa {
				writeServiceAccount(t, env, "sa-token", []byte("ca"))
			}
			cfg, err := loadConfig(tt.kubeconfig, env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Server != tt.want {
				t.Errorf("server %q, want %q", cfg.Server, tt.want)
			}
		})
	}
}

// Each supported kubeconfig field, in YAML and in JSON; relative paths are
// relative to the kubeconfig's directory.
func TestKubeconfigFields(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"ca.pem": "CA FILE", "client.crt": "CERT FILE", "client.key": "KEY FILE", "token": "file-token\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	doc := func(cluster, user string) string {
		return "clusters: [{name: c, cluster: {" + cluster + "}}]\nusers: [{name: u, user: {" + user + "}}]\n" +
			"contexts: [{name: x, context: {cluster: c, user: u}}, {name: other, context: {cluster: nope}}]\ncurrent-context: x\n"
	}
	tests := []struct {
		name    string
		content string
		want    clientConfig
		wantErr string
	}{
		{
			name:    "server, CA file, TLS server name, token",
			content: doc(`server: "https://k.example:6443/prefix", certificate-authority: ca.pem, tls-server-name: kubernetes`, `token: abc`),
			want:    clientConfig{Server: "https://k.example:6443/prefix", CAData: []byte("CA FILE"), TLSServerName: "kubernetes", Token: "abc"},
		},
		{
			name:    "inline CA wins over the file; insecure",
			content: doc(`server: "https://k", certificate-authority: ca.pem, certificate-authority-data: `+b64("CA DATA")+`, insecure-skip-tls-verify: true`, `tokenFile: token`),
			want:    clientConfig{Server: "https://k", CAData: []byte("CA DATA"), Insecure: true, TokenFile: filepath.Join(dir, "token")},
		},
		{
			name:    "client certificate files",
			content: doc(`server: "https://k"`, `client-certificate: client.crt, client-key: `+filepath.Join(dir, "client.key")),
			want:    clientConfig{Server: "https://k", CertData: []byte("CERT FILE"), KeyData: []byte("KEY FILE")},
		},
		{
			name:    "client certificate data",
			content: doc(`server: "https://k"`, `client-certificate-data: `+b64("CERT")+`, client-key-data: `+b64("KEY")),
			want:    clientConfig{Server: "https://k", CertData: []byte("CERT"), KeyData: []byte("KEY")},
		},
		{
			name:    "basic auth",
			content: doc(`server: "https://k"`, `username: admin, password: hunter2`),
			want:    clientConfig{Server: "https://k", Username: "admin", Password: "hunter2"},
		},
		{
			name: "JSON",
			content: `{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":"https://j","certificate-authority-data":"` + b64("CA") + `"}}],` +
				`"users":[{"name":"u","user":{"token":"t"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			want: clientConfig{Server: "https://j", CAData: []byte("CA"), Token: "t"},
		},
		{name: "exec", content: doc(`server: "https://k"`, `exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}`), wantErr: `user "u": exec credential plugins are not supported`},
		{name: "auth-provider", content: doc(`server: "https://k"`, `auth-provider: {name: gcp}`), wantErr: `user "u": auth-provider plugins are not supported`},
		{name: "null exec is absent", content: doc(`server: "https://k"`, `token: t, exec: null`), want: clientConfig{Server: "https://k", Token: "t"}},
		{name: "proxy-url", content: doc(`server: "https://k", proxy-url: "http://proxy"`, `token: t`), wantErr: "proxy-url is not supported"},
		{name: "certificate without key", content: doc(`server: "https://k"`, `client-certificate: client.crt`), wantErr: "needs both"},
		{name: "bad base64", content: doc(`server: "https://k", certificate-authority-data: "!!"`, `token: t`), wantErr: "bad base64"},
		{name: "missing CA file", content: doc(`server: "https://k", certificate-authority: nope.pem`, `token: t`), wantErr: "nope.pem"},
		{name: "no server", content: doc(`insecure-skip-tls-verify: true`, `token: t`), wantErr: "no server"},
		{name: "no current context", content: "clusters: []\n", wantErr: "no current-context"},
		{name: "unknown context", content: "current-context: y\n", wantErr: `current-context "y": no such context`},
		{name: "not YAML", content: "clusters: [", wantErr: "yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "kubeconfig")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := loadConfig(path, testEnv(t))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(*cfg, tt.want); diff != "" {
				t.Errorf("config (-got +want):\n%s", diff)
			}
		})
	}
}

// $KUBECONFIG's files merge as kubectl's do: the first to name a cluster,
// user or context, and the first current-context, win; missing files are
// skipped; relative paths are relative to the file that holds them.
func TestKubeconfigMerge(t *testing.T) {
	a := writeFile(t, "a", `
clusters: [{name: c, cluster: {server: "https://a", certificate-authority: ca.pem}}]
users: [{name: u, user: {token: from-a}}]
`)
	if err := os.WriteFile(filepath.Join(filepath.Dir(a), "ca.pem"), []byte("A's CA"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := writeFile(t, "b", `
clusters: [{name: c, cluster: {server: "https://b"}}]
users: [{name: u, user: {token: from-b}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	c := writeFile(t, "c", `current-context: y`)
	missing := filepath.Join(t.TempDir(), "missing")
	env := envWith(t, "", map[string]string{"KUBECONFIG": strings.Join([]string{missing, a, b, c}, string(filepath.ListSeparator))})
	cfg, err := loadConfig("", env)
	if err != nil {
		t.Fatal(err)
	}
	want := clientConfig{Server: "https://a", CAData: []byte("A's CA"), Token: "from-a"}
	if diff := cmp.Diff(*cfg, want); diff != "" {
		t.Errorf("config (-got +want):\n%s", diff)
	}
}

// testCA is a CA and a certificate it signed, for TLS tests.
type testCA struct {
	pem  []byte
	cert tls.Certificate // signed by the CA, for 127.0.0.1
	pool *x509.CertPool
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"kubernetes"}, IPAddresses: nil,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return testCA{pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), cert: cert, pool: pool}
}

// tlsServer answers lists with an empty one and records the requests.
func tlsServer(t *testing.T, cfg *tls.Config) (*httptest.Server, <-chan *http.Request) {
	reqs := make(chan *http.Request, 10)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs <- r
		io.WriteString(w, `{"metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	srv.TLS = cfg
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, reqs
}

// In a cluster: the service account's CA verifies the API server, its
// token authenticates, and the token file is re-read at most once a
// minute, so that the kubelet's rotation reaches the requests.
func TestInClusterClientRotatesToken(t *testing.T) {
	ca := newTestCA(t)
	srv, reqs := tlsServer(t, &tls.Config{Certificates: []tls.Certificate{ca.cert}})
	host, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "https://"), ":")
	env := envWith(t, "", map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port})
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	env.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	writeServiceAccount(t, env, "token-1\n", ca.pem)

	c, err := newKubeClient("", "tether/test", env)
	if err != nil {
		t.Fatal(err)
	}
	// The certificate is for "kubernetes", not the IP: as a pod would
	// reach kubernetes.default.svc by its name. The test server's address
	// is an IP, so name the server as the cluster's CA does.
	c.http.Transport.(*http.Transport).TLSClientConfig.ServerName = "kubernetes"
	token := func() string {
		t.Helper()
		if _, err := c.ListEndpointSlices(t.Context(), "mcp", "a=b"); err != nil {
			t.Fatal(err)
		}
		return (<-reqs).Header.Get("Authorization")
	}
	if got := token(); got != "Bearer token-1" {
		t.Fatalf("token %q, want token-1", got)
	}
	if err := os.WriteFile(filepath.Join(env.saDir, "token"), []byte("token-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	advance(30 * time.Second)
	if got := token(); got != "Bearer token-1" {
		t.Errorf("token %q after 30s, want token-1 still (re-read once a minute)", got)
	}
	advance(31 * time.Second)
	if got := token(); got != "Bearer token-2" {
		t.Errorf("token %q after a minute, want the rotated token-2", got)
	}
	// A file that cannot be read keeps the last token.
	if err := os.Remove(filepath.Join(env.saDir, "token")); err != nil {
		t.Fatal(err)
	}
	advance(2 * time.Minute)
	if got := token(); got != "Bearer token-2" {
		t.Errorf("token %q with the file gone, want the last one", got)
	}
}

// A client certificate from the kubeconfig is presented, and the server is
// verified against the kubeconfig's CA.
func TestKubeconfigClientCertificate(t *testing.T) {
	ca := newTestCA(t)
	srv, reqs := tlsServer(t, &tls.Config{Certificates: []tls.Certificate{ca.cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool})
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Certificate[0]})
	keyDER, _ := x509.MarshalECPrivateKey(ca.cert.PrivateKey.(*ecdsa.PrivateKey))
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	b64 := base64.StdEncoding.EncodeToString
	path := writeFile(t, "kubeconfig", `
clusters: [{name: c, cluster: {server: "`+srv.URL+`", tls-server-name: kubernetes, certificate-authority-data: `+b64(ca.pem)+`}}]
users: [{name: u, user: {client-certificate-data: `+b64(certPEM)+`, client-key-data: `+b64(keyPEM)+`}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	c, err := newKubeClient(path, "tether/test", testEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListEndpointSlices(t.Context(), "mcp", "a=b"); err != nil {
		t.Fatal(err)
	}
	r := <-reqs
	if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != "client" {
		t.Error("no client certificate presented")
	}
	if got := r.Header.Get("Authorization"); got != "" {
		t.Errorf("Authorization %q with a client certificate only", got)
	}

	// Without the CA the server is not trusted.
	untrusted := writeKubeconfig(t, srv.URL)
	c, err = newKubeClient(untrusted, "tether/test", testEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListEndpointSlices(t.Context(), "mcp", "a=b"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("error %v, want a certificate error", err)
	}
}

// Basic auth, and a server URL with a path prefix (a proxy in front of the
// API server).
func TestKubeClientBasicAuthAndPrefix(t *testing.T) {
	reqs := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs <- r
		io.WriteString(w, `{"metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	t.Cleanup(srv.Close)
	path := writeFile(t, "kubeconfig", `
clusters: [{name: c, cluster: {server: "`+srv.URL+`/k8s/clusters/c-1/"}}]
users: [{name: u, user: {username: admin, password: "p:w"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	c, err := newKubeClient(path, "tether/test", testEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListEndpointSlices(t.Context(), "mcp", "a=b"); err != nil {
		t.Fatal(err)
	}
	r := <-reqs
	if r.URL.Path != "/k8s/clusters/c-1/apis/discovery.k8s.io/v1/namespaces/mcp/endpointslices" {
		t.Errorf("path %s", r.URL.Path)
	}
	if u, p, ok := r.BasicAuth(); !ok || u != "admin" || p != "p:w" {
		t.Errorf("basic auth %q %q %v", u, p, ok)
	}
}
