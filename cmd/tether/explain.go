package main

// tether explain and tether status: clients of the admin listener's debug
// endpoints (admin.go) that print what a replica knows, for an operator
// asking "why did this session land on that pod?" and "is the load even?".

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tether-mcp/tether/internal/proxy"
)

// adminRequestTimeout bounds one request to the admin listener.
const adminRequestTimeout = 5 * time.Second

// errSessionNotFound and errTaskNotFound are the admin's 404s for a
// session and for a task.
var (
	errSessionNotFound = errors.New("session not found")
	errTaskNotFound    = errors.New("task not found")
)

func explainCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tether explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", defaultAdmin(getenv), "admin address of the tether to ask (URL or host:port; env TETHER_ADMIN_LISTEN)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: tether explain SESSION_ID|TASK_ID [--admin URL]")
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return errors.New("explain: want one SESSION_ID or TASK_ID (tether explain ID [--admin URL])")
	}
	base, err := adminURL(*admin)
	if err != nil {
		return err
	}
	var v sessionView
	err = getAdmin(ctx, base, "/debug/sessions/"+url.PathEscape(pos[0]), &v)
	if errors.Is(err, errSessionNotFound) {
		// Session ids and task ids are both minted by backends, and an
		// operator holding one may not know which it is: ask for a task.
		var tv taskView
		err = getAdmin(ctx, base, "/debug/tasks/"+url.PathEscape(pos[0]), &tv)
		if errors.Is(err, errTaskNotFound) {
			return fmt.Errorf("session %q not found, nor a task of that id (asked %s)", pos[0], base)
		}
		if err != nil {
			return err
		}
		writeExplainTask(stdout, tv)
		return nil
	}
	if err != nil {
		return err
	}
	writeExplain(stdout, v)
	return nil
}

// writeExplainTask prints a task's record:
//
//	task      786512e2…  (in traces and logs: mcp.task.id=3c1d…)
//	lives on  http://10.0.0.7:8080  ready, 12 sessions, 1 in flight
//
//	record
//	  principal  bound to its creator's credentials
//	  created    4m ago (…)
//	  expires    in 56m (…), TTL 1h0m0s
func writeExplainTask(w io.Writer, v taskView) {
	t, b := v.Task, v.Backend
	fmt.Fprintf(w, "task      %s  (in traces and logs: mcp.task.id=%s)\n", t.ID, t.IDHash)
	if b.State == "gone" {
		fmt.Fprintf(w, "lives on  %s  gone: no longer an endpoint (the task is lost; its requests get the unknown-task error)\n", t.BackendURL)
	} else {
		fmt.Fprintf(w, "lives on  %s  %s\n", t.BackendURL, backendState(b))
	}
	if t.BackendID != t.BackendURL {
		fmt.Fprintf(w, "          endpoint %s\n", t.BackendID)
	}
	principal := "none: anyone holding the id may poll and cancel it"
	if t.PrincipalBound {
		principal = "bound to its creator's credentials"
	}
	ttl := time.Duration(t.TTLSeconds * float64(time.Second))
	left := t.Expires.Sub(v.Now).Round(time.Second)
	fmt.Fprintln(w, "\nrecord")
	fmt.Fprintf(w, "  %-10s %s\n", "principal", principal)
	fmt.Fprintf(w, "  %-10s %s\n", "created", agoString(v.Now, t.Created))
	fmt.Fprintf(w, "  %-10s in %s (%s), TTL %s\n", "expires", left, t.Expires.Local().Format(time.RFC3339), ttl)
}

func statusCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tether status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", defaultAdmin(getenv), "admin address of the tether to ask (URL or host:port; env TETHER_ADMIN_LISTEN)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("status: unexpected argument %q", fs.Arg(0))
	}
	base, err := adminURL(*admin)
	if err != nil {
		return err
	}
	var v endpointsView
	if err := getAdmin(ctx, base, "/debug/endpoints", &v); err != nil {
		return err
	}
	writeStatus(stdout, v)
	return nil
}

// parseInterspersed parses flags given before or after the positional
// arguments (`tether explain ID --admin URL` reads naturally), which the
// flag package alone stops at.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// defaultAdmin is where serve's admin listener is by default: the
// TETHER_ADMIN_LISTEN it would read, else its default address.
func defaultAdmin(getenv func(string) string) string {
	if v := strings.TrimSpace(getenv("TETHER_ADMIN_LISTEN")); v != "" {
		return v
	}
	return defaultConfig().AdminListen
}

