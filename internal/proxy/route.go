package proxy

// routeKind is the routing decision for one request: a value that is logged,
// traced and counted, so that every placement can be explained.
type routeKind uint8

const (
	// routeNew: an initialize without a session; the balancer picks among
	// endpoints that accept new sessions and the response creates a record.
	routeNew routeKind = iota
	// routeSticky: a request of a known session, sent to the session's backend.
	routeSticky
	// routeReinit: a known session whose backend is gone or has forgotten it;
	// the session was re-initialized on another backend first.
	routeReinit
	// routeStateless: no session and not initialize (health checks,
	// stateless servers, MCP 2026-07-28 requests); picked per request.
	routeStateless
)

var routeNames = [...]string{"new", "sticky", "reinit", "stateless"}

func (r routeKind) String() string { return routeNames[r] }

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
