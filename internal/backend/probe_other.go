//go:build !linux

package backend

import "net"

// stateProbe is a no-op off Linux: connections are used as they are, and a
// request written into a connection its backend has just closed fails as
// it would without tether (502).
type stateProbe struct{}

func (p *stateProbe) init(net.Conn) bool { return false }

func (p *stateProbe) peerGone() bool { return false }
