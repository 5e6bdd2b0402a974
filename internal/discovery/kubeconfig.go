package discovery

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// KubeClient builds the EndpointSlice client of the Kubernetes source. The
// configuration comes from, in order:
//
//  1. kubeconfig, when set: that file and nothing else;
//  2. the pod's service account (in-cluster: KUBERNETES_SERVICE_HOST and
//     KUBERNETES_SERVICE_PORT, and the token and CA mounted in
//     /var/run/secrets/kubernetes.io/serviceaccount), the sidecar's normal
//     case;
//  3. when that is not available: kubectl's loading rules, the files listed
//     in $KUBECONFIG (the first to set a cluster, user, context or the
//     current context wins), else ~/.kube/config, with their current
//     context.
//
// A kubeconfig may be YAML or JSON; its relative file paths are relative to
// the file. Of its users, bearer tokens (inline or tokenFile), client
// certificates and basic auth are supported; exec and auth-provider
// plugins are not (they would run or link cloud SDKs in the sidecar): use a
// ServiceAccount token. A token read from a file (the service account's
// bound token, a tokenFile) is re-read at most once a minute, as client-go
// does, because the kubelet rotates it; certificate and key files are read
// once.
//
// userAgent identifies tether in the API server's logs and audit.
//
// This is the sidecar build's loader; the full build loads with client-go
// instead and hands the result to NewKubeAPI.
func KubeClient(kubeconfig, userAgent string) (KubeAPI, error) {
	return newKubeClient(kubeconfig, userAgent, hostEnv())
}

// KubeAPI is tether's client to the API server: list and watch of
// EndpointSlices for discovery, and single requests for the pod deletion
// cost.
type KubeAPI interface {
	EndpointSliceClient
	Requester
}

// NewKubeAPI builds the client over hc, whose transport already carries
// the TLS configuration and the credentials of every request: the full
// build makes it with client-go's clientcmd and rest.HTTPClientFor, which
// run exec credential plugins and auth-provider plugins, rotate client
// certificates and honour proxy-url (code the sidecar does not link).
// server is the API server's URL, with its path prefix if any.
func NewKubeAPI(server string, hc *http.Client, userAgent string) (KubeAPI, error) {
	base, err := parseServer(server)
	if err != nil {
		return nil, err
	}
	return newAPIClient(base, hc, userAgent), nil
}

// inClusterDir is where the kubelet mounts the service account's token and
// the cluster's CA.
const inClusterDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// tokenRefresh is how often a token file is re-read: client-go's period
// (transport.NewCachedFileTokenSource). Bound tokens are rotated well
// before they expire (after 80% of an hour or more), so a minute is ample.
const tokenRefresh = time.Minute

// configEnv is what the configuration is loaded from besides an explicit
// kubeconfig; tests replace it.
type configEnv struct {
	getenv func(string) string
	home   string // for ~/.kube/config; "" when unknown
	// saDir holds the service account's token and ca.crt.
	saDir string
	now   func() time.Time
}

func hostEnv() configEnv {
	home, _ := os.UserHomeDir()
	return configEnv{getenv: os.Getenv, home: home, saDir: inClusterDir, now: time.Now}
}

// clientConfig is a resolved configuration: where the API server is and how
// to authenticate to it.
type clientConfig struct {
	Server        string // URL, possibly with a path prefix
	TLSServerName string
	Insecure      bool
	CAData        []byte // PEM; nil for the system's roots
	CertData      []byte // PEM client certificate and key
	KeyData       []byte
	Token         string
	TokenFile     string // re-read; used when Token is empty
	Username      string
	Password      string
}

func newKubeClient(kubeconfig, userAgent string, env configEnv) (*apiClient, error) {
	cfg, err := loadConfig(kubeconfig, env)
	if err != nil {
		return nil, err
	}
	c, err := cfg.client(userAgent, env.now)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}

