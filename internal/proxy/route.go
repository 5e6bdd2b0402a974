package proxy

// Route is the routing decision for one request: a value that is logged,
// traced and counted, so that every placement can be explained.
type Route uint8

const (
	// RouteNew: an initialize without a session; the balancer picks among
	// endpoints that accept new sessions and the response creates a record.
	RouteNew Route = iota
	// RouteSticky: a request of a known session, sent to the session's backend.
	RouteSticky
	// RouteReinit: a known session whose backend is gone or has forgotten it;
	// the session was re-initialized on another backend first.
	RouteReinit
	// RouteStateless: no session and not initialize (health checks,
	// stateless servers, MCP 2026-07-28 requests); picked per request.
	RouteStateless
)

var routeNames = [...]string{"new", "sticky", "reinit", "stateless"}

func (r Route) String() string { return routeNames[r] }

// Reasons for a re-initialization.
const (
	reasonGone    = "backend_gone"    // the record's backend is no longer an endpoint
	reasonEjected = "backend_ejected" // passive health ejected the backend
	reasonDial    = "dial_failed"     // a dial to the backend failed for this request
	reasonLost    = "session_lost"    // the backend answered 404 for the session
	// reasonIDTaken is not a re-initialization: a new session's id was
	// already held by a live session, and its initialize is sent elsewhere.
	reasonIDTaken = "session_id_taken"
)
