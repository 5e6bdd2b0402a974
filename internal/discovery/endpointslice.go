package discovery

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// This file is the pure half of the Kubernetes source: EndpointSlices in,
// a Snapshot out. No client, no watch, no clock; tested as data.

// ServiceRef names a Service: NAMESPACE/NAME.
type ServiceRef struct {
	Namespace, Name string
}

func (r ServiceRef) String() string { return r.Namespace + "/" + r.Name }

// dnsLabel is RFC 1123's label (namespaces, Service names and Service port
// names are all DNS labels).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func isDNSLabel(s string) bool { return len(s) <= 63 && dnsLabel.MatchString(s) }

// ParseServiceRef parses NAMESPACE/NAME, both DNS labels. Its errors start
// with the quoted value, so that a caller can put the setting's name before
// them.
func ParseServiceRef(s string) (ServiceRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || strings.Contains(name, "/") {
		return ServiceRef{}, fmt.Errorf("%q: want NAMESPACE/NAME", s)
	}
	if !isDNSLabel(ns) {
		return ServiceRef{}, fmt.Errorf("%q: namespace %q is not a DNS label (lowercase letters, digits and '-', at most 63)", s, ns)
	}
	if !isDNSLabel(name) {
		return ServiceRef{}, fmt.Errorf("%q: name %q is not a DNS label (lowercase letters, digits and '-', at most 63)", s, name)
	}
	return ServiceRef{Namespace: ns, Name: name}, nil
}

// PortSelector chooses the port of an EndpointSlice. The zero
// value means "the slice's only TCP port".
//
// EndpointSlice ports are the pods' (target) ports: Name is the Service
// port's name, Number the port the pod listens on. A named selector is
// resolved per slice, because pods behind one named Service port may listen
// on different numbers (the controller then writes one slice per mapping).
type PortSelector struct {
	Name   string
	Number int32
}

// ParsePortSelector parses a number 1..65535, a Service port name (DNS
// label), or "" for the default. Its errors start with the quoted value,
// like ParseServiceRef's.
func ParsePortSelector(s string) (PortSelector, error) {
	if s == "" {
		return PortSelector{}, nil
	}
	if s[0] >= '0' && s[0] <= '9' {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			return PortSelector{}, fmt.Errorf("%q: want a port number 1..65535 or a port name", s)
		}
		return PortSelector{Number: int32(n)}, nil
	}
	if !isDNSLabel(s) {
		return PortSelector{}, fmt.Errorf("%q: a port name is a DNS label (lowercase letters, digits and '-', at most 63)", s)
	}
	return PortSelector{Name: s}, nil
}

func (p PortSelector) String() string {
	switch {
	case p.Name != "":
		return p.Name
	case p.Number != 0:
		return strconv.Itoa(int(p.Number))
	}
	return "(the only TCP port)"
}

// choosePort resolves the selector against one slice's ports. Only TCP ports
// with a number count (nil protocol means TCP; a nil port number means "all
// ports" and cannot be dialled; a number outside 1..65535, which the API
// server would not accept, cannot be either).
func (p PortSelector) choosePort(ports []EndpointPort) (port EndpointPort, err error) {
	var tcp []EndpointPort
	for _, pt := range ports {
		if pt.Port != nil && *pt.Port >= 1 && *pt.Port <= 65535 && (pt.Protocol == nil || *pt.Protocol == ProtocolTCP) {
			tcp = append(tcp, pt)
		}
	}
	describe := func() string {
		if len(tcp) == 0 {
			return "it has no TCP port"
		}
		var s []string
		for _, pt := range tcp {
			if name := deref(pt.Name); name != "" {
				s = append(s, fmt.Sprintf("%s=%d", name, *pt.Port))
			} else {
				s = append(s, strconv.Itoa(int(*pt.Port)))
			}
		}
		return "its TCP ports are " + strings.Join(s, ", ")
	}
	switch {
	case p.Name != "":
		for _, pt := range tcp {
			if deref(pt.Name) == p.Name {
				return pt, nil
			}
		}
		return port, fmt.Errorf("no TCP port named %q: %s", p.Name, describe())
	case p.Number != 0:
		for _, pt := range tcp {
			if *pt.Port == p.Number {
				return pt, nil
			}
		}
		return port, fmt.Errorf("no TCP port %d: %s", p.Number, describe())
	case len(tcp) == 1:
		return tcp[0], nil
	case len(tcp) == 0:
		return port, fmt.Errorf("%s", describe())
	}
	return port, fmt.Errorf("more than one TCP port and no port selected to choose one: %s", describe())
}