// loadConfig finds the configuration by KubeClient's rules.
func loadConfig(kubeconfig string, env configEnv) (*clientConfig, error) {
	if kubeconfig != "" {
		cfg, err := loadKubeconfig([]string{kubeconfig}, true)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, inClusterErr := inClusterConfig(env)
	if inClusterErr == nil {
		return cfg, nil
	}
	var files []string
	explicit := false
	if list := env.getenv("KUBECONFIG"); list != "" {
		files = filepath.SplitList(list)
		explicit = true
	} else if env.home != "" {
		files = []string{filepath.Join(env.home, ".kube", "config")}
	}
	cfg, err := loadKubeconfig(files, false)
	where := "~/.kube/config"
	if explicit {
		where = "$KUBECONFIG"
	}
	switch {
	case err == nil:
		return cfg, nil
	case errors.Is(inClusterErr, errNotInCluster):
		return nil, fmt.Errorf("not running in a cluster, and no usable kubeconfig (%s): %w", where, err)
	}
	return nil, fmt.Errorf("in-cluster kubernetes config: %v; kubeconfig (%s): %w", inClusterErr, where, err)
}

var errNotInCluster = errors.New("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not in a cluster")

// inClusterConfig is the pod's service account, as client-go's
// rest.InClusterConfig finds it.
func inClusterConfig(env configEnv) (*clientConfig, error) {
	host, port := env.getenv("KUBERNETES_SERVICE_HOST"), env.getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errNotInCluster
	}
	tokenFile := filepath.Join(env.saDir, "token")
	if _, err := os.ReadFile(tokenFile); err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(env.saDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("service account CA: %w", err)
	}
	return &clientConfig{Server: "https://" + net.JoinHostPort(host, port), CAData: ca, TokenFile: tokenFile}, nil
}

// The kubeconfig fields tether reads (clientcmd's v1 Config). Unknown fields
// are ignored, as kubectl does; the plugin fields are read only to refuse
// them.
type (
	kubeconfigFile struct {
		Clusters []struct {
			Name    string      `yaml:"name"`
			Cluster clusterInfo `yaml:"cluster"`
		} `yaml:"clusters"`
		Users []struct {
			Name string   `yaml:"name"`
			User userInfo `yaml:"user"`
		} `yaml:"users"`
		Contexts []struct {
			Name    string `yaml:"name"`
			Context struct {
				Cluster string `yaml:"cluster"`
				User    string `yaml:"user"`
			} `yaml:"context"`
		} `yaml:"contexts"`
		CurrentContext string `yaml:"current-context"`
	}

	clusterInfo struct {
		Server                   string `yaml:"server"`
		CertificateAuthority     string `yaml:"certificate-authority"`
		CertificateAuthorityData string `yaml:"certificate-authority-data"`
		InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
		TLSServerName            string `yaml:"tls-server-name"`
		ProxyURL                 string `yaml:"proxy-url"`
	}

	userInfo struct {
		Token                 string    `yaml:"token"`
		TokenFile             string    `yaml:"tokenFile"`
		ClientCertificate     string    `yaml:"client-certificate"`
		ClientCertificateData string    `yaml:"client-certificate-data"`
		ClientKey             string    `yaml:"client-key"`
		ClientKeyData         string    `yaml:"client-key-data"`
		Username              string    `yaml:"username"`
		Password              string    `yaml:"password"`
		Exec                  yaml.Node `yaml:"exec"`
		AuthProvider          yaml.Node `yaml:"auth-provider"`
		Impersonate           string    `yaml:"as"`
	}
)

// The merged view of one or more kubeconfig files: by name, the first
// file's entry wins; each entry remembers the directory of its file for
// its relative paths.
type (
	namedCluster struct {
		dir     string
		cluster *clusterInfo
	}
	namedUser struct {
		dir  string
		user *userInfo
	}
)

// maxKubeconfigBytes caps a kubeconfig file: real ones are a few KiB, and
// a mistaken path (a log, a device) must not be read whole.
const maxKubeconfigBytes = 4 << 20

