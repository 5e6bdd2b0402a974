// Package kubetest runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver (docs/design.md#kubernetes-test-environment), built once by
// hack/kube-env.sh and started per test on loopback with generated certificates, service-account keys,
// RBAC authorization and static bearer tokens.
//
// There is no controller manager, scheduler or kubelet: tests create
// Services and EndpointSlices by hand.
package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The versions hack/kube-env.sh builds; its cache layout depends on them.
const (
	EtcdVersion       = "v3.7.3"
	KubernetesVersion = "v1.37.2"
)

// RequireEnv is the environment variable that turns a missing test
// environment from a skip into a failure; make test (and so CI) sets it.
const RequireEnv = "TETHER_REQUIRE_KUBE"

// BinDir is where hack/kube-env.sh puts etcd and kube-apiserver:
// $TETHER_KUBE_BIN_DIR, else
// ${TETHER_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/kube}/k8s-<v>-etcd-<v>.
func BinDir() string {
	if d := os.Getenv("TETHER_KUBE_BIN_DIR"); d != "" {
		return d
	}
	root := os.Getenv("TETHER_KUBE_CACHE")
	if root == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		root = filepath.Join(cache, "tether", "kube")
	}
	return filepath.Join(root, "k8s-"+KubernetesVersion+"-etcd-"+EtcdVersion)
}

// Require returns the directory holding both binaries. When they are
// missing it skips t, or fails it when $TETHER_REQUIRE_KUBE is set, so that
// CI never passes by skipping.
func Require(t testing.TB) string {
	t.Helper()
	dir := BinDir()
	var missing []string
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		Unavailable(t, fmt.Sprintf("%s not built in %s: run hack/kube-env.sh (make kube-env)", strings.Join(missing, " and "), dir))
	}
	return dir
}

// Unavailable skips t with reason, or fails it when $TETHER_REQUIRE_KUBE is
// set.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("Kubernetes test environment unavailable: %s (and %s is set)", reason, RequireEnv)
	}
	t.Skipf("Kubernetes test environment unavailable: %s (set %s=1 to fail instead)", reason, RequireEnv)
}

// User is an identity with a static bearer token. Its permissions are what
// RBAC grants its name and groups; a ServiceAccount's Role binding applies
// to Name "system:serviceaccount:NS:NAME" with groups
// "system:serviceaccounts" and "system:serviceaccounts:NS".
type User struct {
	Name   string
	Groups []string
}

// ServiceAccountUser is the identity of ServiceAccount ns/name, as the API
// server would authenticate its token.
func ServiceAccountUser(ns, name string) User {
	return User{
		Name:   "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns},
	}
}

// Options configures Start.
type Options struct {
	// Users get a token and a kubeconfig each, besides the admin (group
	// system:masters).
	Users []User
	// Host is the address both servers listen on (default 127.0.0.1).
	Host string
}

// Env is a running etcd and kube-apiserver.
type Env struct {
	// Dir holds the certificates, tokens, kubeconfigs, data and logs.
	Dir string
	// URL is the API server's https URL.
	URL string
	// Admin is a client configuration for the admin user.
	Admin *rest.Config

	t           testing.TB
	bin         string
	host        string
	etcd        *process
	apiserver   *process
	apiArgs     []string
	adminToken  string
	kubeconfigs map[string]string // by user name
}

