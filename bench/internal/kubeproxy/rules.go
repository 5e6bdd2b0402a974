// Package kubeproxy writes the nat-table rules that kube-proxy's iptables
// mode programs for one ClusterIP Service, as iptables-restore input, so
// that the benchmark can reproduce a Service (sessionAffinity ClientIP or
// None) with the kernel doing what it does in a cluster.
//
// The chain structure and naming mirror kube-proxy (pkg/proxy/iptables):
// PREROUTING and OUTPUT jump to KUBE-SERVICES; KUBE-SERVICES matches the
// cluster IP and port and jumps to KUBE-SVC-<hash>; KUBE-SVC-* first checks
// the affinity lists (`-m recent --rcheck --seconds T --reap`), then picks an
// endpoint with `-m statistic --mode random --probability 1/(n-i)`; each
// KUBE-SEP-<hash> records the client in its recent list (`--set`) and DNATs
// to the pod. Chain hashes are kube-proxy's: base32(sha256(name+proto+ep))
// cut to 16 characters. NodePorts, external IPs, load-balancer and
// topology rules are left out: the benchmark uses none of them.
package kubeproxy

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
)

// Affinity is a Service's spec.sessionAffinity.
type Affinity string

const (
	AffinityNone     Affinity = "None"
	AffinityClientIP Affinity = "ClientIP"
)

// DefaultAffinityTimeout is kube's default
// sessionAffinityConfig.clientIP.timeoutSeconds (3 hours).
const DefaultAffinityTimeout = 10800

// Service is one port of a ClusterIP Service with its ready endpoints.
type Service struct {
	Namespace, Name string
	PortName        string // spec.ports[].name ("" for an unnamed port)
	Protocol        string // "tcp" (kube-proxy hashes the lower-case name)
	ClusterIP       string
	Port            int
	Affinity        Affinity
	// AffinityTimeout is timeoutSeconds for ClientIP (0 = the default).
	AffinityTimeout int
	// Endpoints are "ip:port" of the ready pods, in the order kube-proxy
	// would list them (it sorts them).
	Endpoints []string
	// ClusterCIDR is the pod range; traffic to the cluster IP from outside
	// it is marked for masquerade, as kube-proxy does with --cluster-cidr.
	ClusterCIDR string
}

// portName is kube-proxy's ServicePortName.String(): "ns/name:port", or
// "ns/name" for an unnamed port.
func (s Service) portName() string {
	n := s.Namespace + "/" + s.Name
	if s.PortName != "" {
		n += ":" + s.PortName
	}
	return n
}

func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// SVCChain is the service port's chain, KUBE-SVC-<hash>.
func (s Service) SVCChain() string {
	return "KUBE-SVC-" + hash16(s.portName()+strings.ToLower(s.Protocol))
}

// SEPChain is the chain of one endpoint, KUBE-SEP-<hash>; it is also the
// name of that endpoint's recent list (/proc/net/xt_recent/<name>).
func (s Service) SEPChain(endpoint string) string {
	return "KUBE-SEP-" + hash16(s.portName()+strings.ToLower(s.Protocol)+endpoint)
}

// Mark bits, as kube-proxy's defaults (--iptables-masquerade-bit=14).
const masqMark = "0x4000/0x4000"

// NATRules returns the nat table for the given services in iptables-restore
// format (with COMMIT). Loading it with `iptables-restore` replaces the whole
// nat table of the network namespace.
func NATRules(svcs ...Service) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("*nat")
	for _, c := range []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"} {
		w(":%s ACCEPT [0:0]", c)
	}
	w(":KUBE-SERVICES - [0:0]")
	w(":KUBE-POSTROUTING - [0:0]")
	w(":KUBE-MARK-MASQ - [0:0]")
	for _, s := range svcs {
		w(":%s - [0:0]", s.SVCChain())
		for _, ep := range s.Endpoints {
			w(":%s - [0:0]", s.SEPChain(ep))
		}
	}
	w(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	w("-A KUBE-POSTROUTING -m mark ! --mark %s -j RETURN", masqMark)
	w("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000")
	w(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	w("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000")
	for _, s := range svcs {
		writeService(w, s)
	}
	w("COMMIT")
	return b.String()
}

func writeService(w func(string, ...any), s Service) {
	name, proto := s.portName(), strings.ToLower(s.Protocol)
	svc := s.SVCChain()
	clusterMatch := fmt.Sprintf("-m %s -p %s -d %s/32 --dport %d", proto, proto, s.ClusterIP, s.Port)
	if len(s.Endpoints) == 0 {
		// kube-proxy puts a REJECT in the filter table; with no filter
		// rules here the packet simply finds nobody.
		return
	}
	w(`-A KUBE-SERVICES -m comment --comment "%s cluster IP" %s -j %s`, name, clusterMatch, svc)
	if s.ClusterCIDR != "" {
		w(`-A %s -m comment --comment "%s cluster IP" %s ! -s %s -j KUBE-MARK-MASQ`, svc, name, clusterMatch, s.ClusterCIDR)
	}
	timeout := s.AffinityTimeout
	if timeout == 0 {
		timeout = DefaultAffinityTimeout
	}
	if s.Affinity == AffinityClientIP {
		for _, ep := range s.Endpoints {
			sep := s.SEPChain(ep)
			w(`-A %s -m comment --comment "%s -> %s" -m recent --name %s --rcheck --seconds %d --reap -j %s`,
				svc, name, ep, sep, timeout, sep)
		}
	}
	n := len(s.Endpoints)
	for i, ep := range s.Endpoints {
		sep := s.SEPChain(ep)
		if i < n-1 {
			w(`-A %s -m comment --comment "%s -> %s" -m statistic --mode random --probability %0.10f -j %s`,
				svc, name, ep, 1.0/float64(n-i), sep)
		} else {
			w(`-A %s -m comment --comment "%s -> %s" -j %s`, svc, name, ep, sep)
		}
	}
	for _, ep := range s.Endpoints {
		sep := s.SEPChain(ep)
		ip := ep[:strings.LastIndexByte(ep, ':')]
		w(`-A %s -m comment --comment %s -s %s/32 -j KUBE-MARK-MASQ`, sep, name, ip)
		if s.Affinity == AffinityClientIP {
			w(`-A %s -m comment --comment %s -m recent --name %s --set -m %s -p %s -j DNAT --to-destination %s`,
				sep, name, sep, proto, proto, ep)
		} else {
			w(`-A %s -m comment --comment %s -m %s -p %s -j DNAT --to-destination %s`, sep, name, proto, proto, ep)
		}
	}
}