// merged is the result of merging a Service's EndpointSlices.
type merged struct {
	// Snapshot holds the endpoints that are Ready or Fenced, sorted by ID.
	Snapshot Snapshot
	// Pods maps endpoint IDs to "namespace/name" of their pod (targetRef,
	// also each Endpoint's Pod), for log lines about endpoints that left;
	// endpoints without a targetRef are absent.
	Pods map[string]string
	// Problems are the reasons slices or endpoints were left out (an
	// unresolvable port, an unsupported address type, a bad address), one
	// line each, sorted. They are logged, not fatal: the other slices still
	// count.
	Problems []string
}

// mergeSlices turns all EndpointSlices of one Service into a Snapshot
// (docs/design.md#endpoints-and-their-states), the way kube-proxy's
// endpointslicecache does:
//
//   - every slice counts; FQDN slices are skipped (tether dials IPs);
//   - the port is chosen per slice by sel;
//   - an endpoint's address is its first address (the API says the
//     addresses are fungible and consumers may use the first); IPv6 hosts
//     are bracketed in the URL;
//   - conditions follow the API's nil rules: ready = nil or true, serving =
//     nil or true, terminating = set and true. Ready → Ready; serving and
//     terminating → Fenced; anything else is left out (its sessions
//     re-initialize);
//   - duplicates of an address (host:port) across slices collapse to one:
//     the best state wins (Ready over Fenced over left out), ties go to the
//     slice whose name sorts first, so the result does not depend on the
//     order of the input;
//   - the ID is targetRef.uid + "/" + host:port ("3f1c.../10.0.0.7:8080"),
//     or host:port alone without a targetRef: an address reused by a new pod
//     is a new endpoint; Pod is the targetRef's "namespace/name" (the
//     slice's namespace when the reference has none).
func mergeSlices(in []*EndpointSlice, sel PortSelector) merged {
	sorted := slices.DeleteFunc(slices.Clone(in), func(s *EndpointSlice) bool { return s == nil })
	slices.SortFunc(sorted, func(a, b *EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })

	type candidate struct {
		ep   Endpoint
		rank int // 2 Ready, 1 Fenced, 0 left out
		pod  string
	}
	best := map[string]candidate{} // by host:port
	problems := map[string]bool{}
	for _, s := range sorted {
		if len(s.Endpoints) == 0 {
			continue
		}
		if s.AddressType != AddressTypeIPv4 && s.AddressType != AddressTypeIPv6 {
			problems[fmt.Sprintf("slice %s: address type %s is not supported (IPv4 and IPv6 are)", s.Name, s.AddressType)] = true
			continue
		}
		port, err := sel.choosePort(s.Ports)
		if err != nil {
			problems[fmt.Sprintf("slice %s: %v", s.Name, err)] = true
			continue
		}
		scheme := "http"
		if deref(port.AppProtocol) == "https" {
			scheme = "https"
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			ip, err := netip.ParseAddr(e.Addresses[0])
			if err != nil || ip.Zone() != "" || ip.Is4() != (s.AddressType == AddressTypeIPv4) {
				problems[fmt.Sprintf("slice %s: address %q is not an %s address", s.Name, e.Addresses[0], s.AddressType)] = true
				continue
			}
			hostPort := net.JoinHostPort(ip.String(), strconv.Itoa(int(*port.Port)))
			c := candidate{rank: rankOf(e.Conditions)}
			c.ep = Endpoint{
				ID:    hostPort,
				URL:   &url.URL{Scheme: scheme, Host: hostPort},
				State: Ready,
			}
			if c.rank == 1 {
				c.ep.State = Fenced
			}
			if ref := e.TargetRef; ref != nil && ref.UID != "" {
				c.ep.ID = ref.UID + "/" + hostPort
				if ref.Name != "" {
					c.pod = cmp.Or(ref.Namespace, s.Namespace) + "/" + ref.Name
					c.ep.Pod = c.pod
				}
			}
			// Slices are visited in name order: the first of equal rank stays.
			if old, ok := best[hostPort]; !ok || c.rank > old.rank {
				best[hostPort] = c
			}
		}
	}

	m := merged{Snapshot: Snapshot{Endpoints: []Endpoint{}}, Pods: map[string]string{}}
	for _, c := range best {
		if c.rank == 0 {
			continue
		}
		m.Snapshot.Endpoints = append(m.Snapshot.Endpoints, c.ep)
		if c.pod != "" {
			m.Pods[c.ep.ID] = c.pod
		}
	}
	slices.SortFunc(m.Snapshot.Endpoints, func(a, b Endpoint) int { return cmp.Compare(a.ID, b.ID) })
	for p := range problems {
		m.Problems = append(m.Problems, p)
	}
	slices.Sort(m.Problems)
	return m
}

// rankOf applies the API's nil rules: 2 Ready, 1 Fenced, 0 left out.
func rankOf(c EndpointConditions) int {
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case ready:
		return 2
	case serving && terminating:
		return 1
	}
	return 0
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
