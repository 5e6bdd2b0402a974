// Package netlab builds a small routed network out of Linux network
// namespaces: one "node" namespace that routes (and holds kube-proxy's
// iptables rules), and "pod" namespaces each joined to the node by a veth
// pair on its own /30, with the node as default gateway — the shape of a
// routed CNI such as Calico. Every address lives inside the namespaces, so
// no packet of the benchmark reaches the host's network. It needs root and
// iproute2.
package netlab

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Lab is a set of namespaces named <prefix>-<name>; Close deletes them.
type Lab struct {
	prefix string
	nss    []string
	pods   int
}

// Pod is a namespace attached to the node.
type Pod struct {
	NS string // full namespace name
	IP string // the pod's address
	GW string // the node's side of the link
}

// New creates the node namespace (IP forwarding on) for a lab whose
// namespaces are named tbench<pid>-<name>.
func New() (*Lab, error) {
	l := &Lab{prefix: "tbench" + strconv.Itoa(os.Getpid())}
	if err := l.addNS("node"); err != nil {
		return nil, err
	}
	if err := l.Exec("node", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// NS is the full name of the lab's namespace name.
func (l *Lab) NS(name string) string { return l.prefix + "-" + name }

func (l *Lab) addNS(name string) error {
	ns := l.NS(name)
	if err := run("ip", "netns", "add", ns); err != nil {
		return err
	}
	l.nss = append(l.nss, ns)
	return run("ip", "-n", ns, "link", "set", "lo", "up")
}

// AddPod creates namespace name, joined to the node by a veth pair on
// 10.244.0.4k/30 (k counts pods from 0): the node side is .4k+1, the pod
// .4k+2, and the pod's default route goes through the node.
func (l *Lab) AddPod(name string) (Pod, error) {
	if err := l.addNS(name); err != nil {
		return Pod{}, err
	}
	k := l.pods
	l.pods++
	if k >= 63 {
		return Pod{}, fmt.Errorf("netlab: too many pods")
	}
	p := Pod{NS: l.NS(name), GW: fmt.Sprintf("10.244.0.%d", 4*k+1), IP: fmt.Sprintf("10.244.0.%d", 4*k+2)}
	veth := fmt.Sprintf("veth%d", k)
	node := l.NS("node")
	for _, args := range [][]string{
		{"ip", "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", p.NS},
		{"ip", "-n", node, "addr", "add", p.GW + "/30", "dev", veth},
		{"ip", "-n", node, "link", "set", veth, "up"},
		{"ip", "-n", p.NS, "addr", "add", p.IP + "/30", "dev", "eth0"},
		{"ip", "-n", p.NS, "link", "set", "eth0", "up"},
		{"ip", "-n", p.NS, "route", "add", "default", "via", p.GW},
	} {
		if err := run(args...); err != nil {
			return Pod{}, err
		}
	}
	return p, nil
}

// Exec runs a command inside the lab's namespace name.
func (l *Lab) Exec(name string, argv ...string) error {
	return run(append([]string{"ip", "netns", "exec", l.NS(name)}, argv...)...)
}

// ExecInput runs a command inside namespace name with stdin.
func (l *Lab) ExecInput(name, stdin string, argv ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", l.NS(name)}, argv...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
	return nil
}

// Prefix is the argv prefix that runs a program inside namespace name.
func (l *Lab) Prefix(name string) []string { return []string{"ip", "netns", "exec", l.NS(name)} }

// Close deletes every namespace of the lab (their links, routes and
// iptables rules go with them).
func (l *Lab) Close() {
	for i := len(l.nss) - 1; i >= 0; i-- {
		exec.Command("ip", "netns", "del", l.nss[i]).Run()
	}
	l.nss = nil
}

var staleName = regexp.MustCompile(`^tbench(\d+)-`)

// RemoveStale deletes namespaces left by labs whose process is gone (a
// benchmark killed with SIGKILL cannot clean up after itself).
func RemoveStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		m := staleName.FindStringSubmatch(f[0])
		if m == nil {
			continue
		}
		if _, err := os.Stat("/proc/" + m[1]); err == nil {
			continue
		}
		exec.Command("ip", "netns", "del", f[0]).Run()
	}
}

func run(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
