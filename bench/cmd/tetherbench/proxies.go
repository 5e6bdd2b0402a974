package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ensureTools installs what the benchmark needs and the machine lacks, with
// apt (Debian): nginx, haproxy, redis-server, iptables.
func ensureTools(log func(string, ...any), bins ...string) error {
	pkgs := map[string]string{"nginx": "nginx-light", "haproxy": "haproxy", "redis-server": "redis-server", "iptables-restore": "iptables", "strace": "strace"}
	var missing []string
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, pkgs[b])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s missing and not root: apt-get install %s", strings.Join(bins, ", "), strings.Join(missing, " "))
	}
	log("installing %s with apt-get", strings.Join(missing, " "))
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %v: %s", err, out)
	}
	cmd := exec.Command("apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install %s: %v: %s", strings.Join(missing, " "), err, out)
	}
	return nil
}

// buildTether builds ./cmd/tether as the sidecar image has it (the
// Dockerfile's build-sidecar stage; `make build`'s bin/tether-sidecar), into dir. It
// builds in tether's own module (the bench module's replace points at it),
// with tether's go.mod, as `make build` and the image do: the bench module
// resolves only what the bench imports.
func buildTether(dir string) (string, error) {
	list, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/tether-mcp/tether").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/tether-mcp/tether: %w (run tetherbench from the bench module)", err)
	}
	out := filepath.Join(dir, "tether")
	cmd := exec.Command("go", "build", "-tags", "tether_sidecar", "-trimpath", "-ldflags", "-s -w", "-o", out, "./cmd/tether")
	cmd.Dir = strings.TrimSpace(string(list))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/tether in %s: %v: %s", cmd.Dir, err, b)
	}
	return out, nil
}

// startTether runs the tether binary against backends on loopback and waits
// for /readyz. It returns the client URL; the admin URL is the proc's admin.
func startTether(ctx context.Context, bin, logDir, name string, backends []string, extra ...string) (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	admin, err := freePort()
	if err != nil {
		return nil, "", err
	}
	args := append([]string{bin, "serve",
		"--backends", strings.Join(backends, ","),
		"--listen", "127.0.0.1:" + strconv.Itoa(port),
		"--admin-listen", "127.0.0.1:" + strconv.Itoa(admin),
		"--log-level", "warn", "--shutdown-grace", "1s"}, extra...)
	p, err := startProc(logDir, name, args...)
	if err != nil {
		return nil, "", err
	}
	p.admin = fmt.Sprintf("http://127.0.0.1:%d", admin)
	if err := waitHTTP(ctx, p.admin+"/readyz", 200, 10*time.Second); err != nil {
		p.stop()
		return nil, "", fmt.Errorf("%s: %w%s", name, err, p.logTail())
	}
	return p, fmt.Sprintf("http://127.0.0.1:%d", port), nil
}

// startRedis runs a redis-server with persistence off on a free loopback port.
func startRedis(ctx context.Context, logDir string) (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	dir := filepath.Join(logDir, "redis")
	os.MkdirAll(dir, 0o755)
	p, err := startProc(logDir, "redis", "redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no", "--loglevel", "warning")
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := waitTCP(ctx, addr, 10*time.Second); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, "redis://" + addr + "/0", nil
}