// adminURL turns --admin into a base URL. A listen address is accepted as
// it is configured: with no host, or a wildcard one, it is asked on
// loopback.
func adminURL(s string) (string, error) {
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return "", fmt.Errorf("--admin %q: want an http:// URL or host:port", s)
		}
		return strings.TrimSuffix(u.String(), "/"), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("--admin %q: want an http:// URL or host:port", s)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// getAdmin GETs base+path into v. Errors are one line, for the command's
// exit message.
func getAdmin(ctx context.Context, base, path string, v any) error {
	return callAdmin(ctx, http.MethodGet, base, path, v)
}

// callAdmin asks the admin listener at base and decodes its JSON answer
// into v.
func callAdmin(ctx context.Context, method, base, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, adminRequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
	if err != nil {
		return fmt.Errorf("admin %s: %w", base, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("admin %s unreachable: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("admin %s: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e adminError
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			// Not tether's debug endpoint (an older tether, another server).
			return fmt.Errorf("admin %s%s: %s", base, path, resp.Status)
		}
		if resp.StatusCode == http.StatusNotFound && e.Error == errSessionNotFound.Error() {
			return errSessionNotFound
		}
		if resp.StatusCode == http.StatusNotFound && e.Error == errTaskNotFound.Error() {
			return errTaskNotFound
		}
		return fmt.Errorf("admin %s: %s", base, e.Error)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("admin %s%s: %w", base, path, err)
	}
	return nil
}

// writeExplain prints a session's explanation:
//
//	session    Q2H7…  (in traces and logs: mcp.session.id=1f0a…)
//	lives on   http://10.0.0.7:8080  ready, 12 sessions, 1 in flight
//
//	record
//	  …
//	placed     new session on http://10.0.0.7:8080, 4m ago, status 200
//	  candidate               load
//	  http://10.0.0.7:8080       3  ← chosen
//	  http://10.0.0.9:8080       5
//	…
func writeExplain(w io.Writer, v sessionView) {
	s, b := v.Session, v.Backend
	ago := func(t time.Time) string { return agoString(v.Now, t) }

	fmt.Fprintf(w, "session   %s  (in traces and logs: mcp.session.id=%s)\n", s.ID, s.IDHash)
	fmt.Fprintf(w, "lives on  %s  %s\n", s.BackendURL, backendState(b))
	if s.BackendID != s.BackendURL {
		fmt.Fprintf(w, "          endpoint %s\n", s.BackendID)
	}

	fmt.Fprintln(w, "\nrecord")
	backendSID := "the client's"
	if s.BackendSessionIDHash != s.IDHash {
		backendSID = "its own since the last re-initialization (" + s.BackendSessionIDHash + ")"
	}
	proto := s.ProtocolVersion
	if proto == "" {
		proto = "unknown"
	}
	rows := [][2]string{
		{"backend session id", backendSID},
		{"initialize", fmt.Sprintf("%d bytes kept for re-initialization, protocol %s", s.InitializeBytes, proto)},
		{"created", ago(s.Created)},
		{"last used", ago(s.LastUsed)},
		{"re-initialized", plural(int64(s.Reinits), "time")},
		{"record version", fmt.Sprint(s.Version)},
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-19s %s\n", r[0], r[1])
	}
	fmt.Fprintln(w)

	h := v.History
	if h == nil {
		fmt.Fprintln(w, "decisions  none on this replica: another replica placed the session, or this one restarted since")
		return
	}
	writeDecision(w, "placed", h.Placed, ago, "not seen by this replica (placed by another replica, or before a restart)")
	writeDecision(w, "last re-initialization", h.LastReinit, ago, "none seen by this replica")
	fmt.Fprintf(w, "last decision  %s, status %d, %s (%s through this replica)\n",
		h.LastRoute, h.LastStatus, ago(h.LastAt), plural(h.Requests, "request"))
}

func writeDecision(w io.Writer, title string, d *proxy.Decision, ago func(time.Time) string, none string) {
	if d == nil {
		fmt.Fprintf(w, "%s  %s\n\n", title, none)
		return
	}
	what := "on " + d.Backend
	switch {
	case d.From != "" && d.While == "operator":
		what = "to " + d.Backend + ", moved off " + d.From + " while an operator drained it"
	case d.From != "":
		what = "to " + d.Backend + ", moved off " + d.From + " while it terminated"
	case d.Reason != "":
		what = "to " + d.Backend + " (" + d.Reason + ")"
	}
	fmt.Fprintf(w, "%s  %s, %s, status %d\n", title, what, ago(d.At), d.Status)
	if len(d.Candidates) > 0 {
		width := len("candidate")
		for _, c := range d.Candidates {
			width = max(width, len(c.Backend))
		}
		fmt.Fprintf(w, "  %-*s  %6s\n", width, "candidate", "load")
		for _, c := range d.Candidates {
			mark := ""
			if c.Backend == d.Backend {
				mark = "  <- chosen"
			}
			fmt.Fprintf(w, "  %-*s  %6d%s\n", width, c.Backend, c.Load, mark)
		}
	}
	fmt.Fprintln(w)
}

func backendState(b endpointView) string {
	if b.State == "gone" {
		return "gone: no longer an endpoint (the next request re-initializes the session elsewhere)"
	}
	return fmt.Sprintf("%s, %s, %d in flight", b.State, plural(b.Sessions, "session"), b.Inflight)
}

// writeStatus prints the endpoints as a table:
//
//	balancer p2c, store redis (healthy)
//
//	backend                state    sessions  share  in-flight
//	http://10.0.0.7:8080   ready          12    40%          1
//	…
//
// With Sentinel or Cluster, the store says so, with its primaries and the
// failovers seen: "store redis sentinel, primary 10.0.0.9:6379, 1 failover
// seen (healthy)".
func writeStatus(w io.Writer, v endpointsView) {
	store := v.Store.Kind
	if t := v.Store.Topology; t != "" && t != "single" {
		store += " " + t
		switch len(v.Store.Primaries) {
		case 0:
			store += ", primary not seen yet"
		case 1:
			store += ", primary " + v.Store.Primaries[0]
		default:
			store += ", primaries " + strings.Join(v.Store.Primaries, " ")
		}
		store += ", " + plural(v.Store.Failovers, "failover") + " seen"
	}
	switch {
	case v.Store.Degraded:
		store += fmt.Sprintf(" (DEGRADED: Redis unreachable, serving from cache; %d records pending)", v.Store.Pending)
	case v.Store.Kind == "redis":
		store += " (healthy)"
	}
	ready := ""
	if !v.Ready {
		ready = ", NOT READY"
	}
	fmt.Fprintf(w, "balancer %s, store %s%s\n\n", v.Balancer, store, ready)
	if len(v.Endpoints) == 0 {
		fmt.Fprintln(w, "no endpoints")
		return
	}
	width := len("backend")
	var total, inflight int64
	for _, e := range v.Endpoints {
		width = max(width, len(e.URL))
		total += e.Sessions
		inflight += e.Inflight
	}
	fmt.Fprintf(w, "%-*s  %-7s  %8s  %5s  %9s\n", width, "backend", "state", "sessions", "share", "in-flight")
	for _, e := range v.Endpoints {
		share := "-"
		if total > 0 {
			share = fmt.Sprintf("%.0f%%", 100*float64(e.Sessions)/float64(total))
		}
		fmt.Fprintf(w, "%-*s  %-7s  %8d  %5s  %9d\n", width, e.URL, e.State, e.Sessions, share, e.Inflight)
	}
	fmt.Fprintf(w, "%-*s  %-7s  %8d  %5s  %9d\n", width, fmt.Sprintf("%d endpoints", len(v.Endpoints)), "", total, "", inflight)
	drained := false
	for _, e := range v.Endpoints {
		if e.Drain == nil {
			continue
		}
		if !drained {
			fmt.Fprintln(w)
			drained = true
		}
		why := "it terminates"
		if e.Drain.Reason == "operator" {
			why = "an operator drains it"
		}
		progress := plural(e.Sessions, "session") + " left"
		if e.Drain.EmptiedAfter > 0 {
			progress = "emptied after " + e.Drain.EmptiedAfter.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "draining %s (%s) since %s: %s, %s by this replica\n",
			e.URL, why, agoString(v.Now, e.Drain.Since), progress, plural(e.Drain.Moved, "session")+" moved")
	}
}

// agoString is t, and how long before now it was.
func agoString(now, t time.Time) string {
	if t.IsZero() || t.Unix() <= 0 {
		return "never"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		d = d.Round(time.Millisecond)
	default:
		d = d.Round(time.Second)
	}
	return fmt.Sprintf("%s ago (%s)", d, t.Local().Format(time.RFC3339))
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