// loadKubeconfig merges files in order and resolves the current context.
// Missing files are skipped unless mustExist (an explicit --kubeconfig).
func loadKubeconfig(files []string, mustExist bool) (*clientConfig, error) {
	clusters := map[string]namedCluster{}
	users := map[string]namedUser{}
	contexts := map[string][2]string{} // name → cluster, user
	current := ""
	found := 0
	for _, path := range files {
		if path == "" {
			continue
		}
		data, err := readFileLimited(path, maxKubeconfigBytes)
		if errors.Is(err, fs.ErrNotExist) && !mustExist {
			continue
		}
		if err != nil {
			return nil, err
		}
		found++
		var f kubeconfigFile
		// YAML is a superset of JSON: one parser reads both.
		if err := yaml.Unmarshal(data, &f); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		dir := filepath.Dir(path)
		for i := range f.Clusters {
			if _, ok := clusters[f.Clusters[i].Name]; !ok {
				clusters[f.Clusters[i].Name] = namedCluster{dir: dir, cluster: &f.Clusters[i].Cluster}
			}
		}
		for i := range f.Users {
			if _, ok := users[f.Users[i].Name]; !ok {
				users[f.Users[i].Name] = namedUser{dir: dir, user: &f.Users[i].User}
			}
		}
		for _, c := range f.Contexts {
			if _, ok := contexts[c.Name]; !ok {
				contexts[c.Name] = [2]string{c.Context.Cluster, c.Context.User}
			}
		}
		if current == "" {
			current = f.CurrentContext
		}
	}
	if found == 0 {
		return nil, fmt.Errorf("no kubeconfig file found (looked for %s)", strings.Join(files, ", "))
	}
	if current == "" {
		return nil, errors.New("no current-context")
	}
	ctx, ok := contexts[current]
	if !ok {
		return nil, fmt.Errorf("current-context %q: no such context", current)
	}
	cl, ok := clusters[ctx[0]]
	if !ok {
		return nil, fmt.Errorf("context %q: no cluster %q", current, ctx[0])
	}
	cfg := &clientConfig{
		Server:        cl.cluster.Server,
		TLSServerName: cl.cluster.TLSServerName,
		Insecure:      cl.cluster.InsecureSkipTLSVerify,
	}
	if cfg.Server == "" {
		return nil, fmt.Errorf("cluster %q: no server", ctx[0])
	}
	if cl.cluster.ProxyURL != "" {
		return nil, fmt.Errorf("cluster %q: proxy-url is not supported (the proxy environment variables are)", ctx[0])
	}
	var err error
	if cfg.CAData, err = fileOrData(cl.dir, cl.cluster.CertificateAuthority, cl.cluster.CertificateAuthorityData); err != nil {
		return nil, fmt.Errorf("cluster %q: certificate-authority: %w", ctx[0], err)
	}
	if ctx[1] == "" {
		return cfg, nil // no credentials
	}
	u, ok := users[ctx[1]]
	if !ok {
		return nil, fmt.Errorf("context %q: no user %q", current, ctx[1])
	}
	if err := u.apply(cfg); err != nil {
		return nil, fmt.Errorf("user %q: %w", ctx[1], err)
	}
	return cfg, nil
}

func (u namedUser) apply(cfg *clientConfig) error {
	info := u.user
	switch {
	case present(info.Exec):
		return errors.New("exec credential plugins are not supported: use a token, a tokenFile or a client certificate (a ServiceAccount's token in a pod)")
	case present(info.AuthProvider):
		return errors.New("auth-provider plugins are not supported: use a token, a tokenFile or a client certificate (a ServiceAccount's token in a pod)")
	case info.Impersonate != "":
		return errors.New("impersonation (as) is not supported")
	}
	cfg.Token, cfg.Username, cfg.Password = info.Token, info.Username, info.Password
	if info.TokenFile != "" {
		cfg.TokenFile = resolve(u.dir, info.TokenFile)
	}
	var err error
	if cfg.CertData, err = fileOrData(u.dir, info.ClientCertificate, info.ClientCertificateData); err != nil {
		return fmt.Errorf("client-certificate: %w", err)
	}
	if cfg.KeyData, err = fileOrData(u.dir, info.ClientKey, info.ClientKeyData); err != nil {
		return fmt.Errorf("client-key: %w", err)
	}
	if (cfg.CertData == nil) != (cfg.KeyData == nil) {
		return errors.New("a client certificate needs both client-certificate and client-key")
	}
	return nil
}