// Start runs etcd and kube-apiserver for the rest of the test. It skips
// (or fails, see Require) when the binaries are missing.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	bin := Require(t)
	host := opts.Host
	if host == "" {
		host = "127.0.0.1"
	}
	e := &Env{t: t, bin: bin, host: host, Dir: t.TempDir(), kubeconfigs: map[string]string{}}

	ca, err := writePKI(e.Dir, host)
	if err != nil {
		t.Fatalf("kubetest: certificates: %v", err)
	}
	e.adminToken = randomToken()
	tokens := []string{tokenLine(e.adminToken, User{Name: "admin", Groups: []string{"system:masters"}})}
	userTokens := map[string]string{}
	for _, u := range opts.Users {
		tok := randomToken()
		userTokens[u.Name] = tok
		tokens = append(tokens, tokenLine(tok, u))
	}
	if err := os.WriteFile(filepath.Join(e.Dir, "tokens.csv"), []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	etcdURL := e.startEtcd()
	e.apiArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + host,
		"--advertise-address=" + host,
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(e.Dir, "apiserver-certs"),
		"--tls-cert-file=" + filepath.Join(e.Dir, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(e.Dir, "apiserver.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(e.Dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(e.Dir, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--token-auth-file=" + filepath.Join(e.Dir, "tokens.csv"),
		"--anonymous-auth=false",
		"--profiling=false",
	}
	// A port found free may be taken before the server binds it (by
	// another test's server, or as the local port of a connection):
	// then the server exits at once, and it is started again on others.
	for attempt := 1; ; attempt++ {
		port := strconv.Itoa(findPorts(t, host, 1)[0])
		e.URL = "https://" + net.JoinHostPort(host, port)
		e.apiArgs = append(e.apiArgs[:len(e.apiArgs):len(e.apiArgs)], "--secure-port="+port)
		err := e.startAPIServerOnce()
		if err == nil {
			break
		}
		if attempt == bindAttempts || !e.apiserver.lostBind() {
			t.Fatal(err)
		}
		e.apiArgs = e.apiArgs[:len(e.apiArgs)-1]
	}

	e.Admin = &rest.Config{
		Host:            e.URL,
		BearerToken:     e.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		QPS:             100,
		Burst:           200,
	}
	e.kubeconfigs["admin"] = e.writeKubeconfig("admin", e.adminToken, ca)
	for _, u := range opts.Users {
		e.kubeconfigs[u.Name] = e.writeKubeconfig(u.Name, userTokens[u.Name], ca)
	}
	return e
}

// AdminClient is a clientset with every permission.
func (e *Env) AdminClient() kubernetes.Interface {
	c, err := kubernetes.NewForConfig(e.Admin)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// Kubeconfig returns the path of the kubeconfig of user ("admin" or a name
// from Options.Users).
func (e *Env) Kubeconfig(user string) string {
	p, ok := e.kubeconfigs[user]
	if !ok {
		e.t.Fatalf("kubetest: no user %q", user)
	}
	return p
}

// RestartAPIServer shuts kube-apiserver down (SIGTERM) and starts it again
// on the same address and etcd: every watch ends, and clients must resume.
func (e *Env) RestartAPIServer() {
	e.t.Helper()
	e.apiserver.stop(5 * time.Second)
	e.startAPIServer()
}

// StopAPIServer kills kube-apiserver (SIGKILL, as a crash or a lost node
// would: connections are reset, not closed) until StartAPIServer.
func (e *Env) StopAPIServer() { e.apiserver.stop(0) }

// StartAPIServer starts a stopped kube-apiserver again and waits until it
// is ready.
func (e *Env) StartAPIServer() {
	e.t.Helper()
	e.startAPIServer()
}

func (e *Env) startAPIServer() {
	e.t.Helper()
	if err := e.startAPIServerOnce(); err != nil {
		e.t.Fatal(err)
	}
}

// startAPIServerOnce starts kube-apiserver with e.apiArgs and waits until
// it is ready.
func (e *Env) startAPIServerOnce() error {
	e.t.Helper()
	e.apiserver = e.start("kube-apiserver", e.apiArgs...)
	ca, err := os.ReadFile(filepath.Join(e.Dir, "ca.crt"))
	if err != nil {
		e.t.Fatal(err)
	}
	client, err := rest.HTTPClientFor(&rest.Config{Host: e.URL, BearerToken: e.adminToken, TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.waitHTTP("kube-apiserver", e.URL+"/readyz", client, 90*time.Second)
}

// bindAttempts is how many times a server is started on ports found free
// before a lost bind fails the test.
const bindAttempts = 3

// startEtcd starts etcd on two ports found free, again on others when one
// was taken meanwhile, and returns its client URL once it is healthy.
func (e *Env) startEtcd() string {
	e.t.Helper()
	for attempt := 1; ; attempt++ {
		ports := findPorts(e.t, e.host, 2)
		etcdURL := "http://" + net.JoinHostPort(e.host, strconv.Itoa(ports[0]))
		peerURL := "http://" + net.JoinHostPort(e.host, strconv.Itoa(ports[1]))
		e.etcd = e.start("etcd",
			"--name=kubetest",
			"--data-dir="+filepath.Join(e.Dir, fmt.Sprintf("etcd-data-%d", attempt)),
			"--listen-client-urls="+etcdURL,
			"--advertise-client-urls="+etcdURL,
			"--listen-peer-urls="+peerURL,
			"--initial-advertise-peer-urls="+peerURL,
			"--initial-cluster=kubetest="+peerURL,
			"--unsafe-no-fsync", // a throwaway data dir: durability buys nothing here
			"--log-level=warn",
		)
		err := e.waitHTTP("etcd", etcdURL+"/health", nil, 30*time.Second)
		if err == nil {
			return etcdURL
		}
		if attempt == bindAttempts || !e.etcd.lostBind() {
			e.t.Fatal(err)
		}
	}
}

// lostBind reports whether the process exited because a port it was to
// listen on was taken.
func (p *process) lostBind() bool {
	return p.exited() && strings.Contains(p.tail(40), "address already in use")
}

// waitHTTP polls url until it answers 200. It fails when the process
// exits or timeout passes.
func (e *Env) waitHTTP(what, url string, client *http.Client, timeout time.Duration) error {
	e.t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		var p *process
		if what == "etcd" {
			p = e.etcd
		} else {
			p = e.apiserver
		}
		if p.exited() {
			return fmt.Errorf("kubetest: %s exited: %v\n%s", what, p.err, p.tail(40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			buf := make([]byte, 512)
			n, _ := resp.Body.Read(buf)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, buf[:n])
			if resp.StatusCode == http.StatusOK {
				cancel()
				return nil
			}
		} else {
			last = err.Error()
		}
		cancel()
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kubetest: %s not ready after %s (last: %s)", what, timeout, last)
}

func (e *Env) writeKubeconfig(user, token string, ca []byte) string {
	e.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: e.URL, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: user}
	cfg.CurrentContext = "kubetest"
	name := strings.NewReplacer(":", "_", "/", "_").Replace(user)
	path := filepath.Join(e.Dir, "kubeconfig-"+name)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		e.t.Fatal(err)
	}
	return path
}

func tokenLine(token string, u User) string {
	return fmt.Sprintf("%s,%s,%s,%q", token, u.Name, "uid-"+u.Name, strings.Join(u.Groups, ","))
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// findPorts is freePorts; a test takes ports instead.
var findPorts = freePorts

// freePorts finds n free TCP ports on host. They are released before use,
// so one may be taken before its server binds it: the servers' starts
// retry on a lost bind (bindAttempts).
func freePorts(t testing.TB, host string, n int) []int {
	t.Helper()
	var lns []net.Listener
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// process is one child process with its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

func (e *Env) start(name string, args ...string) *process {
	e.t.Helper()
	logPath := filepath.Join(e.Dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e.bin, name), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		e.t.Fatalf("kubetest: start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	e.t.Cleanup(func() {
		p.stop(3 * time.Second)
		if e.t.Failed() {
			e.t.Logf("kubetest: last lines of %s's log:\n%s", name, p.tail(30))
		}
	})
	return p
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and, after grace, SIGKILL (at once when grace is 0);
// it waits for the exit.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	if grace > 0 {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(grace):
		}
	}
	p.cmd.Process.Kill()
	<-p.done
}

func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
