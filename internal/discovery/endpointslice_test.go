package discovery

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Builders for slices written as data.

func ptr[T any](v T) *T { return &v }

type conds struct{ ready, serving, terminating *bool }

var (
	yes, no = ptr(true), ptr(false)

	condNil         = conds{}
	condReady       = conds{ready: yes, serving: yes, terminating: no}
	condNotReady    = conds{ready: no, serving: no, terminating: no}
	condTerminating = conds{ready: no, serving: yes, terminating: yes} // serving and terminating: fenced
	condGone        = conds{ready: no, serving: no, terminating: yes}  // terminating, no longer serving
)

type ep struct {
	addr string
	uid  string // "" = no targetRef
	c    conds
}

func ips(addrs ...string) []ep {
	var out []ep
	for _, a := range addrs {
		out = append(out, ep{addr: a, uid: "uid-" + a, c: condNil})
	}
	return out
}

func port(name string, n int32) EndpointPort {
	p := EndpointPort{Port: ptr(n), Protocol: ptr(ProtocolTCP)}
	if name != "" {
		p.Name = ptr(name)
	}
	return p
}

func slice(name string, at string, ports []EndpointPort, eps ...ep) *EndpointSlice {
	s := &EndpointSlice{
		ObjectMeta: ObjectMeta{
			Name:      name,
			Namespace: "mcp",
			Labels:    map[string]string{LabelServiceName: "everything"},
		},
		AddressType: at,
		Ports:       ports,
	}
	for _, e := range eps {
		d := SliceEndpoint{
			Addresses:  []string{e.addr},
			Conditions: EndpointConditions{Ready: e.c.ready, Serving: e.c.serving, Terminating: e.c.terminating},
		}
		if e.uid != "" {
			d.TargetRef = &ObjectReference{Kind: "Pod", Namespace: "mcp", Name: "pod-" + e.addr, UID: e.uid}
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	return s
}

func v4(name string, ports []EndpointPort, eps ...ep) *EndpointSlice {
	return slice(name, AddressTypeIPv4, ports, eps...)
}

var mcpPort = []EndpointPort{port("mcp", 8080)}

// want describes an expected endpoint as "ID URL state".
func summarize(s Snapshot) []string {
	out := []string{}
	for _, e := range s.Endpoints {
		out = append(out, e.ID+" "+e.URL.String()+" "+e.State.String())
	}
	return out
}

func TestMergeSlices(t *testing.T) {
	tests := []struct {
		name         string
		slices       []*EndpointSlice
		port         PortSelector
		want         []string
		wantProblems []string // substrings, one per problem
	}{
		{
			name:   "no slices",
			slices: nil,
			want:   []string{},
		},
		{
			name:   "one slice, the only port, nil conditions are ready",
			slices: []*EndpointSlice{v4("a", mcpPort, ips("10.0.0.2", "10.0.0.1")...)},
			want: []string{
				"uid-10.0.0.1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"uid-10.0.0.2/10.0.0.2:8080 http://10.0.0.2:8080 ready",
			},
		},
		{
			name: "several slices merge",
			slices: []*EndpointSlice{
				v4("b", mcpPort, ips("10.0.0.3")...),
				v4("a", mcpPort, ips("10.0.0.1", "10.0.0.2")...),
				v4("c", mcpPort), // empty slice: no endpoints, no problem
			},
			want: []string{
				"uid-10.0.0.1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"uid-10.0.0.2/10.0.0.2:8080 http://10.0.0.2:8080 ready",
				"uid-10.0.0.3/10.0.0.3:8080 http://10.0.0.3:8080 ready",
			},
		},
		{
			name: "conditions",
			slices: []*EndpointSlice{v4("a", mcpPort,
				ep{"10.0.0.1", "u1", condReady},
				ep{"10.0.0.2", "u2", condNotReady},
				ep{"10.0.0.3", "u3", condTerminating},
				ep{"10.0.0.4", "u4", condGone},
				ep{"10.0.0.5", "u5", conds{ready: yes, terminating: yes}},             // ready wins, whatever else
				ep{"10.0.0.6", "u6", conds{ready: no, terminating: yes}},              // serving nil = true: fenced
				ep{"10.0.0.7", "u7", conds{ready: no, serving: yes}},                  // serving, not terminating: out
				ep{"10.0.0.8", "u8", conds{ready: no, serving: yes, terminating: no}}, // the same, explicit
			)},
			want: []string{
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"u3/10.0.0.3:8080 http://10.0.0.3:8080 fenced",
				"u5/10.0.0.5:8080 http://10.0.0.5:8080 ready",
				"u6/10.0.0.6:8080 http://10.0.0.6:8080 fenced",
			},
		},
		{
			name: "duplicate address across slices: one endpoint",
			slices: []*EndpointSlice{
				v4("a", mcpPort, ep{"10.0.0.1", "u1", condReady}),
				v4("b", mcpPort, ep{"10.0.0.1", "u1", condReady}, ep{"10.0.0.2", "u2", condReady}),
			},
			want: []string{
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready",
			},
		},
		{
			name: "duplicate address: the best state wins, whichever slice has it",
			slices: []*EndpointSlice{
				v4("a", mcpPort, ep{"10.0.0.1", "u1", condNotReady}, ep{"10.0.0.2", "u2", condReady}),
				v4("b", mcpPort, ep{"10.0.0.1", "u1", condTerminating}, ep{"10.0.0.2", "u2", condGone}),
			},
			want: []string{
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 fenced",
				"u2/10.0.0.2:8080 http://10.0.0.2:8080 ready",
			},
		},
		{
			name: "duplicate address with equal state: the first slice by name wins",
			slices: []*EndpointSlice{
				v4("b", mcpPort, ep{"10.0.0.1", "new-pod", condReady}),
				v4("a", mcpPort, ep{"10.0.0.1", "old-pod", condReady}),
			},
			want: []string{"old-pod/10.0.0.1:8080 http://10.0.0.1:8080 ready"},
		},
		{
			name: "IP reused by a new pod: the old pod's endpoint is not ready any more, the new one is",
			slices: []*EndpointSlice{
				v4("a", mcpPort, ep{"10.0.0.1", "old-pod", condGone}),
				v4("b", mcpPort, ep{"10.0.0.1", "new-pod", condReady}),
			},
			want: []string{"new-pod/10.0.0.1:8080 http://10.0.0.1:8080 ready"},
		},
		{
			name:   "no targetRef: the ID is the address",
			slices: []*EndpointSlice{v4("a", mcpPort, ep{"10.0.0.1", "", condReady})},
			want:   []string{"10.0.0.1:8080 http://10.0.0.1:8080 ready"},
		},
		{
			name: "IPv6 and IPv4 slices of a dual-stack Service",
			slices: []*EndpointSlice{
				slice("v6", AddressTypeIPv6, mcpPort, ep{"fd00:10:244::0b", "u1", condReady}, ep{"fd00:10:244::c", "u2", condTerminating}),
				v4("v4", mcpPort, ep{"10.0.0.1", "u1", condReady}),
			},
			want: []string{
				"u1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"u1/[fd00:10:244::b]:8080 http://[fd00:10:244::b]:8080 ready",
				"u2/[fd00:10:244::c]:8080 http://[fd00:10:244::c]:8080 fenced",
			},
		},
		{
			name: "FQDN slices and bad addresses are skipped with a problem",
			slices: []*EndpointSlice{
				slice("f", AddressTypeFQDN, mcpPort, ep{"mcp.example.com", "u1", condReady}),
				v4("a", mcpPort, ep{"10.0.0.1", "u2", condReady}, ep{"fd00::1", "u3", condReady}, ep{"not-an-ip", "u4", condReady}),
			},
			want: []string{"u2/10.0.0.1:8080 http://10.0.0.1:8080 ready"},
			wantProblems: []string{
				`slice a: address "fd00::1" is not an IPv4 address`,
				`slice a: address "not-an-ip" is not an IPv4 address`,
				"slice f: address type FQDN is not supported",
			},
		},
		{
			name: "port by name, resolved per slice",
			slices: []*EndpointSlice{
				v4("a", []EndpointPort{port("metrics", 9090), port("mcp", 8080)}, ips("10.0.0.1")...),
				v4("b", []EndpointPort{port("mcp", 3000), port("metrics", 9090)}, ips("10.0.0.2")...),
			},
			port: PortSelector{Name: "mcp"},
			want: []string{
				"uid-10.0.0.1/10.0.0.1:8080 http://10.0.0.1:8080 ready",
				"uid-10.0.0.2/10.0.0.2:3000 http://10.0.0.2:3000 ready",
			},
		},
		{
			name: "port by number",
			slices: []*EndpointSlice{
				v4("a", []EndpointPort{port("metrics", 9090), port("mcp", 8080)}, ips("10.0.0.1")...),
				v4("b", []EndpointPort{port("mcp", 3000), port("metrics", 9090)}, ips("10.0.0.2")...),
			},
			port: PortSelector{Number: 9090},
			want: []string{
				"uid-10.0.0.1/10.0.0.1:9090 http://10.0.0.1:9090 ready",
				"uid-10.0.0.2/10.0.0.2:9090 http://10.0.0.2:9090 ready",
			},
		},
		{
			name:         "no port of that name",
			slices:       []*EndpointSlice{v4("a", mcpPort, ips("10.0.0.1")...)},
			port:         PortSelector{Name: "http"},
			want:         []string{},
			wantProblems: []string{`slice a: no TCP port named "http": its TCP ports are mcp=8080`},
		},
		{
			name:         "no port of that number",
			slices:       []*EndpointSlice{v4("a", mcpPort, ips("10.0.0.1")...)},
			port:         PortSelector{Number: 80},
			want:         []string{},
			wantProblems: []string{"slice a: no TCP port 80: its TCP ports are mcp=8080"},
		},
		{
			name: "default with two TCP ports is ambiguous: nothing from that slice",
			slices: []*EndpointSlice{
				v4("a", []EndpointPort{port("mcp", 8080), port("metrics", 9090)}, ips("10.0.0.1")...),
				v4("b", mcpPort, ips("10.0.0.2")...),
			},
			want:         []string{"uid-10.0.0.2/10.0.0.2:8080 http://10.0.0.2:8080 ready"},
			wantProblems: []string{"slice a: more than one TCP port and no port selected to choose one: its TCP ports are mcp=8080, metrics=9090"},
		},
		{
			name: "default ignores UDP ports and ports without a number; nil protocol is TCP; unnamed port",
			slices: []*EndpointSlice{
				v4("a", []EndpointPort{
					{Name: ptr("dns"), Port: ptr(int32(53)), Protocol: ptr("UDP")},
					{Name: ptr("all")},
					{Port: ptr(int32(8080))},
				}, ips("10.0.0.1")...),
			},
			want: []string{"uid-10.0.0.1/10.0.0.1:8080 http://10.0.0.1:8080 ready"},
		},
		{
			name: "port numbers outside 1..65535 cannot be dialled",
			slices: []*EndpointSlice{v4("a", []EndpointPort{
				{Name: ptr("zero"), Port: ptr(int32(0))},
				{Name: ptr("big"), Port: ptr(int32(70000))},
			}, ips("10.0.0.1")...)},
			want:         []string{},
			wantProblems: []string{"slice a: it has no TCP port"},
		},
		{
			name:         "slice without ports",
			slices:       []*EndpointSlice{v4("a", nil, ips("10.0.0.1")...)},
			want:         []string{},
			wantProblems: []string{"slice a: it has no TCP port"},
		},
		{
			name: "appProtocol https selects the https scheme",
			slices: []*EndpointSlice{v4("a", []EndpointPort{
				{Name: ptr("mcps"), Port: ptr(int32(8443)), AppProtocol: ptr("https")},
			}, ips("10.0.0.1")...)},
			want: []string{"uid-10.0.0.1/10.0.0.1:8443 https://10.0.0.1:8443 ready"},
		},
		{
			name: "endpoint without addresses and nil slices are ignored",
			slices: []*EndpointSlice{
				nil,
				{ObjectMeta: ObjectMeta{Name: "a"}, AddressType: AddressTypeIPv4, Ports: mcpPort,
					Endpoints: []SliceEndpoint{{Addresses: nil}}},
			},
			want: []string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mergeSlices(tt.slices, tt.port)
			if diff := cmp.Diff(summarize(m.Snapshot), tt.want); diff != "" {
				t.Errorf("endpoints (-got +want):\n%s", diff)
			}
			if len(m.Problems) != len(tt.wantProblems) {
				t.Fatalf("problems %q, want %d: %q", m.Problems, len(tt.wantProblems), tt.wantProblems)
			}
			for i, p := range tt.wantProblems {
				if !strings.Contains(m.Problems[i], p) {
					t.Errorf("problem %d: %q, want it to contain %q", i, m.Problems[i], p)
				}
			}
			// The merge does not depend on the order of its input.
			rev := slices.Clone(tt.slices)
			slices.Reverse(rev)
			if diff := cmp.Diff(summarize(mergeSlices(rev, tt.port).Snapshot), tt.want); diff != "" {
				t.Errorf("reversed input: endpoints (-got +want):\n%s", diff)
			}
		})
	}
}

// The pod names ride along, on each endpoint (for the pod deletion cost
// writer) and by ID (for log lines).
func TestMergeSlicesPods(t *testing.T) {
	m := mergeSlices([]*EndpointSlice{v4("a", mcpPort, ep{"10.0.0.1", "u1", condReady}, ep{"10.0.0.2", "", condReady})}, PortSelector{})
	want := map[string]string{"u1/10.0.0.1:8080": "mcp/pod-10.0.0.1"}
	if diff := cmp.Diff(m.Pods, want); diff != "" {
		t.Errorf("pods (-got +want):\n%s", diff)
	}
	got := map[string]string{}
	for _, e := range m.Snapshot.Endpoints {
		got[e.ID] = e.Pod
	}
	want["10.0.0.2:8080"] = "" // no targetRef: no pod
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("Endpoint.Pod by ID (-got +want):\n%s", diff)
	}
}