// fileOrData returns the base64 data when given (it wins, as in
// client-go), else the file's content, else nil.
func fileOrData(dir, file, data string) ([]byte, error) {
	if data != "" {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(data))
		if err != nil {
			return nil, fmt.Errorf("bad base64: %w", err)
		}
		return b, nil
	}
	if file == "" {
		return nil, nil
	}
	return readFileLimited(resolve(dir, file), maxKubeconfigBytes)
}

func resolve(dir, path string) string {
	if path == "" || filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

func readFileLimited(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, nil
}

// present says whether a plugin field is set (kubeconfig writers may spell
// an absent one as null).
func present(n yaml.Node) bool { return !n.IsZero() && n.Tag != "!!null" }

// client builds the HTTP client for cfg.
func (cfg *clientConfig) client(userAgent string, now func() time.Time) (*apiClient, error) {
	base, err := parseServer(cfg.Server)
	if err != nil {
		return nil, err
	}
	tlsConfig := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         cfg.TLSServerName,
		InsecureSkipVerify: cfg.Insecure, //nolint:gosec // the kubeconfig asked for it
	}
	if cfg.CAData != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CAData) {
			return nil, errors.New("the certificate authority holds no PEM certificate")
		}
		tlsConfig.RootCAs = pool
	}
	if cfg.CertData != nil {
		cert, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tlsConfig.Certificates = []tls.Certificate{cert}
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
		// A watch is silent for minutes when nothing changes: HTTP/2 pings
		// find a dead connection (a lost node, a dropped NAT entry) within
		// a minute instead of at the watch's deadline; client-go's values.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
	}
	c := newAPIClient(base, &http.Client{Transport: transport}, userAgent)
	switch {
	case cfg.Token != "":
		token := cfg.Token
		c.auth = func(r *http.Request) error { r.Header.Set("Authorization", "Bearer "+token); return nil }
	case cfg.TokenFile != "":
		ts := &fileToken{path: cfg.TokenFile, now: now}
		if _, err := ts.get(); err != nil {
			return nil, err
		}
		c.auth = func(r *http.Request) error {
			tok, err := ts.get()
			if err != nil {
				return err
			}
			r.Header.Set("Authorization", "Bearer "+tok)
			return nil
		}
	case cfg.Username != "" || cfg.Password != "":
		user, pass := cfg.Username, cfg.Password
		c.auth = func(r *http.Request) error { r.SetBasicAuth(user, pass); return nil }
	}
	return c, nil
}

// fileToken is a bearer token read from a file and re-read at most every
// tokenRefresh. When a re-read fails the last token stays in use (the
// kubelet replaces the file atomically; a transient error must not stop
// the watch).
type fileToken struct {
	path string
	now  func() time.Time

	mu     sync.Mutex
	token  string    // guarded by mu
	readAt time.Time // guarded by mu
}

// maxTokenBytes caps a token file; bound tokens are about 1 KiB.
const maxTokenBytes = 64 << 10

func (f *fileToken) get() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if f.token != "" && now.Sub(f.readAt) < tokenRefresh {
		return f.token, nil
	}
	b, err := readFileLimited(f.path, maxTokenBytes)
	tok := strings.TrimSpace(string(b))
	switch {
	case err == nil && tok != "":
		f.token, f.readAt = tok, now
	case f.token != "":
		f.readAt = now // keep the last token; try again in a while
	case err != nil:
		return "", fmt.Errorf("token file: %w", err)
	default:
		return "", fmt.Errorf("token file %s is empty", f.path)
	}
	return f.token, nil
}

func parseServer(server string) (*url.URL, error) {
	base, err := url.Parse(server)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("server %q: want an http or https URL", server)
	}
	return base, nil
}

func newAPIClient(base *url.URL, hc *http.Client, userAgent string) *apiClient {
	return &apiClient{
		base:      base,
		http:      hc,
		userAgent: userAgent,
		maxList:   maxListBytes,
		maxEvent:  maxEventBytes,
	}
}
