package server

// The admin listener: probes, /metrics, and the debug endpoints which
// `tether explain` and `tether status` read. They answer from this replica's view: its balancer,
// its decision log, and the session store (shared with the fleet when it is
// Redis). The admin listener is bound to loopback by default, so a session
// is looked up by its raw id, the one the operator typed.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tether-mcp/tether/internal/proxy"
	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// adminLookupTimeout bounds a debug request's session store read.
const adminLookupTimeout = 2 * time.Second

// EndpointView is one backend as the debug endpoints show it.
type EndpointView struct {
	ID       string `json:"id"`
	URL      string `json:"url"`
	State    string `json:"state"` // ready, fenced, ejected; gone when no longer an endpoint
	Sessions int64  `json:"sessions"`
	Inflight int64  `json:"inflight"`
	// ListenStreams are the open subscriptions/listen streams (MCP 2026-07-28).
	ListenStreams int64 `json:"listen_streams"`
	// Draining: tether moves the endpoint's sessions elsewhere; Drain says
	// since when, why, and how far this replica got.
	Draining bool              `json:"draining"`
	Drain    *proxy.DrainState `json:"drain,omitempty"`
}

// storeView is the session store's state.
type storeView struct {
	Kind     string `json:"kind"` // memory or redis
	Degraded bool   `json:"degraded"`
	// Pending records were created while Redis was unreachable and wait to
	// be written; Unwritten ones could not even be kept.
	Pending   int   `json:"pending"`
	Unwritten int64 `json:"unwritten"`
	// Redis only: the deployment (single, sentinel, cluster), the
	// primaries tether talks to, and the failovers it saw.
	Topology  string   `json:"topology,omitempty"`
	Primaries []string `json:"primaries,omitempty"`
	Failovers int64    `json:"failovers,omitempty"`
}

// EndpointsView is GET /debug/endpoints.
type EndpointsView struct {
	// Now is the replica's clock, so that "ago" is computed on one clock.
	Now       time.Time      `json:"now"`
	Balancer  string         `json:"balancer"`
	Ready     bool           `json:"ready"`
	Store     storeView      `json:"store"`
	Endpoints []EndpointView `json:"endpoints"`
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

// SessionView is GET /debug/sessions/{id}.
type SessionView struct {
	Session recordView   `json:"session"`
	Backend EndpointView `json:"backend"`
	// History is what this replica decided for the session; nil when it has
	// routed none of its requests (another replica placed it, or this one
	// restarted since).
	History *proxy.SessionHistory `json:"history"`
	// Now is the replica's clock, so that "ago" is computed on one clock.
	Now time.Time `json:"now"`
}

// AdminError is the body of a debug endpoint's error answer.
type AdminError struct {
	Error string `json:"error"`
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", s.metrics.Handler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	// For `tether explain` and `tether status`.
	// The admin listener may be reachable from the pod network (kubelet
	// probes cannot reach loopback); /debug stays local: kubectl exec and
	// port-forward arrive on loopback.
	mux.Handle("GET /debug/sessions/{id}", loopbackOnly(http.HandlerFunc(s.debugSession)))
	mux.Handle("GET /debug/endpoints", loopbackOnly(http.HandlerFunc(s.debugEndpoints)))
	mux.Handle("GET /debug/tasks/{id}", loopbackOnly(http.HandlerFunc(s.debugTask)))
	// `tether drain`: an operator drains a backend, or undoes it.
	mux.Handle("POST /drain", loopbackOnly(http.HandlerFunc(s.setDrain)))
	mux.Handle("DELETE /drain", loopbackOnly(http.HandlerFunc(s.setDrain)))
	return mux
}

// loopbackOnly refuses requests that do not come from a loopback address.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "/debug is served to loopback clients only", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// debugSession serves GET /debug/sessions/{id}.
func (s *Server) debugSession(w http.ResponseWriter, r *http.Request) {
	sid := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), adminLookupTimeout)
	defer cancel()
	rec, err := s.store.Get(ctx, sid)
	if lookupFailed(w, err, "session") {
		return
	}
	v := SessionView{
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
		Backend: EndpointView{ID: rec.BackendID, URL: rec.BackendURL, State: "gone"},
		Now:     time.Now(),
	}
	for _, e := range s.Stats() {
		if e.ID == rec.BackendID {
			v.Backend = s.endpointView(e)
			break
		}
	}
	if h, ok := s.proxy.History(sid); ok {
		v.History = &h
	}
	writeAdminJSON(w, http.StatusOK, v)
}

// taskRecordView is a task record (SEP-2663 tasks, recorded by the proxy
// when a backend created the task). The principal digest is not shown:
// only whether the task is bound to its creator's credentials.
type taskRecordView struct {
	ID         string `json:"id"`
	IDHash     string `json:"id_hash"` // as in traces (mcp.task.id) and logs (task)
	BackendID  string `json:"backend_id"`
	BackendURL string `json:"backend_url"`
	// PrincipalBound: the creating request carried credentials, and only
	// requests with the same ones are routed to the task.
	PrincipalBound bool      `json:"principal_bound"`
	Created        time.Time `json:"created"`
	TTLSeconds     float64   `json:"ttl_seconds"`
	Expires        time.Time `json:"expires"`
}