func TestParsePortSelector(t *testing.T) {
	tests := []struct {
		in      string
		want    PortSelector
		wantErr bool
	}{
		{"", PortSelector{}, false},
		{"http", PortSelector{Name: "http"}, false},
		{"mcp-2", PortSelector{Name: "mcp-2"}, false},
		{"8080", PortSelector{Number: 8080}, false},
		{"65535", PortSelector{Number: 65535}, false},
		{"0", PortSelector{}, true},
		{"65536", PortSelector{}, true},
		{"80a", PortSelector{}, true},
		{"-1", PortSelector{}, true},
		{"HTTP", PortSelector{}, true},
		{"a_b", PortSelector{}, true},
		{strings.Repeat("a", 64), PortSelector{}, true},
	}
	for _, tt := range tests {
		got, err := ParsePortSelector(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParsePortSelector(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseServiceRef(t *testing.T) {
	tests := []struct {
		in      string
		want    ServiceRef
		wantErr bool
	}{
		{"mcp/everything", ServiceRef{"mcp", "everything"}, false},
		{"default/a-1", ServiceRef{"default", "a-1"}, false},
		{"everything", ServiceRef{}, true},
		{"/everything", ServiceRef{}, true},
		{"mcp/", ServiceRef{}, true},
		{"a/b/c", ServiceRef{}, true},
		{"Mcp/x", ServiceRef{}, true},
		{"mcp/x.y", ServiceRef{}, true},
	}
	for _, tt := range tests {
		got, err := ParseServiceRef(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseServiceRef(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestDiffSnapshots(t *testing.T) {
	mk := func(specs ...string) Snapshot {
		var s Snapshot
		for _, spec := range specs { // "ID URL state"
			f := strings.Fields(spec)
			u, _ := url.Parse(f[1])
			st := Ready
			if f[2] == "fenced" {
				st = Fenced
			}
			s.Endpoints = append(s.Endpoints, Endpoint{ID: f[0], URL: u, State: st})
		}
		return s
	}
	old := mk("a http://a ready", "b http://b ready", "c http://c ready", "d http://d ready")
	new := mk("b http://b fenced", "c http://c2 ready", "d http://d ready", "e http://e ready")
	want := []change{
		{Kind: removed, ID: "a", URL: "http://a", From: Ready},
		{Kind: stateChanged, ID: "b", URL: "http://b", From: Ready, To: Fenced},
		{Kind: removed, ID: "c", URL: "http://c", From: Ready},
		{Kind: added, ID: "c", URL: "http://c2", To: Ready},
		{Kind: added, ID: "e", URL: "http://e", To: Ready},
	}
	if diff := cmp.Diff(diffSnapshots(old, new), want); diff != "" {
		t.Errorf("changes (-got +want):\n%s", diff)
	}
	if got := diffSnapshots(new, new); len(got) != 0 {
		t.Errorf("no change: got %v", got)
	}
	if got := diffSnapshots(Snapshot{}, old); len(got) != 4 {
		t.Errorf("from empty: got %v, want 4 additions", got)
	}
}
