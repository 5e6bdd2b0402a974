package kubetest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// netnsEnv marks the child test process that runs inside the namespace.
const netnsEnv = "TETHER_KUBETEST_NETNS"

// InNetns runs the calling test inside a network namespace of its own, whose
// loopback interface also carries addrs (such as "10.244.0.11"): the API
// server accepts those in EndpointSlices, unlike 127.0.0.0/8, and no packet
// for them leaves the namespace (docs/design.md#kubernetes-test-environment).
//
// In the test process it creates the namespace, runs the test binary again
// inside it (`ip netns exec NAME <binary> -test.run '^Name$'`), relays that
// run's output to t, fails t if the run failed, deletes the namespace, and
// returns false: the caller returns at once. In that second run it returns
// true, and the test proceeds. Everything the test starts (etcd,
// kube-apiserver, tether, servers) is then inside the namespace.
//
// It needs root and iproute2; without them it skips (or fails, see
// Require).
func InNetns(t *testing.T, addrs ...string) bool {
	t.Helper()
	if name := os.Getenv(netnsEnv); name != "" {
		t.Logf("inside network namespace %s", name)
		return true
	}
	if os.Geteuid() != 0 {
		Unavailable(t, "network namespaces need root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		Unavailable(t, "network namespaces need iproute2's ip command")
	}
	name := fmt.Sprintf("tether-test-%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() { exec.Command(ip, "netns", "del", name).Run() })
	run("-n", name, "link", "set", "lo", "up")
	for _, a := range addrs {
		prefix := "/32"
		if strings.Contains(a, ":") {
			prefix = "/128"
		}
		run("-n", name, "addr", "add", a+prefix, "dev", "lo")
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	args := []string{"netns", "exec", name, exe, "-test.run=" + strings.Join(parts, "/"), "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Truncate(time.Second).String())
	}
	cmd := exec.Command(ip, args...)
	cmd.Env = append(os.Environ(), netnsEnv+"="+name)
	out := &lineLogger{t: t}
	cmd.Stdout, cmd.Stderr = out, out
	t.Logf("running %s inside network namespace %s (addresses %s)", t.Name(), name, strings.Join(addrs, ", "))
	err = cmd.Run()
	out.flush()
	switch {
	case err != nil:
		t.Errorf("the run inside network namespace %s failed: %v", name, err)
	case strings.Contains(out.all.String(), "--- SKIP: "+parts0(t.Name())):
		t.Skip("skipped inside the network namespace")
	case !strings.Contains(out.all.String(), "--- PASS: "+parts0(t.Name())):
		t.Errorf("the run inside network namespace %s did not report a pass", name)
	}
	return false
}

func parts0(name string) string { return strings.SplitN(name, "/", 2)[0] }

// lineLogger relays a child's output to t.Log, line by line.
type lineLogger struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
	all strings.Builder
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		l.t.Log("│ " + string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.t.Log("│ " + string(l.buf))
		l.buf = nil
	}
}

var _ io.Writer = (*lineLogger)(nil)
