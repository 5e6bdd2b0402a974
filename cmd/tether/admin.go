package main

// The admin listener's debug endpoints, which `tether explain` and
// `tether status` read. They answer from this replica's view: its balancer,
// its decision log, and the session store (shared with the fleet when it is
// Redis). The admin listener is bound to loopback by default, so a session
// is looked up by its raw id, the one the operator typed.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// adminLookupTimeout bounds a debug request's session store read.
const adminLookupTimeout = 2 * time.Second

// endpointView is one backend as the debug endpoints show it.
type endpointView struct {
	ID       string `json:"id"`
	URL      string `json:"url"`
	State    string `json:"state"` // ready, fenced, ejected; gone when no longer an endpoint
	Sessions int64  `json:"sessions"`
	Inflight int64  `json:"inflight"`
}

// storeView is the session store's state.
type storeView struct {
	Kind     string `json:"kind"` // memory or redis
	Degraded bool   `json:"degraded"`
	// Pending records were created while Redis was unreachable and wait to
	// be written; Unwritten ones could not even be kept.
	Pending   int   `json:"pending"`
	Unwritten int64 `json:"unwritten"`
}

// endpointsView is GET /debug/endpoints.
type endpointsView struct {
	Balancer  string         `json:"balancer"`
	Ready     bool           `json:"ready"`
	Store     storeView      `json:"store"`
	Endpoints []endpointView `json:"endpoints"`
}

// recordView is a session record without its secrets: the initialize body
// is shown by size only, the backend's session id by digest only.
type recordView struct {
	ID                   string    `json:"id"`
	IDHash               string    `json:"id_hash"` // as in traces and logs (mcp.session.id)
	BackendID            string    `json:"backend_id"`
	BackendURL           string    `json:"backend_url"`
	BackendSessionIDHash string    `json:"backend_session_id_hash"`
	InitializeBytes      int       `json:"initialize_bytes"`
	ProtocolVersion      string    `json:"protocol_version,omitempty"`
	Created              time.Time `json:"created"`
	LastUsed             time.Time `json:"last_used"`
	Reinits              uint32    `json:"reinits"`
	Version              uint64    `json:"version"`
}

// sessionView is GET /debug/sessions/{id}.
type sessionView struct {
	Session recordView   `json:"session"`
	Backend endpointView `json:"backend"`
	// History is what this replica decided for the session; nil when it has
	// routed none of its requests (another replica placed it, or this one
	// restarted since).
	History *proxy.SessionHistory `json:"history"`
	// Now is the replica's clock, so that "ago" is computed on one clock.
	Now time.Time `json:"now"`
}

type adminError struct {
	Error string `json:"error"`
}

// debugSession serves GET /debug/sessions/{id}.
func (s *server) debugSession(w http.ResponseWriter, r *http.Request) {
	sid := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), adminLookupTimeout)
	defer cancel()
	rec, err := s.store.Get(ctx, sid)
	switch {
	case errors.Is(err, session.ErrNotFound):
		writeAdminJSON(w, http.StatusNotFound, adminError{"session not found"})
		return
	case err != nil:
		writeAdminJSON(w, http.StatusServiceUnavailable, adminError{"session store: " + err.Error()})
		return
	}
	v := sessionView{
		Session: recordView{
			ID:                   rec.ClientSID,
			IDHash:               session.HashID(rec.ClientSID),
			BackendID:            rec.BackendID,
			BackendURL:           rec.BackendURL,
			BackendSessionIDHash: session.HashID(rec.BackendSID),
			InitializeBytes:      len(rec.Init),
			ProtocolVersion:      protocolVersion(rec),
			Created:              rec.Created,
			LastUsed:             rec.LastUsed,
			Reinits:              rec.Reinits,
			Version:              rec.Version,
		},
		Backend: endpointView{ID: rec.BackendID, URL: rec.BackendURL, State: "gone"},
		Now:     time.Now(),
	}
	for _, e := range s.endpointStats() {
		if e.ID == rec.BackendID {
			v.Backend = endpointView(e)
			break
		}
	}
	if h, ok := s.proxy.History(sid); ok {
		v.History = &h
	}
	writeAdminJSON(w, http.StatusOK, v)
}

// protocolVersion is the MCP version the session's client asked for: the
// header of its initialize request, else the initialize's
// params.protocolVersion. Only that field of the body is read.
func protocolVersion(rec *session.Record) string {
	if rec.ProtocolVersion != "" {
		return rec.ProtocolVersion
	}
	var init struct {
		Params struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"params"`
	}
	if json.Unmarshal(rec.Init, &init) != nil {
		return ""
	}
	return init.Params.ProtocolVersion
}

// debugEndpoints serves GET /debug/endpoints.
func (s *server) debugEndpoints(w http.ResponseWriter, r *http.Request) {
	stats := s.endpointStats()
	v := endpointsView{
		Balancer:  s.cfg.Balancer,
		Ready:     s.ready.Load(),
		Store:     storeView{Kind: storeName(s.cfg)},
		Endpoints: make([]endpointView, len(stats)),
	}
	for i, e := range stats {
		v.Endpoints[i] = endpointView(e)
	}
	if c, ok := s.store.(*session.Cache); ok {
		st := c.Stats()
		v.Store.Degraded, v.Store.Pending, v.Store.Unwritten = st.Degraded, st.Pending, st.Unwritten
	}
	writeAdminJSON(w, http.StatusOK, v)
}

// The debug endpoints show the metrics' view of each endpoint, so that one
// place (endpointStats) decides what "ejected" means; this conversion stops
// the build if the two types drift apart.
var _ = endpointView(telemetry.EndpointStat{})

func writeAdminJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
