package proxy

// HashSessionID is how a session id appears in tether's traces and logs: a
// short digest, since a session id is a bearer credential on many servers.
// The admin endpoints show it next to the raw id so that an operator can go
// from `tether explain` to the session's spans and log lines.
func HashSessionID(sid string) string { return hashSessionID(sid) }
