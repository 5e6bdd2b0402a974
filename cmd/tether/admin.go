package main

import "github.com/tether-mcp/tether/internal/server"

// The admin listener's debug views, as `tether explain` and `tether status`
// read them (served by internal/server).
type (
	endpointView  = server.EndpointView
	endpointsView = server.EndpointsView
	drainView     = server.DrainView
	sessionView   = server.SessionView
	taskView      = server.TaskView
	adminError    = server.AdminError
)
