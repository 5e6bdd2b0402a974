// Package e2e holds end-to-end tests that run the tether binary against real
// peers: a real kube-apiserver (internal/kubetest) and real go-sdk MCP
// servers (internal/mcpbackend). It has no code of its own.
package e2e