// nginxConfig is nginx OSS configured fairly for MCP
// (docs/design.md#benchmark-anchors): the backends put their name in the session id, a map sends each id to its
// backend's upstream, and requests without an id (initialize) go to the
// pool. A second server block is the configuration people write first,
// `hash $http_mcp_session_id consistent`, which is not sticky for MCP: it is
// only used to count how many follow-ups it sends to the wrong backend.
//
// Both keep upstream connections alive (keepalive + HTTP/1.1 + an empty
// Connection header), stream responses (proxy_buffering off, for SSE) and
// pass Host through (go-sdk answers 403 to a Host that is not loopback).
func nginxConfig(dir string, port, hashPort int, names []string, addrs map[string]string) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("worker_processes auto;")
	w("daemon off;")
	w("pid %s/nginx.pid;", dir)
	w("error_log %s/error.log warn;", dir)
	w("events { worker_connections 8192; }")
	w("http {")
	w("  access_log off;")
	for _, t := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		w("  %s_temp_path %s/%s;", t, dir, t)
	}
	w("  map $http_mcp_session_id $mcp_upstream {")
	w("    default mcp_pool;")
	for _, n := range names {
		w("    ~^%s\\. mcp_%s;", n, n)
	}
	w("  }")
	w("  upstream mcp_pool {")
	for _, n := range names {
		w("    server %s;", addrs[n])
	}
	w("    keepalive 64;")
	w("  }")
	for _, n := range names {
		w("  upstream mcp_%s { server %s; keepalive 64; }", n, addrs[n])
	}
	w("  upstream mcp_hash {")
	w("    hash $http_mcp_session_id consistent;")
	for _, n := range names {
		w("    server %s;", addrs[n])
	}
	w("    keepalive 64;")
	w("  }")
	common := "proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $http_host; proxy_buffering off; proxy_request_buffering on;"
	w("  server { listen 127.0.0.1:%d; location / { %s proxy_pass http://$mcp_upstream; } }", port, common)
	w("  server { listen 127.0.0.1:%d; location / { %s proxy_pass http://mcp_hash; } }", hashPort, common)
	w("}")
	return b.String()
}

// startNginx runs nginx (master and workers, our own process) and returns
// the fair URL and the hash URL.
func startNginx(ctx context.Context, logDir string, names []string, addrs map[string]string) (*proc, string, string, error) {
	dir := filepath.Join(logDir, "nginx")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", "", err
	}
	port, _ := freePort()
	hashPort, _ := freePort()
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConfig(dir, port, hashPort, names, addrs)), 0o644); err != nil {
		return nil, "", "", err
	}
	p, err := startProc(logDir, "nginx", "nginx", "-e", filepath.Join(dir, "error.log"), "-p", dir, "-c", conf)
	if err != nil {
		return nil, "", "", err
	}
	for _, pt := range []int{port, hashPort} {
		if err := waitTCP(ctx, "127.0.0.1:"+strconv.Itoa(pt), 10*time.Second); err != nil {
			p.stop()
			return nil, "", "", fmt.Errorf("nginx: %w%s", err, p.logTail())
		}
	}
	return p, fmt.Sprintf("http://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.1:%d", hashPort), nil
}

// haproxyConfig sticks sessions with a stick table that learns the id from
// the response that mints it (docs/design.md#benchmark-anchors):
// `stick store-response res.hdr(mcp-session-id)` and `stick match req.hdr(mcp-session-id)`.
// Requests without an id are balanced round-robin. Upstream connections
// are reused (`http-reuse always`), as tether and nginx reuse theirs.
func haproxyConfig(port int, names []string, addrs map[string]string) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("global")
	w("  maxconn 8000")
	w("  nbthread 2")
	w("defaults")
	w("  mode http")
	w("  timeout connect 2s")
	w("  timeout client 60s")
	w("  timeout server 60s")
	w("  timeout http-keep-alive 60s")
	w("  option http-keep-alive")
	w("frontend mcp_in")
	w("  bind 127.0.0.1:%d", port)
	w("  default_backend mcp")
	w("backend mcp")
	w("  balance roundrobin")
	w("  http-reuse always")
	w("  stick-table type string len 128 size 1m expire 1h")
	w("  stick match req.hdr(mcp-session-id)")
	w("  stick store-response res.hdr(mcp-session-id)")
	for _, n := range names {
		w("  server %s %s", n, addrs[n])
	}
	return b.String()
}

func startHAProxy(ctx context.Context, logDir string, names []string, addrs map[string]string) (*proc, string, error) {
	port, _ := freePort()
	conf := filepath.Join(logDir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(haproxyConfig(port, names, addrs)), 0o644); err != nil {
		return nil, "", err
	}
	p, err := startProc(logDir, "haproxy", "haproxy", "-db", "-f", conf)
	if err != nil {
		return nil, "", err
	}
	if err := waitTCP(ctx, "127.0.0.1:"+strconv.Itoa(port), 10*time.Second); err != nil {
		p.stop()
		return nil, "", fmt.Errorf("haproxy: %w%s", err, p.logTail())
	}
	return p, fmt.Sprintf("http://127.0.0.1:%d", port), nil
}
