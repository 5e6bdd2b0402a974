package kubeproxy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Chain names seen on every cluster: the hashes must be kube-proxy's.
func TestChainNamesMatchKubeProxy(t *testing.T) {
	for _, tc := range []struct {
		svc  Service
		want string
	}{
		{Service{Namespace: "default", Name: "kubernetes", PortName: "https", Protocol: "TCP"}, "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		{Service{Namespace: "kube-system", Name: "kube-dns", PortName: "dns", Protocol: "UDP"}, "KUBE-SVC-TCOU7JCQXEZGVUNU"},
		{Service{Namespace: "kube-system", Name: "kube-dns", PortName: "dns-tcp", Protocol: "TCP"}, "KUBE-SVC-ERIFXISQEP7F7OF4"},
		{Service{Namespace: "kube-system", Name: "kube-dns", PortName: "metrics", Protocol: "TCP"}, "KUBE-SVC-JD5MR3NA4I4DYORP"},
	} {
		if got := tc.svc.SVCChain(); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.svc.portName(), got, tc.want)
		}
	}
}

func TestNATRulesClientIP(t *testing.T) {
	s := Service{Namespace: "mcp", Name: "mcp-server", PortName: "http", Protocol: "tcp",
		ClusterIP: "10.96.0.10", Port: 80, Affinity: AffinityClientIP, ClusterCIDR: "10.244.0.0/16",
		Endpoints: []string{"10.244.2.2:8080", "10.244.2.6:8080", "10.244.2.10:8080"}}
	rules := NATRules(s)
	svc := s.SVCChain()
	sep := func(i int) string { return s.SEPChain(s.Endpoints[i]) }
	var got []string
	for _, l := range strings.Split(rules, "\n") {
		if strings.HasPrefix(l, "-A "+svc) || strings.HasPrefix(l, "-A KUBE-SEP-") || strings.HasPrefix(l, "-A KUBE-SERVICES") {
			got = append(got, l)
		}
	}
	want := []string{
		`-A KUBE-SERVICES -m comment --comment "mcp/mcp-server:http cluster IP" -m tcp -p tcp -d 10.96.0.10/32 --dport 80 -j ` + svc,
		`-A ` + svc + ` -m comment --comment "mcp/mcp-server:http cluster IP" -m tcp -p tcp -d 10.96.0.10/32 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ`,
		`-A ` + svc + ` -m comment --comment "mcp/mcp-server:http -> 10.244.2.2:8080" -m recent --name ` + sep(0) + ` --rcheck --seconds 10800 --reap -j ` + sep(0),
		`-A ` + svc + ` -m comment --comment "mcp/mcp-server:http -> 10.244.2.6:8080" -m recent --name ` + sep(1) + ` --rcheck --seconds 10800 --reap -j ` + sep(1),
		`-A ` + svc + ` -m comment --comment "mcp/mcp-server:http -> 10.244.2.10:8080" -m recent --name ` + sep(2) + ` --rcheck --seconds 10800 --reap -j ` + sep(2),
		`-A ` + svc + ` -m comment --comment "mcp/mcp-server:http -> 10.244.2.2:8080" -m statistic --mode random --probability 0.3333333333 -j ` + sep(0),
		`-A ` + svc + ` -m comment --comment "mcp/mcp-server:http -> 10.244.2.6:8080" -m statistic --mode random --probability 0.5000000000 -j ` + sep(1),
		`-A ` + svc + ` -m comment --comment "mcp/mcp-server:http -> 10.244.2.10:8080" -j ` + sep(2),
		`-A ` + sep(0) + ` -m comment --comment mcp/mcp-server:http -s 10.244.2.2/32 -j KUBE-MARK-MASQ`,
		`-A ` + sep(0) + ` -m comment --comment mcp/mcp-server:http -m recent --name ` + sep(0) + ` --set -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080`,
		`-A ` + sep(1) + ` -m comment --comment mcp/mcp-server:http -s 10.244.2.6/32 -j KUBE-MARK-MASQ`,
		`-A ` + sep(1) + ` -m comment --comment mcp/mcp-server:http -m recent --name ` + sep(1) + ` --set -m tcp -p tcp -j DNAT --to-destination 10.244.2.6:8080`,
		`-A ` + sep(2) + ` -m comment --comment mcp/mcp-server:http -s 10.244.2.10/32 -j KUBE-MARK-MASQ`,
		`-A ` + sep(2) + ` -m comment --comment mcp/mcp-server:http -m recent --name ` + sep(2) + ` --set -m tcp -p tcp -j DNAT --to-destination 10.244.2.10:8080`,
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("rules (-got +want):\n%s\nall:\n%s", diff, rules)
	}
	if !strings.HasPrefix(rules, "*nat\n") || !strings.HasSuffix(rules, "COMMIT\n") {
		t.Error("not an iptables-restore table")
	}
	for i := range s.Endpoints {
		if !strings.Contains(rules, ":"+sep(i)+" - [0:0]") {
			t.Errorf("chain %s not declared", sep(i))
		}
	}
}

// Without affinity there is no recent match at all: every new connection
// (and only the first packet of one: conntrack keeps the rest) is a fresh
// random pick.
func TestNATRulesNone(t *testing.T) {
	s := Service{Namespace: "mcp", Name: "mcp-server", Protocol: "tcp", ClusterIP: "10.96.0.10", Port: 80,
		Affinity: AffinityNone, Endpoints: []string{"10.244.2.2:8080", "10.244.2.6:8080"}}
	rules := NATRules(s)
	if strings.Contains(rules, "recent") {
		t.Errorf("affinity None uses recent:\n%s", rules)
	}
	if !strings.Contains(rules, `--comment "mcp/mcp-server -> 10.244.2.2:8080" -m statistic --mode random --probability 0.5000000000`) {
		t.Errorf("missing the 1/2 pick:\n%s", rules)
	}
	if strings.Contains(rules, "KUBE-MARK-MASQ -m") || strings.Contains(rules, "! -s") {
		t.Errorf("masquerade rule without a cluster CIDR:\n%s", rules)
	}
}