// TaskView is GET /debug/tasks/{id}.
type TaskView struct {
	Task    taskRecordView `json:"task"`
	Backend EndpointView   `json:"backend"`
	Now     time.Time      `json:"now"`
}

// debugTask serves GET /debug/tasks/{id}.
func (s *Server) debugTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ts, ok := s.store.(session.TaskStore)
	if !ok {
		writeAdminJSON(w, http.StatusNotFound, AdminError{"task not found"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminLookupTimeout)
	defer cancel()
	rec, err := ts.GetTask(ctx, id)
	if lookupFailed(w, err, "task") {
		return
	}
	v := TaskView{
		Task: taskRecordView{
			ID:             rec.TaskID,
			IDHash:         session.HashID(rec.TaskID),
			BackendID:      rec.BackendID,
			BackendURL:     rec.BackendURL,
			PrincipalBound: rec.Principal != "",
			Created:        rec.Created,
			TTLSeconds:     rec.TTL.Seconds(),
			Expires:        rec.Expires(),
		},
		Backend: EndpointView{ID: rec.BackendID, URL: rec.BackendURL, State: "gone"},
		Now:     time.Now(),
	}
	for _, e := range s.Stats() {
		if e.ID == rec.BackendID {
			v.Backend = s.endpointView(e)
			break
		}
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

func (s *Server) endpointView(e telemetry.EndpointStat) EndpointView {
	v := EndpointView{ID: e.ID, URL: e.URL, State: e.State, Sessions: e.Sessions, Inflight: e.Inflight,
		ListenStreams: e.ListenStreams, Draining: e.Draining}
	if st, ok := s.proxy.Drain(e.ID); ok {
		v.Drain = &st
	}
	return v
}

// debugEndpoints serves GET /debug/endpoints.
func (s *Server) debugEndpoints(w http.ResponseWriter, r *http.Request) {
	stats := s.Stats()
	v := EndpointsView{
		Now:       time.Now(),
		Balancer:  s.cfg.Balancer,
		Ready:     s.ready.Load(),
		Store:     storeView{Kind: s.storeName()},
		Endpoints: make([]EndpointView, len(stats)),
	}
	for i, e := range stats {
		v.Endpoints[i] = s.endpointView(e)
	}
	if c, ok := s.store.(*session.Cache); ok {
		st := c.Stats()
		v.Store.Degraded, v.Store.Pending, v.Store.Unwritten = st.Degraded, st.Pending, st.Unwritten
		top := c.Topology()
		v.Store.Topology, v.Store.Primaries, v.Store.Failovers = string(top.Topology), top.Primaries, top.Failovers
	}
	writeAdminJSON(w, http.StatusOK, v)
}

// The debug endpoints show the metrics' view of each endpoint
// (endpointView), so that one place (EndpointStats) decides what "ejected"
// means.

func writeAdminJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// lookupFailed answers a failed store lookup of a what ("session",
// "task"): 404 when the store does not hold it, 503 when the store could
// not say. It reports whether it answered.
func lookupFailed(w http.ResponseWriter, err error, what string) bool {
	switch {
	case errors.Is(err, session.ErrNotFound):
		writeAdminJSON(w, http.StatusNotFound, AdminError{what + " not found"})
	case err != nil:
		writeAdminJSON(w, http.StatusServiceUnavailable, AdminError{"session store: " + err.Error()})
	default:
		return false
	}
	return true
}

// DrainView is the answer to POST and DELETE /drain.
type DrainView struct {
	Backend  string `json:"backend"` // its URL
	ID       string `json:"id"`
	Draining bool   `json:"draining"`
	Sessions int64  `json:"sessions"`
}

// setDrain serves POST /drain?backend=B (drain B: it takes no new session,
// and its sessions move to others) and DELETE /drain?backend=B (undo). B is
// an endpoint's ID or URL, as /debug/endpoints shows them.
func (s *Server) setDrain(w http.ResponseWriter, r *http.Request) {
	backend := r.URL.Query().Get("backend")
	if backend == "" {
		writeAdminJSON(w, http.StatusBadRequest, AdminError{Error: "the backend query parameter is required (an endpoint's id or url)"})
		return
	}
	on := r.Method == http.MethodPost
	e, ok := s.drains.Set(backend, on)
	if !ok {
		writeAdminJSON(w, http.StatusNotFound, AdminError{Error: "no endpoint has the id or url " + strconv.Quote(backend)})
		return
	}
	v := DrainView{ID: e.ID, Draining: on, Backend: e.ID}
	if e.URL != nil {
		v.Backend = e.URL.String()
	}
	if ep, ok := s.bal.Lookup(e.ID); ok {
		v.Sessions = ep.Sessions()
	}
	s.log.Info("operator drain", "backend", v.Backend, "draining", on)
	writeAdminJSON(w, http.StatusOK, v)
}
